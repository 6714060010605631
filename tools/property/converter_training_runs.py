"""Networks trained as users train them, then converted (issue #37): the converter suite's training family.

A `ConverterTrainingRun` is a random network of
tools/property/converter_networks.py, a `tools.property.training_loop.Regime`
(RMSProp with slim's defaults or SGD at learning rate 1, a few steps, maybe a
NaN or infinite batch mid-training, maybe a run overlapping a step) and a
`tools.property.training_branches.Branches` (a reader of a block output, an
auxiliary head, a drop path, observers). `check_run()` builds and rewrites
its training graph (`experimental_create_training_graph(symmetric_weights=True)`),
trains it as the regime says and saves it; then, unless training diverged
(where float training, built and trained alike, must diverge too), every
invariant of tools/property/converter_invariants.py holds on its eval graph
(the model alone: no branch, no observer) restored strictly from the
checkpoint and converted to uint8 and int8, and every invariant of
tools/property/training_invariants.py on the training.
"""
import dataclasses
import os
import shutil
import tempfile
from typing import Dict, Iterator, Optional

from hypothesis import strategies as st

from qat.export import kernel_checks
from tools.property import converter_invariants
from tools.property import converter_networks as networks
from tools.property import converter_graphs
from tools.property import shrinking
from tools.property import training_branches as branches_lib
from tools.property import branch_graphs
from tools.property import training_invariants as checks
from tools.property import training_loop
from tools.property import training_runs as rewrite_training_runs

INVARIANTS = converter_invariants.INVARIANTS + tuple(
    n for n in checks.INVARIANTS if n not in converter_invariants.INVARIANTS)
_SETTINGS = dict(symmetric_weights=True)
_LAYER_KINDS = ("conv", "depthwise", networks.GROUPED)


@dataclasses.dataclass(frozen=True)
class ConverterTrainingRun(rewrite_training_runs.TrainingRun):
    """A converter-suite network, how it is trained, and what its training graph has besides it."""
    net: networks.ConvNet


def _activations(net: networks.ConvNet):
    return [b.activation if b.kind in _LAYER_KINDS else None for b in net.blocks]


@st.composite
def training_runs(draw, max_depth: int = 4, grouped: bool = False) -> ConverterTrainingRun:
    """Hypothesis strategy: valid `ConverterTrainingRun`s."""
    net = draw(networks.conv_networks(max_depth, grouped=grouped))
    return ConverterTrainingRun(net, draw(training_loop.regimes()),
                                draw(branches_lib.branches(len(net.blocks), _activations(net))))


def is_valid(run: ConverterTrainingRun) -> bool:
    """True if `training_runs()` can draw `run`."""
    return rewrite_training_runs.is_valid(run, networks.is_valid, _activations)


def simpler(run: ConverterTrainingRun) -> Iterator[ConverterTrainingRun]:
    """Runs one step simpler than `run` (for shrinking; maybe invalid)."""
    return rewrite_training_runs.simpler(run, networks.simpler)


def shrink(run: ConverterTrainingRun, still_fails, budget: int = 40) -> ConverterTrainingRun:
    """Greedily simplifies `run` while `still_fails(candidate)` holds."""
    return shrinking.greedy(run, simpler, is_valid, still_fails, budget)


def build(run: ConverterTrainingRun, mode: str, seed: int = 0, branches_on: bool = True,
          observers_on: bool = True):
    """(the built network, its `BranchHooks`) in `mode` (EVAL: the converted graph)."""
    hooks = branch_graphs.BranchHooks(run.branches, mode, branches_on, observers_on)
    built = converter_graphs.build(run.net, training=mode == branches_lib.TRAINING, seed=seed,
                           batch=converter_invariants.TRAIN_BATCH, hooks=hooks)
    return built, hooks


def _model_ranges(rewritten: checks.Rewritten) -> dict:
    """`converter_invariants.ranges` of a training graph, less its branches' ranges
    (which `branches_keep_ranges` checks): what the converted eval graph must have."""
    found = converter_invariants.ranges(rewritten.built)
    branch = {name for name, t in found["quantizers"].items()
              if t.op in rewritten.hooks.branch_ops}
    found["quantizers"] = {n: t for n, t in found["quantizers"].items() if n not in branch}
    found["variables"] = {n: s for n, s in found["variables"].items()
                          if n.rsplit("/", 1)[0] not in branch}
    return found


def _record(results: Dict[str, Optional[str]], name: str, problems) -> None:
    if problems and results.get(name) is None:
        results[name] = "; ".join(problems)[:600]


