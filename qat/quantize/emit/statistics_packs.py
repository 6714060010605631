"""The packed vector of a step's range statistics, and where it joins.

`qat.quantize.emit.step_statistics` combines the range statistics of
data-parallel replicas once per step. This module holds what it packs and
joins: each device's batch mins and negated maxes of every range in one
float32 vector, in the order the join lists (`RANGES_ATTR`): the per-tensor
ranges' mins, their maxes, the per-channel ranges' mins, their maxes; the
devices' vectors meet in one elementwise Minimum. A later call joins an
earlier call's join in its layout (`join_earlier`). `gated_plans` says which
quantizers may wait for the update.
"""
import collections
import dataclasses
from typing import Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from absl import logging
import numpy as np
import tensorflow as tf

from qat.quantize.emit.node_writer import NodeWriter
from qat.quantize.emit.node_writer import PlacedWriter
from qat.quantize.emit.quantizer_spec import QuantizerSpec

_FLOAT = tf.float32
_INT32 = tf.int32
# The join's attributes: the ranges it combines, in order (their variables'
# scope), and each one's channels (0: a per-tensor range, one scalar).
RANGES_ATTR = "_qat_ranges"
CHANNELS_ATTR = "_qat_channels"


class DeviceStatistics(NamedTuple):
    """A quantizer's batch statistics of a range, on the device that computed them."""
    device: str
    batch_min: Optional[str]   # None: nonnegative values (the range's min is 0).
    batch_max: str


class RangeOwner(NamedTuple):
    """The quantizer of this batch that owns a range's variables."""
    spec: QuantizerSpec
    prefix: str
    min_var: str
    max_var: str
    step: Union[tf.Tensor, str, None]   # The quantization step.
    index: int                          # Its quantizer index.
    counter: str    # Its skipped-batch counter (`qat.quantize.emit.finite_ranges`).


@dataclasses.dataclass
class RangeStatistics:
    """One range's statistics of this batch, and its owner here, if any."""
    name: str       # Its variables' scope.
    channels: int   # 0: a per-tensor range.
    # The statistics of each quantizer reading it.
    statistics: List[DeviceStatistics] = dataclasses.field(default_factory=list)
    owner: Optional[RangeOwner] = None
    join: Optional[tf.Operation] = None  # An earlier call's join.


class DevicePack(NamedTuple):
    """One device's packed vector of statistics."""
    device: str
    vector: str


def parts(ranges: Sequence[RangeStatistics]) -> List[List[int]]:
    """The ranges in each part of a packed vector: per-tensor mins, per-tensor
    maxes (negated), per-channel mins, per-channel maxes (negated)."""
    scalar = [k for k, r in enumerate(ranges) if not r.channels]
    vector = [k for k, r in enumerate(ranges) if r.channels]
    return [scalar, scalar, vector, vector]


