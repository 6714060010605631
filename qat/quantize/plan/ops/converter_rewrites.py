"""Rewrites TensorFlow's TFLite converter makes to quantized graphs, as data.

Why this module exists: every range the eval graph has must be a tensor of
the converted model with exactly that scale and zero point (range survival,
`qat.export.range_survival`). The converter decides which tensors exist from
static shapes and constants as well as op types: where it removes an op, the
range qat put on that op's output has no TFLite tensor, and the next layer
reads values on its input's grid instead. So such an op gets no range of its
own: the planner treats it as a same-scale op (`RangeReader.same_scale`), whose
output has its input's range, exactly as the converter computes it.

What TF 2.21's converter (`TFLiteConverter.from_session`, uint8 and int8)
removes, each measured with distinct ranges on every quantizer:

* Arithmetic with a neutral constant: `x + 0`, `x - 0`, `x * 1`, `x / 1`
  (tf_keras `Rescaling` without an offset adds a scalar 0): the op is
  folded away with its range. A constant that is not neutral keeps its
  MUL / ADD (a `Rescaling` with an offset, a normalisation by constants):
  those keep their ranges.
* Reductions over axes whose size is statically 1 (a global average pool or
  squeeze-excite mean over a 1x1 map): the MEAN / SUM becomes a reshape, or
  a requantize when nothing else reads its input; either way the output has
  no range of its own unless the planner requantizes.
* Pools whose window is 1x1 with stride 1: the output is the input.

TFLite runs REDUCE_MAX / REDUCE_MIN (a global max pool written with
`tf.reduce_max`) in its input's scale: same-scale ops
(`is_extremum_reduction`). A constant added to a layer's output, when the
add is its sole reader (MobileNetV3's hard sigmoid `relu6(conv + 3) / 6`), is
folded into the layer's bias and a RELU / RELU6 after it fused: the layer's
range goes after them (`folded_bias_add`).

And what it rewrites into an op that needs a range: a division by a
constant (`(x - mean) / std` normalisation) becomes a MUL by the constant's
reciprocal, an own-range op (`is_constant_division`).

A select of a value and a constant, `where(mask, x, c)` (Keras 3's masked
softmax fills the masked scores with a large negative number): TFLite's
SELECT_V2 runs in x's scale, with c rounded (so clamped) to x's grid: a
same-scale op (`is_constant_select`), whose output gets a FakeQuant reading
x's range so the eval graph rounds c as TFLite does.

Clamps by a constant written with `tf.maximum` / `tf.minimum`
(`qat.quantize.plan.ops.clamps`): `Maximum(x, 0)` is a RELU, fused like one; other
clamps run in their input's scale (same-scale ops).

Where a shape or a constant is not known statically (a dynamic spatial size,
axes computed at run time) the op is assumed to be kept: it keeps its own
range, as the planner has always done.
"""
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.quantize.plan.ops import clamps

# Element-wise ops the converter removes when the constant operand is
# neutral: op type -> (neutral value, whether the constant may be operand 0).
_NEUTRAL = {
    "Add": (0.0, True), "AddV2": (0.0, True), "Sub": (0.0, False),
    "Mul": (1.0, True), "RealDiv": (1.0, False), "Div": (1.0, False),
}
_REDUCTIONS = frozenset(["Mean", "Sum", "Max", "Min", "Prod"])
_POOLS = frozenset(["AvgPool", "MaxPool"])


def _constant(t: tf.Tensor) -> Optional[np.ndarray]:
    try:
        value = tensor_util.constant_value(t)
    except (TypeError, ValueError):
        return None
    return None if value is None else np.asarray(value)


def _one_data_input(op: tf.Operation, is_data: Callable[[tf.Tensor], bool]):
    """(index of the one data input, the other input's constant value) or None."""
    if len(op.inputs) != 2:
        return None
    data = [k for k, t in enumerate(op.inputs) if is_data(t)]
    if len(data) != 1:
        return None
    value = _constant(op.inputs[1 - data[0]])
    if value is None:
        return None
    return data[0], value


