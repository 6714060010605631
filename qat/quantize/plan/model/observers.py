"""Observers: ops that watch the model's tensors and feed nothing the model computes.

A training graph reads the model's tensors for more than the loss:
summaries (research/slim's histogram and `tf.nn.zero_fraction` of every end
point), metric updates, `tf.print` / `tf.Print`, asserts and numeric checks.
None of them is a model op, and none is a model output left float: what
they compute ends in a summary, a print, an assert or a variable update
(a metric's count, a moving average) and nowhere else. `find_observers` finds
them by structure (op types, and which ops read which), so the planner gives
them no "left float" entry (`qat.quantize.plan.model.boundary`).

An op is an observer when

* it is an observation sink (`SINK_TYPES`: summaries, Assert, PrintV2) or a
  variable update (`qat.quantize.plan.ops.patterns.is_state_update`);
* it checks or prints a value on the way (`PASS_THROUGH_TYPES`: Print,
  CheckNumerics), or is the Identity such a check orders (what
  `tf.debugging.assert_all_finite` returns), and only observers read it, if
  anything does;
* or something reads it and every reader is an observer (a Switch of TF1's
  `cond` whose other branch is unread, the arithmetic of a metric update).

Shapes and sizes (`METADATA_TYPES`) read no values and do not count as
readers. Gradient ops and model ops are never observers, so a tensor the
loss's gradient reads is not an observer's.

Observers only lose their warnings: they never take an op out of the model.
A loss that only a summary reads (slim builds the optimizer after the
rewrite) has the structure of an observer, and a model op before it must
keep its range, as in the export graph, for a strict restore of the
training checkpoint there.
"""
from typing import Iterable, Set

import tensorflow as tf

from qat.engine import function_library
from qat.quantize.plan.ops import patterns as qp

# Ops that consume what they watch and compute nothing the model reads.
SINK_TYPES = frozenset([
    "ScalarSummary", "HistogramSummary", "ImageSummary", "AudioSummary",
    "AudioSummaryV2", "TensorSummary", "TensorSummaryV2", "MergeSummary",
    "WriteSummary", "WriteScalarSummary", "WriteHistogramSummary",
    "WriteImageSummary", "WriteAudioSummary", "WriteRawProtoSummary",
    "Assert", "PrintV2",
])
# Ops that return their input unchanged, checked or printed on the way: the
# model's when it reads their output.
PASS_THROUGH_TYPES = frozenset(["Print", "CheckNumerics", "CheckNumericsV2"])


# Functional conditionals: TF 2's control flow builds an assert's guard as one
# (`tf.debugging.assert_*` with control flow v2: AssertGuard).
_MERGE_TYPES = frozenset(["Merge", "RefMerge"])
# What else a guard's branches may hold besides sinks.
_INERT_TYPES = frozenset(["NoOp", "Identity", "Const", "Placeholder"])


def _branches_only_observe(op: tf.Operation) -> bool:
    """Whether every branch of the conditional `op` holds only sinks and
    inert ops, and nothing reads its outputs' values (but for an Identity
    nothing reads: the guard's own output)."""
    if any(c.type != "Identity" or any(o.consumers() for o in c.outputs)
           for out in op.outputs for c in out.consumers()):
        return False
    for attr in ("then_branch", "else_branch"):
        try:
            name = op.get_attr(attr).name
        except ValueError:
            return False
        function = op.graph._get_function(name)  # pylint: disable=protected-access
        if function is None:
            return False
        if any(node.op not in SINK_TYPES and node.op not in _INERT_TYPES
               for node in function.definition.node_def):
            return False
    return True


def _is_assert_guard(op: tf.Operation) -> bool:
    """TF 1's guard of an assert (`tf.debugging.assert_*` with control flow v1):
    an unread Merge of its cond's branches, one of which ends in the Identity
    the Assert orders."""
    return (op.type in _MERGE_TYPES and not any(o.consumers() for o in op.outputs)
            and any(is_check(i.op) for i in op.inputs))


def is_sink(op: tf.Operation) -> bool:
    """An observation sink (an assert's guard too) or a variable update."""
    return (op.type in SINK_TYPES or qp.is_state_update(op)
            or (op.type in function_library.CONDITIONAL_TYPES and _branches_only_observe(op))
            or _is_assert_guard(op))


def is_check(op: tf.Operation) -> bool:
    """A pass-through check, or an Identity a check or sink orders (the
    checked value an assert returns)."""
    return op.type in PASS_THROUGH_TYPES or (
        op.type == "Identity" and any(c.type in PASS_THROUGH_TYPES or c.type in SINK_TYPES
                                      for c in op.control_inputs))


def find_observers(candidates: Iterable[tf.Operation]) -> Set[tf.Operation]:
    """The observers among `candidates` (see the module docstring).

    Args:
      candidates: the ops that may be observers: the data ops outside the
        model (never gradient ops). An op outside them is an observer only
        when it is a sink.

    Returns:
      The observers among `candidates`.
    """
    candidates = set(candidates)
    observers: Set[tf.Operation] = set()

    def is_observer(op: tf.Operation) -> bool:
        if is_sink(op):
            return True
        readers = [c for out in op.outputs for c in out.consumers()
                   if c.type not in qp.METADATA_TYPES]
        return all(c in observers or is_sink(c) for c in readers) and (
            bool(readers) or is_check(op))

    # Readers first (popped from the end), then back to what they read; graph
    # order is no topological order (TF1's cond creates a Switch after the op
    # reading it), so an op is looked at again when a reader becomes one.
    pending = sorted(candidates, key=lambda o: o._id)  # pylint: disable=protected-access
    while pending:
        op = pending.pop()
        if op in observers or not is_observer(op):
            continue
        observers.add(op)
        pending.extend(i.op for i in op.inputs if i.op in candidates and i.op not in observers)
    return observers
