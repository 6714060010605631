"""The packed vector of a step's range statistics, and where it joins (a mixin).

`qat.quantize.emit.step_statistics` combines the range statistics of
data-parallel replicas once per step. This module holds what it packs and
joins: each device's batch mins and negated maxes of every range in one
float32 vector, in the order the join lists (`RANGES_ATTR`): the per-tensor
ranges' mins, their maxes, the per-channel ranges' mins, their maxes; the
devices' vectors meet in one elementwise Minimum. A later call joins an
earlier call's join in its layout (`_join_earlier`). `gated_plans` says which
quantizers may wait for the update.
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Sequence, Set

from absl import logging
import numpy as np
import tensorflow as tf

_FLOAT = tf.float32
_INT32 = tf.int32
# The join's attributes: the ranges it combines, in order (their variables'
# scope), and each one's channels (0: a per-tensor range, one scalar).
RANGES_ATTR = "_qat_ranges"
CHANNELS_ATTR = "_qat_channels"


@dataclasses.dataclass
class RangeStatistics:
    """One range's statistics of this batch, and its owner here, if any."""
    name: str       # Its variables' scope.
    channels: int   # 0: a per-tensor range.
    # (device, batch min or None, batch max) of each quantizer reading it.
    statistics: List[tuple] = dataclasses.field(default_factory=list)
    owner: Optional[tuple] = None  # `step_statistics`' owner of its variables here.
    join: Optional[tf.Operation] = None  # An earlier call's join.


def parts(ranges: Sequence[RangeStatistics]) -> List[List[int]]:
    """The ranges in each part of a packed vector: per-tensor mins, per-tensor
    maxes (negated), per-channel mins, per-channel maxes (negated)."""
    scalar = [k for k, r in enumerate(ranges) if not r.channels]
    vector = [k for k, r in enumerate(ranges) if r.channels]
    return [scalar, scalar, vector, vector]


class StatisticsPacks(object):
    """Mixin of `qat.quantize.emit.step_statistics.StepStatistics` (uses `QuantizerBatch`'s helpers)."""

    def _packs(self, scope: str, ranges: Sequence[RangeStatistics]):
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
            for part, members in enumerate(parts(ranges)):
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

    def _statistic(self, found, side: int, r: RangeStatistics) -> str:
        """A device's min (side 0) or max (side 1) of a range: 0 for the min of
        nonnegative values (a range takes min(min, 0)), the neutral +inf (-inf
        for a max) where the device has no statistics of the range."""
        value = None if found is None else found[side]
        if value is not None:
            return value
        fill = 0.0 if found is not None else (np.inf if side == 0 else -np.inf)
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

    def _unstack(self, name: str, value: str, n: int) -> List[str]:
        out = self._node(name, "Unpack", [value], T=_FLOAT, num=n, axis=0)
        return ["%s:%d" % (out, i) for i in range(n)]

    def _join_earlier(self, join: tf.Operation, ranges: Sequence[RangeStatistics]) -> None:
        """Packs statistics of an earlier call's ranges in its join's layout and joins them."""
        laid_out = [RangeStatistics(n.decode(), int(c)) for n, c in zip(
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
