"""Which eval-graph tensor each TFLite tensor holds, read from TFLite's names.

The converter names a tensor after the TF ops it fused into the op that
computes it, the op whose output it holds first: "relu;BiasAdd;Conv2D" holds
the ReLU's output. It appends a digit to make a name unique
("pool/AvgPool1": a requantized copy of "pool/AvgPool"). `layer_numerics`
uses these rules to compare each activation quantizer (a "row") with its
TFLite tensor, and to read the tensors between rows from TFLite.
"""
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ops import patterns as quantize_patterns
from qat.tflite import graph_structure as structure


def name_parts(name: str, graph_ops: set):
    """The TF op names a TFLite tensor is named after ("relu;BiasAdd;Conv2D").

    Args:
      name: the TFLite tensor name.
      graph_ops: the eval graph's op names (a part that is one is kept as
        it is; otherwise TFLite's de-duplicating digits are stripped too).

    Yields:
      The parts, in order (the first holds the tensor's value), each
      followed by its form without the digits where that differs.
    """
    for part in name.split(";"):
        yield part
        stripped = part.rstrip("0123456789")  # TFLite's de-duplicating suffix.
        if stripped != part and part not in graph_ops:
            yield stripped


def _suffix(name: str, op_name: str) -> int:
    """The de-duplicating number TFLite appended to `op_name` in `name` (0: none)."""
    for part in name.split(";"):
        if part.startswith(op_name) and part[len(op_name):].isdigit():
            return int(part[len(op_name):])
    return 0


def match_rows(rows_spec: Sequence[tuple], values: Sequence[np.ndarray],
               tflite: Dict[str, Dict[str, Any]], graph_ops: set,
               permuting_ops: frozenset = frozenset()) -> List[Optional[str]]:
    """The TFLite tensor of each row: None where none matched.

    Args:
      rows_spec: (label, eval tensor, candidate TF op names) per row, in
        graph order.
      values: the eval graph's value of each row (for its shape).
      tflite: `qat.report.model_runs.run_tflite_tensors`' result.
      graph_ops: the eval graph's op names.
      permuting_ops: the names of its ops that reorder values (Transpose).

    A row takes a tensor of its shape named after its first candidate TF op
    that has one (quantized tensors first; of a lowered op's numbered tensors
    the last). A fused TFLite op names its tensor
    after every TF op it fused ("relu;BiasAdd;Conv2D") and holds the last
    one's output, so a tensor named after the ops of several rows (a layer's
    own quantizer and its activation's) belongs to the last of them only; nor
    does a tensor whose first name is a transpose of the row's value (the
    converter merges a model input's QUANTIZE into the TRANSPOSE of a
    channels-first input, naming it "transpose;input_quant/..."), whatever
    its shape.
    """
    rows_of_op: Dict[str, List[int]] = {}
    for i, (_, _, candidates) in enumerate(rows_spec):
        for candidate in candidates:
            rows_of_op.setdefault(candidate, []).append(i)
    names_of_op: Dict[str, List[str]] = {}
    last_row = {}
    for name in tflite:
        parts = set(name_parts(name, graph_ops))
        for part in parts:
            names_of_op.setdefault(part, []).append(name)
        last_row[name] = max((i for part in parts for i in rows_of_op.get(part, ())),
                             default=-1)
    matches = []
    for i, ((_, _, candidates), value) in enumerate(zip(rows_spec, values)):
        match = None
        for k, candidate in enumerate(candidates):
            found = [name for name in names_of_op.get(candidate, ())
                     if last_row[name] == i and tflite[name]["value"].shape == value.shape
                     and (name.split(";")[0] not in permuting_ops
                          or name.split(";")[0] in candidates)]
            if found:
                # Integer tensors first. An op the converter lowers to
                # several (Einsum: TRANSPOSE, BATCH_MATMUL, RESHAPE, ...)
                # numbers their tensors ("Einsum", "Einsum1", ...): the last
                # holds its output. (A quantizer's numbered copy is a
                # requantized one: the first candidate keeps the unnumbered.)
                # A requantized copy last.
                match = min(found, key=lambda name: (tflite[name].get("requantized", False),
                                                     not tflite[name]["integer"],
                                                     -_suffix(name, candidate) if k else 0))
                break
        matches.append(match)
    return matches


def _computes_with(t: tf.Tensor) -> bool:
    """Whether a layer or an own-range kernel (a matmul, an add) reads `t`,
    through Identity ops."""
    stack, seen = [t], set()
    while stack:
        for c in stack.pop().consumers():
            if c in seen:
                continue
            seen.add(c)
            if c.type == "Identity":
                stack.append(c.outputs[0])
            elif c.type in op_table.OWN_RANGE_TYPES or c.type in quantize_patterns.LAYER_TYPES:
                return True
    return False


def unquantized_tensors_tflite_rounds(path: Sequence[tf.Operation], graph: tf.Graph,
                                      forced: Dict[str, str], tflite: Dict[str, Dict[str, Any]]
                                      ) -> Dict[str, str]:
    """Tensors between rows that TFLite holds as integers: {eval tensor: TFLite tensor}.

    Same-scale ops (pools, reshapes, resizes: `op_table.SAME_SCALE_TYPES`)
    have no quantizer of their own. Most move values, but an average pool or a
    bilinear resize computes new ones, which the eval graph keeps exact where
    TFLite rounds them to the input's grid: half a step at most, which the
    next layer's gain multiplies. Fixed-range ops (softmax, logistic, tanh)
    round to their fixed grid in TFLite (a softmax to 1/256), where the eval
    graph keeps them exact: over a 32-token attention the context matmul
    sums 32 such roundings; where a layer or an integer kernel computes with them (not
    where they are the model output, whose own kernel is then checked), they
    are read from TFLite too. Reading their outputs from TFLite too keeps
    each row's own difference to that row's own kernel. A TFLite tensor is
    named after the op whose output it holds first ("relu;BiasAdd;Conv2D").
    """
    by_first_op = {}
    for name, value in tflite.items():
        if value["integer"]:
            by_first_op.setdefault(name.split(";")[0], []).append(name)
    extra = {}
    for op in structure.topological_order(path, graph):
        if not op.outputs or not (op.type in op_table.SAME_SCALE_TYPES or (
                op.type in op_table.FIXED_RANGE_TYPES and _computes_with(op.outputs[0]))):
            continue
        tensor = op.outputs[0]
        if tensor.name in forced or tensor.dtype != tf.float32:
            continue
        for name in by_first_op.get(op.name, ()):
            if tensor.shape.is_compatible_with(tflite[name]["value"].shape):
                extra[tensor.name] = name
                break
    return extra
