"""The invariants of training (issue #37), for both suites' training families.

Checked on a `tools.property.training_loop.Trace` of a rewritten training
graph trained as its `Regime` says, and on the rewritten graphs built with
and without their `tools.property.training_branches.Branches`:

* `training_run_succeeds`: building, rewriting and training raise nothing (a
  run's TensorFlow error is a divergence, below).
* `ranges_finite`: after every run, and as every FakeQuant read it in the
  run, every range is finite and holds 0: min <= 0 <= max, min < max (the
  bad batch's run and the overlapping runs included).
* `nonfinite_batch_skipped`: in the bad batch's run, every range a FakeQuant
  of a non-finite tensor reads keeps its value bit for bit and counts the
  batch once (`<range>/skipped_batches`); a range that counted it kept its
  value; no counter rises by more than one; the run raises nothing.
* `bad_batch_keeps_model`: a bad batch through the loss alone leaves every
  variable of the model (weights, batch norms' moving statistics) bit for
  bit; through a step that skips non-finite gradients and whose loss was not
  finite, every trainable one.
* `trains_like_float`: where QAT's training diverges (a finite batch's loss
  or a run's result is not finite, or a model variable at the end), the
  float graph, built and trained alike, diverges too.
* `branches_keep_ranges`: the training-only branches rename no range: every
  activation quantizer of the graph built without them is the graph with
  them's, of the same name, quantizing the same model tensor (matched by
  creation order), with its range variables; the graph with them adds
  quantizers on the branches' tensors only; a plain `Saver()` of the eval
  and export graphs restores the training checkpoint (every variable, its
  shape), and the export graph's ranges are those of the training graph
  built without the branches.
* `observers_not_model`: summaries, prints, asserts, checks and metric
  updates add no quantizer, no range variable and no `left_float` entry, in
  training and eval graphs.
"""
import dataclasses
from typing import Callable, Dict, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf

from qat import api
from qat.engine import config as config_lib
from qat.engine import marks
from qat.quantize.plan.ops import dropout_patterns
from qat.tflite import graph_structure as structure
from tools.property import invariants as rewrite_invariants
from tools.property import training_loop

INVARIANTS = (
    "training_run_succeeds",
    "ranges_finite",
    "nonfinite_batch_skipped",
    "bad_batch_keeps_model",
    "trains_like_float",
    "branches_keep_ranges",
    "observers_not_model",
)


@dataclasses.dataclass
class Rewritten:
    """A built graph after its rewrite, and what the checks compare."""
    built: object              # the generator's built network (graph, input, output, loss)
    hooks: object              # its `branch_graphs.BranchHooks`
    ops: List[tf.Operation]    # the graph's ops before the rewrite, in creation order
    model_variables: List[object]
    quantizers: Dict[str, tf.Tensor] = dataclasses.field(default_factory=dict)
    variables: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    left_float: List[str] = dataclasses.field(default_factory=list)

    @property
    def graph(self) -> tf.Graph:
        return self.built.graph


def rewrite(built, hooks, is_training: bool, quantize: bool = True, **settings) -> Rewritten:
    """`built` rewritten by qat (`quantize`; else left float), as `Rewritten`."""
    graph = built.graph
    with graph.as_default():
        model_variables = tf.compat.v1.global_variables()
    out = Rewritten(built, hooks, list(graph.get_operations()), model_variables)
    if not quantize:
        return out
    result = api.rewrite_graph(graph, config_lib.RewriteConfig(is_training=is_training,
                                                                 **settings))
    out.quantizers = rewrite_invariants.activation_quantizers(graph)
    with graph.as_default():
        out.variables = {v.op.name: tuple(v.shape.as_list())
                         for v in tf.compat.v1.global_variables()}
    out.left_float = [item.name for item in result.quantize.left_float]
    return out


def trainee(rewritten: Rewritten) -> training_loop.Trainee:
    built = rewritten.built
    return training_loop.Trainee(built.graph, built.input, built.loss,
                                 rewritten.model_variables)


# --- After each run ---------------------------------------------------------

def _range_problem(lo, hi) -> Optional[str]:
    lo, hi = np.asarray(lo), np.asarray(hi)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        return "not finite"
    if not (np.all(lo <= 0.0) and np.all(hi >= 0.0)):
        return "does not hold 0"
    if not np.all(lo < hi):
        return "is empty"
    return None


