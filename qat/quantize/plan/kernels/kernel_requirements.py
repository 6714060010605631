"""Where each kernel precondition applies: the plans it constrains and reads.

`find_requirements(planner)` walks a planned graph and returns one
`Requirement` per op whose TFLite kernel has a precondition in
`qat.quantize.plan.kernels.kernel_preconditions.PRECONDITIONS`:

* HARD_SWISH (a multi-op activation of `activation_patterns`): its output
  range, relative to its input's range;
* ADD (an Add / AddV2 / BiasAdd with a range of its own, not a layer's bias
  add): its output range (after the RELU / RELU6 TFLite fuses into it),
  relative to its inputs' ranges;
* SQUARED_DIFFERENCE: its output range, relative to its inputs' ranges;
* a layer's int32 bias: the layer's input range, relative to its weight
  range and its bias as the converter computes it (`layer_bias.LayerBias`: the bias
  adds of its tail, a folded batch norm's offset from its moving statistics,
  the constant adds the converter folds into the bias);
* a layer's bias scale: the layer's output range (after a fused
  activation), relative to its input and weight ranges.

A range is a `Plan` of this call, or the FakeQuant op of a range built
before (a second call, a user's FakeQuant, a frozen eval graph). `attach`
puts each requirement on the plan owning the constrained range's variables
(shared ranges, concatenation groups and replicas, apply it once, at the
owner) with its ranges resolved to their owners too; the emitter
(`qat.quantize.emit.range_updates`) enforces it where the range is learnt.
`qat.export.kernel_checks` evaluates the same requirements on a frozen graph.
"""
import dataclasses
from typing import Dict, List, Optional, Tuple, Union

import tensorflow as tf

from qat.matching import layer_patterns
from qat.matching import tensors
from qat.quantize.plan.kernels import kernel_preconditions as kp
from qat.quantize.plan.kernels import layer_bias as layer_bias_lib
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.ops import activation_patterns
from qat.quantize.plan.ops import patterns as qp

# A range: a plan of this call (`qat.quantize.plan.Plan`) or a FakeQuant op.
RangeSource = Union["object", tf.Operation]

FAKE_QUANT_TYPES = tensors.FAKE_QUANT_TYPES | {"FakeQuantWithMinMaxArgs"}
# Between a quantizer's output and its FakeQuant (delay, casts, reshapes).
_QUANTIZER_PATH = frozenset(["Select", "SelectV2", "Cast", "Reshape", "Identity"])


@dataclasses.dataclass
class Requirement:
    """One precondition as it applies to one op.

    Attributes:
      precondition: the table entry.
      op: the TF op TFLite runs the kernel for (the layer, the ADD, ...).
      constrained: the range the precondition bounds.
      ranges: RATIO / SQUARE: the ranges it is relative to.
      weights: BIAS: the layer's weight range.
      bias: BIAS: the layer's bias.
      lagged: read `ranges` / `weights` as they were before this step's update
        (set by `attach` where reading the updated ones would be a cycle).
    """
    precondition: kp.Precondition
    op: tf.Operation
    constrained: RangeSource
    ranges: Tuple[RangeSource, ...] = ()
    weights: Optional[RangeSource] = None
    bias: Optional[layer_bias_lib.LayerBias] = None
    lagged: bool = False

    def sources(self) -> List[RangeSource]:
        """The ranges the bound is computed from."""
        return list(self.ranges) + ([self.weights] if self.weights is not None else [])


def fake_quant_op(t: tf.Tensor) -> Optional[tf.Operation]:
    """The FakeQuant op behind a quantizer's output `t` (delay, casts), or None."""
    op = t.op
    for _ in range(6):
        if op.type in FAKE_QUANT_TYPES:
            return op
        if op.type not in _QUANTIZER_PATH or not op.inputs:
            return None
        # A delayed quantizer's Select(active, quantized, raw): the quantized one.
        op = op.inputs[1].op if op.type in ("Select", "SelectV2") else op.inputs[0].op
    return None


def _range_at(planner, t: tf.Tensor) -> Optional[RangeSource]:
    """The range `t` itself has (no walk back): its plan or its FakeQuant."""
    plan = planner.book.plans.get(t)
    if plan is not None:
        return plan
    if plan_graph.is_quantized_output(t):
        return fake_quant_op(t)
    out, _ = plan_graph.existing_quantizer(t)
    return fake_quant_op(out) if out is not None else None


def _range_of(planner, t: tf.Tensor) -> Optional[RangeSource]:
    """The range TFLite reads `t` with (back through same-scale ops)."""
    return _range_at(planner, planner.reader.source(t))


def _fused_activation(planner, out: tf.Tensor) -> Optional[tf.Operation]:
    """The activation TFLite fuses into the op writing `out` (one, or the first
    of identical ones the converter keeps as one, which share its range)."""
    readers = planner.reader.final_readers(out)
    if readers and all(r in planner.book.fused for r in readers):
        return readers[0]
    return None


