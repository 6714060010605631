"""Replicas' range statistics combined once per training step (a mixin of `QuantizerBatch`).

Why this module exists: data-parallel replicas (a strategy's replicas or
workers, TF1 towers and clones) share one range per tensor, updated each
step with the min of the replicas' batch mins and the max of their batch
maxes. Combined range by range, every layer of every replica waited for
every other replica's statistics of that layer, and a strategy ran two
collectives per range and step.

What a training step computes where a range is `QuantizerSpec.combined`:

1. Forward: each replica's FakeQuant reads the range moved one step by its
   own replica's batch statistics, from the variables' value before the
   step (`RangeUpdates._range_step`, nothing assigned): the range one device
   training on that replica's batch would read. No replica waits for another.
2. Statistics: each device packs the batch min and max of every range into
   one float32 vector (the mins, then the negated maxes; per channel for
   per-channel ranges; +inf where it has no statistics of a range, NaN
   made -inf so that a non-finite batch stays non-finite everywhere).
3. Combination: the devices' vectors meet in one elementwise Minimum (one
   graph) at the join, an Identity marked `range_statistics` listing its
   ranges; then one all-reduce with merge op Min (`QuantizerSpec.all_reduce`:
   across workers, or the replicas of a TF 2 strategy). Its result is the
   same on every replica: the min of the mins and the max of the maxes.
4. Update: each range's step from the combined statistics (the same
   arithmetic; kernel floors read the other ranges' combined steps),
   assigned to its variables. A NoOp groups the assignments: the outputs of
   the quantizers whose values no range's statistics read wait for it
   (`QuantizerSpec.gated`), so a graph-mode run that computes the model's
   output updates every range once (a `tf.function` runs every assignment).

A later call that quantizes another replica (the rewrite called inside the
replica function) packs its statistics in the layout the join lists and
joins them there: one more Minimum.
"""
import collections
import dataclasses
from typing import Dict, List, NamedTuple, Optional, Sequence, Set

from absl import logging
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from qat.engine import marks

_FLOAT = tf.float32
_INT32 = tf.int32
# The join's attributes: the ranges it combines, in order (their variables'
# scope), and each one's channels (0: a per-tensor range, one scalar).
RANGES_ATTR = "_qat_ranges"
CHANNELS_ATTR = "_qat_channels"


class _Owner(NamedTuple):
    """The quantizer of this batch that owns a range's variables."""
    spec: object    # Its QuantizerSpec.
    prefix: str
    min_var: str
    max_var: str
    step: object    # The quantization step.
    index: int      # Its quantizer index.


@dataclasses.dataclass
class _Range:
    """One range's statistics of this batch, and its owner here, if any."""
    name: str       # Its variables' scope.
    channels: int   # 0: a per-tensor range.
    # (device, batch min or None, batch max) of each quantizer reading it.
    statistics: List[tuple] = dataclasses.field(default_factory=list)
    owner: Optional[_Owner] = None
    join: Optional[tf.Operation] = None  # An earlier call's join.


def _parts(ranges: Sequence[_Range]) -> List[List[int]]:
    """The ranges in each part of a packed vector: per-tensor mins, per-tensor
    maxes (negated), per-channel mins, per-channel maxes (negated)."""
    scalar = [k for k, r in enumerate(ranges) if not r.channels]
    vector = [k for k, r in enumerate(ranges) if r.channels]
    return [scalar, scalar, vector, vector]


def _floored(spec) -> bool:
    """Whether kernel floors widen the range after its moving average (as
    `RangeUpdates._range_step` applies them)."""
    return bool(spec.floors) and spec.moving_average and not spec.per_channel


def _group_key(spec) -> tuple:
    """Per-tensor ranges whose step one set of vector ops takes: the same settings."""
    return (spec.moving_average, spec.symmetric, spec.num_bits, bool(spec.narrow_range),
            float(spec.ema_decay), spec.init_from_first_batch, _floored(spec))


