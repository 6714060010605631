"""Dropout in its spellings: training-only ops the planner looks through.

Dropout exists in training graphs only: the eval and export graphs read the
value it drops from directly. So its ops get no range and are looked through
like a same-scale op (`Planner.looked_through`), and training and eval graphs
plan, and name, the same ranges. Two structures, declared as patterns:

* DROPOUT, `Select(random >= rate, x * scale, 0)` (tf.nn.dropout, with or
  without a noise shape; Keras and slim dropout call it).
* A random mask multiply, `x * mask`: `mask` a 0/1 value drawn at random
  (`RANDOM_MASK`: `floor(keep + random)`, `random < keep` and the other
  comparisons, either cast to float), maybe scaled (`mask / keep`,
  `mask * (1 / keep)`), per element (TF 1's tf.nn.dropout) or per example
  (drop path: NASNet-A's, tf_keras ConvNeXt's StochasticDepth). One scale
  multiply or divide of x by a value that is not data may come before or
  after it (`x / keep * mask`, `x * mask / keep`).

A mask is drawn: it is computed from a random draw (within a few ops) and
never reads x (but for x's shape). A scale is not data either: a value of
one element that does not read x (a constant, or a keep probability computed
from the global step as NASNet-A's is).

`dropout_ops(op)` returns, for an op of one of them, each of its ops and the
tensor that op reads in place of its output.
"""
from typing import Dict, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.matching.matcher import GraphMatcher, OneofPattern, OpTypePattern
from qat.quantize.plan.ops import op_table

DROPOUT = OpTypePattern("Select|SelectV2", name="dropout", inputs=[
    OpTypePattern("GreaterEqual", name="keep_mask", inputs=["*", "*"]),
    OpTypePattern("Mul|RealDiv", name="dropout_scale",
                  inputs=[OpTypePattern("*", name="dropout_input"), "*"]),
    "*"])

# Where a draw becomes 0/1: floor(keep + uniform), uniform < keep, ...
_MASK_CORE = "Floor|Less|LessEqual|Greater|GreaterEqual"
RANDOM_MASK = OneofPattern([
    OpTypePattern(_MASK_CORE, name="mask_core"),
    OpTypePattern("Cast", inputs=[OpTypePattern(_MASK_CORE, name="mask_core")]),
])
# A mask divided or multiplied by its keep probability.
SCALED_MASK = OneofPattern([
    OpTypePattern("RealDiv", inputs=[RANDOM_MASK, OpTypePattern("*", name="mask_scale")]),
    OpTypePattern("Mul", inputs=[RANDOM_MASK, OpTypePattern("*", name="mask_scale")],
                  ordered_inputs=False),
])
# x * mask, x * scaled mask.
MASK_MULTIPLY = OpTypePattern("Mul", name="mask_multiply", inputs=[
    OneofPattern([RANDOM_MASK, SCALED_MASK], name="mask"),
    OpTypePattern("*", name="data")], ordered_inputs=False)
# x * scale, x / scale: the scale of a mask multiply, before or after it.
SCALE_MULTIPLY_TYPES = frozenset(["Mul", "RealDiv"])

_DROPOUT_MATCHER = GraphMatcher(DROPOUT)
_MASK_MATCHER = GraphMatcher(MASK_MULTIPLY)

# Ops whose output depends on their input's shape only (a mask's shape).
_SHAPE_TYPES = frozenset(["Shape", "ShapeN", "Size", "Rank"])
# How far back a mask or a scale is searched for a read of x.
_ANCESTOR_LIMIT = 256


def _depends_on_random(t: tf.Tensor, depth: int = 6) -> bool:
    frontier = [t.op]
    for _ in range(depth):
        nxt = []
        for op in frontier:
            if op.type.startswith(op_table.RANDOM_PREFIXES):
                return True
            nxt.extend(i.op for i in op.inputs)
        frontier = nxt
    return False


