"""Eval-graph batch norms that follow no layer, as a quantizable 1x1 depthwise conv.

A batch norm the fold pass cannot fold (input normalisation, a batch norm
after a concat or an add) reaches TFLite as MUL then ADD. A FakeQuant after
the batch norm gives the ADD output a range but not the MUL output, so both
stay float ("lacking min/max data"), and so does everything up to the next
range. In an eval graph the batch norm is `x * scale + offset` with constant
`scale = gamma / sqrt(moving_var + eps)` and `offset = beta - moving_mean *
scale`: the same as a 1x1 depthwise convolution with weights `scale` and bias
`offset`, which TFLite runs as one integer DEPTHWISE_CONV_2D (int32 bias).

`replace_with_depthwise` builds that form next to the batch norm, quantizes
its weights with a symmetric narrow range computed from the weights themselves
(no range variables: the training checkpoint has none for it), and moves the
batch norm's consumers onto it. The range after it (`<bn ctx>/bn_quant` or
the activation's `act_quant`) is the one training learnt.
"""
from typing import Optional, Tuple

import tensorflow as tf

from qat.engine import marks
from qat.matching import layer_patterns
from qat.matching.matcher import GraphMatcher

# Suffix of the name scope of the replacement ops: `<bn op name>_depthwise`.
SCOPE_SUFFIX = "_depthwise"


_BATCH_NORM_TYPES = frozenset(["FusedBatchNorm", "FusedBatchNormV2",
                               "FusedBatchNormV3"])


_UNFUSED_MATCHER = GraphMatcher(layer_patterns.UNFUSED_BATCH_NORM)


