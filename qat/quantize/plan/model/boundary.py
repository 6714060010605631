"""The model/loss boundary: which ops are the model's, decided once per graph.

Why this module exists: a training graph computes more from the model's
outputs than its export graph does (the loss, metrics), and a planner rule
that reads an op's readers can reach across: a constant added to the logits
in an MSE loss looked like a bias the converter folds, and the logits' range
moved into the loss (issue #33). A quantizer on loss arithmetic changes the
gradients QAT trains with and nothing in the integer model corresponds to
it; a model output whose range moved into the loss has none in the export
graph. So the boundary is computed once, here, and every planner rule
respects it (`op in view.model`): nothing outside the model gets a range,
and every model output keeps its own, in training, eval and export graphs
alike.

The model (`GraphView.model`) is

* the layers, their tails and what computes their data inputs, from the
  model sources on (`GraphView.model_ops`; `qat.quantize.plan.model.feeds`);
* after the last layers, ops that carry a model tensor on as the model does
  whatever reads them (`STEP`): activations, fixed-range ops, same-scale
  ops, batch norms, reductions that keep the batch axis (a global pool),
  whole activations, dropout, arithmetic with a model parameter (a bias or
  scale variable, a per-channel constant): the model's when their one value
  operand is;
* ops that offset or combine model tensors (`ARITHMETIC`: arithmetic with
  one constant value, `x - 1`, `x / T`, `x * 3 + 0.5`, `max(x, 0)`; adds,
  products, concatenations of several model tensors): the model's only where
  a model op reads their result, or an Identity does. An Identity names an
  output, so `tf.identity(logits * 10, name="pred")` makes the multiply the
  model's in every graph, while `logits * 10` that only the loss (or
  nothing) reads is not the model's in any.

Nothing else is: ops reading a tensor the model does not compute (labels,
targets, a teacher's outputs), ops without an integer TFLite kernel
(Square, Exp, Log, ...), scalars and loss kernels. The loss
(`GraphView.loss`) is the data ops outside the model whose results reach
only scalars and loss kernels: no range, no warning. Ops outside both read
the model's outputs where something other than the loss reads their result
(`predictions = logits * 3 + 0.5` in an export graph): they stay float after
the model's last range, and the planner names them in `left_float`
(docs/known_limits.md). Observers (`GraphView.observers`,
`qat.quantize.plan.model.observers`: summaries, prints, asserts, metric updates and
what only they read) are neither: no range, no `left_float` entry.
"""
import dataclasses
from typing import Dict, List, Optional, Set

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import function_graphs
from qat.engine import marks
from qat.matching import tensors
from qat.quantize.plan.model import feeds
from qat.quantize.plan.model import observers as observers_lib
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ops import patterns as qp

STEP = "step"
ARITHMETIC = "arithmetic"

# Ops that only move or copy values (reshape, squeeze, slices, pads,
# transposes): the model's only where a model op (or an Identity) reads them;
# a loss reshapes and slices the logits too.
LAYOUT_TYPES = frozenset([
    "Reshape", "Squeeze", "ExpandDims", "Transpose", "StridedSlice", "Slice",
    "GatherV2", "Split", "SplitV", "Unpack", "Tile", "Pad", "PadV2", "MirrorPad",
    "StopGradient", "PreventGradient", "ReverseV2"])
# Ops that carry their one value operand on as the model does.
STEP_TYPES = (op_table.ACTIVATION_TYPES | op_table.FUSABLE_ACTIVATION_TYPES
              | op_table.FIXED_RANGE_TYPES | op_table.SAME_SCALE_TYPES
              | qp.BATCH_NORM_TYPES) - LAYOUT_TYPES
# Reductions: a step when they keep the batch axis and a rank (a global pool).
REDUCTION_TYPES = frozenset(["Mean", "Sum", "Max", "Min", "Prod"])
# Element-wise arithmetic with a second operand: with a model parameter a
# step (a bias, a scale), with one constant value arithmetic.
OPERAND_TYPES = frozenset(["Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "BiasAdd",
                           "Maximum", "Minimum", "SquaredDifference"])
# What the model may compute after its layers: TFLite's integer ops.
INTEGER_TYPES = op_table.OWN_RANGE_TYPES | frozenset(["RealDiv", "Div"])
# Steps that make what they read the model's: an Identity names an output;
# activations, fixed-range ops and batch norms are what models compute (a
# model ending in `sigmoid(x + skip)` ends there, whatever reads it).
ANCHOR_TYPES = (frozenset(["Identity"]) | op_table.ACTIVATION_TYPES
                | op_table.FUSABLE_ACTIVATION_TYPES | op_table.FIXED_RANGE_TYPES
                | qp.BATCH_NORM_TYPES)
