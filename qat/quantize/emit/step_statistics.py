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
   made -inf so that a non-finite batch stays non-finite everywhere;
   `qat.quantize.emit.statistics_packs`).
3. Combination: the devices' vectors meet in one elementwise Minimum (one
   graph) at the join, an Identity marked `range_statistics` listing its
   ranges; then one all-reduce with merge op Min (`QuantizerSpec.all_reduce`:
   across workers, or the replicas of a TF 2 strategy). Its result is the
   same on every replica: the min of the mins and the max of the maxes.
4. Update: each range's step from the combined statistics (the same
   arithmetic; kernel floors read the other ranges' combined steps),
   assigned to its variables where it is finite, else the batch counted
   (`qat.quantize.emit.finite_ranges`): every replica decides alike. A NoOp
   groups the assignments: the outputs of the quantizers whose values no
   range's statistics read wait for it (`QuantizerSpec.gated`), so a
   graph-mode run that computes the model's output updates every range once
   (a `tf.function` runs every assignment).

A later call that quantizes another replica (the rewrite called inside the
replica function) packs its statistics in the layout the join lists and
joins them there: one more Minimum.
"""
import collections
import dataclasses
from typing import Dict, List, NamedTuple, Optional, Sequence

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from qat.engine import marks
from qat.quantize.emit import statistics_packs

_FLOAT = tf.float32
_INT32 = tf.int32


class _Owner(NamedTuple):
    """The quantizer of this batch that owns a range's variables."""
    spec: object    # Its QuantizerSpec.
    prefix: str
    min_var: str
    max_var: str
    step: object    # The quantization step.
    index: int      # Its quantizer index.
    counter: str    # Its skipped-batch counter (`qat.quantize.emit.finite_ranges`).


def _floored(spec) -> bool:
    """Whether kernel floors widen the range after its moving average (as
    `RangeUpdates._range_step` applies them)."""
    return bool(spec.floors) and spec.moving_average and not spec.per_channel


def _group_key(spec) -> tuple:
    """Per-tensor ranges whose step one set of vector ops takes: the same settings."""
    return (spec.moving_average, spec.symmetric, spec.num_bits, bool(spec.narrow_range),
            float(spec.ema_decay), spec.init_from_first_batch, _floored(spec))