def is_neutral_arithmetic(op: tf.Operation, is_data) -> bool:
    """`x + 0`, `x - 0`, `x * 1`, `x / 1` with a constant: removed."""
    if op.type not in _NEUTRAL:
        return False
    found = _one_data_input(op, is_data)
    if found is None:
        return False
    index, value = found
    neutral, either_side = _NEUTRAL[op.type]
    if index == 1 and not either_side:
        return False
    return (value.size > 0 and bool(np.all(value == neutral))
            and _broadcasts_into(value.shape, op.inputs[index].shape))


def _broadcasts_into(constant_shape, x_shape: tf.TensorShape) -> bool:
    """Whether a constant of `constant_shape` broadcasts without growing x.

    Each constant dimension must be 1 or x's static size there (an unknown
    batch is fine where the constant has 1 or no dimension).
    """
    if x_shape.rank is None or len(constant_shape) > x_shape.rank:
        return False
    dims = x_shape.as_list()[x_shape.rank - len(constant_shape):]
    return all(c == 1 or c == d for c, d in zip(constant_shape, dims))


# What a parameter expression may read: constants and variables.
_PARAMETER_SOURCES = frozenset(["Const", "ReadVariableOp", "VariableV2", "VarHandleOp"])
_MAX_PARAMETER_DEPTH = 8


def is_parameter_expression(t: tf.Tensor, depth: int = 0) -> bool:
    """A tensor computed from constants and variables only (no input, no
    random op): a constant once the graph is frozen, which the converter
    folds (Keras 3 `Normalization` divides by `maximum(sqrt(variance), eps)`)."""
    op = t.op
    if op.type in _PARAMETER_SOURCES:
        return True
    if op.type == "Placeholder":
        return t.dtype == tf.resource  # A function's captured variable handle.
    if (depth >= _MAX_PARAMETER_DEPTH or not op.inputs or op.type.startswith(
            ("Random", "StatelessRandom"))):
        return False
    return all(is_parameter_expression(i, depth + 1) for i in op.inputs)


def is_constant_division(op: tf.Operation, is_data) -> bool:
    """`x / c` with a constant divisor, or one computed from constants and
    variables (`is_parameter_expression`): the converter makes it MUL by 1/c."""
    if op.type not in ("RealDiv", "Div"):
        return False
    found = _one_data_input(op, is_data)
    if found is not None:
        return found[0] == 0 and _broadcasts_into(found[1].shape, op.inputs[0].shape)
    x, c = op.inputs
    return (is_data(x) and not is_data(c) and c.shape.is_fully_defined()
            and is_parameter_expression(c) and _broadcasts_into(c.shape.as_list(), x.shape))


def is_size_one_reduction(op: tf.Operation) -> bool:
    """A reduction over axes of static size 1 only: its output is its input."""
    if op.type not in _REDUCTIONS or len(op.inputs) != 2:
        return False
    x = op.inputs[0]
    axes = _constant(op.inputs[1])
    rank = x.shape.rank
    if axes is None or rank is None:
        return False
    dims = x.shape.as_list()
    axes = [int(a) % rank for a in np.ravel(axes)]
    return bool(axes) and all(dims[a] == 1 for a in axes)


# Same-scale ops the converter does not carry its input's scale through: left
# float unless a FakeQuant states its output's scale (measured with a
# bidirectional layer's REVERSE_V2 of its quantized input).
UNPROPAGATED_TYPES = frozenset(["ReverseV2"])


def needs_stated_scale(op: tf.Operation) -> bool:
    """A same-scale op the converter keeps in float without a FakeQuant on its
    output holding its input's range (`UNPROPAGATED_TYPES`)."""
    return op.type in UNPROPAGATED_TYPES


