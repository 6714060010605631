"""Replicas' range statistics combined once per training step (`StepStatistics`).

Why this module exists: data-parallel replicas (a strategy's replicas or
workers, TF1 towers and clones) share one range per tensor, updated each
step with the min of the replicas' batch mins and the max of their batch
maxes. Combined range by range, every layer of every replica waited for
every other replica's statistics of that layer, and a strategy ran two
collectives per range and step.

What a training step computes where a range is `QuantizerSpec.combined`:

1. Forward: each replica's FakeQuant reads the range moved one step by its
   own replica's batch statistics, from the variables' value before the
   step (`RangeUpdates.step`, nothing assigned): the range one device
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
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from qat.engine import marks
from qat.quantize.emit import statistics_packs as packs_lib
from qat.quantize.emit.finite_ranges import FiniteGuard
from qat.quantize.emit.node_writer import NodeWriter
from qat.quantize.emit.node_writer import PlacedWriter
from qat.quantize.emit.quantizer_spec import QuantizerSpec
from qat.quantize.emit.range_floors import QuantizerRange
from qat.quantize.emit.range_floors import RangeFloors
from qat.quantize.emit.range_floors import RangeView
from qat.quantize.emit.range_updates import RangeUpdates
from qat.quantize.emit.statistics_packs import RangeOwner
from qat.quantize.emit.statistics_packs import RangeStatistics

_FLOAT = tf.float32


class _GroupKey(NamedTuple):
    """Per-tensor ranges whose step one set of vector ops takes: the same settings."""
    moving_average: bool
    symmetric: bool
    num_bits: int
    narrow_range: bool
    ema_decay: float
    init_from_first_batch: bool
    # Kernel floors widen the range after its moving average (as
    # `RangeUpdates.step` applies them): one by one, after the group's step.
    floored: bool


def _group_key(spec: QuantizerSpec) -> _GroupKey:
    return _GroupKey(spec.moving_average, spec.symmetric, spec.num_bits,
                     bool(spec.narrow_range), float(spec.ema_decay), spec.init_from_first_batch,
                     bool(spec.floors) and spec.moving_average and not spec.per_channel)


class _Step(NamedTuple):
    """A range's combined step, kept where not finite, not assigned."""
    lo: str
    hi: str
    finite: str


class _Floored(NamedTuple):
    """A floored range's combined step before its floors."""
    position: int   # The range's position in the combined ranges.
    lo: str
    hi: str
    width: str      # The combined batch range's width.