def _output_range(planner, op: tf.Operation) -> Optional[RangeSource]:
    """The range of `op`'s output, after the activation TFLite fuses into it."""
    out = op.outputs[0]
    found = _range_at(planner, out)
    if found is not None:
        return found
    act = _fused_activation(planner, out)
    return _range_at(planner, act.outputs[0]) if act is not None else None


def _layer_output_range(planner, layer: tf.Operation) -> Optional[RangeSource]:
    """The range of the tensor TFLite's layer op writes (after a fused activation)."""
    out = layer_bias_lib.layer_output(planner, layer)
    if out is None:
        return None
    tail = planner.layout.tails[layer]
    for _ in range(10):
        found = _range_at(planner, out)
        if found is not None:
            return found
        act = _fused_activation(planner, out)
        if act is not None:
            return _range_at(planner, act.outputs[0])
        if out.op.type != "Identity" or out.op not in tail or out.op is layer:
            return None
        out = out.op.inputs[0]  # An Identity ending the tail reads the range before it.
    return None


def _input_ranges(planner, op: tf.Operation) -> Tuple[RangeSource, ...]:
    """The ranges of `op`'s inputs that have one (data, or quantized parameters)."""
    found = []
    for t in op.inputs:
        if not plan_graph.is_float(t):
            continue
        r = _range_of(planner, t) if planner.view.is_data(t) else _range_at(planner, t)
        if r is not None and not any(r is f for f in found):
            found.append(r)
    return tuple(found)


def find_requirements(planner) -> List[Requirement]:
    """Every precondition of `PRECONDITIONS` where it applies in `planner`'s graph.

    Args:
      planner: a `qat.quantize.plan.Planner` after `run()`.

    Returns:
      The requirements, in graph order; `constrained` and the ranges are
      plans of `planner` or FakeQuant ops already in the graph.
    """
    found: List[Requirement] = []

    def add(precondition, op, constrained, **kwargs):
        if constrained is not None and not (
                isinstance(constrained, tf.Operation) and constrained.type not in FAKE_QUANT_TYPES):
            found.append(Requirement(precondition, op, constrained, **kwargs))

    view, layout = planner.view, planner.layout
    skip = layout.tail_ops | layout.interior | planner.book.fused | set(layout.looked_through)
    for op in sorted(view.data_ops, key=lambda o: o._id):  # pylint: disable=protected-access
        if op in view.loss or not planner.settings.in_scope(op):
            continue
        if op in layout.whole_activations:
            match = activation_patterns.match_whole_activation(op)
            if match is not None and match[0].tflite_op == "HARD_SWISH":
                x = _range_of(planner, layout.whole_activations[op])
                if x is not None:
                    add(kp.HARD_SWISH, op, _output_range(planner, op), ranges=(x,))
        elif op in layout.tails:
            weights = _weight_range(planner, op)
            x = _range_of(planner, qp.data_input(op))
            bias = layer_bias_lib.layer_bias(planner, op)
            if weights is not None and bias is not None:
                add(kp.LAYER_BIAS, op, x, weights=weights, bias=bias)
            if weights is not None and x is not None:
                add(kp.BIAS_SCALE, op, _layer_output_range(planner, op), ranges=(x,),
                    weights=weights)
        elif op in skip or planner.reader.same_scale(op):
            continue
        elif op.type in kp.ADD.applies_to + kp.SQUARED_DIFFERENCE.applies_to:
            inputs = _input_ranges(planner, op)
            if inputs:
                precondition = kp.ADD if op.type in kp.ADD.applies_to else kp.SQUARED_DIFFERENCE
                add(precondition, op, _output_range(planner, op), ranges=inputs)
    return found


def _weight_range(planner, layer: tf.Operation) -> Optional[RangeSource]:
    w = layer_patterns.weight_input(layer)
    if plan_graph.is_quantized_output(w):
        return fake_quant_op(w)
    plan = planner.book.plans.get(w)
    if plan is None:
        key = w.op.inputs[0] if w.op.type == "ReadVariableOp" else w
        plan = planner.book.weight_plans.get(key)
    if plan is None:
        out, _ = plan_graph.existing_quantizer(w)
        return fake_quant_op(out) if out is not None else None
    return plan


# --- On the plans -----------------------------------------------------------


def _owner(source: RangeSource):
    """The plan owning a plan's variables (itself, or the one it shares); an op as it is."""
    if isinstance(source, tf.Operation):
        return source
    for _ in range(10000):
        if source.shared is None:
            break
        source = source.shared
    return source


