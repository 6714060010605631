"""The ops that update a quantizer's range while training (a mixin of `QuantizerBatch`).

Last value (weights): the batch's min and max, widened to include 0.
Moving average (activations): `v = v - rate * (v - batch value)`, assigned as a
value (overlapping session runs each leave a range that holds 0); rate 1 - decay,
or, when the quantization step t is given, the bias-corrected (1 - decay) /
(1 - decay^t) (see `RangeUpdates._ema_rate`).
Symmetric ranges widen one side; a concatenation's group (`statistics_of`)
takes the min and max over every member. An empty activation batch range (a
dead ReLU's [0, 0]) becomes `EMPTY_RANGE_WIDTH` wide (`RangeUpdates._widen_empty`).
A range a TFLite kernel constrains (`QuantizerSpec.floors`) is widened after
the moving average to the floors of `qat.quantize.emit.range_floors`. A
batch whose range is not finite leaves the range as it was and is counted
(`qat.quantize.emit.finite_ranges`).
Each method writes NodeDefs through `QuantizerBatch`'s helpers and returns the
names of the range's (min, max).

Replicas (`QuantizerSpec.combined`): the range step runs twice. In the
forward, nothing assigned or counted: the range this replica's FakeQuant
reads, moved by its own batch statistics (kept as it was where they are not
finite). After the forward, from the statistics of every replica combined in
one reduction (`qat.quantize.emit.step_statistics`): the step the variables
are assigned, decided alike on every replica.
"""
import dataclasses

import tensorflow as tf

from qat.quantize.emit import finite_ranges
from qat.quantize.emit import range_floors
from qat.quantize.emit.quantizer_spec import low_precision_dtype

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


