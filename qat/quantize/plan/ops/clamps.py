"""Clamps written with `tf.maximum` / `tf.minimum` and a constant, as data.

TFLite's MAXIMUM and MINIMUM kernels run in one scale: inputs and output
share it. What TF 2.21's converter (`TFLiteConverter.from_session`, uint8 and
int8, every quantizer given a distinct range) makes of a clamp by a constant:

* `Maximum(x, 0)` is a RELU. Where it is the sole reader of a layer's
  (or an ADD's) output, the converter fuses it into that op, exactly as a
  `tf.nn.relu`: the layer's range goes after it. Elsewhere it is a RELU op
  with a range of its own.
* `Minimum(x, c)`, and `Maximum(x, c)` with c other than 0, stay MINIMUM /
  MAXIMUM in their input's scale; where the clamp is the sole reader of the
  op before it, the converter merges the requantize into that op (the conv
  before `tf.minimum(tf.maximum(conv, 0), 6)` writes the MINIMUM's scale).
  So such a clamp is a same-scale op: no range of its own, its input's. Its
  output gets a FakeQuant reading that range (`<ctx>/identity_quant`, no
  variables): TFLite clamps to the constant rounded to the grid, the eval
  graph then does too.

A clamp `minimum(maximum(x, 0), 6)` is therefore one range, after the
RELU (the layer's), shared by the MINIMUM; the converter did not make it a
RELU6 in any measured case. A MAXIMUM or MINIMUM of two activations is not a
clamp: an own-range op, as before (docs/known_limits.md).

`CLAMPS` declares what each form is: op type and constant -> what the
converter makes of it.
"""
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

# (op type, constant or None for any other constant) -> TFLite's op.
RELU = "RELU"
SAME_SCALE = "SAME_SCALE"
CLAMPS = {
    ("Maximum", 0.0): RELU,
    ("Maximum", None): SAME_SCALE,
    ("Minimum", None): SAME_SCALE,
}


def _bound(op: tf.Operation, is_data: Callable[[tf.Tensor], bool]) -> Optional[float]:
    """The constant of a clamp `op(x, c)` (one data input, c one value), or None."""
    if op.type not in ("Maximum", "Minimum") or len(op.inputs) != 2:
        return None
    data = [k for k, t in enumerate(op.inputs) if is_data(t)]
    if len(data) != 1:
        return None
    c = op.inputs[1 - data[0]]
    try:
        value = tensor_util.constant_value(c)
    except (TypeError, ValueError):
        return None
    if value is None:
        return None
    value = np.ravel(np.asarray(value, np.float64))
    x = op.inputs[data[0]]
    # The output must have x's shape: a constant that broadcasts x bigger is
    # not a clamp of x.
    if value.size == 0 or not np.all(value == value[0]) or not (
            x.shape.is_compatible_with(op.outputs[0].shape)
            and (x.shape.rank is None or c.shape.rank is None or c.shape.rank <= x.shape.rank)):
        return None
    return float(value[0])


def converted_as(op: tf.Operation, is_data: Callable[[tf.Tensor], bool]) -> Optional[str]:
    """What the converter makes of a clamp by a constant.

    Args:
      op: any op of the data path.
      is_data: whether a tensor is computed from the model's inputs.

    Returns:
      `RELU`, `SAME_SCALE`, or None when `op` is not such a clamp.
    """
    bound = _bound(op, is_data)
    if bound is None:
        return None
    return CLAMPS.get((op.type, bound), CLAMPS.get((op.type, None)))


def is_relu(op: tf.Operation, is_data) -> bool:
    """`Maximum(x, 0)`: a RELU (fused into the layer it alone reads)."""
    return converted_as(op, is_data) == RELU


def is_same_scale_clamp(op: tf.Operation, is_data) -> bool:
    """`Minimum(x, c)`, `Maximum(x, c != 0)`: MINIMUM / MAXIMUM in x's scale."""
    return converted_as(op, is_data) == SAME_SCALE
