"""No NaN or infinite value enters a range (a mixin of `RangeUpdates`).

One bad batch (a NaN or infinite input value, an activation that overflowed)
would otherwise poison a range for good: the moving average of NaN is NaN, the
FakeQuant reading it outputs NaN, and every later step's loss is NaN, even
where the optimizer skips the step (Keras's `LossScaleOptimizer`). So a range
update is assigned only where it is finite:

* the batch's min and max, after the replicas' all-reduce (every replica
  decides alike), must be finite, every channel of a per-channel range;
* the range the update computes from it must be finite too: the moving
  average, the last value, a range widened by kernel floors
  (`qat.quantize.emit.range_floors`: a floor computed from a non-finite value
  does not widen a range to inf or NaN).

Otherwise the range's min and max keep their value (`SelectV2`: arithmetic
and selects only, so the training function still compiles under XLA), the
FakeQuant of that step reads them, and the range's counter
`<prefix>/skipped_batches` (int64, training graphs only: eval graphs read no
counter, so a strict restore of any training checkpoint into them works) adds
one. The moving average's bias correction counts only the batches the range
learned from (the step less the skipped batches,
`RangeUpdates._ema_rate`), so the first finite batch after skipped ones still
sets a new range with its full weight.
"""
import tensorflow as tf

SKIPPED_BATCHES = "skipped_batches"
# The graph collection of the counters (training graphs).
SKIPPED_BATCHES_COLLECTION = "qat_skipped_batches"

_FLOAT = tf.float32
_INT32 = tf.int32
_INT64 = tf.int64


def counter_name(range_name: str) -> str:
    """The counter variable of the range whose variables are `<range_name>/min|max`."""
    return range_name + "/" + SKIPPED_BATCHES


class FiniteRanges(object):
    """Mixin of `qat.quantize.emit.range_updates.RangeUpdates` (uses `QuantizerBatch`'s helpers)."""

    def _batch_width(self, p: str, batch_min, batch_max: str) -> str:
        """The batch range's width: finite exactly when both ends are."""
        if batch_min is None:  # Nonnegative: the min is 0.
            return batch_max
        return self._node(p + "/BatchWidth", "Sub", [batch_max, batch_min], T=_FLOAT)

    def _finite(self, p: str, width: str, per_channel: bool, lo: str, hi: str) -> str:
        """Whether the batch range of `width` and the range [lo, hi] the update
        computed from it are finite (every channel).

        Checked before the ops that may drop a NaN (an empty range's widening
        takes NaN for empty) and after the floors: one check of the sum (a
        NaN or an infinity in either makes it one; finite widths whose sum
        overflows, a range too wide to quantize anything, are skipped too).
        """
        width = self._node(p + "/Widths", "AddV2", [
            width, self._node(p + "/RangeWidth", "Sub", [hi, lo], T=_FLOAT)], T=_FLOAT)
        finite = self._node(p + "/Finite", "IsFinite", [width], T=_FLOAT)
        if per_channel:
            finite = self._node(p + "/Finite/All", "All",
                                [finite, self._shared_const("reduction_indices", [0], tf.int32)],
                                Tidx=_INT32, keep_dims=False)
        return finite

    def _skipped_counter(self, p: str) -> str:
        """The range's int64 counter of skipped batches (a new variable)."""
        return self._variable(p, SKIPPED_BATCHES, [], 0,
                              [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                               SKIPPED_BATCHES_COLLECTION],
                              dtype=_INT64, statistic=True)

    def _assign_finite(self, p: str, scopes, variables, values, finite: str,
                       counter: str):
        """Assigns `values` to `variables` where `finite`, else keeps them and
        counts the batch; returns the (min, max) nodes after the update.
        """
        skip = self._node(p + "/Skipped", "SelectV2",
                          [finite, self._shared_const("zero_count", 0, tf.int64),
                           self._shared_const("one_count", 1, tf.int64)], T=_INT64)
        counted = self._variables_emitter.assign_add(
            p + "/CountSkipped", counter, skip, device=self._variable_device, return_read=False)
        emitter, out = self._variables_emitter, []
        for scope, var, value in zip(scopes, variables, values):
            # The counter's update runs with the range's.
            control = [] if out else [counted]
            old = emitter.before_update(var, self._variable_device)
            kept = self._node(scope + "/finite", "SelectV2", [finite, value, old], T=_FLOAT)
            out.append(emitter.assign(scope, var, kept, device=self._variable_device,
                                      control=control))
        return tuple(out)
