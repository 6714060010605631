"""Eval-graph batch norms that follow no layer, as a quantizable 1x1 depthwise conv.

A batch norm the fold pass cannot fold (input normalisation, a batch norm
after a concat or an add) reaches TFLite as MUL then ADD. A FakeQuant after
the batch norm gives the ADD output a range but not the MUL output, so both
stay float ("lacking min/max data"), and so does everything up to the next
range. In an eval graph the batch norm is `x * scale + offset` with constant
`scale = gamma / sqrt(moving_var + eps)` and `offset = beta - moving_mean *
scale`: the same as a 1x1 depthwise convolution with weights `scale` and bias
`offset`, which TFLite runs as one integer DEPTHWISE_CONV_2D (int32 bias).

`add_depthwise` builds that form next to the batch norm, quantizes
its weights with a symmetric narrow range computed from the weights themselves
(no range variables: the training checkpoint has none for it), and moves the
batch norm's consumers onto it. The range after it (`<bn ctx>/bn_quant` or
the activation's `act_quant`) is the one training learnt.
"""
from typing import Optional, Tuple

import tensorflow as tf

from qat.engine import marks
from qat.matching.standalone_batch_norms import REPLACES_ATTR
from qat.matching.standalone_batch_norms import is_replaceable
from qat.matching.standalone_batch_norms import is_replaced
from qat.matching.standalone_batch_norms import unfused_parts

# Suffix of the name scope of the replacement ops: `<bn op name>_depthwise`.
SCOPE_SUFFIX = "_depthwise"


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