def packs(writer: NodeWriter, scope: str, ranges: Sequence[RangeStatistics]
          ) -> List[DevicePack]:
    """Each device's packed vector, devices in order of appearance."""
    by_device: "collections.OrderedDict[str, Dict[int, Tuple[Optional[str], str]]]" = (
        collections.OrderedDict())
    for k, r in enumerate(ranges):
        for device, lo, hi in r.statistics:
            here = by_device.setdefault(device, {})
            if k in here:  # Two quantizers of one device read the range.
                old_lo, old_hi = here[k]
                out = writer.at(device)
                if lo is not None and old_lo is not None:
                    lo = out.node(writer.nodes.unique_name(scope + "/local_min"), "Minimum",
                                  [old_lo, lo], T=_FLOAT)
                lo = lo if lo is not None else old_lo
                hi = out.node(writer.nodes.unique_name(scope + "/local_max"), "Maximum",
                              [old_hi, hi], T=_FLOAT)
            here[k] = (lo, hi)
    found = []
    for device, statistics in by_device.items():
        out = writer.at(device)
        q = writer.nodes.unique_name(scope + "/pack")
        pieces = []
        for part, members in enumerate(parts(ranges)):
            if not members:
                continue
            side = part % 2
            values = [_statistic(out, statistics.get(k), side, ranges[k]) for k in members]
            if part < 2:
                piece = out.node("%s/part_%d" % (q, part), "Pack", values, T=_FLOAT,
                                 N=len(values), axis=0)
            else:
                piece = concat(out, "%s/part_%d" % (q, part), values)
            if side:
                piece = out.node("%s/part_%d/negated" % (q, part), "Neg", [piece], T=_FLOAT)
            pieces.append(piece)
        packed = concat(out, q + "/concat", pieces)
        # NaN -> -inf: the min-reduce then keeps a non-finite batch
        # non-finite, whatever the order it meets the others in.
        nan = out.node(q + "/IsNan", "IsNan", [packed], T=_FLOAT)
        minus_inf = out.shared_const("minus_inf", -np.inf, tf.float32)
        found.append(DevicePack(device, out.node(q + "/finite_or_minus_inf", "SelectV2",
                                                 [nan, minus_inf, packed], T=_FLOAT)))
    return found


def _statistic(out: PlacedWriter, found: Optional[Tuple[Optional[str], str]], side: int,
               r: RangeStatistics) -> str:
    """A device's min (side 0) or max (side 1) of a range: 0 for the min of
    nonnegative values (a range takes min(min, 0)), the neutral +inf (-inf
    for a max) where the device has no statistics of the range."""
    value = None if found is None else found[side]
    if value is not None:
        return value
    fill = 0.0 if found is not None else (np.inf if side == 0 else -np.inf)
    shape = [r.channels] if r.channels else []
    return out.shared_const("neutral_statistic", np.full(shape, fill, np.float32), tf.float32)


def concat(out: PlacedWriter, name: str, values: List[str]) -> str:
    """`values` concatenated along their axis (the one value itself)."""
    if len(values) == 1:
        return values[0]
    axis = out.shared_const("concat_axis", 0, tf.int32)
    return out.node(name, "ConcatV2", list(values) + [axis], T=_FLOAT, N=len(values),
                    Tidx=_INT32)


def split(out: PlacedWriter, name: str, value: str, sizes: Sequence[int]) -> List[str]:
    """`value` split along its axis into pieces of `sizes`."""
    if len(sizes) == 1:
        return [value]
    pieces = out.node(name, "SplitV",
                      [value, out.const(name + "/sizes", list(sizes), tf.int32),
                       out.shared_const("concat_axis", 0, tf.int32)],
                      T=_FLOAT, Tlen=_INT32, num_split=len(sizes))
    return ["%s:%d" % (pieces, k) for k in range(len(sizes))]


def unstack(out: PlacedWriter, name: str, value: str, n: int) -> List[str]:
    """The `n` elements of vector `value`."""
    elements = out.node(name, "Unpack", [value], T=_FLOAT, num=n, axis=0)
    return ["%s:%d" % (elements, i) for i in range(n)]


def minimum(writer: NodeWriter, found: Sequence[DevicePack], device: str) -> str:
    """The elementwise Minimum of the devices' vectors (on `device`)."""
    out = writer.at(device)
    combined = found[0].vector
    for pack in found[1:]:
        combined = out.node(writer.nodes.unique_name(pack.vector.rsplit("/", 1)[0] + "/join"),
                            "Minimum", [combined, pack.vector], T=_FLOAT)
    return combined


def join_earlier(writer: NodeWriter, join: tf.Operation,
                 ranges: Sequence[RangeStatistics]) -> None:
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
    scope = writer.nodes.unique_name(join.name.rsplit("/", 1)[0] + "/replica")
    found = packs(writer, scope, laid_out)
    if not found:
        return
    current = minimum(writer, [DevicePack(join.device, writer.external(join.inputs[0]))]
                      + found, join.device)
    writer.rewrite.reroute(join, 0, current)


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
