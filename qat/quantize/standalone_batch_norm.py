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
from typing import Optional

import tensorflow as tf

from qat.graph_editor import reroute

# Suffix of the name scope of the replacement ops: `<bn op name>_depthwise`.
SCOPE_SUFFIX = "_depthwise"


_BATCH_NORM_TYPES = frozenset(["FusedBatchNorm", "FusedBatchNormV2",
                               "FusedBatchNormV3"])


def is_replaceable(bn: tf.Operation) -> bool:
    """True for an inference-mode NHWC fused batch norm on a 4-D float input."""
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


def data_input(op: tf.Operation, is_data) -> Optional[tf.Tensor]:
    """The tensor a batch norm (or batch norm If op) normalises.

    Args:
      op: a FusedBatchNorm* op or an If op from `is_batch_norm_cond`.
      is_data: predicate telling data tensors from parameters.
    """
    if op.type not in _COND_TYPES:
        return op.inputs[0]
    for t in op.inputs:
        if t.dtype == tf.float32 and is_data(t):
            return t
    return None


def is_replaced(bn: tf.Operation) -> bool:
    """True if an earlier pass already replaced `bn`."""
    try:
        bn.graph.get_operation_by_name(
            bn.name + SCOPE_SUFFIX + "/DepthwiseConv2dNative")
        return True
    except KeyError:
        return False


def replace_with_depthwise(bn: tf.Operation,
                           per_channel: bool = False) -> Optional[tf.Tensor]:
    """Replaces an inference batch norm's output by a 1x1 depthwise conv.

    Args:
      bn: a FusedBatchNorm* op with is_training=False, NHWC.
      per_channel: one weight range per channel (int8 only), else one range.

    Returns:
      The new output (the bias add), or None when `bn` does not qualify or
      nothing reads its output.
    """
    if not is_replaceable(bn) or is_replaced(bn):
        return None
    out = bn.outputs[0]
    consumers = list(out.consumers())
    if not consumers:
        return None
    x, gamma, beta, mean, variance = bn.inputs[:5]
    channels = int(x.shape[-1])
    graph = bn.graph
    with graph.as_default(), graph.control_dependencies(None), \
            graph.name_scope(bn.name + SCOPE_SUFFIX + "/"):
        scale = gamma * tf.math.rsqrt(variance + bn.get_attr("epsilon"),
                                      name="rsqrt")
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
        new_out = tf.nn.bias_add(conv, offset, name="BiasAdd")
    reroute.reroute_ts(new_out, out, can_modify=consumers)
    return new_out
