"""No NaN or infinite value enters a range (a mixin of `RangeUpdates`).

One bad batch (a NaN or infinite input value, an activation that overflowed)
would otherwise poison a range for good: the moving average of NaN is NaN, the
FakeQuant reading it outputs NaN, and every later step's loss is NaN, even
where the optimizer skips the step (Keras's `LossScaleOptimizer`). So a range
update is assigned only where it is finite:

* the batch's min and max, after the replicas' all-reduce (every replica
  decides alike), must be finite, every channel of a per-channel range;
* a range widened by kernel floors (`qat.quantize.emit.range_floors`) must
  be finite after the floors too (a floor computed from a non-finite value
  does not widen a range to inf or NaN).

Otherwise the range's min and max keep their value (`SelectV2`: arithmetic
and selects only, so the training function still compiles under XLA), the
FakeQuant of that step reads them, and the range's counter
`<prefix>/skipped_batches` (int64, training graphs only: eval graphs read no
counter, so a strict restore of any training checkpoint into them works) adds
one. The moving average's bias correction counts only the batches the range
learned from (`learned_steps`), so the first finite batch after skipped ones
still sets a new range with its full weight.
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

    def _finite_batch(self, p: str, batch_min, batch_max: str, per_channel: bool) -> str:
        """Whether the batch range is finite (its width is, so both ends are)."""
        width = batch_max if batch_min is None else self._node(
            p + "/BatchWidth", "Sub", [batch_max, batch_min], T=_FLOAT)
        finite = self._node(p + "/BatchFinite", "IsFinite", [width], T=_FLOAT)
        if per_channel:
            finite = self._node(p + "/BatchFinite/All", "All",
                                [finite, self._shared_const("reduction_indices", [0], tf.int32)],
                                Tidx=_INT32, keep_dims=False)
        return finite

    def _finite_result(self, p: str, finite: str, lo: str, hi: str) -> str:
        """`finite` and the range [lo, hi] (per tensor) is finite."""
        width = self._node(p + "/RangeWidth", "Sub", [hi, lo], T=_FLOAT)
        result = self._node(p + "/RangeFinite", "IsFinite", [width], T=_FLOAT)
        return self._node(p + "/Finite", "LogicalAnd", [finite, result])

    def _skipped_counter(self, p: str) -> str:
        """The range's int64 counter of skipped batches (a new variable)."""
        return self._variable(p, SKIPPED_BATCHES, [], 0,
                              [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                               SKIPPED_BATCHES_COLLECTION],
                              dtype=_INT64, statistic=True)

    def _learned_steps(self, p: str, step: str, counter: str) -> str:
        """The batches this range learned from: the float step less its skips."""
        skipped = self._node(p + "/skipped_steps", "Cast",
                             [self._variables_emitter.before_update(counter, self._variable_device)],
                             SrcT=_INT64, DstT=_FLOAT, Truncate=False)
        return self._node(p + "/learned_steps", "Sub", [step, skipped], T=_FLOAT)

    def _assign_finite(self, p: str, scopes, variables, values, finite: str,
                       counter: str):
        """Assigns `values` to `variables` where `finite`, else keeps them and
        counts the batch; returns the (min, max) nodes after the update."""
        skip = self._node(p + "/Skipped", "SelectV2",
                          [finite, self._shared_const("zero_count", 0, tf.int64),
                           self._shared_const("one_count", 1, tf.int64)], T=_INT64)
        counted = self._variables_emitter.assign_add(p + "/CountSkipped", counter, skip,
                                                     device=self._variable_device)
        out = []
        for scope, var, value in zip(scopes, variables, values):
            old = self._variables_emitter.before_update(var, self._variable_device)
            kept = self._node(scope + "/finite", "SelectV2", [finite, value, old], T=_FLOAT)
            # The counter's update runs with the range's.
            out.append(self._variables_emitter.assign(
                scope, var, kept, device=self._variable_device,
                control=[counted] if not out else []))
        return tuple(out)