class RangeUpdates(range_floors.RangeFloors, finite_ranges.FiniteRanges):
    """Mixin of `qat.quantize.emit.quantizer_batch.QuantizerBatch` (uses its NodeDef helpers)."""

    def _updates(self, spec, p, x, rank, min_var, max_var, step):
        nonnegative = spec.nonnegative and not spec.per_channel
        batch_min, batch_max = self._batch_range(spec, p, x, rank, nonnegative)
        for k, t in enumerate(spec.statistics_of):
            # A concatenation's group: the range covers every member.
            q = "%s/member_%d" % (p, k)
            # Reduced where the member is (another replica's device).
            self._device = t.op.device or spec.device
            y = self._external(t)
            low = low_precision_dtype(t)
            if low is not None:
                y = self._cast(q + "/ToFloat32", y, low, _FLOAT)
            y_min, y_max = self._batch_range(
                dataclasses.replace(spec, per_channel=False), q, y, t.shape.rank,
                t.op.type in ("Relu", "Relu6"))
            self._device = spec.device
            if y_min is not None:
                batch_min = y_min if batch_min is None else self._node(
                    q + "/GroupMin", "Minimum", [batch_min, y_min], T=_FLOAT)
            batch_max = self._node(q + "/GroupMax", "Maximum", [batch_max, y_max],
                                   T=_FLOAT)
        counter = self._range_counter(spec, p)
        variables = (min_var, max_var)
        scopes, values, width = self._range_step(spec, p, batch_min, batch_max, variables, step,
                                                 counter)
        finite = self._finite(p, width, spec.per_channel, *values)
        if spec.combined:  # Replicas: combined once per step, after the forward.
            self._contribute(spec, p, batch_min, batch_max, variables, step, counter)
            return self._kept(scopes, variables, values, finite)
        return self._assign_finite(p, scopes, variables, values, finite, counter)

    def _range_step(self, spec, p, batch_min, batch_max, variables, step, counter,
                    rate=None):
        """The range after this step's batch, not assigned: (the assignments'
        scopes, (min, max), the batch range's width).

        `batch_min` is None for nonnegative values; `rate`: the moving
        average's (by default the range's own, `_ema_rate`).
        """
        zero = self._shared_const("zero", 0.0, tf.float32)
        min_var, max_var = variables
        width = self._batch_width(p, batch_min, batch_max)
        nonnegative = batch_min is None
        if nonnegative:
            # min(batch) >= 0, so min(batch_min, 0) = 0 and max(batch_max, 0)
            # = batch_max: no reduction for the min.
            lo, hi = zero, batch_max
        else:
            # TFLite requires 0 inside every range.
            lo = self._node(p + "/Minimum", "Minimum", [batch_min, zero],
                            T=_FLOAT)
            hi = self._node(p + "/Maximum", "Maximum", [batch_max, zero],
                            T=_FLOAT)
        if spec.moving_average:
            lo, hi = self._widen_empty(p, lo, hi)
        if spec.symmetric:
            lo, hi = self._symmetric(p, lo, hi, spec.num_bits, spec.narrow_range)
        scopes = (p + "/AssignMinLast", p + "/AssignMaxLast")
        if spec.moving_average:
            scopes = (p + "/AssignMinEma", p + "/AssignMaxEma")
            if rate is None:
                rate = self._ema_rate(float(spec.ema_decay), step if spec.init_from_first_batch
                                      else None, p, counter)
            if spec.floors and not spec.per_channel:
                # Floors widen the average: finite only if they are too.
                lo, hi = self._floored_average(spec, p, min_var, max_var, lo, hi, rate)
            else:
                lo, hi = (self._average(scope, var, value, rate) for scope, var, value
                          in zip(scopes, (min_var, max_var), (lo, hi)))
        return scopes, (lo, hi), width

    def _range_counter(self, spec, p: str) -> str:
        """The skipped-batch counter of the range `spec` moves: its own (a new
        variable), or, for a replica, the one of the range's owner."""
        if spec.replica_of is not None:
            return self._counters[spec.replica_of]
        if spec.earlier_range is not None:  # An earlier call's, read before its update.
            read = spec.earlier_range[4]
            name = read.op.inputs[0].op.name
            self._reads[name] = read
            return name
        counter = self._counters[len(self._ranges)] = self._skipped_counter(p)
        return counter

    def _kept(self, scopes, variables, values, finite: str):
        """`values` where `finite`, else the variables as they were: nothing assigned."""
        return tuple(self._node(scope + "/finite", "SelectV2", [finite, value,
                                                               self._before_update(var)],
                                T=_FLOAT) for scope, var, value in zip(scopes, variables, values))

    def _widen_empty(self, p, lo, hi):
        """(lo, hi), (lo, lo + `EMPTY_RANGE_WIDTH`) where hi <= lo, and at
        least `MIN_LIVE_WIDTH` wide (the top raised) where it is narrower.

        Applied to the batch range before the moving average, so the
        variables, the training graph and the eval graph (which reads the
        variables) agree. A dead ReLU's output is all zeros, the same values
        on any range holding 0.
        """
        width = self._shared_const("empty_range_width", EMPTY_RANGE_WIDTH, tf.float32)
        top = self._node(p + "/EmptyRangeTop", "AddV2", [lo, width], T=_FLOAT)
        live = self._node(p + "/RangeNotEmpty", "Greater", [hi, lo], T=_FLOAT)
        least = self._shared_const("min_live_width", MIN_LIVE_WIDTH, tf.float32)
        live_top = self._node(p + "/WidenNarrow", "Maximum",
                              [hi, self._node(p + "/NarrowRangeTop", "AddV2", [lo, least], T=_FLOAT)],
                              T=_FLOAT)
        return lo, self._node(p + "/WidenEmpty", "SelectV2", [live, live_top, top], T=_FLOAT)

    def _batch_range(self, spec, p, x, rank, nonnegative):
        """(batch min or None when `nonnegative`, batch max) of `x`."""
        batch_min = None
        if spec.per_channel and rank == 1:
            batch_min = batch_max = x  # Every element is its own channel.
        elif rank is None:  # Unknown rank (per-tensor only): reduce it flat.
            flat = self._node(p + "/Flatten", "Reshape",
                              [x, self._shared_const("flat_shape", [-1], tf.int32)],
                              T=_FLOAT, Tshape=_INT32)
            axis = self._shared_const("reduction_indices", [0], tf.int32)
            if not nonnegative:
                batch_min = self._node(p + "/BatchMin", "Min", [flat, axis],
                                       T=_FLOAT, Tidx=_INT32)
            batch_max = self._node(p + "/BatchMax", "Max", [flat, axis],
                                   T=_FLOAT, Tidx=_INT32)
        else:
            axes = list(range(rank - 1)) if spec.per_channel else list(range(rank))
            axes_const = self._shared_const("reduction_indices", axes,
                                            tf.int32)
            if not nonnegative:
                batch_min = self._node(p + "/BatchMin", "Min", [x, axes_const],
                                       T=_FLOAT, Tidx=_INT32)
            batch_max = self._node(p + "/BatchMax", "Max", [x, axes_const],
                                   T=_FLOAT, Tidx=_INT32)
        return batch_min, batch_max

    def _ema_rate(self, decay: float, step, p: str, counter: str) -> str:
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
        (`_emit_rates`, at `finish`): a few ops per batch, not per range.
        """
        if step is None:
            return self._shared_const("ema_rate", 1.0 - decay, tf.float32)
        key = ("rates", decay)
        if key not in self._shared:
            self._shared[key] = (self._nodes.unique_name(
                "%s/ema_rates" % self._shared_scope_name()), step, [])
        name, _, skipped = self._shared[key]
        read = self._before_update(counter)
        slots = self._shared.setdefault(("rate_slots", decay), {})
        if read not in slots:  # One rate per range (a replicas' combined step asks again).
            slots[read] = len(skipped)
            skipped.append(read)
        return "%s/rates:%d" % (name, slots[read])

    def _emit_rates(self) -> None:
        """The rates `_ema_rate` handed out, one vector op chain per decay."""
        for key, value in list(self._shared.items()):
            if key[0] != "rates" or not value[2]:
                continue
            decay, (scope, step, skipped) = key[1], value
            node = self._nodes.node
            step_ref = step if isinstance(step, str) else self._external(step)
            count = node(scope + "/step", "Cast", [step_ref], SrcT=_INT64, DstT=_FLOAT,
                         Truncate=False)
            packed = node(scope + "/skipped", "Pack", skipped, T=_INT64, N=len(skipped), axis=0)
            learned = node(scope + "/learned_steps", "Sub",
                           [count, node(scope + "/skipped_f", "Cast", [packed], SrcT=_INT64,
                                        DstT=_FLOAT, Truncate=False)], T=_FLOAT)
            # t is at least 1: never divide 0 by 0 if a run reads the counter
            # before its increment.
            t = node(scope + "/steps_at_least_one", "Maximum",
                     [learned, self._shared_const("one_step_f", 1.0, tf.float32)], T=_FLOAT)
            if decay == 1.0:
                rate = node(scope + "/rate", "Reciprocal", [t], T=_FLOAT)
            else:
                # 1 - decay and 1 - decay^1 are the same float32 subtraction:
                # the rate of a range's first batch is exactly 1.
                d = self._shared_const("ema_decay", decay, tf.float32)
                one = self._shared_const("one", 1.0, tf.float32)
                num = node(scope + "/one_minus_decay", "Sub", [one, d], T=_FLOAT)
                power = node(scope + "/decay_pow_steps", "Pow", [d, t], T=_FLOAT)
                den = node(scope + "/one_minus_decay_pow", "Sub", [one, power], T=_FLOAT)
                rate = node(scope + "/rate", "RealDiv", [num, den], T=_FLOAT)
            node(scope + "/rates", "Unpack", [rate], T=_FLOAT, num=len(skipped), axis=0)

    def _symmetric(self, p, lo, hi, num_bits, narrow_range):
        """max = -min * (2^b - 2) / 2^b (-min if narrow), widening one side."""
        if narrow_range:
            ratio = -1.0
        else:
            # Two's complement: the negative side is one step longer.
            ratio = -float((1 << num_bits) - 2) / float(1 << num_bits)
        r = self._shared_const("symmetric_ratio", ratio, tf.float32)
        div = self._node(p + "/symmetric_div", "RealDiv", [hi, r], T=_FLOAT)
        mul = self._node(p + "/symmetric_mul", "Mul", [lo, r], T=_FLOAT)
        new_lo = self._node(p + "/SymmetricMin", "Minimum", [lo, div], T=_FLOAT)
        new_hi = self._node(p + "/SymmetricMax", "Maximum", [hi, mul], T=_FLOAT)
        return new_lo, new_hi

    def _average(self, scope, var, value, rate):
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
        read, delta = self._ema_delta(scope, var, value, rate)
        return self._node(scope + "/average", "Sub", [read, delta], T=_FLOAT)

    def _ema_delta(self, scope, var, value, rate):
        """(the value before the update, the moving average's delta)."""
        # The value before the update: the update's data dependency on it
        # orders the two.
        read = self._before_update(var)
        sub = self._node(scope + "/sub", "Sub", [read, value], T=_FLOAT)
        return read, self._node(scope + "/mul", "Mul", [sub, rate], T=_FLOAT)

    def _floored_average(self, spec, p, min_var, max_var, lo, hi, rate):
        """The moving average, then widened to the kernel floors (`range_floors`)."""
        new_lo = self._average(p + "/AssignMinEma", min_var, lo, rate)
        new_hi = self._average(p + "/AssignMaxEma", max_var, hi, rate)
        need = self._floor_need(spec, p)
        if need is None:
            return new_lo, new_hi
        if not spec.symmetric:
            # The min as every range's; the max at least the updated min + the floor.
            return new_lo, self._widen_top(p + "/KernelFloor", new_lo, new_hi, need)
        return self._widen_about_zero(p + "/KernelFloor", new_lo, new_hi, need)
