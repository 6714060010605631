"""Training a graph as users do, with what goes wrong in training (issue #37).

A `Regime` is a plain description of a short training run, drawn by
`regimes()`:

* the optimizer (`OPTIMIZERS`), with large steps: plain SGD at learning rate
  1, or RMSProp with research/slim's defaults (learning rate 0.01, decay
  0.9, momentum 0.9, epsilon 1.0);
* 2 to 4 steps on finite batches;
* a bad batch fed mid-training (`BAD_VALUES`: NaN, +inf or -inf, in one
  element or the whole batch) through the loss alone (`sess.run(loss)`: no
  train op, no update ops), through a step whose optimizer skips
  non-finite gradients (TF 1's `MixedPrecisionLossScaleOptimizer` with a
  dynamic loss scale, as mixed precision trains) or through a plain step
  (the model dies with it, as float training does);
* an overlapping run at step 1 or 2 (`overlap`): research/slim's Supervisor
  runs the summary op in a thread beside the training step, and both run
  the model. Made deterministic: the second run, on the next batch, is fed
  at each range read that no update precedes the value the first run read,
  as if both read before either wrote (where the bias-corrected rates are 1
  and 1 / (1 + decay)).

`train()` runs a regime on a built graph (rewritten or float) and returns a
`Trace`: after each run, every range and skipped-batch counter of qat's,
and the ranges each FakeQuant read in it; around the bad batch, the model's
variables and which FakeQuants read a non-finite tensor.
"""
import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st
from tensorflow.core.protobuf import rewriter_config_pb2

from qat.engine import marks
from qat.quantize.emit import finite_ranges
from qat.tflite import graph_structure as structure
from tools.property import branch_graphs

OPTIMIZERS = ("sgd_1", "rmsprop_slim")
BAD_VALUES = ("none", "nan", "inf", "-inf")
BAD_EXTENTS = ("element", "batch")
BAD_VIAS = ("loss", "skipping_step", "step")
OVERLAPS = (0, 1, 2)
MAX_STEPS = 4


@dataclasses.dataclass(frozen=True)
class Regime:
    """A short training run; see the module docstring."""
    optimizer: str = "sgd_1"
    steps: int = 2
    bad_value: str = "none"
    bad_extent: str = "element"
    bad_via: str = "loss"
    bad_after: int = 1
    overlap: int = 0

    def size(self) -> int:
        """A measure to pick the smallest of several failing networks."""
        return (self.steps + (self.optimizer != "sgd_1") + (self.bad_value != "none") * 3
                + (self.bad_via != "loss") + (self.bad_extent != "element")
                + (self.overlap != 0) * 3)

    def describe(self) -> str:
        """One line, for reports."""
        text = f"{self.optimizer}, {self.steps} steps"
        if self.bad_value != "none":
            text += (f", a {self.bad_value} {self.bad_extent} after step {self.bad_after} "
                     f"through the {self.bad_via.replace('_', ' ')}")
        if self.overlap:
            text += f", a run overlapping step {self.overlap}"
        return text


def is_valid(r: Regime) -> bool:
    """True if `regimes()` can draw `r`."""
    if (r.optimizer not in OPTIMIZERS or r.bad_value not in BAD_VALUES
            or r.bad_extent not in BAD_EXTENTS or r.bad_via not in BAD_VIAS
            or r.overlap not in OVERLAPS or not 2 <= r.steps <= MAX_STEPS):
        return False
    if r.bad_value == "none":
        return r.bad_extent == "element" and r.bad_via == "loss" and r.bad_after == 1
    return 1 <= r.bad_after < r.steps


@st.composite
def regimes(draw) -> Regime:
    """Hypothesis strategy: `Regime`s."""
    steps = draw(st.integers(2, MAX_STEPS))
    fields = dict(optimizer=draw(st.sampled_from(OPTIMIZERS)), steps=steps,
                  overlap=draw(st.sampled_from(OVERLAPS)))
    bad = draw(st.sampled_from(BAD_VALUES))
    if bad != "none":
        fields.update(bad_value=bad, bad_extent=draw(st.sampled_from(BAD_EXTENTS)),
                      bad_via=draw(st.sampled_from(BAD_VIAS)),
                      bad_after=draw(st.integers(1, steps - 1)))
    return Regime(**fields)