class StepStatistics(statistics_packs.StatisticsPacks):
    """Mixin of `qat.quantize.emit.quantizer_batch.QuantizerBatch` (uses its NodeDef helpers)."""

    def _init_step_statistics(self) -> None:
        self._step_ranges: "collections.OrderedDict[tuple, statistics_packs.RangeStatistics]" = collections.OrderedDict()
        self._update_group: Optional[str] = None
        self._counters: Dict[int, str] = {}  # Quantizer index -> its range's counter.
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

    def _contribute(self, spec, p, batch_min, batch_max, variables, step, counter) -> None:
        """Records a quantizer's batch statistics for the combined update."""
        min_var, max_var = variables
        channels = 0
        if spec.per_channel:
            channels = int((spec.channel_reshape or spec.inputs.shape.as_list())[-1])
        key = (min_var, max_var)
        found = self._step_ranges.get(key)
        if found is None:
            found = self._step_ranges[key] = statistics_packs.RangeStatistics(min_var.rsplit("/", 1)[0], channels,
                                                    join=spec.earlier_join)
        found.statistics.append((self._device, batch_min, batch_max))
        if spec.replica_of is None and spec.earlier_join is None:
            found.owner = _Owner(spec, p, min_var, max_var, step, len(self._ranges), counter)

    # --- After the forward: pack, combine, update ------------------------------

    def _combine_step_statistics(self) -> None:
        """Builds steps 2-4 of the module docstring for every recorded range."""
        recorded, self._step_ranges = list(self._step_ranges.values()), collections.OrderedDict()
        joins: "collections.OrderedDict[tf.Operation, List[statistics_packs.RangeStatistics]]" = collections.OrderedDict()
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
                 statistics_packs.RANGES_ATTR: attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                     s=[r.name.encode() for r in own])),
                 statistics_packs.CHANNELS_ATTR: [r.channels for r in own]}
        join = self._nodes.node(scope + "/join", "Identity", [self._minimum(packs, device)],
                                device=device, T=_FLOAT, **attrs)
        all_reduce = own[0].owner.spec.all_reduce
        if all_reduce is not None:  # One collective: across workers, or a strategy's replicas.
            join = all_reduce.emit(self._nodes, scope + "/all_reduce", join, "Min")
        self._device = device
        self._update_combined(scope + "/combined", own, join)

    def _update_combined(self, q: str, ranges: Sequence[statistics_packs.RangeStatistics], combined: str) -> None:
        """Each owned range's step from the combined statistics, assigned; the group.

        Per-tensor ranges of one group (`_group_key`) take their moving-average
        (or last-value) step as vectors: the same elementwise ops as one
        range's, so the same values. Kernel floors, which read other ranges'
        steps, then widen the floored ones one by one in the order they were
        added; per-channel ranges take their step one by one. A range whose
        combined batch (or step) is not finite keeps its value and counts the
        batch (`qat.quantize.emit.finite_ranges`), on every replica alike.
        """
        parts = statistics_packs.parts(ranges)
        sizes = [sum(max(ranges[k].channels, 1) for k in members) for members in parts]
        present = [k for k, n in enumerate(sizes) if n]
        pieces = dict(zip(present, self._split(q + "/parts", combined,
                                               [sizes[k] for k in present])))
        for part in (1, 3):
            if part in pieces:
                pieces[part] = self._node("%s/part_%d/max" % (q, part), "Neg", [pieces[part]],
                                          T=_FLOAT)
        steps = {}    # range position -> (min, max, finite) after its step
        floored = []  # (range position, min, max, batch width) before the floors
        if parts[0]:
            groups: "collections.OrderedDict[tuple, List[int]]" = collections.OrderedDict()
            for k in parts[0]:
                groups.setdefault(_group_key(ranges[k].owner.spec), []).append(k)
            sides = [self._split("%s/part_%d/groups" % (q, part), pieces[part],
                                 [len(m) for m in groups.values()]) for part in (0, 1)]
            for g, (key, members) in enumerate(groups.items()):
                found = self._group_step("%s/group_%d" % (q, g), [ranges[k] for k in members],
                                         sides[0][g], sides[1][g], floored=key[-1])
                for k, values in zip(members, found):
                    if key[-1]:
                        floored.append((k,) + values)
                    else:
                        steps[k] = values
        if parts[2]:
            sizes = [ranges[k].channels for k in parts[2]]
            lows = self._split(q + "/part_2/ranges", pieces[2], sizes)
            highs = self._split(q + "/part_3/ranges", pieces[3], sizes)
            for k, lo, hi in zip(parts[2], lows, highs):
                owner = ranges[k].owner
                p = owner.prefix + "/combined"
                self._device, self._variable_device = owner.spec.device, owner.spec.variable_device
                scopes, values, width = self._range_step(
                    owner.spec, p, lo, hi, (owner.min_var, owner.max_var), owner.step,
                    owner.counter)
                finite = self._finite(p, width, True, *values)
                steps[k] = self._kept(scopes, (owner.min_var, owner.max_var), values,
                                      finite) + (finite,)
        self._range_view = list(self._ranges)
        try:
            for k, (lo, hi, _) in steps.items():
                self._range_view[ranges[k].owner.index] = (lo, hi)
            for k, lo, hi, width in sorted(floored, key=lambda e: ranges[e[0]].owner.index):
                owner = ranges[k].owner
                p = owner.prefix + "/combined"
                self._device, self._variable_device = owner.spec.device, owner.spec.variable_device
                need = self._floor_need(owner.spec, p)
                if need is not None and not owner.spec.symmetric:
                    hi = self._widen_top(p + "/KernelFloor", lo, hi, need)
                elif need is not None:
                    lo, hi = self._widen_about_zero(p + "/KernelFloor", lo, hi, need)
                finite = self._finite(p, width, False, lo, hi)
                scopes = (p + "/AssignMinEma", p + "/AssignMaxEma")
                steps[k] = self._kept(scopes, (owner.min_var, owner.max_var), (lo, hi),
                                      finite) + (finite,)
                self._range_view[owner.index] = steps[k][:2]
        finally:
            self._range_view = self._ranges
        updates = []
        for k, (lo, hi, finite) in steps.items():
            owner = ranges[k].owner
            self._device, self._variable_device = owner.spec.device, owner.spec.variable_device
            updates += self._assign_step(owner, lo, hi, finite)
        self._nodes.node(self.update_group(), "NoOp", control=updates)

    def _assign_step(self, owner: _Owner, lo: str, hi: str, finite: str) -> List[str]:
        """Assigns a range its combined step and counts a skipped batch; the update ops."""
        p, emitter, device = owner.prefix + "/combined", self._variables_emitter, self._variable_device
        updates = []
        skip = self._node(p + "/Skipped", "SelectV2",
                          [finite, self._shared_const("zero_count", 0, tf.int64),
                           self._shared_const("one_count", 1, tf.int64)], T=tf.int64)
        updates.append(emitter.assign_add(p + "/CountSkipped", owner.counter, skip,
                                          device=device, return_read=False))
        for side, var, value in (("Min", owner.min_var, lo), ("Max", owner.max_var, hi)):
            updates.append(emitter.assign("%s/Assign%s" % (p, side), var, value, device=device,
                                          return_read=False))
        return updates

    def _group_step(self, q: str, members: Sequence[statistics_packs.RangeStatistics], lo: str, hi: str, floored: bool):
        """The step of per-tensor ranges of one group, as vectors: each one's (min,
        max, finite) kept where finite, or, `floored`, (min, max, batch width)
        before its floors."""
        owner = members[0].owner
        spec = dataclasses.replace(owner.spec, per_channel=False, floors=())
        self._device, self._variable_device = spec.device, spec.variable_device
        # The variables before the step, side by side: what `_before_update` reads
        # of the group's variables.
        reads = []
        for side in ("min", "max"):
            name = "%s/%s" % (q, side)
            variables = [getattr(r.owner, side + "_var") for r in members]
            self._reads[name] = self._node(name, "Pack", [self._before_update(v) for v in variables],
                                           T=_FLOAT, N=len(members), axis=0)
            reads.append(name)
        rate = None
        if spec.moving_average:  # Each range's own rate (its skipped batches).
            rate = self._node(q + "/rates", "Pack", [self._ema_rate(
                float(spec.ema_decay), r.owner.step if spec.init_from_first_batch else None,
                r.owner.prefix, r.owner.counter) for r in members], T=_FLOAT, N=len(members), axis=0)
        scopes, (lo, hi), width = self._range_step(spec, q, lo, hi, tuple(reads), owner.step,
                                                   None, rate=rate)
        n = len(members)
        if floored:
            return list(zip(*[self._unstack("%s/%s_each" % (q, side), v, n)
                              for side, v in (("min", lo), ("max", hi), ("width", width))]))
        finite = self._finite(q, width, False, lo, hi)
        lo, hi = self._kept(scopes, tuple(reads), (lo, hi), finite)
        flags = self._node(q + "/finite_each", "Unpack", [finite], T=tf.bool, num=n, axis=0)
        return list(zip(self._unstack(q + "/min_each", lo, n), self._unstack(q + "/max_each", hi, n),
                        ["%s:%d" % (flags, i) for i in range(n)]))