def is_identity_pool(op: tf.Operation) -> bool:
    """A pool with a 1x1 window and stride 1, or one that maps 1x1 to 1x1."""
    if op.type not in _POOLS:
        return False
    ksize, strides = op.get_attr("ksize"), op.get_attr("strides")
    if all(k == 1 for k in ksize) and all(s == 1 for s in strides):
        return True
    # The batch axis aside: a feed with a static batch (a queue's dequeue) and
    # a placeholder with none give one answer.
    x, out = op.inputs[0].shape, op.outputs[0].shape
    if x.rank != 4 or out.rank != 4:
        return False
    x, out = x[1:], out[1:]
    if not x.is_fully_defined() or not out.is_fully_defined():
        return False
    spatial = (1, 2) if op.get_attr("data_format").startswith(b"NC") else (0, 1)
    return x == out and all(x[a] == 1 for a in spatial)


def is_extremum_reduction(op: tf.Operation) -> bool:
    """REDUCE_MAX / REDUCE_MIN (a global max pool): TFLite keeps the input's scale."""
    return op.type in ("Max", "Min") and len(op.inputs) == 2


def folded_bias_add(op: tf.Operation, out: tf.Tensor, is_data) -> bool:
    """`out + c` / `out - c` after a layer: the converter folds c into the bias.

    Args:
      op: the sole reader of a layer's output `out`.
      out: the layer output.
      is_data: whether a tensor is computed from the model's inputs.

    Returns:
      True if `op` adds a constant (scalar or per channel) to `out`.
    """
    if op.type not in ("Add", "AddV2", "Sub") or op.inputs[0] is not out and (
            op.type == "Sub" or op.inputs[1] is not out):
        return False
    found = _one_data_input(op, is_data)
    return found is not None and _broadcasts_into(found[1].shape, out.shape)


SELECT_TYPES = frozenset(["Select", "SelectV2"])


def is_constant_select(op: tf.Operation, is_data) -> bool:
    """`where(mask, x, c)` or `where(mask, c, x)` with one constant value c."""
    if op.type not in SELECT_TYPES or len(op.inputs) != 3:
        return False
    values = op.inputs[1:]
    data = [k for k, t in enumerate(values) if is_data(t)]
    if len(data) != 1 or not values[data[0]].dtype.is_floating:
        return False
    c = _constant(values[1 - data[0]])
    return c is not None and c.size > 0 and bool(np.all(c == np.ravel(c)[0]))


# Ops that never reach the converted model: the converter connects their
# readers to their input (IdentityN: output k to input k).
_REMOVED_TYPES = frozenset(["Identity", "IdentityN", "StopGradient", "PreventGradient",
                            "Snapshot"])


def removed_input(t: tf.Tensor, is_data: Callable[[tf.Tensor], bool]) -> Optional[tf.Tensor]:
    """The tensor TFLite reads in `t`'s place where the converter removes `t.op`.

    Args:
      t: an output of an op on the data path.
      is_data: whether a tensor is computed from the model's inputs.

    Returns:
      The data input the converter connects `t`'s readers to: an Identity's
      (`tf.identity(x, name="depthwise_output")`), a neutral `x + 0` / `x * 1`'s,
      a 1x1 stride-1 pool's. None where the op is kept (a max pool, a
      reshape: same-scale ops that are TFLite ops of their own).
    """
    op = t.op
    if op.type in _REMOVED_TYPES:
        index = t.value_index if op.type == "IdentityN" else 0
    elif is_neutral_arithmetic(op, is_data):
        index = _one_data_input(op, is_data)[0]
    elif is_identity_pool(op) and all(k == 1 for k in op.get_attr("ksize")):
        index = 0
    else:
        return None
    if index >= len(op.inputs) or not is_data(op.inputs[index]):
        return None
    return op.inputs[index]


def removed_or_same_scale(op: tf.Operation,
                          is_data: Callable[[tf.Tensor], bool]) -> bool:
    """Whether the converter removes `op` or runs it in its input's scale.

    Args:
      op: an op on the data path.
      is_data: whether a tensor is computed from the model's inputs.

    Returns:
      True if `op`'s output must share its data input's range (no own range).
    """
    return (is_neutral_arithmetic(op, is_data) or is_size_one_reduction(op)
            or is_identity_pool(op) or is_extremum_reduction(op)
            or clamps.is_same_scale_clamp(op, is_data) or is_constant_select(op, is_data))