def range_problems(trace: training_loop.Trace) -> List[str]:
    """`ranges_finite`: each run's ranges after it, and those its FakeQuants read."""
    problems = []
    for run in trace.runs:
        for what, found in (("after", run.ranges), ("read by", run.reads)):
            for name, (lo, hi) in sorted(found.items()):
                problem = _range_problem(lo, hi)
                if problem:
                    problems.append(f"{run.kind} run {run.step}: range {what} {name} "
                                    f"[{np.min(lo):.4g}, {np.max(hi):.4g}] {problem}")
    return problems[:3]


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def bad_batch_problems(trace: training_loop.Trace, regime: training_loop.Regime,
                       trainable: Set[str]) -> Tuple[List[str], List[str]]:
    """(`nonfinite_batch_skipped` problems, `bad_batch_keeps_model` problems)."""
    skipped, model = [], []
    for run in (r for r in trace.runs if r.kind == "bad"):
        if run.error:
            skipped.append(f"the bad batch's run failed: {run.error}")
            continue
        for name, fake_quant in sorted(run.nonfinite.items()):
            delta = run.counters.get(name, 0) - run.counters_before.get(name, 0)
            if name not in run.counters:
                skipped.append(f"{name} read a non-finite tensor ({fake_quant}) and has no counter")
            elif delta != 1:
                skipped.append(f"{name} read a non-finite tensor ({fake_quant}) and counted "
                               f"{delta} batches")
        for name, count in sorted(run.counters.items()):
            delta = count - run.counters_before.get(name, 0)
            changed = name in run.ranges and not all(
                _same(a, b) for a, b in zip(run.ranges[name], run.ranges_before[name]))
            if delta not in (0, 1):
                skipped.append(f"{name} counted {delta} batches in one run")
            if changed and (delta or name in run.nonfinite):
                skipped.append(f"{name} skipped the batch but changed: "
                               f"{run.ranges_before[name]} -> {run.ranges[name]}")
        keep = None
        if regime.bad_via == "loss":
            keep = set(run.model_before)
        elif regime.bad_via == "skipping_step" and not np.isfinite(run.loss):
            keep = trainable
        for name in sorted(keep or ()):
            if not _same(run.model_before[name], run.model_after[name]):
                model.append(f"{name} changed in a {regime.bad_value} batch's run through the "
                             f"{regime.bad_via.replace('_', ' ')}")
    return skipped[:3], model[:3]


def divergence_problem(quantized: training_loop.Trace,
                       float_trace: Callable[[], training_loop.Trace]) -> Optional[str]:
    """`trains_like_float`: None unless QAT diverged and float, trained alike, did not."""
    if not quantized.diverged:
        return None
    if float_trace().diverged:
        return None
    return f"QAT diverged ({quantized.first_divergence()}); float did not"


# --- Graphs with and without their extras ---------------------------------

def _correspondence(plus: Rewritten, zero: Rewritten) -> Optional[Dict[str, str]]:
    """{op name with extras: its op's name without}, matched by creation order."""
    extras = plus.hooks.branch_ops | plus.hooks.observer_ops
    mine = [op for op in plus.ops if op not in extras]
    if len(mine) != len(zero.ops) or any(a.type != b.type for a, b in zip(mine, zero.ops)):
        return None
    mapping = {a.name: b.name for a, b in zip(mine, zero.ops)}
    for stand_in, model in plus.hooks.stand_ins.items():  # A drop path stands for its input.
        mapping[stand_in] = mapping[model]
    return mapping


def _signature(t: tf.Tensor, mapping: Dict[str, str]) -> tuple:
    """What `t` computes, in the graph without extras' names: identical ops (one
    type, the same inputs and attributes) compute one value."""
    op = t.op
    attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                         for k, v in op.node_def.attr.items()))
    inputs = []
    for i in op.inputs:
        for _ in range(16):  # Back through qat's own ops (a FakeQuant) to the model's.
            if not marks.made_by_qat(i.op) or not i.op.inputs:
                break
            i = i.op.inputs[0]
        inputs.append((mapping.get(i.op.name, i.op.name), i.value_index))
    return op.type, tuple(inputs), attrs, t.value_index


def extras_problems(plus: Rewritten, zero: Rewritten, graph: str,
                    renames_allowed: bool = False) -> Tuple[List[str], List[str]]:
    """(`branches_keep_ranges` problems, `observers_not_model` problems) of `plus`
    against `zero`, the same graph built without its extras.

    A range of either graph is matched by the value its tensor computes (the
    op, by creation order, or an op identical to it: a branch's ReLU of a
    tensor the model's ReLU reads too computes the model's value).
    `renames_allowed`: an eval graph with an auxiliary head whose reader the
    model's identical op shares (the first one built owns the range): only
    what the extras add is checked.
    """
    mapping = _correspondence(plus, zero)
    if mapping is None:
        return [f"{graph}: the graphs differ beyond their extras"], []
    identity = {op.name: op.name for op in zero.ops}
    hooks = plus.hooks
    branch, observer = [], []
    model_list = observer if not hooks.branch_ops else branch
    computed = {_signature(t, identity) for t in zero.quantizers.values()}
    for name, t in sorted(plus.quantizers.items()):
        if t.op in hooks.observer_ops:
            observer.append(f"{graph}: {name} quantizes the observer tensor {t.name}")
        elif (name not in zero.quantizers and t.op not in hooks.branch_ops
              and not renames_allowed and _signature(t, mapping) not in computed):
            model_list.append(f"{graph}: {name} quantizes {t.name}, a range the graph without "
                              f"its extras lacks")
    for name, t in sorted(zero.quantizers.items()):
        if renames_allowed:
            break
        p = plus.quantizers.get(name)
        if p is None:
            model_list.append(f"{graph}: {name} ({t.name}) is missing with the extras")
        elif _signature(p, mapping) != _signature(t, identity):
            model_list.append(f"{graph}: {name} quantizes {p.name} with the extras, {t.name} "
                              f"without")
    for name, shape in sorted(zero.variables.items()):
        if renames_allowed:
            break
        if plus.variables.get(name) != shape:
            model_list.append(f"{graph}: variable {name} {shape} is "
                              f"{plus.variables.get(name)} with the extras")
    ops = {op.name: op for op in plus.ops}
    without = set(zero.left_float)
    for name in plus.left_float:
        op_name, _, index = name.partition(":")
        op = ops.get(op_name)
        if op in hooks.observer_ops:
            observer.append(f"{graph}: the observer tensor {name} is left float")
        elif op not in hooks.branch_ops:
            mapped = mapping.get(op_name, op_name) + (":" + index if index else "")
            if mapped not in without:
                model_list.append(f"{graph}: {name} is left float with the extras only")
    return branch[:3], observer[:3]