def unfused_parts(op: tf.Operation) -> Optional[Tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """(x, inv, offset) of a batch norm written as arithmetic, `x * inv + offset`
    (`layer_patterns.UNFUSED_BATCH_NORM`, Keras 3's BatchNormalization), on a
    4-D channels-last input with one scale and offset per channel; else None."""
    if op.type not in ("Add", "AddV2"):
        return None
    match = _UNFUSED_MATCHER.match_op(op)
    if match is None:
        return None
    x, inv, offset = (match.get_tensor(name) for name in ("bn_input", "inv", "offset"))
    channels = x.shape[-1] if x.shape.rank == 4 else None
    if channels is None or op.outputs[0].shape.rank != 4:
        return None
    for t in (inv, offset):
        if t.shape.num_elements() != channels or (t.shape.rank or 0) > 4 or (
                t.shape.rank and t.shape[-1] != channels):
            return None
    return x, inv, offset


def normalised_input(bn: tf.Operation) -> tf.Tensor:
    """The tensor a batch norm op (fused, or the final add of its arithmetic) reads."""
    parts = unfused_parts(bn)
    return parts[0] if parts else bn.inputs[0]


def is_replaceable(bn: tf.Operation) -> bool:
    """True for an inference-mode NHWC fused batch norm on a 4-D float input,
    or the arithmetic of one (`unfused_parts`) whose scale and offset are
    constants here (eval graphs: moving statistics)."""
    parts = unfused_parts(bn)
    if parts is not None:
        x, inv, offset = parts
        return (x.dtype == tf.float32 and not _computed_from(inv, x)
                and not _computed_from(offset, x))
    if bn.type not in _BATCH_NORM_TYPES:
        return False
    if bn.get_attr("is_training"):
        return False
    if bn.get_attr("data_format") not in (b"NHWC", "NHWC"):
        return False
    x = bn.inputs[0]
    return (x.dtype == tf.float32 and x.shape.rank == 4
            and x.shape[-1] is not None)


_COND_TYPES = ("If", "StatelessIf")


def is_batch_norm_cond(op: tf.Operation, library) -> bool:
    """True for an If op whose branches run a fused batch norm.

    What a batch norm built with a `training` tensor becomes (the fold pass
    warns about those); its output 0 is the batch norm output.

    Args:
      op: any op.
      library: {function name: FunctionDef} of the graph.
    """
    if op.type not in _COND_TYPES or not op.outputs:
        return False
    for key in ("then_branch", "else_branch"):
        function = library.get(op.get_attr(key).name)
        if function is not None and any(
                node.op in _BATCH_NORM_TYPES for node in function.node_def):
            return True
    return False


def _computed_from(t: tf.Tensor, x: tf.Tensor, depth: int = 12) -> bool:
    """Whether `t` depends on `x` (batch statistics) within `depth` ops."""
    frontier, seen = [t], set()
    for _ in range(depth):
        following = []
        for u in frontier:
            if u is x:
                return True
            if u.op not in seen:
                seen.add(u.op)
                following.extend(u.op.inputs)
        frontier = following
    return False


def data_input(op: tf.Operation, is_data) -> Optional[tf.Tensor]:
    """The tensor a batch norm (or batch norm If op) normalises.

    Args:
      op: a FusedBatchNorm* op, the final add of a batch norm's arithmetic
        (`unfused_parts`) or an If op from `is_batch_norm_cond`.
      is_data: predicate telling data tensors from parameters.
    """
    if op.type not in _COND_TYPES:
        return normalised_input(op)
    for t in op.inputs:
        if t.dtype == tf.float32 and is_data(t):
            return t
    return None


# Attribute of the replacement's depthwise conv naming the batch norm it
# replaces (qat's own mark; see qat.engine.marks).
REPLACES_ATTR = "_qat_replaces"


def is_replaced(bn: tf.Operation) -> bool:
    """True if an earlier pass already replaced `bn`."""
    for op in normalised_input(bn).consumers():
        if marks.made_by_qat(op, marks.STANDALONE_BATCH_NORM):
            try:
                if op.get_attr(REPLACES_ATTR) == bn.name.encode():
                    return True
            except ValueError:
                continue
    return False


def add_depthwise(rewrite, bn: tf.Operation, per_channel: bool = False,
                  x_ref=None) -> Optional[str]:
    """Adds the 1x1 depthwise form of an inference batch norm to `rewrite`.

    The caller moves the batch norm's consumers onto the returned node.

    Args:
      rewrite: the quantize pass's `qat.engine.rewrite.Rewrite`.
      bn: a FusedBatchNorm* op with is_training=False, NHWC, or the final
        add of a batch norm's arithmetic with constant scale and offset.
      per_channel: one weight range per channel (int8 only), else one range.
      x_ref: what the conv reads instead of the batch norm's input (its
        quantized value in the rewrite), as (`name:<i>`, dtype, shape).

    Returns:
      The new output (the bias add, `name:0`), or None when `bn` does not
      qualify.
    """
    if not is_replaceable(bn) or is_replaced(bn):
        return None
    parts = unfused_parts(bn)
    if parts is not None:
        x, inv, offset = parts
        inputs = [x_ref or x, inv, offset]
    else:
        x = bn.inputs[0]
        inputs = [x_ref or x] + list(bn.inputs[1:5])
    channels = int(x.shape[-1])
    epsilon = None if parts is not None else bn.get_attr("epsilon")

    def build(x, *parameters):
        if epsilon is None:  # The arithmetic's own scale and offset.
            scale, offset = (tf.reshape(t, [channels]) for t in parameters)
        else:
            gamma, beta, mean, variance = parameters
            scale = gamma * tf.math.rsqrt(variance + epsilon, name="rsqrt")
            offset = tf.subtract(beta, mean * scale, name="offset")
        weights = tf.reshape(scale, [1, 1, channels, 1], name="weights")
        # Symmetric narrow range: zero point 0 in int8 as well as uint8 128.
        axes = [0, 1, 3] if per_channel else None
        bound = tf.maximum(tf.reduce_max(tf.abs(weights), axis=axes),
                           1e-8, name="bound")
        with tf.name_scope("weights_quant"):
            if per_channel:
                quantized = tf.reshape(
                    tf.quantization.fake_quant_with_min_max_vars_per_channel(
                        tf.reshape(weights, [1, 1, channels]), -bound, bound,
                        narrow_range=True, name="FakeQuantWithMinMaxVars"),
                    [1, 1, channels, 1])
            else:
                quantized = tf.quantization.fake_quant_with_min_max_vars(
                    weights, -bound, bound, narrow_range=True,
                    name="FakeQuantWithMinMaxVars")
        conv = tf.compat.v1.nn.depthwise_conv2d_native(
            x, quantized, [1, 1, 1, 1], "VALID", name="DepthwiseConv2dNative")
        conv.op._set_attr(REPLACES_ATTR, tf.compat.v1.AttrValue(s=bn.name.encode()))  # pylint: disable=protected-access
        return [tf.nn.bias_add(conv, offset, name="BiasAdd")]

    return rewrite.nodes.python_ops(bn.name + SCOPE_SUFFIX, inputs,
                                    build, device=bn.device,
                                    mark=marks.STANDALONE_BATCH_NORM)[0]
