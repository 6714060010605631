"""Networks trained as users train them (issue #37): the rewrite suite's training family.

A `TrainingRun` is a random network of tools/property/networks.py (depth 1
to 4), a `tools.property.training_loop.Regime` (RMSProp with slim's
defaults or SGD at learning rate 1, a few steps, maybe a NaN or infinite
batch mid-training, maybe a run overlapping a step) and a
`tools.property.training_branches.Branches` (an auxiliary head, a drop path,
observers). `check_run()` builds it as training, eval and export graphs
(with and without the branches and observers), rewrites them with
`create_training_graph` / `create_eval_graph`'s settings, trains the
training graph as the regime says, and holds it to the invariants of
tools/property/training_invariants.py.
"""
import dataclasses
from typing import Callable, Dict, Iterator, Optional

from hypothesis import strategies as st

from tools.property import networks
from tools.property import network_graphs
from tools.property import shrinking
from tools.property import training_branches as branches_lib
from tools.property import branch_graphs
from tools.property import training_invariants as checks
from tools.property import training_loop

MAX_DEPTH = 4
INVARIANTS = checks.INVARIANTS


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """A network, how it is trained, and what its training graph has besides it."""
    net: networks.Network
    regime: training_loop.Regime = training_loop.Regime()
    branches: branches_lib.Branches = branches_lib.Branches()

    def size(self) -> int:
        """A measure to pick the smallest of several failing runs."""
        return self.net.size() + self.regime.size() + self.branches.size()

    def describe(self) -> str:
        """The network's lines, then the training's."""
        return (f"{self.net.describe()}\n  trained: {self.regime.describe()}\n"
                f"  besides the model: {self.branches.describe()}")


@st.composite
def training_runs(draw, max_depth: int = MAX_DEPTH) -> TrainingRun:
    """Hypothesis strategy: valid `TrainingRun`s (networks of depth 1..max_depth, at most 4)."""
    net = draw(networks.networks(max_depth=min(max_depth, MAX_DEPTH)))
    return TrainingRun(net, draw(training_loop.regimes()),
                       draw(branches_lib.branches(len(net.blocks), _activations(net))))


def _activations(net: networks.Network):
    return [b.activation for b in net.blocks]


def is_valid(run: TrainingRun, net_is_valid: Callable = networks.is_valid,
             activations: Callable = _activations) -> bool:
    """True if `training_runs()` can draw `run` (the converter suite's runs:
    with its networks' `net_is_valid` and `activations`)."""
    return (net_is_valid(run.net) and training_loop.is_valid(run.regime)
            and branches_lib.is_valid(run.branches, len(run.net.blocks), activations(run.net)))


def simpler(run: TrainingRun, net_simpler: Callable = networks.simpler) -> Iterator[TrainingRun]:
    """Runs one step simpler than `run` (for shrinking; maybe invalid); the
    network one step simpler by `net_simpler`."""
    for b in branches_lib.simpler(run.branches):
        yield dataclasses.replace(run, branches=b)
    for r in training_loop.simpler(run.regime):
        yield dataclasses.replace(run, regime=r)
    for n in net_simpler(run.net):
        yield dataclasses.replace(run, net=n)


def shrink(run: TrainingRun, still_fails, budget: int = 40) -> TrainingRun:
    """Greedily simplifies `run` while `still_fails(candidate)` holds."""
    return shrinking.greedy(run, simpler, is_valid, still_fails, budget)


def build(run: TrainingRun, mode: str, seed: int = 0, branches_on: bool = True,
          observers_on: bool = True):
    """(the built network, its `BranchHooks`) in `mode` (training_branches' TRAINING, EVAL, EXPORT)."""
    hooks = branch_graphs.BranchHooks(run.branches, mode, branches_on, observers_on)
    built = network_graphs.build(run.net, training=mode == branches_lib.TRAINING, seed=seed,
                           export=mode == branches_lib.EXPORT, hooks=hooks)
    return built, hooks


def _has_extras(hooks: branch_graphs.BranchHooks) -> bool:
    return hooks.head_on or hooks.drop_on or hooks.observers_on


def _record(results: Dict[str, Optional[str]], name: str, problems) -> None:
    if problems and results.get(name) is None:
        results[name] = "; ".join(problems)[:600]


