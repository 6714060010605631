"""tf_keras's fused layer norm, rewritten as arithmetic an integer model can run.

tf_keras `LayerNormalization` (epsilon >= 1.001e-5, the default 1e-3)
normalises with a training-mode fused batch norm on a reshaped input::

    Reshape(x, [1, pre, in, 1]) -> FusedBatchNormV3(ones, zeros, is_training,
        NCHW) -> Reshape(., shape(x)) -> * gamma -> + beta

The converter lowers the fused batch norm to MEAN, SQUARED_DIFFERENCE, ADD,
RSQRT, MUL, SUB inside the converted model, where no range can reach them,
so they stay float. `unfuse_layer_norms` replaces each one, in training and
eval graphs alike, by the same arithmetic over the normalised axes of x
(`<bn op>_unfused/moments/mean`, `.../moments/variance`, `.../Rsqrt`, ...),
whose intermediates the quantize pass gives ranges like any layer norm
written by hand. The fused batch norm is left unconnected and marked
(`qat.engine.marks.is_replaced`), so the fold and quantize passes skip it.
"""
from typing import List

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import tensor_util

from qat.engine import marks
from qat.engine import rewrite as rewrite_lib
from qat.matching.matcher import GraphMatcher, OneofPattern, OpTypePattern

def _filled(name: str) -> OneofPattern:
    """A constant vector: Const, or Fill(shape, Const) (dynamic length)."""
    return OneofPattern([
        OpTypePattern("Const", name=name),
        OpTypePattern("Fill", inputs=["*", OpTypePattern("Const", name=name)]),
    ])


# `in`, the size of the normalised axes: Prod(shape(x)[begin:end]).
_NORMALISED_SIZE = OpTypePattern("Prod", inputs=[
    OpTypePattern("StridedSlice", name="normalised_axes", inputs=[
        OpTypePattern("Shape"), OpTypePattern("Const"), OpTypePattern("Const"),
        OpTypePattern("Const")]), "*"])
FUSED_LAYER_NORM = OpTypePattern("Reshape", name="ln_output", inputs=[
    OpTypePattern("FusedBatchNormV3|FusedBatchNormV2|FusedBatchNorm", name="ln_bn", inputs=[
        OpTypePattern("Reshape", name="ln_input", inputs=[
            OpTypePattern("*", name="x"),
            OpTypePattern("Pack", inputs=["*", "*", _NORMALISED_SIZE, "*"])]),
        _filled("ones"), _filled("zeros"), "*", "*"]),
    "*"])
_MATCHER = GraphMatcher(FUSED_LAYER_NORM)


def _constant(t: tf.Tensor, value: float) -> bool:
    found = tensor_util.constant_value(t)
    return found is not None and np.all(np.asarray(found) == value)


def _normalised_axes(x: tf.Tensor, axes_slice: tf.Operation) -> List[int]:
    """The axes of x the layer norm reduces over: shape(x)[begin:end]."""
    rank = x.shape.rank
    begin, end = (tensor_util.constant_value(t) for t in axes_slice.inputs[1:3])
    strides = tensor_util.constant_value(axes_slice.inputs[3])
    if (rank is None or begin is None or end is None or strides is None
            or np.size(begin) != 1 or np.ravel(strides)[0] != 1
            or axes_slice.get_attr("begin_mask") or axes_slice.get_attr("shrink_axis_mask")):
        return []
    start = int(np.ravel(begin)[0]) % rank
    stop = rank if axes_slice.get_attr("end_mask") else int(np.ravel(end)[0])
    stop = stop if stop > 0 else stop + rank
    return list(range(start, stop)) if 0 < start < stop <= rank else []


def unfuse_layer_norms(graph: tf.Graph) -> int:
    """Replaces tf_keras's fused layer norms by their arithmetic.

    Args:
      graph: the graph to rewrite (training or eval).

    Returns:
      How many layer norms were replaced.
    """
    rewrite = rewrite_lib.Rewrite(graph, marks.LAYER_NORM)
    count = 0
    for op in graph.get_operations():
        if op.type != "Reshape":
            continue
        match = _MATCHER.match_op(op)
        if match is None:
            continue
        bn = match.get_op("ln_bn")
        if (marks.is_replaced(bn) or not bn.get_attr("is_training")
                or bn.get_attr("data_format") not in (b"NCHW", "NCHW")
                or not _constant(match.get_tensor("ones"), 1.0)
                or not _constant(match.get_tensor("zeros"), 0.0)
                or bn.outputs[0].consumers() != [op]):
            continue
        x = match.get_tensor("x")
        axes = _normalised_axes(x, match.get_op("normalised_axes"))
        if not axes or op.outputs[0].shape.rank != x.shape.rank:
            continue
        epsilon = bn.get_attr("epsilon")

        def build(x, axes=axes, epsilon=epsilon):
            with tf.name_scope("moments"):
                mean = tf.reduce_mean(x, axes, keepdims=True, name="mean")
                variance = tf.reduce_mean(
                    tf.math.squared_difference(x, tf.stop_gradient(mean)), axes,
                    keepdims=True, name="variance")
            inverse = tf.math.rsqrt(variance + epsilon, name="Rsqrt")
            return [tf.multiply(tf.subtract(x, mean, name="sub"), inverse, name="mul")]

        out = rewrite.nodes.python_ops(bn.name + "_unfused", [x], build,
                                       device=bn.device, mark=marks.LAYER_NORM)[0]
        rewrite.reroute_consumers(op.outputs[0], out, op.outputs[0].consumers())
        rewrite.set_attr(bn, marks.REPLACED_BY_ATTR, attr_value_pb2.AttrValue(s=out.encode()))
        count += 1
    rewrite_lib.apply(rewrite)
    return count
