"""`zeros_like(x)` and `ones_like(x)` as a `Fill` of x's shape.

Why this module exists: TFLite's ZEROS_LIKE and ONES_LIKE have no integer
kernels, so the converter keeps them (and what reads them) in float, while a
FILL of a quantized value is integer (measured on TF 2.21). Keras 3 writes
the first output of a masked recurrent layer as `where(mask, output,
zeros_like(output))`. `fill_constant_likes` puts `Fill(Shape(x), 0)` (or 1) in
the graph and moves the readers onto it; the planner quantizes the Fill's
value (`qat.quantize.plan.ranges.rules`). The op replaced is left unconnected and
marked. Gradient ops (`tf.gradients` builds ZerosLike ops) are left alone.
"""
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from qat.engine import marks
from qat.engine import op_index
from qat.engine import rewrite as rewrite_lib
from qat.matching import tensors

# Op type -> the value its output holds everywhere.
LIKE_TYPES = {"ZerosLike": 0.0, "OnesLike": 1.0}


def fill_constant_likes(graph: tf.Graph) -> int:
    """Replaces each float `ZerosLike` / `OnesLike` read by an op with a Fill.

    Args:
      graph: the graph to rewrite in place; ops replaced before are left alone.

    Returns:
      How many ops were replaced.

    Raises:
      qat.engine.rewrite.RewriteError: the new ops fail their checks; the graph
        is then unchanged.
    """
    found = [op for op in op_index.ops_of_types(graph, LIKE_TYPES)
             if tensors.is_float(op.outputs[0])
             and op.outputs[0].consumers() and getattr(op, "_original_op", None) is None
             and not marks.is_replaced(op)]
    if not found:
        return 0
    rewrite = rewrite_lib.Rewrite(graph, marks.CONSTANT_FILL)
    nodes = rewrite.nodes
    for op in found:
        out = op.outputs[0]
        name = nodes.unique_name(op.name + "/fill")
        shape = nodes.node(name + "/shape", "Shape", [nodes.external(op.inputs[0])],
                           device=op.device, T=op.inputs[0].dtype, out_type=tf.int32)
        value = nodes.const(name + "/value", np.asarray(LIKE_TYPES[op.type]), out.dtype)
        fill = nodes.node(name, "Fill", [shape, value], device=op.device, T=out.dtype,
                          index_type=tf.int32)
        rewrite.reroute_consumers(out, fill, out.consumers())
        rewrite.set_attr(op, marks.REPLACED_BY_ATTR, attr_value_pb2.AttrValue(s=fill.encode()))
    rewrite_lib.apply(rewrite)
    return len(found)
