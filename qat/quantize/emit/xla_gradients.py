"""The quantizers' training gradients where XLA compiles them.

`qat.quantize.emit.fake_quant_gradient` masks the incoming gradient with
QuantizeAndDequantizeV4Grad over a nudged range it recomputes: one pass, the
values of TensorFlow's FakeQuant gradient bit for bit. That kernel has no
XLA kernel. Where XLA compiles the gradient, the input gradient is instead
TensorFlow's own FakeQuantWithMinMaxVars(PerChannel)Gradient over the op's
own min and max:

* XLA compiles it from the same nudge as the FakeQuant forward it compiles.
  XLA's arithmetic is not TensorFlow's kernels' (its algebraic simplifier
  turns the division by the grid's width into a multiplication by its
  reciprocal), so the nudged bounds of a range can differ from the kernels'
  by a float step; a mask recomputed by other ops could then disagree with
  the clamp of the forward, TensorFlow's own gradient never does.
* The gradients of min and max, unused (the ranges are assigned, not
  learned), are dead code XLA removes; the mask is elementwise work XLA
  fuses with the ops around it (a ReLU's own gradient before it included:
  the fused-ReLU gradient of the one-pass form is not needed).

Values: where TensorFlow's kernels run either form, both are TensorFlow's
FakeQuant input gradient.
"""
import tensorflow as tf


def fake_quant_input_grad(op: tf.Operation, grad: tf.Tensor) -> tf.Tensor:
    """TensorFlow's gradient of FakeQuant `op`'s input, for `grad`.

    Args:
      op: a FakeQuantWithMinMaxVars or FakeQuantWithMinMaxVarsPerChannel op.
      grad: the gradient of its output.

    Returns:
      `grad` where the input lies in the op's nudged range, 0 elsewhere.
    """
    kernel = (tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient
              if op.type == "FakeQuantWithMinMaxVarsPerChannel"
              else tf.raw_ops.FakeQuantWithMinMaxVarsGradient)
    return kernel(gradients=grad, inputs=op.inputs[0], min=op.inputs[1], max=op.inputs[2],
                  num_bits=op.get_attr("num_bits"),
                  narrow_range=op.get_attr("narrow_range")).backprops_wrt_input


def delayed_quant_grad(active: tf.Tensor, fake_quant: tf.Operation,
                       grad: tf.Tensor) -> tf.Tensor:
    """The input gradient of `Select(active, fake_quant(x), x)`, all of it to x.

    Before the delay `grad`, after it the FakeQuant's input gradient. As in
    the one-pass form (a mask over (-inf, inf) before the delay), a NaN
    input gets 0.

    Args:
      active: the scalar condition: quantization has started.
      fake_quant: the FakeQuant op; its input is x.
      grad: the gradient of the Select's output.

    Returns:
      The gradient of x.
    """
    inputs = fake_quant.inputs[0]
    passed = tf.where(active, fake_quant_input_grad(fake_quant, grad), grad)
    return tf.where(tf.math.is_nan(inputs), tf.zeros([], grad.dtype), passed)
