"""A converged calibration for test models: ranges iterated until none moves.

`calibrate_to_convergence` works on any graph rewritten by qat's
`create_training_graph` (tests/calibration_test.py; tests/zoo_util.py says
why the zoo keeps its one-shot recalibration).
"""
import dataclasses
from typing import List, Tuple

from absl import logging
import tensorflow as tf

from qat.engine import marks
from qat.engine import step_counter
from zoo_util import recalibrate_batch_norms

tf1 = tf.compat.v1


# Converged calibration: a range has settled when a round moves it by at most
# this fraction of its width (a quarter of an 8-bit step).
CALIBRATION_TOLERANCE = 1e-3
CALIBRATION_MAX_ROUNDS = 10


class CalibrationNotConverged(AssertionError):
    """`calibrate_to_convergence` ran out of rounds."""


@dataclasses.dataclass
class Calibration:
    """What `calibrate_to_convergence` did."""
    rounds: int    # Range rounds run (the batch-norm statistics are set before).
    move: float    # The last round's largest activation range move / its width.
    worst: str     # The range that moved most in the last round.


def _data_ops(graph: tf.Graph) -> set:
    """The ops computed from a placeholder."""
    data_ops = set()
    frontier = [op for op in graph.get_operations() if op.type == "Placeholder"]
    while frontier:
        op = frontier.pop()
        if op in data_ops:
            continue
        data_ops.add(op)
        frontier.extend(c for t in op.outputs for c in t.consumers())
    return data_ops


# Stateful random ops: a new draw each run (dropout masks, drop connect).
_RANDOM_TYPES = frozenset(["RandomUniform", "RandomStandardNormal", "TruncatedNormal",
                           "RandomUniformInt"])


def _activation_ranges(graph: tf.Graph, data_ops: set) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """(min, max) value tensors of every activation range qat created.

    An activation range is a quantizer range whose update reads data (computed
    from a placeholder); a weight range follows the weights (and, folded, the
    moving variance) and is left out.
    """
    found = {}
    for op in graph.get_operations():
        end = op.name.rpartition("/")[2]
        if (op.type == "VarHandleOp" and end in ("min", "max")
                and marks.made_by_qat(op, marks.QUANTIZER)
                and any(c in data_ops for c in op.outputs[0].consumers()
                        if c.type in ("AssignVariableOp", "AssignSubVariableOp"))):
            found.setdefault(op.name.rpartition("/")[0], {})[end] = op
    pairs = []
    for prefix, ends in sorted(found.items()):
        if len(ends) == 2:
            with tf1.name_scope(None):
                pairs.append(tuple(tf.raw_ops.ReadVariableOp(
                    resource=ends[k].outputs[0], dtype=tf.float32,
                    name=f"calibration_read/{prefix}/{k}") for k in ("min", "max")))
    return pairs


def calibrate_to_convergence(sess, fetches, feed,
                             tolerance: float = CALIBRATION_TOLERANCE,
                             max_rounds: int = CALIBRATION_MAX_ROUNDS) -> Calibration:
    """Calibrates a rewritten training graph: statistics, then ranges until none moves.

    Two training steps from random weights leave the batch norms' moving
    statistics near their initial values and the activation ranges at a
    moving average of two batches; end-to-end bounds measured on such a
    model amplify that chaos. First every training batch norm's moving mean
    and variance is set to its statistics on `feed`
    (`recalibrate_batch_norms`), as after a long training. Then, in rounds,
    qat's `fake_quantization_step` is reset, so that a run's range updates
    take the batch's own range (qat's first-batch start) instead of a
    moving-average step, and `fetches` run on `feed` (random ops in the data
    path, dropout's masks, fed one draw for all rounds); the rounds end when no
    activation range moved by more than `tolerance` of its width (weight
    ranges follow the weights and the moving variances). The statistics are
    set once, not iterated with the ranges: with per-tensor weight ranges the
    folded weights w * gamma / sigma_moving are quantized on one grid for all
    channels, the statistics of the next round depend on that grid, and the
    iteration does not settle (docs/known_limits.md).

    Args:
      sess: a session of the rewritten training graph, variables initialised.
      fetches: what to run each round; must depend on every quantizer (the
        model output, or the loss).
      feed: the calibration batch (a feed dict), the same every round.
      tolerance: the largest relative range move of a settled round.
      max_rounds: range rounds before giving up.

    Returns:
      A `Calibration`.

    Raises:
      ValueError: for a graph qat did not rewrite for training.
      CalibrationNotConverged: after `max_rounds` rounds without a settled
        one; the message names the range that moved most.
    """
    graph = sess.graph
    with graph.as_default():
        step = step_counter.get_quantization_step_variable(graph)
        if step is None:
            raise ValueError("calibrate_to_convergence needs a graph rewritten by "
                             "qat's create_training_graph (no fake_quantization_step).")
        reset = tf1.assign(step, tf.constant(0, step.dtype.base_dtype))
        recalibrate = recalibrate_batch_norms(graph)
        data_ops = _data_ops(graph)
        ranges = _activation_ranges(graph, data_ops)
        watched = [t for pair in ranges for t in pair]
        random = [op.outputs[0] for op in graph.get_operations()
                  if op.type in _RANDOM_TYPES and op in data_ops]
    # Dropout draws a new mask each run: one draw, fed to every round.
    feed = dict(feed)
    feed.update(zip(random, sess.run(random, feed)))
    sess.run(recalibrate, feed)
    before = None
    result = Calibration(0, float("inf"), "")
    for rounds in range(1, max_rounds + 1):
        sess.run(reset)
        sess.run(fetches, feed)
        now = sess.run(watched)
        if before is not None:
            moves = [(0.0, "")]
            for k, (lo, _) in enumerate(ranges):
                width = max(float(before[2 * k + 1] - before[2 * k]), 1e-12)
                move = max(abs(float(now[2 * k] - before[2 * k])),
                           abs(float(now[2 * k + 1] - before[2 * k + 1]))) / width
                moves.append((move, lo.name.rpartition("/")[0]))
            move, worst = max(moves)
            result = Calibration(rounds, move, worst)
            logging.info("calibration round %d: largest range move %.3g (%s)",
                         rounds, move, worst)
            if move <= tolerance:
                return result
        before = now
    raise CalibrationNotConverged(
        f"calibration did not converge in {max_rounds} rounds: the last round moved "
        f"{result.worst} by {result.move:.3g} of its width (tolerance {tolerance:g}).")