def attach(planner, plans: List) -> None:
    """Puts every requirement on the plan owning the constrained range.

    A shared range (a concatenation's group, replicas, a pool's rounding)
    gets its members' requirements once, at its owner, with the ranges they
    read resolved to their owners. Ranges this call does not learn (a
    FakeQuant already in the graph, a fixed grid, an earlier call's range it
    only reads, weights) are not constrained. Identical requirements are
    kept once. Training replicas (`Plan.replica_of`, an earlier call's range
    this call's replica moves) each get their own, on the range their
    forward reads; the shared range's update applies its owner's.

    Args:
      planner: the `Planner` after `run()`.
      plans: its plans (after replication).
    """
    seen = set()
    for req in find_requirements(planner):
        owner = _owner(req.constrained)
        if (isinstance(owner, tf.Operation) or owner.fixed is not None or owner.is_weight
                or (owner.earlier is not None and owner.earlier_join is None)):
            continue
        ranges = []
        for source in (_owner(s) for s in req.ranges):
            if source is not owner and not any(source is r for r in ranges):
                ranges.append(source)
        weights = _owner(req.weights) if req.weights is not None else None
        if req.precondition.form in (kp.RATIO, kp.SQUARE) and not ranges:
            continue
        key = (req.precondition.name, id(owner), tuple(id(r) for r in ranges), id(weights),
               tuple(id(t) for t in req.bias.tensors()) if req.bias is not None else ())
        if key in seen:
            continue
        seen.add(key)
        owner.requirements.append(dataclasses.replace(
            req, constrained=owner, ranges=tuple(ranges), weights=weights))
    _lag_cycles(planner, plans)


def _lag_cycles(planner, plans: List) -> None:
    """Marks `lagged` the requirements whose updated ranges would form a cycle.

    A requirement makes its owner's range update read the updated ranges it
    depends on. Those are computed from tensors upstream of the op (its
    inputs, its weights), so no cycle arises, except where a range also
    learns from other tensors (a concatenation's group, replicas) one of
    which is computed from the owner's quantized value. There the update
    reads the ranges as they were before this step's update (one step
    behind; the margin covers it).
    """
    readers: Dict[int, List] = {}
    for plan in plans:
        if plan.shared is not None and not plan.before_update:
            readers.setdefault(id(_owner(plan)), []).append(plan)
    grouped: Dict[int, bool] = {}  # id(plan) -> its bounds reach a range with members.

    def reaches_members(plan) -> bool:
        key = id(plan)
        if key not in grouped:
            grouped[key] = bool(plan.members)
            grouped[key] = bool(plan.members) or any(
                reaches_members(s) for req in plan.requirements if not req.lagged
                for s in req.sources() if not isinstance(s, tf.Operation))
        return grouped[key]

    order = _topological_positions(planner.view.data_ops)
    latest: Dict[int, int] = {}  # id(plan) -> the latest position its bounds learn from.

    def latest_statistics(plan) -> int:
        key = id(plan)
        if key not in latest:
            latest[key] = -1
            found = [order.get(t.op, -1) for t in [plan.tensor] + list(plan.members)]
            found += [latest_statistics(s) for req in plan.requirements if not req.lagged
                      for s in req.sources() if not isinstance(s, tf.Operation)]
            latest[key] = max(found)
        return latest[key]

    for plan in plans:
        starts, down = None, None
        for k, req in enumerate(plan.requirements):
            sources = [s for s in req.sources() if not isinstance(s, tf.Operation)]
            if (not plan.members and id(plan) not in readers
                    and not any(reaches_members(s) for s in sources)):
                continue  # Every range in reach learns from tensors upstream of the op.
            if starts is None:
                starts = [plan.tensor.op] + [p.tensor.op for p in readers.get(id(plan), [])]
                first = min(order.get(op, -1) for op in starts)
            # Only an op after the first start (in a topological order) can depend on it.
            if max((latest_statistics(s) for s in sources), default=-1) <= first:
                continue
            late = [t.op for r in _reach(req) for t in [r.tensor] + list(r.members)
                    if order.get(t.op, -1) > first]
            if down is None:
                down = layer_bias_lib.within(starts, planner.view.data_ops, forward=True)
            if any(op in down for op in late):
                plan.requirements[k] = dataclasses.replace(req, lagged=True)


def _topological_positions(ops) -> Dict[tf.Operation, int]:
    """Each op's position in a topological order of `ops` (inputs first)."""
    pending = {op: sum(1 for t in op.inputs if t.op in ops) for op in ops}
    ready = [op for op, n in pending.items() if n == 0]
    order: Dict[tf.Operation, int] = {}
    while ready:
        op = ready.pop()
        order[op] = len(order)
        for out in op.outputs:
            for c in out.consumers():
                if c in pending:
                    pending[c] -= 1
                    if pending[c] == 0:
                        ready.append(c)
    return order


def _reach(req: Requirement) -> List:
    """The plans whose updated ranges `req`'s bound reads, directly or through theirs."""
    reach, seen, stack = [], set(), [req]
    while stack:
        for source in stack.pop().sources():
            if not isinstance(source, tf.Operation) and id(source) not in seen:
                seen.add(id(source))
                reach.append(source)
                stack.extend(r for r in source.requirements if not r.lagged)
    return reach