# Where loss arithmetic ends: loss kernels (and scalars).
LOSS_KERNEL_TYPES = qp.LOSS_KERNEL_TYPES


@dataclasses.dataclass
class Kind:
    """How an op after the layers belongs to the model."""
    kind: str                   # STEP or ARITHMETIC
    operands: List[tf.Tensor]   # the value operands it takes from the model
    any_operand: bool = False   # a step when any operand is the model's (qat's own ops)
    anchor: bool = False        # makes what it reads the model's


# Ops whose output is one value repeated whatever their input holds.
UNIFORM_TYPES = frozenset(["OnesLike", "ZerosLike"])


def _uniform_constant(t: tf.Tensor) -> bool:
    """A constant whose elements are all one value (a scalar, `ones_like(x)`)."""
    for _ in range(8):
        if t.op.type in UNIFORM_TYPES:
            return True
        if t.op.type in ("Identity", "Cast", "Fill") and t.op.inputs:
            t = t.op.inputs[-1]  # Fill(dims, value): its value.
            continue
        break
    try:
        value = tensor_util.constant_value(t)
    except (TypeError, ValueError):
        return False
    if value is None:
        return False
    value = np.ravel(np.asarray(value))
    return value.size > 0 and bool(np.all(value == value[0]))


def _keeps_batch(op: tf.Operation) -> bool:
    """A reduction to rank >= 1 over known axes other than the batch axis."""
    if not op.outputs or op.outputs[0].shape.rank in (None, 0) or len(op.inputs) < 2:
        return False
    rank = op.inputs[0].shape.rank
    try:
        axes = tensor_util.constant_value(op.inputs[1])
    except (TypeError, ValueError):
        return False
    if axes is None or rank is None:
        return False
    return 0 not in {int(a) % rank for a in np.ravel(axes)}


def has_integer_kernel(op: tf.Operation) -> bool:
    """Whether TFLite could run `op` in integer (qat's op table)."""
    return op.type in INTEGER_TYPES or op.type in STEP_TYPES or op.type in LAYOUT_TYPES


def is_root(op: tf.Operation) -> bool:
    """Where loss arithmetic ends: a loss kernel, or an op with scalar outputs only."""
    return op.type in LOSS_KERNEL_TYPES or bool(
        op.outputs and all(o.shape.rank == 0 for o in op.outputs))


def kind_of(view, op: tf.Operation, tail_ops: Set[tf.Operation],
            whole_activations: Dict[tf.Operation, tf.Tensor],
            looked_through: Dict[tf.Operation, tf.Tensor]) -> Optional[Kind]:
    """How `op` (a data op after the layers) may belong to the model, or None.

    Args:
      view: the `GraphView` (its parameter test and data path).
      op: a data op outside `view.model_ops`.
      tail_ops: the layers' tails.
      whole_activations: output op of an activation written as several ops -> its input.
      looked_through: dropout ops -> the tensor they read.
    """
    if (qp.is_state_update(op) or op.type in qp.METADATA_TYPES or is_root(op)
            or not any(tensors.is_float(o) for o in op.outputs)):
        return None
    if marks.made_by_qat(op, marks.QUANTIZER, marks.QUANTIZER_OUTPUT):
        return Kind(STEP, [i for i in op.inputs if view.is_data(i)], any_operand=True)
    if op.type in tensors.FAKE_QUANT_TYPES or op.type == "FakeQuantWithMinMaxArgs":
        return Kind(STEP, [op.inputs[0]])
    if op in whole_activations:
        return Kind(STEP, [whole_activations[op]], anchor=True)
    if op in looked_through:
        return Kind(STEP, [looked_through[op]])
    operands = feeds.value_operands(op, 0, view.params)
    if op in tail_ops:
        if _constant_arithmetic(op, operands) and not any(
                c in tail_ops for out in op.outputs for c in out.consumers()):
            return Kind(ARITHMETIC, operands)  # A constant after the layer: `logits + 1`.
        return Kind(STEP, operands, any_operand=True)
    if not operands:
        return None
    if op.type in REDUCTION_TYPES:
        if _keeps_batch(op):
            return Kind(STEP, operands)
        return Kind(ARITHMETIC, operands) if op.type in INTEGER_TYPES else None
    if op.type in LAYOUT_TYPES:
        return Kind(ARITHMETIC, operands)
    if op.type in STEP_TYPES:
        return Kind(STEP, operands, anchor=op.type in ANCHOR_TYPES)
    if op.type in OPERAND_TYPES and len(operands) == 1 and len(op.inputs) == 2:
        other = [t for t in op.inputs if t is not operands[0]]
        if other and feeds.per_example(other[0], operands[0]):
            return None  # Constant labels: values the model does not compute.
        if not other or _constant_arithmetic(op, operands):
            return Kind(ARITHMETIC, operands)  # x * x, x - 1.
        return Kind(STEP, operands, anchor=True)  # With a model parameter: a bias, a scale.
    if op.type in INTEGER_TYPES:
        return Kind(ARITHMETIC, operands)
    return None