class StepStatistics(object):
    """Mixin of `qat.quantize.emit.quantizer_batch.QuantizerBatch` (uses its NodeDef helpers)."""

    def _init_step_statistics(self) -> None:
        self._step_ranges: "collections.OrderedDict[tuple, _Range]" = collections.OrderedDict()
        self._update_group: Optional[str] = None
        # Reads of variables before this step's update that are not this
        # batch's own: {variable: an earlier call's tensor, or a node}.
        self._reads: Dict[str, object] = {}
        # What kernel floors read of quantizer i: its range as its FakeQuant
        # reads it; in the combined update, as combined.
        self._range_view = self._ranges

    def _before_update(self, variable: str) -> str:
        """The read of `variable` before this step's update."""
        found = self._reads.get(variable)
        if isinstance(found, tf.Tensor):
            return self._external(found)
        if found is not None:
            return found
        return self._variables_emitter.before_update(variable, self._variable_device)

    def update_group(self) -> str:
        """The NoOp that runs this batch's combined range updates (a name reserved now)."""
        if self._update_group is None:
            self._update_group = self._nodes.unique_name("quant_range_update")
        return self._update_group

    def _contribute(self, spec, p, batch_min, batch_max, min_var, max_var, step) -> None:
        """Records a quantizer's batch statistics for the combined update."""
        channels = 0
        if spec.per_channel:
            channels = int((spec.channel_reshape or spec.inputs.shape.as_list())[-1])
        key = (min_var, max_var)
        found = self._step_ranges.get(key)
        if found is None:
            found = self._step_ranges[key] = _Range(min_var.rsplit("/", 1)[0], channels,
                                                    join=spec.earlier_join)
        found.statistics.append((self._device, batch_min, batch_max))
        if spec.replica_of is None and spec.earlier_join is None:
            found.owner = _Owner(spec, p, min_var, max_var, step, len(self._ranges))

    # --- After the forward: pack, combine, update ------------------------------

    def _combine_step_statistics(self) -> None:
        """Builds steps 2-4 of the module docstring for every recorded range."""
        recorded, self._step_ranges = list(self._step_ranges.values()), collections.OrderedDict()
        joins: "collections.OrderedDict[tf.Operation, List[_Range]]" = collections.OrderedDict()
        for r in recorded:
            if r.join is not None:
                joins.setdefault(r.join, []).append(r)
        for join, ranges in joins.items():
            self._join_earlier(join, ranges)
        own = [r for r in recorded if r.join is None]
        if not own:
            return
        # Per-tensor ranges of one group side by side (one set of ops updates them).
        keys = {}
        for r in own:
            if not r.channels:
                keys.setdefault(_group_key(r.owner.spec), len(keys))
        own.sort(key=lambda r: (bool(r.channels), keys.get(_group_key(r.owner.spec), 0)
                                if not r.channels else 0))
        scope = self._nodes.unique_name("quant_range_statistics")
        packs = self._packs(scope, own)
        device = packs[0][0]
        attrs = {marks.ATTR: marks.RANGE_STATISTICS,
                 RANGES_ATTR: attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                     s=[r.name.encode() for r in own])),
                 CHANNELS_ATTR: [r.channels for r in own]}
        join = self._nodes.node(scope + "/join", "Identity", [self._minimum(packs, device)],
                                device=device, T=_FLOAT, **attrs)
        all_reduce = own[0].owner.spec.all_reduce
        if all_reduce is not None:  # One collective: across workers, or a strategy's replicas.
            join = all_reduce.emit(self._nodes, scope + "/all_reduce", join, "Min")
        self._device = device
        self._update_combined(scope + "/combined", own, join)

    def _packs(self, scope: str, ranges: Sequence[_Range]):
        """[(device, the device's packed vector)], devices in order of appearance."""
        by_device: "collections.OrderedDict[str, Dict[int, tuple]]" = collections.OrderedDict()
        for k, r in enumerate(ranges):
            for device, lo, hi in r.statistics:
                here = by_device.setdefault(device, {})
                if k in here:  # Two quantizers of one device read the range.
                    old_lo, old_hi = here[k]
                    self._device = device
                    if lo is not None and old_lo is not None:
                        lo = self._node(self._nodes.unique_name(scope + "/local_min"),
                                        "Minimum", [old_lo, lo], T=_FLOAT)
                    lo = lo if lo is not None else old_lo
                    hi = self._node(self._nodes.unique_name(scope + "/local_max"), "Maximum",
                                    [old_hi, hi], T=_FLOAT)
                here[k] = (lo, hi)
        packs = []
        for device, found in by_device.items():
            self._device = device
            q = self._nodes.unique_name(scope + "/pack")
            pieces = []
            for part, members in enumerate(_parts(ranges)):
                if not members:
                    continue
                side = part % 2
                values = [self._statistic(found.get(k), side, ranges[k]) for k in members]
                if part < 2:
                    piece = self._node("%s/part_%d" % (q, part), "Pack", values, T=_FLOAT,
                                       N=len(values), axis=0)
                else:
                    piece = self._concat("%s/part_%d" % (q, part), values)
                if side:
                    piece = self._node("%s/part_%d/negated" % (q, part), "Neg", [piece], T=_FLOAT)
                pieces.append(piece)
            packed = self._concat(q + "/concat", pieces)
            # NaN -> -inf: the min-reduce then keeps a non-finite batch
            # non-finite, whatever the order it meets the others in.
            nan = self._node(q + "/IsNan", "IsNan", [packed], T=_FLOAT)
            minus_inf = self._shared_const("minus_inf", -np.inf, tf.float32)
            packs.append((device, self._node(q + "/finite_or_minus_inf", "SelectV2",
                                             [nan, minus_inf, packed], T=_FLOAT)))
        return packs

    def _statistic(self, found, side: int, r: _Range) -> str:
        """A device's min (side 0) or max (side 1) of a range, or the neutral value
        (+inf for a min: a range of nonnegative values, min(+inf, 0) = 0)."""
        value = None if found is None else found[side]
        if value is not None:
            return value
        fill = np.inf if side == 0 else -np.inf
        shape = [r.channels] if r.channels else []
        return self._shared_const("neutral_statistic", np.full(shape, fill, np.float32),
                                  tf.float32)

    def _concat(self, name: str, values: List[str]) -> str:
        if len(values) == 1:
            return values[0]
        axis = self._shared_const("concat_axis", 0, tf.int32)
        return self._node(name, "ConcatV2", list(values) + [axis], T=_FLOAT, N=len(values),
                          Tidx=_INT32)

    def _split(self, name: str, value: str, sizes: Sequence[int]) -> List[str]:
        """`value` split along its axis into pieces of `sizes`."""
        if len(sizes) == 1:
            return [value]
        split = self._node(name, "SplitV",
                           [value, self._const(name + "/sizes", list(sizes), tf.int32),
                            self._shared_const("concat_axis", 0, tf.int32)],
                           T=_FLOAT, Tlen=_INT32, num_split=len(sizes))
        return ["%s:%d" % (split, k) for k in range(len(sizes))]

    def _minimum(self, packs, device: str) -> str:
        """The elementwise Minimum of the devices' vectors (on `device`)."""
        combined = packs[0][1]
        for _, packed in packs[1:]:
            combined = self._node(self._nodes.unique_name(packed.rsplit("/", 1)[0] + "/join"),
                                  "Minimum", [combined, packed], device=device, T=_FLOAT)
        return combined

    def _update_combined(self, q: str, ranges: Sequence[_Range], combined: str) -> None:
        """Each owned range's step from the combined statistics, assigned; the group.

        Per-tensor ranges of one group (`_group_key`) take their moving-average
        (or last-value) step as vectors: the same elementwise ops as one
        range's, so the same values. Kernel floors, which read other ranges'
        steps, then widen the floored ones one by one in the order they were
        added (`RangeUpdates._floored_ema`'s arithmetic); per-channel ranges
        take their step one by one.
        """
        parts = _parts(ranges)
        sizes = [sum(max(ranges[k].channels, 1) for k in members) for members in parts]
        present = [k for k, n in enumerate(sizes) if n]
        pieces = dict(zip(present, self._split(q + "/parts", combined,
                                               [sizes[k] for k in present])))
        for part in (1, 3):
            if part in pieces:
                pieces[part] = self._node("%s/part_%d/max" % (q, part), "Neg", [pieces[part]],
                                          T=_FLOAT)
        steps = {}    # range position -> (min, max) after its step
        floored = []  # (range position, min, max) before the floors
        if parts[0]:
            groups: "collections.OrderedDict[tuple, List[int]]" = collections.OrderedDict()
            for k in parts[0]:
                groups.setdefault(_group_key(ranges[k].owner.spec), []).append(k)
            sides = [self._split("%s/part_%d/groups" % (q, part), pieces[part],
                                 [len(m) for m in groups.values()]) for part in (0, 1)]
            for g, members in enumerate(groups.values()):
                lo, hi = self._group_step("%s/group_%d" % (q, g), [ranges[k] for k in members],
                                          sides[0][g], sides[1][g])
                for i, k in enumerate(members):
                    if _floored(ranges[k].owner.spec):
                        floored.append((k, lo[i], hi[i]))
                    else:
                        steps[k] = (lo[i], hi[i])
        if parts[2]:
            sizes = [ranges[k].channels for k in parts[2]]
            lows = self._split(q + "/part_2/ranges", pieces[2], sizes)
            highs = self._split(q + "/part_3/ranges", pieces[3], sizes)
            for k, lo, hi in zip(parts[2], lows, highs):
                spec, p, min_var, max_var, step, _ = ranges[k].owner
                self._device, self._variable_device = spec.device, spec.variable_device
                steps[k] = self._range_step(spec, p + "/combined", lo, hi, min_var, max_var,
                                            step, assign=False)
        self._range_view = list(self._ranges)
        try:
            for k, (lo, hi) in steps.items():
                self._range_view[ranges[k].owner.index] = (lo, hi)
            for k, lo, hi in sorted(floored, key=lambda e: ranges[e[0]].owner.index):
                spec, p, _, _, _, index = ranges[k].owner
                self._device, self._variable_device = spec.device, spec.variable_device
                need = self._floor_need(spec, p + "/combined")
                if need is not None and not spec.symmetric:
                    hi = self._widen_top(p + "/combined/KernelFloor", lo, hi, need)
                elif need is not None:
                    lo, hi = self._widen_about_zero(p + "/combined/KernelFloor", lo, hi, need)
                steps[k] = self._range_view[index] = (lo, hi)
        finally:
            self._range_view = self._ranges
        updates = []
        for k, (lo, hi) in steps.items():
            spec, p, min_var, max_var, _, _ = ranges[k].owner
            self._device, self._variable_device = spec.device, spec.variable_device
            for side, var, value in (("Min", min_var, lo), ("Max", max_var, hi)):
                updates += self._variables_emitter.assign_ops(
                    "%s/combined/Assign%s" % (p, side), var, value,
                    device=self._variable_device)
        self._nodes.node(self.update_group(), "NoOp", control=updates)

    def _unstack(self, name: str, value: str, n: int) -> List[str]:
        out = self._node(name, "Unpack", [value], T=_FLOAT, num=n, axis=0)
        return ["%s:%d" % (out, i) for i in range(n)]

    def _group_step(self, q: str, members: Sequence[_Range], lo: str, hi: str):
        """The step of per-tensor ranges of one group, as vectors; each one's (min, max)."""
        spec, _, _, _, step, _ = members[0].owner
        spec = dataclasses.replace(spec, per_channel=False, floors=())
        self._device, self._variable_device = spec.device, spec.variable_device
        # The variables before the step, side by side: what `_before_update` reads
        # of the group's variables (a moving average's; unused, a last value's).
        reads = []
        for side in ("min", "max"):
            name = "%s/%s" % (q, side)
            variables = [getattr(r.owner, side + "_var") for r in members]
            self._reads[name] = self._node(name, "Pack", [self._before_update(v) for v in variables],
                                           T=_FLOAT, N=len(members), axis=0)
            reads.append(name)
        lo, hi = self._range_step(spec, q, lo, hi, reads[0], reads[1], step, assign=False)
        return (self._unstack(q + "/min_each", lo, len(members)),
                self._unstack(q + "/max_each", hi, len(members)))

    def _join_earlier(self, join: tf.Operation, ranges: Sequence[_Range]) -> None:
        """Packs statistics of an earlier call's ranges in its join's layout and joins them."""
        laid_out = [_Range(n.decode(), int(c)) for n, c in zip(
            join.get_attr(RANGES_ATTR), join.get_attr(CHANNELS_ATTR))]
        position = {r.name: k for k, r in enumerate(laid_out)}
        for r in ranges:
            k = position.get(r.name)
            if k is None or r.channels != laid_out[k].channels:
                logging.warning("qat: the statistics of '%s' do not fit the ranges '%s' "
                                "combines; this replica's batch does not join them",
                                r.name, join.name)
                continue
            laid_out[k].statistics.extend(r.statistics)
        scope = self._nodes.unique_name(join.name.rsplit("/", 1)[0] + "/replica")
        packs = self._packs(scope, laid_out)
        if not packs:
            return
        current = self._minimum([(join.device, self._external(join.inputs[0]))] + packs,
                                join.device)
        self._rewrite.reroute(join, 0, current)


def gated_plans(plans: Sequence, combined: Sequence[bool]) -> Set[int]:
    """Positions of the plans whose quantized values no combined range's statistics read.

    Their quantizers' outputs may wait for the combined update without a
    cycle; one of them is the model's output.

    Args:
      plans: the quantize pass's plans (`qat.quantize.plan.Plan`).
      combined: for each plan, whether its range is combined after the forward.
    """
    starts = [t.op for plan, c in zip(plans, combined) if c
              for t in [plan.tensor] + list(plan.members)]
    upstream: Set[tf.Operation] = set()
    stack = list(starts)
    while stack:
        op = stack.pop()
        if op in upstream:
            continue
        upstream.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return {k for k, plan in enumerate(plans)
            if not any(c in upstream for c in list(plan.consumers) + list(plan.weight_sharers))}
