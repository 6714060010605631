"""What a rewritten graph quantizes, in terms two graphs of one model can compare.

Used by tests/model_boundary_test.py and tests/input_feed_test.py: a
training graph (a feed, the model, a loss) and the export graph (a
placeholder and the model) must quantize the same model tensors, under the
same names, with the same range variables (a strict `Saver()` restore).
"""
import re
from typing import Dict, List, Set, Tuple

import tensorflow as tf

from qat.engine import marks
from qat.tflite import graph_structure
from tools.property import invariants


def _readers(t: tf.Tensor, gradients: Set[tf.Operation]) -> Tuple[str, ...]:
    """The non-qat, non-gradient ops reading the quantized value of `t`."""
    out = marks.quantizer_of(t)
    if out is None:
        return ()
    return tuple(sorted({c.name for c in out.consumers()
                         if not marks.made_by_qat(c) and c not in gradients}))


def activation_quantizers(graph: tf.Graph) -> Dict[str, Tuple[str, Tuple[str, ...]]]:
    """{quantizer name: (tensor it quantizes, ops reading the quantized value)}.

    Weight quantizers are left out.
    """
    gradients = graph_structure.gradient_ops(graph)
    found = {}
    for op in graph_structure.fake_quant_ops(graph):
        name = op.name.rsplit("/", 1)[0]
        if name.endswith("weights_quant") or op in gradients:
            continue
        t = invariants.quantized_tensor(op)
        found[name] = (t.name, _readers(t, gradients))
    return found


def range_variables(graph: tf.Graph) -> List[str]:
    """The activation range variables (what a checkpoint holds of them)."""
    with graph.as_default():
        return sorted({v.op.name for v in tf.compat.v1.global_variables()
                       if re.search(r"_quant(_\d+)?/(min|max)$", v.op.name)
                       and "weights_quant" not in v.op.name})


def variable_names(graph: tf.Graph) -> Set[str]:
    with graph.as_default():
        return {v.op.name for v in tf.compat.v1.global_variables()}
