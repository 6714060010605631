"""No NaN or infinite value enters a range (`FiniteGuard`).

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
`qat.quantize.emit.range_updates.RangeUpdates.ema_rate`), so the first finite
batch after skipped ones still sets a new range with its full weight.
`warn(counts)` logs the counters' readings, once per range and process (the
readers: `qat.report.skipped_batches`, the TF 2 model's `skipped_batches()`).
"""
from typing import Dict, List, Optional, Sequence, Set, Tuple

from absl import logging
import tensorflow as tf

from qat.quantize.emit.node_writer import NodeWriter
from qat.quantize.emit.node_writer import PlacedWriter
from qat.quantize.emit.quantizer_spec import QuantizerSpec

SKIPPED_BATCHES = "skipped_batches"
# The graph collection of the counters (training graphs).
SKIPPED_BATCHES_COLLECTION = "qat_skipped_batches"

_FLOAT = tf.float32
_INT32 = tf.int32
_INT64 = tf.int64


def counter_name(range_name: str) -> str:
    """The counter variable of the range whose variables are `<range_name>/min|max`."""
    return range_name + "/" + SKIPPED_BATCHES


_WARNED: Set[str] = set()


def warn(counts: Dict[str, int], tensors: Optional[Dict[str, str]] = None) -> None:
    """Logs a warning, once per range and process, for each range that skipped batches.

    Args:
      counts: {range name (`<prefix>` of `<prefix>/min`): skipped batches}.
      tensors: {range name: the tensor it quantizes}, where known.
    """
    for name, count in sorted(counts.items()):
        if not count or name in _WARNED:
            continue
        _WARNED.add(name)
        tensor = (tensors or {}).get(name)
        logging.warning(
            "qat: the range %s%s skipped %d training batch%s whose min or max was NaN or "
            "infinite, and kept its value. Look for NaN or infinite values in the data fed at "
            "those steps, or for an overflow before %s (a range restored as NaN skips every "
            "batch: see docs/known_limits.md).", name,
            f" (of {tensor})" if tensor else "", count, "" if count == 1 else "es",
            tensor or "that tensor")


class FiniteGuard:
    """Keeps non-finite batches out of a batch's ranges and counts them.

    Args:
      writer: the batch's node writer.
    """

    def __init__(self, writer: NodeWriter):
        self._writer = writer
        self._counters: Dict[int, str] = {}  # Quantizer index -> its range's counter.

    def counter(self, out: PlacedWriter, spec: QuantizerSpec, prefix: str, index: int) -> str:
        """The skipped-batch counter of the range quantizer `index` moves: its
        own (a new variable `<prefix>/skipped_batches`), or, for a replica, the
        one of the range's owner (an earlier call's, read before its update).

        Args:
          out: where the counter's ops go (its variable device).
          spec: the quantizer.
          prefix: its name scope.
          index: its index in the batch.

        Returns:
          The counter variable's name.
        """
        if spec.replica_of is not None:
            return self._counters[spec.replica_of]
        if spec.earlier_range is not None:  # An earlier call's, read before its update.
            read = spec.earlier_range[4]
            name = read.op.inputs[0].op.name
            self._writer.stand_in(name, read)
            return name
        counter = self._counters[index] = self._writer.variable(
            prefix, SKIPPED_BATCHES, [], 0,
            [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, SKIPPED_BATCHES_COLLECTION],
            device=out.variable_device, dtype=_INT64, statistic=True)
        return counter

    def batch_width(self, out: PlacedWriter, p: str, batch_min: Optional[str],
                    batch_max: str) -> str:
        """The batch range's width: finite exactly when both ends are."""
        if batch_min is None:  # Nonnegative: the min is 0.
            return batch_max
        return out.node(p + "/BatchWidth", "Sub", [batch_max, batch_min], T=_FLOAT)

    def finite(self, out: PlacedWriter, p: str, width: str, per_channel: bool, lo: str,
               hi: str) -> str:
        """Whether the batch range of `width` and the range [lo, hi] the update
        computed from it are finite (every channel).

        Checked before the ops that may drop a NaN (an empty range's widening
        takes NaN for empty) and after the floors: one check of the sum (a
        NaN or an infinity in either makes it one; finite widths whose sum
        overflows, a range too wide to quantize anything, are skipped too).
        """
        width = out.node(p + "/Widths", "AddV2", [
            width, out.node(p + "/RangeWidth", "Sub", [hi, lo], T=_FLOAT)], T=_FLOAT)
        finite = out.node(p + "/Finite", "IsFinite", [width], T=_FLOAT)
        if per_channel:
            finite = out.node(p + "/Finite/All", "All",
                              [finite, out.shared_const("reduction_indices", [0], tf.int32)],
                              Tidx=_INT32, keep_dims=False)
        return finite

    def kept(self, out: PlacedWriter, scopes: Sequence[str], variables: Sequence[str],
             values: Sequence[str], finite: str) -> Tuple[str, ...]:
        """`values` where `finite`, else the variables as they were: nothing assigned."""
        return tuple(out.node(scope + "/finite", "SelectV2",
                              [finite, value, out.before_update(var)], T=_FLOAT)
                     for scope, var, value in zip(scopes, variables, values))

    def assign(self, out: PlacedWriter, p: str, scopes: Sequence[str],
               variables: Sequence[str], values: Sequence[str], finite: str,
               counter: str) -> Tuple[str, ...]:
        """Assigns `values` to `variables` where `finite`, else keeps them and
        counts the batch.

        Args:
          out: where the ops go.
          p: the name scope of the count.
          scopes: the name scopes of the (min, max) assignments.
          variables: the (min, max) variables.
          values: their new values.
          finite: whether the step is finite (`finite`).
          counter: the range's skipped-batch counter.

        Returns:
          The (min, max) nodes after the update.
        """
        counted = self._count(out, p, counter, finite)
        emitter, assigned = self._writer.variables, []
        for scope, var, value in zip(scopes, variables, values):
            # The counter's update runs with the range's.
            control = [] if assigned else [counted]
            old = emitter.before_update(var, out.variable_device)
            kept = out.node(scope + "/finite", "SelectV2", [finite, value, old], T=_FLOAT)
            assigned.append(emitter.assign(scope, var, kept, device=out.variable_device,
                                           control=control))
        return tuple(assigned)

    def assign_kept(self, out: PlacedWriter, p: str, variables: Tuple[str, str],
                    kept: Tuple[str, str], finite: str, counter: str) -> List[str]:
        """Assigns a range its step as `kept` (`kept`'s values) and counts the
        batch where not `finite`; returns the update ops."""
        updates = [self._count(out, p, counter, finite)]
        for side, var, value in zip(("Min", "Max"), variables, kept):
            updates.append(self._writer.variables.assign(
                "%s/Assign%s" % (p, side), var, value, device=out.variable_device,
                return_read=False))
        return updates

    def _count(self, out: PlacedWriter, p: str, counter: str, finite: str) -> str:
        """Adds one to `counter` where not `finite`; returns the update op."""
        skip = out.node(p + "/Skipped", "SelectV2",
                        [finite, out.shared_const("zero_count", 0, tf.int64),
                         out.shared_const("one_count", 1, tf.int64)], T=_INT64)
        return self._writer.variables.assign_add(
            p + "/CountSkipped", counter, skip, device=out.variable_device, return_read=False)