def simpler(r: Regime):
    """`Regime`s one step simpler than `r` (for shrinking; maybe invalid)."""
    if r.bad_value != "none":
        yield dataclasses.replace(r, bad_value="none", bad_extent="element", bad_via="loss",
                                  bad_after=1)
    if r.overlap:
        yield dataclasses.replace(r, overlap=0)
    if r.steps > 2:
        yield dataclasses.replace(r, steps=r.steps - 1)
    for field, value in (("optimizer", "sgd_1"), ("bad_via", "loss"),
                         ("bad_extent", "element"), ("bad_after", 1)):
        if getattr(r, field) != value:
            yield dataclasses.replace(r, **{field: value})


def bad_batch(batch: np.ndarray, r: Regime) -> np.ndarray:
    """`batch` with its middle element (or every element) set to the bad value."""
    value = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[r.bad_value]
    bad = np.array(batch, np.float32)
    if r.bad_extent == "batch":
        bad[...] = value
    else:
        bad.reshape(-1)[bad.size // 4] = value
    return bad


def optimizer(r: Regime) -> tf.compat.v1.train.Optimizer:
    """The regime's optimizer (skipping non-finite steps where `bad_via` says so)."""
    if r.optimizer == "rmsprop_slim":
        opt = tf.compat.v1.train.RMSPropOptimizer(0.01, decay=0.9, momentum=0.9, epsilon=1.0)
    else:
        opt = tf.compat.v1.train.GradientDescentOptimizer(1.0)
    if r.bad_value != "none" and r.bad_via == "skipping_step":
        opt = tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer(opt, "dynamic")
    return opt


def session(graph: tf.Graph) -> tf.compat.v1.Session:
    """A one-thread session without Grappler (the checks are about qat's graph)."""
    rewrite_options = rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
        graph_options=tf.compat.v1.GraphOptions(rewrite_options=rewrite_options))
    return tf.compat.v1.Session(graph=graph, config=config)


def range_variables(graph: tf.Graph) -> Dict[str, tuple]:
    """{range name: (min variable, max variable)} of qat's ranges (weights' too)."""
    found: Dict[str, dict] = {}
    for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        scope, _, end = v.op.name.rpartition("/")
        if end in ("min", "max") and marks.made_by_qat(v.op, marks.QUANTIZER):
            found.setdefault(scope, {})[end] = v
    return {scope: (ends["min"], ends["max"]) for scope, ends in found.items()
            if len(ends) == 2}


def stale_reads(graph: tf.Graph, ranges: Dict[str, tuple]) -> Dict[tf.Tensor, object]:
    """{read of a range variable that no update precedes: the variable}."""
    variables = {v.op: v for pair in ranges.values() for v in pair}
    return {op.outputs[0]: variables[op.inputs[0].op] for op in graph.get_operations()
            if op.type in ("Snapshot", "Identity", "ReadVariableOp")
            and op.inputs and op.inputs[0].op in variables and not op.control_inputs}


@dataclasses.dataclass
class Run:
    """One session run of a training: what it ran and what it left."""
    kind: str                      # "step", "bad" or "overlap" (the second run)
    step: int                      # the finite steps before and with it
    loss: Optional[float] = None
    error: Optional[str] = None
    ranges: Dict[str, tuple] = dataclasses.field(default_factory=dict)    # after the run
    counters: Dict[str, int] = dataclasses.field(default_factory=dict)    # after the run
    reads: Dict[str, tuple] = dataclasses.field(default_factory=dict)     # FakeQuant: (min, max)
    # The bad run only:
    ranges_before: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    counters_before: Dict[str, int] = dataclasses.field(default_factory=dict)
    model_before: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    model_after: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    nonfinite: Dict[str, str] = dataclasses.field(default_factory=dict)  # range: FakeQuant

    @property
    def finite_batch(self) -> bool:
        return self.kind != "bad"

    @property
    def diverged(self) -> bool:
        return self.finite_batch and (self.error is not None or self.loss is None
                                      or not np.isfinite(self.loss))


@dataclasses.dataclass
class Trace:
    """What `train` saw: its runs, the model at the end, the last step's extra values."""
    runs: List[Run]
    model: Dict[str, np.ndarray]
    extra: object = None

    @property
    def diverged(self) -> bool:
        """A finite batch's loss went non-finite, a run failed, or a model variable did."""
        return (any(r.diverged for r in self.runs)
                or any(not np.all(np.isfinite(v)) for v in self.model.values()
                       if np.issubdtype(np.asarray(v).dtype, np.floating)))

    def first_divergence(self) -> str:
        for r in self.runs:
            if r.diverged:
                return f"{r.kind} run at step {r.step}: " + (r.error or f"loss {r.loss}")
        return "a model variable is not finite at the end"