def check_run(run: ConverterTrainingRun, seed: int = 0) -> Dict[str, Optional[str]]:
    """Checks every invariant of `INVARIANTS` on `run`.

    Returns:
      {invariant: None if it holds, else a message}.
    """
    results: Dict[str, Optional[str]] = {name: None for name in INVARIANTS}
    training = branches_lib.TRAINING
    workdir = tempfile.mkdtemp(prefix="qat_converter_training_")
    stage = ["training graph"]
    try:
        plus = checks.rewrite(*build(run, training, seed), is_training=True, **_SETTINGS)
        if plus.hooks.head_on or plus.hooks.drop_on or plus.hooks.observers_on:
            zero = checks.rewrite(*build(run, training, seed, False, False), is_training=True,
                                  **_SETTINGS)
            branch, observer = checks.extras_problems(plus, zero, "training")
            _record(results, "branches_keep_ranges", branch)
            _record(results, "observers_not_model", observer)
        range_check = kernel_checks.RangeCheck(plus.graph)
        model_ranges = _model_ranges(plus)
        stage[0] = "training"
        checkpoint = os.path.join(workdir, "model")
        batch = lambda step: networks.inputs(run.net, converter_invariants.TRAIN_BATCH,
                                             seed + step)
        trace = training_loop.train(checks.trainee(plus), run.regime, batch,
                                    checkpoint=checkpoint, last_fetches=range_check.fetches)
        _record(results, "ranges_finite", checks.range_problems(trace))
        trainable = {v.op.name for v in plus.model_variables if v.trainable}
        skipped, model = checks.bad_batch_problems(trace, run.regime, trainable)
        _record(results, "nonfinite_batch_skipped", skipped)
        _record(results, "bad_batch_keeps_model", model)
        if trace.diverged:  # Nothing to convert: float must diverge too.
            stage[0] = "float training"
            float_trace = lambda: training_loop.train(checks.trainee(checks.rewrite(
                *build(run, training, seed), is_training=True, quantize=False)), run.regime,
                batch)
            _record(results, "trains_like_float",
                    [p for p in [checks.divergence_problem(trace, float_trace)] if p])
            return results
        if trace.extra is not None:
            converter_invariants._record(  # pylint: disable=protected-access
                results, "kernel_preconditions", "training graph",
                converter_invariants._describe(  # pylint: disable=protected-access
                    range_check.violations(trace.extra)))
        stage[0] = "eval graph"
        converter_invariants.check_export(
            run.net, checkpoint, model_ranges, results, seed,
            hooks=branch_graphs.BranchHooks(run.branches, branches_lib.EVAL,
                                           branches_on=False, observers_on=False),
            stage=stage)
    except Exception as e:  # pylint: disable=broad-except
        if stage[0] in ("training graph", "training", "float training"):
            results["training_run_succeeds"] = f"{stage[0]}: {type(e).__name__}: {e}"[:600]
        else:
            converter_invariants.record_failure(results, stage[0], e)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def violations(run: ConverterTrainingRun, seed: int = 0) -> Dict[str, str]:
    """The violated invariants only."""
    return {k: v for k, v in check_run(run, seed).items() if v is not None}


def example_runs() -> Dict[str, ConverterTrainingRun]:
    """Fixed runs with issue #37's patterns (regression seeds for the bounded test)."""
    block = networks.ConvBlock
    return {
        # Item 1: ResNet's end (a global pool of a ReLU, logits) trained with
        # RMSProp as slim's script does, its summary thread beside step 1.
        "resnet_end_overlapping": ConverterTrainingRun(
            networks.ConvNet(4, "scale_offset", (
                block("conv", 4, batch_norm=True), block("global_pool", variant="mean")),
                head="logits"),
            training_loop.Regime("rmsprop_slim", 3, overlap=1),
            branches_lib.Branches(observers=("histogram", "zero_fraction"), control_flow="v1")),
        # Item 4: a NaN element through the loss alone mid-training, then an
        # export of the checkpoint.
        "nan_then_export": ConverterTrainingRun(
            networks.ConvNet(4, "none", (block("conv", 4, batch_norm=True),), head="softmax"),
            training_loop.Regime("sgd_1", 3, "nan", bad_after=1)),
        # A squeeze-excite block's multiply read through a ReLU6 (TFLite fuses
        # it into the MUL), watched by a histogram and a control flow v2
        # assert (an `If` guard): neither unfuses it in the training graph.
        "observed_fused_multiply": ConverterTrainingRun(
            networks.ConvNet(8, "scale_offset", (
                block("se", 2, variant="sigmoid"),
                block("conv", 5, stride=2, kernel=1, batch_norm=True, activation="none")),
                head="logits"),
            training_loop.Regime("sgd_1", 2),
            branches_lib.Branches(reader="relu6", observers=("assert", "histogram"),
                                  control_flow="v2")),
        # Item 2: PNASNet's head, before the next cell's identical ReLU.
        "aux_head_export": ConverterTrainingRun(
            networks.ConvNet(4, "none", (block("conv", 4), block("conv", 4))),
            training_loop.Regime("rmsprop_slim", 2),
            branches_lib.Branches(reader="relu", aux="block_output", aux_reader="relu")),
    }
