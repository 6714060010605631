"""The ops that compute a quantizer's range step while training (`RangeUpdates`).

Last value (weights): the batch's min and max, widened to include 0.
Moving average (activations): `v = v - rate * (v - batch value)`, assigned as a
value (overlapping session runs each leave a range that holds 0); rate 1 - decay,
or, when the quantization step t is given, the bias-corrected (1 - decay) /
(1 - decay^t) (see `RangeUpdates.ema_rate`).
Symmetric ranges widen one side; a concatenation's group (`statistics_of`)
takes the min and max over every member. An empty activation batch range (a
dead ReLU's [0, 0]) becomes `EMPTY_RANGE_WIDTH` wide (`RangeUpdates._widen_empty`).
A range a TFLite kernel constrains (`QuantizerSpec.floors`) is widened after
the moving average to the floors of `qat.quantize.emit.range_floors`. The
step is computed here and not assigned: `qat.quantize.emit.quantizer_batch`
assigns it where it is finite, else keeps the range and counts the batch
(`qat.quantize.emit.finite_ranges`).

Replicas (`QuantizerSpec.combined`): the range step runs twice. In the
forward, nothing assigned or counted: the range this replica's FakeQuant
reads, moved by its own batch statistics (kept as it was where they are not
finite). After the forward, from the statistics of every replica combined in
one reduction (`qat.quantize.emit.step_statistics`): the step the variables
are assigned, decided alike on every replica.
"""
import dataclasses
from typing import List, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from qat.quantize.emit.finite_ranges import FiniteGuard
from qat.quantize.emit.node_writer import NodeWriter
from qat.quantize.emit.node_writer import PlacedWriter
from qat.quantize.emit.quantizer_spec import QuantizerSpec
from qat.quantize.emit.quantizer_spec import low_precision_dtype
from qat.quantize.emit.range_floors import RangeFloors
from qat.quantize.emit.range_floors import RangeView

_FLOAT = tf.float32
_INT32 = tf.int32
_INT64 = tf.int64

# The width an empty activation batch range is given. A ReLU that never fires
# has the batch range [0, 0]; TFLite's converter widens an empty range to about
# 1e-6, and the next layer's bias scale (input scale x weight scale) then makes
# its int32 bias overflow. With this width the bias stays representable while
# |bias| / max|weight| < 2^31 * EMPTY_RANGE_WIDTH / (255 * 127) (about 660).
# Only empty ranges are widened that far: a narrow live range (a layer norm's
# variance) keeps its resolution down to `MIN_LIVE_WIDTH`.
EMPTY_RANGE_WIDTH = 1e-2
# The narrowest live range kept. The converter widens a range narrower than
# about 1e-6 (a GELU of inputs near -8 has [-1e-13, 0]) to a grid of its own,
# on which the eval graph did not compute; a range at least this wide is
# converted as it is.
MIN_LIVE_WIDTH = 1e-5

# The quantization step: a tensor, or a node of the batch.
Step = Union[tf.Tensor, str]


class RangeStep(NamedTuple):
    """A range after this step's batch, not assigned."""
    scopes: Tuple[str, str]   # The name scopes of its (min, max) assignments.
    values: Tuple[str, str]   # Its (min, max).
    width: str                # The batch range's width (finite exactly when it is).


@dataclasses.dataclass
class _Rates:
    """The moving-average rates of the ranges of one decay (`RangeUpdates.ema_rate`)."""
    decay: float
    scope: str
    step: Step
    skipped: List[str]   # Each range's skipped-batch counter, read before the update.