class StepStatistics:
    """Records replicas' range statistics in the forward and combines them after it.

    Args:
      writer: the batch's node writer.
      updates: computes range steps.
      floors: widens ranges to their kernel floors.
      guard: keeps non-finite steps out of the ranges and counts them.
    """

    def __init__(self, writer: NodeWriter, updates: RangeUpdates, floors: RangeFloors,
                 guard: FiniteGuard):
        self._writer = writer
        self._updates = updates
        self._floors = floors
        self._guard = guard
        self._ranges: "collections.OrderedDict[Tuple[str, str], RangeStatistics]" = (
            collections.OrderedDict())
        self._update_group: Optional[str] = None

    def update_group(self) -> str:
        """The NoOp that runs this batch's combined range updates (a name reserved now)."""
        if self._update_group is None:
            self._update_group = self._writer.nodes.unique_name("quant_range_update")
        return self._update_group

    def contribute(self, spec: QuantizerSpec, prefix: str, device: str,
                   batch_min: Optional[str], batch_max: str, variables: Tuple[str, str],
                   step: Union[tf.Tensor, str, None], counter: str, index: int) -> None:
        """Records a quantizer's batch statistics for the combined update.

        Args:
          spec: the quantizer.
          prefix: its name scope.
          device: where its statistics were computed.
          batch_min: its batch min, None for nonnegative values.
          batch_max: its batch max.
          variables: the (min, max) variables of the range it moves.
          step: the quantization step.
          counter: the range's skipped-batch counter.
          index: its index in the batch.
        """
        min_var, max_var = variables
        channels = 0
        if spec.per_channel:
            channels = int((spec.channel_reshape or spec.inputs.shape.as_list())[-1])
        found = self._ranges.get(variables)
        if found is None:
            found = self._ranges[variables] = RangeStatistics(
                min_var.rsplit("/", 1)[0], channels, join=spec.earlier_join)
        found.statistics.append(packs_lib.DeviceStatistics(device, batch_min, batch_max))
        if spec.replica_of is None and spec.earlier_join is None:
            found.owner = RangeOwner(spec, prefix, min_var, max_var, step, index, counter)

    # --- After the forward: pack, combine, update ------------------------------

    def combine(self, quantizers: Sequence[QuantizerRange]) -> None:
        """Builds steps 2-4 of the module docstring for every recorded range.

        Args:
          quantizers: the batch's ranges, by quantizer index (kernel floors read them).
        """
        recorded, self._ranges = list(self._ranges.values()), collections.OrderedDict()
        joins: "collections.OrderedDict[tf.Operation, List[RangeStatistics]]" = (
            collections.OrderedDict())
        for r in recorded:
            if r.join is not None:
                joins.setdefault(r.join, []).append(r)
        for join, ranges in joins.items():
            packs_lib.join_earlier(self._writer, join, ranges)
        own = [r for r in recorded if r.join is None]
        if not own:
            return
        # Per-tensor ranges of one group side by side (one set of ops updates them).
        keys: Dict[_GroupKey, int] = {}
        for r in own:
            if not r.channels:
                keys.setdefault(_group_key(r.owner.spec), len(keys))
        own.sort(key=lambda r: (bool(r.channels), keys.get(_group_key(r.owner.spec), 0)
                                if not r.channels else 0))
        nodes = self._writer.nodes
        scope = nodes.unique_name("quant_range_statistics")
        packs = packs_lib.packs(self._writer, scope, own)
        device = packs[0].device
        attrs = {marks.ATTR: marks.RANGE_STATISTICS,
                 packs_lib.RANGES_ATTR: attr_value_pb2.AttrValue(
                     list=attr_value_pb2.AttrValue.ListValue(s=[r.name.encode() for r in own])),
                 packs_lib.CHANNELS_ATTR: [r.channels for r in own]}
        join = nodes.node(scope + "/join", "Identity",
                          [packs_lib.minimum(self._writer, packs, device)],
                          device=device, T=_FLOAT, **attrs)
        all_reduce = own[0].owner.spec.all_reduce
        if all_reduce is not None:  # One collective: across workers, or a strategy's replicas.
            join = all_reduce.emit(nodes, scope + "/all_reduce", join, "Min")
        self._update_combined(scope + "/combined", own, join, device, quantizers)

    def _update_combined(self, q: str, ranges: Sequence[RangeStatistics], combined: str,
                         device: str, quantizers: Sequence[QuantizerRange]) -> None:
        """Each owned range's step from the combined statistics (on the join's
        `device`), assigned; the group.

        Per-tensor ranges of one group (`_GroupKey`) take their moving-average
        (or last-value) step as vectors: the same elementwise ops as one
        range's, so the same values. Kernel floors, which read other ranges'
        steps, then widen the floored ones one by one in the order they were
        added; per-channel ranges take their step one by one. A range whose
        combined batch (or step) is not finite keeps its value and counts the
        batch (`qat.quantize.emit.finite_ranges`), on every replica alike.
        """
        writer = self._writer
        at_join = writer.at(device)
        parts = packs_lib.parts(ranges)
        sizes = [sum(max(ranges[k].channels, 1) for k in members) for members in parts]
        present = [k for k, n in enumerate(sizes) if n]
        pieces = dict(zip(present, packs_lib.split(at_join, q + "/parts", combined,
                                                   [sizes[k] for k in present])))
        for part in (1, 3):
            if part in pieces:
                pieces[part] = at_join.node("%s/part_%d/max" % (q, part), "Neg", [pieces[part]],
                                            T=_FLOAT)
        steps: Dict[int, _Step] = {}     # By range position.
        floored: List[_Floored] = []
        # The per-channel parts are split on the device of the last group's step.
        at_parts = at_join
        if parts[0]:
            groups: "collections.OrderedDict[_GroupKey, List[int]]" = collections.OrderedDict()
            for k in parts[0]:
                groups.setdefault(_group_key(ranges[k].owner.spec), []).append(k)
            sides = [packs_lib.split(at_join, "%s/part_%d/groups" % (q, part), pieces[part],
                                     [len(m) for m in groups.values()]) for part in (0, 1)]
            for g, (key, members) in enumerate(groups.items()):
                spec = ranges[members[0]].owner.spec
                at_parts = writer.at(spec.device, spec.variable_device)
                found = self._group_step(at_parts, "%s/group_%d" % (q, g),
                                         [ranges[k] for k in members], sides[0][g], sides[1][g],
                                         floored=key.floored)
                for k, values in zip(members, found):
                    if key.floored:
                        floored.append(_Floored(k, *values))
                    else:
                        steps[k] = _Step(*values)
        if parts[2]:
            sizes = [ranges[k].channels for k in parts[2]]
            lows = packs_lib.split(at_parts, q + "/part_2/ranges", pieces[2], sizes)
            highs = packs_lib.split(at_parts, q + "/part_3/ranges", pieces[3], sizes)
            for k, lo, hi in zip(parts[2], lows, highs):
                owner = ranges[k].owner
                p = owner.prefix + "/combined"
                out = writer.at(owner.spec.device, owner.spec.variable_device)
                variables = (owner.min_var, owner.max_var)
                found = self._updates.step(out, owner.spec, p, lo, hi, variables, owner.step,
                                           owner.counter)
                finite = self._guard.finite(out, p, found.width, True, *found.values)
                steps[k] = _Step(*self._guard.kept(out, found.scopes, variables, found.values,
                                                   finite), finite)
        # Kernel floors read the other ranges as combined.
        view = RangeView(quantizers, {ranges[k].owner.index: (s.lo, s.hi)
                                      for k, s in steps.items()})
        for f in sorted(floored, key=lambda f: ranges[f.position].owner.index):
            owner = ranges[f.position].owner
            p = owner.prefix + "/combined"
            out = writer.at(owner.spec.device, owner.spec.variable_device)
            lo, hi = self._floors.widen(out, owner.spec, p, f.lo, f.hi, view)
            finite = self._guard.finite(out, p, f.width, False, lo, hi)
            scopes = (p + "/AssignMinEma", p + "/AssignMaxEma")
            lo, hi = self._guard.kept(out, scopes, (owner.min_var, owner.max_var), (lo, hi),
                                      finite)
            steps[f.position] = _Step(lo, hi, finite)
            view.combined[owner.index] = (lo, hi)
        updates = []
        for k, step in steps.items():
            owner = ranges[k].owner
            out = writer.at(owner.spec.device, owner.spec.variable_device)
            updates += self._guard.assign_kept(out, owner.prefix + "/combined",
                                               (owner.min_var, owner.max_var),
                                               (step.lo, step.hi), step.finite, owner.counter)
        writer.nodes.node(self.update_group(), "NoOp", control=updates)

    def _group_step(self, out: PlacedWriter, q: str, members: Sequence[RangeStatistics],
                    lo: str, hi: str, floored: bool) -> List[Tuple[str, str, str]]:
        """The step of per-tensor ranges of one group, as vectors: each one's (min,
        max, finite) kept where finite, or, `floored`, (min, max, batch width)
        before its floors."""
        owner = members[0].owner
        spec = dataclasses.replace(owner.spec, per_channel=False, floors=())
        # The variables before the step, side by side: what the step reads as
        # the group's variables.
        reads = []
        for side in ("min", "max"):
            name = "%s/%s" % (q, side)
            variables = [getattr(r.owner, side + "_var") for r in members]
            self._writer.stand_in(name, out.node(
                name, "Pack", [out.before_update(v) for v in variables], T=_FLOAT,
                N=len(members), axis=0))
            reads.append(name)
        rate = None
        if spec.moving_average:  # Each range's own rate (its skipped batches).
            rate = out.node(q + "/rates", "Pack", [self._updates.ema_rate(
                out, float(spec.ema_decay), r.owner.step if spec.init_from_first_batch else None,
                r.owner.counter) for r in members], T=_FLOAT, N=len(members), axis=0)
        found = self._updates.step(out, spec, q, lo, hi, tuple(reads), owner.step, None,
                                   rate=rate)
        (lo, hi), n = found.values, len(members)
        if floored:
            return list(zip(*[packs_lib.unstack(out, "%s/%s_each" % (q, side), v, n)
                              for side, v in (("min", lo), ("max", hi), ("width", found.width))]))
        finite = self._guard.finite(out, q, found.width, False, lo, hi)
        lo, hi = self._guard.kept(out, found.scopes, tuple(reads), (lo, hi), finite)
        flags = out.node(q + "/finite_each", "Unpack", [finite], T=tf.bool, num=n, axis=0)
        return list(zip(packs_lib.unstack(out, q + "/min_each", lo, n),
                        packs_lib.unstack(out, q + "/max_each", hi, n),
                        ["%s:%d" % (flags, i) for i in range(n)]))