def _constant_arithmetic(op: tf.Operation, operands: List[tf.Tensor]) -> bool:
    """`x op c` with one value operand and a constant of one value."""
    if op.type not in OPERAND_TYPES or len(operands) != 1:
        return False
    others = [t for t in op.inputs if t is not operands[0]]
    return len(others) == 1 and _uniform_constant(others[0])


def find_boundary(view, tail_ops: Set[tf.Operation],
                  whole_activations: Dict[tf.Operation, tf.Tensor],
                  interiors: Dict[tf.Operation, Set[tf.Operation]],
                  looked_through: Dict[tf.Operation, tf.Tensor]) -> None:
    """Sets `view.model`, `view.loss` and `view.after_model` (see above).

    Args:
      view: the `GraphView` (a planner's `view`).
      tail_ops: the layers' tails (walked without the boundary).
      whole_activations: output op of an activation written as several ops -> its input.
      interiors: output op of such an activation -> the ops inside it.
      looked_through: dropout ops -> the tensor they read.
    """
    model: Set[tf.Operation] = set(view.model_ops)
    ordered = sorted(view.data_ops - view.gradient_ops, key=lambda o: o._id)  # pylint: disable=protected-access
    view.observers = observers_lib.find_observers(
        op for op in ordered if op not in model and op not in tail_ops
        and not marks.made_by_qat(op, marks.QUANTIZER, marks.QUANTIZER_OUTPUT))
    kinds: Dict[tf.Operation, Kind] = {}
    for op in ordered:
        if op in view.observers and observers_lib.is_check(op):
            continue  # A check nothing but observers reads names no output.
        if op not in model:
            found = kind_of(view, op, tail_ops, whole_activations, looked_through)
            if found is not None:
                kinds[op] = found

    def holds(k: Kind, members: Set[tf.Operation]) -> bool:
        inside = [t.op in members for t in k.operands]
        return bool(inside) and (any(inside) if k.any_operand else all(inside))

    # The ops that may be the model's: every operand may be.
    loose = set(model)
    changed = True
    while changed:
        changed = False
        for op, k in kinds.items():
            if op not in loose and holds(k, loose):
                loose.add(op)
                changed = True

    def add_with_ancestors(op: tf.Operation) -> None:
        stack = [op]
        while stack:
            top = stack.pop()
            if top in model:
                continue
            model.add(top)
            model.update(interiors.get(top, ()))
            k = kinds.get(top)
            if k is not None:
                stack.extend(t.op for t in k.operands if t.op in loose)

    changed = True
    while changed:
        changed = False
        for op in ordered:
            k = kinds.get(op)
            if k is None or op in model or op not in loose:
                continue
            if k.anchor or holds(k, model) and k.kind == STEP:
                add_with_ancestors(op)
                changed = True
    view.model = model
    _split_rest(view, ordered, model)


def _split_rest(view, ordered: List[tf.Operation], model: Set[tf.Operation]) -> None:
    """The data ops outside the model: the loss, and what is after the model."""
    rest = [op for op in ordered if op not in model
            and not marks.made_by_qat(op, marks.QUANTIZER, marks.QUANTIZER_OUTPUT)
            and not marks.is_replaced(op) and not qp.is_state_update(op)
            and op.type not in qp.METADATA_TYPES]
    rest_set = set(rest)
    ends = []
    returned = function_graphs.traced_outputs(view.graph)
    for op in rest:
        if is_root(op) or op in view.observers:
            continue
        if returned is not None and op not in returned:
            continue  # In a traced function, an unread op that is no output is dead.
        for out in op.outputs:
            if (tensors.is_float(out) and out.shape.rank != 0
                    and not [c for c in out.consumers() if c.type not in qp.METADATA_TYPES]):
                ends.append(op)
                break
    after: Set[tf.Operation] = set()
    stack = list(ends)
    while stack:
        op = stack.pop()
        if op in after:
            continue
        after.add(op)
        stack.extend(i.op for i in op.inputs if i.op in rest_set and view.is_data(i)
                     and tensors.is_float(i) and i.op not in view.observers)
    view.after_model = after
    view.loss = rest_set - after