def check_run(run: TrainingRun, seed: int = 0) -> Dict[str, Optional[str]]:
    """Checks every invariant of `INVARIANTS` on `run`.

    Returns:
      {invariant: None if it holds, else a message}.
    """
    results: Dict[str, Optional[str]] = {name: None for name in INVARIANTS}
    training, evaluation, export = branches_lib.TRAINING, branches_lib.EVAL, branches_lib.EXPORT
    stage = "training graph"
    try:
        plus = checks.rewrite(*build(run, training, seed), is_training=True)
        zero = plus
        if _has_extras(plus.hooks):
            zero = checks.rewrite(*build(run, training, seed, False, False), is_training=True)
            branch, observer = checks.extras_problems(plus, zero, "training")
            _record(results, "branches_keep_ranges", branch)
            _record(results, "observers_not_model", observer)
        stage = "eval graph"
        eval_plus = checks.rewrite(*build(run, evaluation, seed), is_training=False)
        eval_zero = eval_plus
        if _has_extras(eval_plus.hooks):
            eval_zero = checks.rewrite(*build(run, evaluation, seed, False, False),
                                       is_training=False)
            branch, observer = checks.extras_problems(
                eval_plus, eval_zero, "eval", renames_allowed=eval_plus.hooks.head_on)
            _record(results, "branches_keep_ranges", branch)
            _record(results, "observers_not_model", observer)
        stage = "export graph"
        exported = checks.rewrite(*build(run, export, seed), is_training=False)
        _record(results, "branches_keep_ranges",
                checks.restore_problems(eval_plus.variables, plus.variables, "eval")
                + checks.restore_problems(exported.variables, plus.variables, "export")
                + checks.restored_range_problems(exported, zero, "export")
                + checks.restored_range_problems(eval_zero, zero, "eval"))
        stage = "training"
        batch = lambda step: networks.inputs(run.net, seed + step)
        trace = training_loop.train(checks.trainee(plus), run.regime, batch)
        _record(results, "ranges_finite", checks.range_problems(trace))
        trainable = {v.op.name for v in plus.model_variables if v.trainable}
        skipped, model = checks.bad_batch_problems(trace, run.regime, trainable)
        _record(results, "nonfinite_batch_skipped", skipped)
        _record(results, "bad_batch_keeps_model", model)
        stage = "float training"
        float_trace = lambda: training_loop.train(checks.trainee(checks.rewrite(
            *build(run, training, seed), is_training=True, quantize=False)), run.regime, batch)
        if trace.diverged:
            _record(results, "trains_like_float",
                    [p for p in [checks.divergence_problem(trace, float_trace)] if p])
    except Exception as e:  # pylint: disable=broad-except
        results["training_run_succeeds"] = f"{stage}: {type(e).__name__}: {e}"[:600]
    return results


def violations(run: TrainingRun, seed: int = 0) -> Dict[str, str]:
    """The violated invariants only."""
    return {k: v for k, v in check_run(run, seed).items() if v is not None}


def example_runs() -> Dict[str, TrainingRun]:
    """Fixed runs with issue #37's patterns (regression seeds for the bounded test)."""
    conv = networks.Block("conv", 3, "bias_add", "fused", "relu", "none", "none")
    concat = dataclasses.replace(conv, concat="block_input")
    return {
        # Issue #37 item 4: a NaN element through the loss alone, mid-training,
        # a batch norm folded; then training goes on.
        "nan_through_loss": TrainingRun(
            networks.Network(4, True, (conv,), head="squeeze"),
            training_loop.Regime("rmsprop_slim", 3, "nan", bad_after=1)),
        # An infinite batch through a step that skips non-finite gradients.
        "inf_through_skipping_step": TrainingRun(
            networks.Network(2, False, (networks.Block("dense", 3, "plus", "unfused", "relu6",
                                                       "none", "none"),)),
            training_loop.Regime("sgd_1", 3, "inf", "batch", "skipping_step", 2)),
        # Item 1: slim's summary thread running the model beside step 1, a
        # global pool of a ReLU read by the logits (ResNet's).
        "overlapping_summary_run": TrainingRun(
            networks.Network(4, True, (conv,), head="squeeze", head_in_scope=False),
            training_loop.Regime("rmsprop_slim", 3, overlap=1),
            branches_lib.Branches(observers=("histogram", "zero_fraction"), control_flow="v1")),
        # Item 2: PNASNet's head, reading a cell's concatenation through a ReLU
        # built before the next cell's identical one, in the cell's scope.
        "aux_head_before_identical_relu": TrainingRun(
            networks.Network(4, True, (concat, conv)),
            training_loop.Regime("sgd_1", 2),
            branches_lib.Branches(reader="relu", aux="block_output", aux_reader="relu",
                                  aux_scope="shared", drop_path="div_mask", drop_block=1)),
        # A drop path after hard-swish, whose x * relu6(x + 3) / 6 ends in a
        # constant multiply: the drop path's scale is 1 / keep, the 1/6 is the
        # model's (a scale of another value is no dropout's).
        "drop_path_after_hard_swish": TrainingRun(
            networks.Network(4, True, (dataclasses.replace(conv, activation="hard_swish"),
                                       conv)),
            training_loop.Regime("sgd_1", 2),
            branches_lib.Branches(drop_path="mask_div", drop_block=0)),
        # A concatenation of ref variables' reads (Snapshot ops in training
        # graphs) whose output an aux head kept in eval graphs reads: its
        # members' ranges are the concatenation's variables in every graph.
        "ref_variable_concat_aux_in_eval": TrainingRun(
            networks.Network(4, False, (networks.Block(
                "atrous", 3, "none", "none", "hard_swish", "post", "net_input",
                dropout="keras", offset=-8.0),), head="reshape", head_in_scope=False,
                head_dropout="keras", feed="tf.data", pipeline="reshape", loss="mse_const"),
            training_loop.Regime("sgd_1", 2, overlap=1),
            branches_lib.Branches(aux="block_output", aux_in_eval=True)),
        # Item 3: what slim's script and users watch the model with.
        "observers": TrainingRun(
            networks.Network(4, True, (conv, conv), head="identity"),
            training_loop.Regime("sgd_1", 2),
            branches_lib.Branches(observers=("print", "assert", "accuracy", "auc"),
                                  control_flow="v1")),
    }
