"""What the ops mean: TFLite's requirements, and the op forms the rules recognise.

  op_table            -> TFLite's integer op requirements, as data
  patterns            -> op types the planner walks through (tails, losses,
                         metadata, gradient kernels)
  activation_patterns -> activations written as several ops (hard-swish, GELU)
  dropout_patterns    -> dropout and drop path: training-only, looked through
  clamps              -> clamps by a constant (`tf.maximum(x, 0)` is a RELU)
  converter_rewrites  -> ops the TFLite converter removes or runs in their
                         input's scale

Each answers about an op and its operands; the room imports no other room of
the plan (`qat.quantize.plan`).
"""