def restore_problems(target: Dict[str, tuple], training: Dict[str, tuple],
                     graph: str) -> List[str]:
    """Variables of `graph` a strict restore of the training checkpoint lacks."""
    return [f"{graph}: {p}" for p in
            rewrite_invariants.symmetry_violations(target, training)[:3]]


def _model_tensor(t: tf.Tensor) -> tf.Tensor:
    """`t`, or the model tensor behind qat's pass-through ops (a FakeQuant)."""
    for _ in range(16):
        if not marks.made_by_qat(t.op) or not t.op.inputs or t.op.type not in (
                "Identity", "Select", "SelectV2") and not t.op.type.startswith("FakeQuant"):
            return t
        t = t.op.inputs[1] if t.op.type in ("Select", "SelectV2") else t.op.inputs[0]
    return t


def _is_dropout(op: tf.Operation) -> bool:
    found = dropout_patterns.dropout_ops(op)
    return bool(found) and op in found


def _readers(fake_quant: tf.Operation) -> frozenset:
    """The model ops reading a FakeQuant's output, forward through qat's ops,
    dropout's (training graphs only have it) and Identity ops (an eval
    graph's dropout)."""
    found, stack, seen = set(), [fake_quant], {fake_quant}
    while stack:
        for out in stack.pop().outputs:
            for c in out.consumers():
                if c in seen:
                    continue
                seen.add(c)
                if marks.made_by_qat(c) or c.type == "Identity" or _is_dropout(c):
                    stack.append(c)
                else:
                    found.add(c.name)
    return frozenset(found)


def _value(fake_quant: tf.Operation, feeds: Dict[str, str]) -> Tuple[str, tuple, frozenset]:
    """(tensor name, what its op computes, its readers) of what a FakeQuant quantizes."""
    t = _model_tensor(fake_quant.inputs[0])
    name = lambda x: feeds.get(x.op.name, x.op.name) + f":{x.value_index}"
    attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                         for k, v in t.op.node_def.attr.items()))
    computes = (t.op.type, tuple(name(_model_tensor(i)) for i in t.op.inputs), attrs)
    return name(t), computes, _readers(fake_quant)


def restored_range_problems(target: Rewritten, source: Rewritten, graph: str) -> List[str]:
    """Ranges `target` restores from a checkpoint of `source` (a graph built
    alike, in another mode) that `source` learnt on another value.

    A FakeQuant of `target` reading the range variables `<name>/min|max` must
    quantize what a FakeQuant of `source` reading them quantizes (the range's
    own, or a member of its concatenation's group): the tensor of the same
    name (the fed batch for the fed batch), an op identical to it, or a
    tensor the same model ops read (a batch norm's output, folded apart in
    training and eval graphs).
    """
    learnt: Dict[str, list] = {}  # range name -> the values read with it
    feeds = {source.built.input.op.name: "<fed batch>"}
    for fq in structure.fake_quant_ops(source.graph):
        q = structure.quantizer_op(fq)
        if q.min_variable:
            learnt.setdefault(q.min_variable.rsplit("/", 1)[0], []).append(_value(fq, feeds))
    feeds = {target.built.input.op.name: "<fed batch>"}
    problems = []
    for fq in structure.fake_quant_ops(target.graph):
        q = structure.quantizer_op(fq)
        if not q.min_variable:
            continue
        name = q.min_variable.rsplit("/", 1)[0]
        mine, theirs = _value(fq, feeds), learnt.get(name, [])
        if not theirs:
            problems.append(f"{graph}: {fq.name} reads {name}, no range of the training graph")
        elif not any(a == b for value in theirs for a, b in zip(mine, value)):
            problems.append(f"{graph}: {q.name} quantizes {mine[0]} with {name}, learnt in "
                            f"training on {', '.join(v[0] for v in theirs)}")
    return problems[:3]