class RangeUpdates:
    """Computes range steps from batch statistics.

    Args:
      writer: the batch's node writer.
      floors: widens a range to its kernel floors.
      guard: the batch's finite guard (the batch range's width).
    """

    def __init__(self, writer: NodeWriter, floors: RangeFloors, guard: FiniteGuard):
        self._writer = writer
        self._floors = floors
        self._guard = guard
        self._rates: List[_Rates] = []

    def batch_range(self, out: PlacedWriter, spec: QuantizerSpec, p: str, x: str,
                    rank: Optional[int]) -> Tuple[Optional[str], str]:
        """(batch min, or None for nonnegative values, batch max) of `x` and of
        the further tensors of `spec.statistics_of`."""
        nonnegative = spec.nonnegative and not spec.per_channel
        batch_min, batch_max = self._min_max(out, spec, p, x, rank, nonnegative)
        for k, t in enumerate(spec.statistics_of):
            # A concatenation's group: the range covers every member.
            q = "%s/member_%d" % (p, k)
            # Reduced where the member is (another replica's device).
            member = self._writer.at(t.op.device or spec.device, out.variable_device)
            y = member.external(t)
            low = low_precision_dtype(t)
            if low is not None:
                y = member.cast(q + "/ToFloat32", y, low, _FLOAT)
            y_min, y_max = self._min_max(
                member, dataclasses.replace(spec, per_channel=False), q, y, t.shape.rank,
                t.op.type in ("Relu", "Relu6"))
            if y_min is not None:
                batch_min = y_min if batch_min is None else out.node(
                    q + "/GroupMin", "Minimum", [batch_min, y_min], T=_FLOAT)
            batch_max = out.node(q + "/GroupMax", "Maximum", [batch_max, y_max], T=_FLOAT)
        return batch_min, batch_max

    def step(self, out: PlacedWriter, spec: QuantizerSpec, p: str, batch_min: Optional[str],
             batch_max: str, variables: Tuple[str, str], step: Optional[Step],
             counter: Optional[str], view: Optional[RangeView] = None,
             rate: Optional[str] = None) -> RangeStep:
        """The range of `variables` after this step's batch, not assigned.

        Args:
          out: where the ops go.
          spec: the range's settings.
          p: the name scope of the ops.
          batch_min: the batch min, None for nonnegative values.
          batch_max: the batch max.
          variables: the range's (min, max) variables (read before the update).
          step: the quantization step.
          counter: the range's skipped-batch counter (for its rate).
          view: the batch's ranges, for the kernel floors of `spec`.
          rate: the moving average's (by default the range's own, `ema_rate`).
        """
        zero = out.shared_const("zero", 0.0, tf.float32)
        min_var, max_var = variables
        width = self._guard.batch_width(out, p, batch_min, batch_max)
        nonnegative = batch_min is None
        if nonnegative:
            # min(batch) >= 0, so min(batch_min, 0) = 0 and max(batch_max, 0)
            # = batch_max: no reduction for the min.
            lo, hi = zero, batch_max
        else:
            # TFLite requires 0 inside every range.
            lo = out.node(p + "/Minimum", "Minimum", [batch_min, zero], T=_FLOAT)
            hi = out.node(p + "/Maximum", "Maximum", [batch_max, zero], T=_FLOAT)
        if spec.moving_average:
            lo, hi = self._widen_empty(out, p, lo, hi)
        if spec.symmetric:
            lo, hi = self._symmetric(out, p, lo, hi, spec.num_bits, spec.narrow_range)
        scopes = (p + "/AssignMinLast", p + "/AssignMaxLast")
        if spec.moving_average:
            scopes = (p + "/AssignMinEma", p + "/AssignMaxEma")
            if rate is None:
                rate = self.ema_rate(out, float(spec.ema_decay),
                                     step if spec.init_from_first_batch else None, counter)
            lo, hi = (self._average(out, scope, var, value, rate) for scope, var, value
                      in zip(scopes, (min_var, max_var), (lo, hi)))
            if spec.floors and not spec.per_channel:
                # Floors widen the average: finite only if they are too.
                lo, hi = self._floors.widen(out, spec, p, lo, hi, view)
        return RangeStep(scopes, (lo, hi), width)

    def ema_rate(self, out: PlacedWriter, decay: float, step: Optional[Step],
                 counter: Optional[str]) -> str:
        """The moving average's rate: 1 - decay; with the step t, bias-corrected.

        With t the batches the range learned from (the quantization step, 1
        on the first training run, less the range's skipped batches) the rate
        is (1 - decay) / (1 - decay^t): the zero-debiased moving average of the
        batch ranges so far (Adam's bias correction), with no variable of its
        own. It is 1 at t = 1 (the first batch's range), about 1/t while
        t << 1 / (1 - decay) (the mean of the batches so far, which follows a
        fast-changing range early in training), and 1 - decay later. Decay 1
        gives the limit 1/t (the mean of every batch). The rates of all the
        batch's ranges of one decay are computed together, as one vector
        (`emit_rates`, at the batch's end): a few ops per batch, not per range.
        """
        if step is None:
            return out.shared_const("ema_rate", 1.0 - decay, tf.float32)
        writer = self._writer

        def new_rates() -> _Rates:
            rates = _Rates(decay, writer.nodes.unique_name(
                "%s/ema_rates" % writer.shared_scope()), step, [])
            self._rates.append(rates)
            return rates
        rates = writer.shared(("rates", decay), new_rates)
        read = out.before_update(counter)
        slots = writer.shared(("rate_slots", decay), dict)
        if read not in slots:  # One rate per range (a replicas' combined step asks again).
            slots[read] = len(rates.skipped)
            rates.skipped.append(read)
        return "%s/rates:%d" % (rates.scope, slots[read])

    def emit_rates(self) -> None:
        """The rates `ema_rate` handed out, one vector op chain per decay."""
        writer = self._writer
        node = writer.nodes.node
        for rates in self._rates:
            decay, scope, step, skipped = rates.decay, rates.scope, rates.step, rates.skipped
            step_ref = step if isinstance(step, str) else writer.external(step)
            count = node(scope + "/step", "Cast", [step_ref], SrcT=_INT64, DstT=_FLOAT,
                         Truncate=False)
            packed = node(scope + "/skipped", "Pack", skipped, T=_INT64, N=len(skipped), axis=0)
            learned = node(scope + "/learned_steps", "Sub",
                           [count, node(scope + "/skipped_f", "Cast", [packed], SrcT=_INT64,
                                        DstT=_FLOAT, Truncate=False)], T=_FLOAT)
            # t is at least 1: never divide 0 by 0 if a run reads the counter
            # before its increment.
            t = node(scope + "/steps_at_least_one", "Maximum",
                     [learned, writer.shared_const("one_step_f", 1.0, tf.float32)], T=_FLOAT)
            if decay == 1.0:
                rate = node(scope + "/rate", "Reciprocal", [t], T=_FLOAT)
            else:
                # 1 - decay and 1 - decay^1 are the same float32 subtraction:
                # the rate of a range's first batch is exactly 1.
                d = writer.shared_const("ema_decay", decay, tf.float32)
                one = writer.shared_const("one", 1.0, tf.float32)
                num = node(scope + "/one_minus_decay", "Sub", [one, d], T=_FLOAT)
                power = node(scope + "/decay_pow_steps", "Pow", [d, t], T=_FLOAT)
                den = node(scope + "/one_minus_decay_pow", "Sub", [one, power], T=_FLOAT)
                rate = node(scope + "/rate", "RealDiv", [num, den], T=_FLOAT)
            node(scope + "/rates", "Unpack", [rate], T=_FLOAT, num=len(skipped), axis=0)

    @staticmethod
    def _widen_empty(out: PlacedWriter, p: str, lo: str, hi: str) -> Tuple[str, str]:
        """(lo, hi), (lo, lo + `EMPTY_RANGE_WIDTH`) where hi <= lo, and at
        least `MIN_LIVE_WIDTH` wide (the top raised) where it is narrower.

        Applied to the batch range before the moving average, so the
        variables, the training graph and the eval graph (which reads the
        variables) agree. A dead ReLU's output is all zeros, the same values
        on any range holding 0.
        """
        width = out.shared_const("empty_range_width", EMPTY_RANGE_WIDTH, tf.float32)
        top = out.node(p + "/EmptyRangeTop", "AddV2", [lo, width], T=_FLOAT)
        live = out.node(p + "/RangeNotEmpty", "Greater", [hi, lo], T=_FLOAT)
        least = out.shared_const("min_live_width", MIN_LIVE_WIDTH, tf.float32)
        live_top = out.node(p + "/WidenNarrow", "Maximum",
                            [hi, out.node(p + "/NarrowRangeTop", "AddV2", [lo, least],
                                          T=_FLOAT)],
                            T=_FLOAT)
        return lo, out.node(p + "/WidenEmpty", "SelectV2", [live, live_top, top], T=_FLOAT)

    @staticmethod
    def _min_max(out: PlacedWriter, spec: QuantizerSpec, p: str, x: str, rank: Optional[int],
                 nonnegative: bool) -> Tuple[Optional[str], str]:
        """(batch min or None when `nonnegative`, batch max) of `x`."""
        batch_min = None
        if spec.per_channel and rank == 1:
            batch_min = batch_max = x  # Every element is its own channel.
        elif rank is None:  # Unknown rank (per-tensor only): reduce it flat.
            flat = out.node(p + "/Flatten", "Reshape",
                            [x, out.shared_const("flat_shape", [-1], tf.int32)],
                            T=_FLOAT, Tshape=_INT32)
            axis = out.shared_const("reduction_indices", [0], tf.int32)
            if not nonnegative:
                batch_min = out.node(p + "/BatchMin", "Min", [flat, axis], T=_FLOAT, Tidx=_INT32)
            batch_max = out.node(p + "/BatchMax", "Max", [flat, axis], T=_FLOAT, Tidx=_INT32)
        else:
            axes = list(range(rank - 1)) if spec.per_channel else list(range(rank))
            axes_const = out.shared_const("reduction_indices", axes, tf.int32)
            if not nonnegative:
                batch_min = out.node(p + "/BatchMin", "Min", [x, axes_const], T=_FLOAT,
                                     Tidx=_INT32)
            batch_max = out.node(p + "/BatchMax", "Max", [x, axes_const], T=_FLOAT, Tidx=_INT32)
        return batch_min, batch_max

    @staticmethod
    def _symmetric(out: PlacedWriter, p: str, lo: str, hi: str, num_bits: int,
                   narrow_range: bool) -> Tuple[str, str]:
        """max = -min * (2^b - 2) / 2^b (-min if narrow), widening one side."""
        if narrow_range:
            ratio = -1.0
        else:
            # Two's complement: the negative side is one step longer.
            ratio = -float((1 << num_bits) - 2) / float(1 << num_bits)
        r = out.shared_const("symmetric_ratio", ratio, tf.float32)
        div = out.node(p + "/symmetric_div", "RealDiv", [hi, r], T=_FLOAT)
        mul = out.node(p + "/symmetric_mul", "Mul", [lo, r], T=_FLOAT)
        new_lo = out.node(p + "/SymmetricMin", "Minimum", [lo, div], T=_FLOAT)
        new_hi = out.node(p + "/SymmetricMax", "Maximum", [hi, mul], T=_FLOAT)
        return new_lo, new_hi

    @staticmethod
    def _average(out: PlacedWriter, scope: str, var: str, value: str, rate: str) -> str:
        """The moving average's new value, `read - (read - value) * rate`.

        Assigned as a value, never as a delta. Session runs may overlap
        (research/slim's Supervisor runs the summary op in a thread of its
        own beside the training step; asynchronous workers share one range):
        each reads the range, then writes. Assigned as deltas (`var -= (read -
        value) * rate`), two runs that read the same value both subtract
        theirs, and while the bias-corrected rate is near 1 (1 at step 1, 1 /
        (1 + decay) at step 2) the range overshoots past the batch's: a ReLU
        mean's min went from -6 to +3. The average lies between the range it
        read and the batch's, so whichever run writes last leaves a range
        that holds 0 (both do).
        """
        # The value before the update: the update's data dependency on it
        # orders the two.
        read = out.before_update(var)
        sub = out.node(scope + "/sub", "Sub", [read, value], T=_FLOAT)
        delta = out.node(scope + "/mul", "Mul", [sub, rate], T=_FLOAT)
        return out.node(scope + "/average", "Sub", [read, delta], T=_FLOAT)