def _reads(t: tf.Tensor, x: tf.Tensor) -> bool:
    """Whether `t` is computed from x's value (its shape aside); True when unsure."""
    seen, stack = set(), [t.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        if op is x.op or len(seen) >= _ANCESTOR_LIMIT:
            return True
        seen.add(op)
        if op.type not in _SHAPE_TYPES:
            stack.extend(i.op for i in op.inputs)
    return False


def _is_scale(t: tf.Tensor, x: tf.Tensor) -> bool:
    """A value of one element, not data (a keep probability or its inverse)."""
    shape = t.shape
    return (shape.is_fully_defined() and shape.num_elements() == 1
            and not _depends_on_random(t) and not _reads(t, x))


def _single_reader(t: tf.Tensor) -> Optional[tf.Operation]:
    readers = t.consumers()
    return readers[0] if len(readers) == 1 else None


def _keep(match) -> Optional[tf.Tensor]:
    """The mask's threshold: `keep` of floor(keep + random), of random < keep."""
    core = match.get_op("mask_core")
    operands = core.inputs
    if core.type == "Floor":
        add = core.inputs[0].op
        if add.type not in ("Add", "AddV2") or len(add.inputs) != 2:
            return None
        operands = add.inputs
    fixed = [t for t in operands if not _depends_on_random(t)]
    return fixed[0] if len(fixed) == 1 else None


def _scales_by_keep(scale: tf.Tensor, keep: Optional[tf.Tensor]) -> bool:
    """Whether `scale` is the mask's keep probability or its inverse: the
    threshold itself or computed from it (NASNet-A's scheduled keep, a keep
    placeholder), or a constant of keep, 1 / keep, 1 - keep (a drop rate's
    threshold) or its inverse. A scale of another value (hard-swish's 1/6
    before a drop path) is not the dropout's."""
    if keep is None:
        return False
    if scale is keep or _reads(scale, keep):
        return True
    a, b = tensor_util.constant_value(scale), tensor_util.constant_value(keep)
    if a is None or b is None or np.size(a) != 1 or np.size(b) != 1:
        return False
    a, b = float(np.reshape(a, [])), float(np.reshape(b, []))
    candidates = [b, 1.0 - b]
    candidates += [1.0 / k for k in candidates if k]
    return any(abs(a - k) <= 1e-6 * max(1.0, abs(k)) for k in candidates)


def _mask_multiply(op: tf.Operation):
    """(the x of `x * mask` at `op`, whether the mask is scaled, the mask's
    keep threshold), else None."""
    match = _MASK_MATCHER.match_op(op)
    if match is None:
        return None
    x = match.get_tensor("data")
    if not _depends_on_random(match.get_tensor("mask_core")):
        return None
    if _reads(match.get_tensor("mask"), x):
        return None
    keep = _keep(match)
    scale = match.get_tensor("mask_scale")
    if scale is not None and not (_is_scale(scale, x) and _scales_by_keep(scale, keep)):
        return None
    return x, scale is not None, keep


def _scale_multiply(op: tf.Operation, keep: Optional[tf.Tensor] = None) -> Optional[tf.Tensor]:
    """The x of `x * scale` or `x / scale` at `op` (a scale by `keep`, if given), else None."""
    if op.type not in SCALE_MULTIPLY_TYPES or len(op.inputs) != 2:
        return None
    a, b = op.inputs
    by_keep = lambda t: keep is None or _scales_by_keep(t, keep)
    if _is_scale(b, a) and by_keep(b):
        return a
    if op.type == "Mul" and _is_scale(a, b) and by_keep(a):
        return b
    return None


def _drop_path_ops(op: tf.Operation) -> Optional[Dict[tf.Operation, tf.Tensor]]:
    """The mask multiply `op` is or is next to, with its scale multiply.

    The scale multiply, before or after the mask multiply, is the dropout's
    only where the mask is not scaled already and it scales by the mask's
    keep probability (`_scales_by_keep`): an activation's own constant
    multiply before a drop path (hard-swish's 1/6) stays the model's.
    """
    if op.type not in SCALE_MULTIPLY_TYPES:
        return None
    candidates = [op, _single_reader(op.outputs[0])]
    candidates += [i.op for i in op.inputs]
    for mul in candidates:
        if mul is None or mul.type != "Mul":
            continue
        found_mask = _mask_multiply(mul)
        if found_mask is None:
            continue
        x, scaled, keep = found_mask
        found = {mul: x}
        after = _single_reader(mul.outputs[0])
        if scaled:
            pass  # A scaled mask is the whole dropout.
        elif _single_reader(x) is mul and _scale_multiply(x.op, keep) is not None:
            found[x.op] = _scale_multiply(x.op, keep)  # x / keep * mask.
        elif after is not None and _scale_multiply(after, keep) is mul.outputs[0]:
            found[after] = mul.outputs[0]  # x * mask / keep.
        if op in found:
            return found
    return None


def dropout_ops(op: tf.Operation) -> Optional[Dict[tf.Operation, tf.Tensor]]:
    """The dropout `op` belongs to: each of its ops -> the tensor it reads, or None.

    The end op reads the op before it (or x); the first op reads x.
    """
    for end in [op] + list(op.outputs[0].consumers() if op.outputs else []):
        if end.type not in ("Select", "SelectV2"):
            continue
        match = _DROPOUT_MATCHER.match_op(end)
        if match is None or not _depends_on_random(match.get_tensor("keep_mask")):
            continue
        scale = match.get_op("dropout_scale")
        if _single_reader(scale.outputs[0]) is not end or op not in (end, scale):
            continue
        return {end: scale.outputs[0], scale: match.get_tensor("dropout_input")}
    return _drop_path_ops(op)