@dataclasses.dataclass
class Trainee:
    """A built graph to train: its feed, loss and the model's own variables."""
    graph: tf.Graph
    input: tf.Tensor
    loss: tf.Tensor
    model_variables: List[object]


def _values(sess, fetches: dict) -> dict:
    return sess.run(fetches) if fetches else {}


def train(trainee: Trainee, regime: Regime, batch: Callable[[int], np.ndarray],
          checkpoint: Optional[str] = None, last_fetches=None) -> Trace:
    """Trains `trainee` as `regime` says.

    Args:
      trainee: the graph (rewritten or float), built and ready for its optimizer.
      regime: how to train it.
      batch: step -> the finite batch of that step (steps from 1).
      checkpoint: where to save the trained variables, if anywhere.
      last_fetches: fetched with the last step (`Trace.extra`).

    Returns:
      The `Trace` of the runs.
    """
    graph = trainee.graph
    with graph.as_default():
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        # TF 1's cond: the skipping optimizer's v2 cond takes no ref variables.
        with tf.control_dependencies(updates), branch_graphs.control_flow("v1"):
            train_op = optimizer(regime).minimize(
                trainee.loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        ranges = range_variables(graph)
        counters = {v.op.name.rsplit("/", 1)[0]: v for v in
                    graph.get_collection(finite_ranges.SKIPPED_BATCHES_COLLECTION)}
        fake_quants = [op for op in structure.fake_quant_ops(graph)
                       if structure.quantizer_op(op).min_variable]
        reads = {op.name: (op.inputs[1], op.inputs[2]) for op in fake_quants}
        finite = {op.name: tf.reduce_all(tf.math.is_finite(op.inputs[0])) for op in fake_quants}
        range_of = {op.name: structure.quantizer_op(op).min_variable.rsplit("/", 1)[0]
                    for op in fake_quants}
        stale = stale_reads(graph, ranges)
        observers = graph.get_collection(branch_graphs.OBSERVER_FETCHES)
        model = {v.op.name: v for v in trainee.model_variables}
        init = [tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer()]
        saver = tf.compat.v1.train.Saver() if checkpoint else None
    runs: List[Run] = []
    extra = None
    with session(graph) as sess:
        sess.run(init)

        def record(run: Run, fetches: dict, feed: dict) -> dict:
            try:
                values = sess.run(fetches, feed)
                run.loss = float(values["loss"])
                run.reads = values["reads"]
            except tf.errors.OpError as e:
                values = {}
                run.error = f"{type(e).__name__}: {str(e).splitlines()[0]}"[:300]
            run.ranges = _values(sess, ranges)
            run.counters = {k: int(v) for k, v in _values(sess, counters).items()}
            runs.append(run)
            return values

        step = 0
        while step < regime.steps:
            step += 1
            feed = {trainee.input: batch(step)}
            fetches = {"op": train_op, "loss": trainee.loss, "reads": reads}
            if step == regime.steps:
                fetches["observers"] = observers
                if last_fetches is not None:
                    fetches["extra"] = last_fetches
            overlapped = step == regime.overlap
            before = dict(zip(stale, sess.run(list(stale.values())))) if overlapped else {}
            values = record(Run("step", step), fetches, feed)
            extra = values.get("extra", extra)
            if overlapped:  # The summary thread's run, begun before the step wrote.
                record(Run("overlap", step), {"loss": trainee.loss, "reads": reads,
                                              "observers": observers},
                       {trainee.input: batch(step + 1), **before})
            if regime.bad_value != "none" and step == regime.bad_after:
                run = Run("bad", step, ranges_before=_values(sess, ranges),
                          counters_before={k: int(v) for k, v in _values(sess, counters).items()},
                          model_before=_values(sess, model))
                op = trainee.loss if regime.bad_via == "loss" else train_op
                values = record(run, {"op": op, "loss": trainee.loss, "reads": reads,
                                      "finite": finite},
                                {trainee.input: bad_batch(batch(step), regime)})
                run.model_after = _values(sess, model)
                run.nonfinite = {range_of[name]: name
                                 for name, ok in values.get("finite", {}).items() if not ok}
        final = _values(sess, model)
        if saver is not None:
            saver.save(sess, checkpoint)
    return Trace(runs, final, extra)
