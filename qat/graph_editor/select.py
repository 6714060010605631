"""Selecting ops and tensors (contrib r1.15 `graph_editor.select`).

Filters, boundaries and graph walks. Walks are breadth-first with sets and a
deque: linear in the ops and edges they visit.
"""
import collections
import re
from typing import Callable, List, Optional, Tuple

import tensorflow as tf

from qat.graph_editor import util

__all__ = [
    "can_be_regex",
    "make_regex",
    "filter_ts",
    "filter_ts_from_regex",
    "filter_ops",
    "filter_ops_from_regex",
    "get_name_scope_ops",
    "check_cios",
    "get_ops_ios",
    "compute_boundary_ts",
    "get_within_boundary_ops",
    "get_forward_walk_ops",
    "get_backward_walk_ops",
    "get_walks_intersection_ops",
    "get_walks_union_ops",
    "select_ops",
    "select_ts",
    "select_ops_and_ts",
]

_RE_TYPE = type(re.compile(""))


def can_be_regex(obj) -> bool:
    """Returns True if `obj` is a string or a compiled regex."""
    return isinstance(obj, (str, _RE_TYPE))


def make_regex(obj):
    """Returns a compiled regex from a string or a compiled regex.

    Raises:
      TypeError: if `obj` is neither.
    """
    if isinstance(obj, _RE_TYPE):
        return obj
    if isinstance(obj, str):
        return re.compile(obj)
    raise TypeError("Expected a string or a regex, got: {}".format(type(obj)))


def _get_input_ts(ops) -> List[tf.Tensor]:
    """The unique input tensors of `ops`, in order."""
    ts = []
    seen = set()
    for op in ops:
        for t in op.inputs:
            if t not in seen:
                seen.add(t)
                ts.append(t)
    return ts


def _get_output_ts(ops) -> List[tf.Tensor]:
    """The output tensors of `ops`, in order."""
    ts = []
    for op in ops:
        ts += op.outputs
    return ts


def filter_ts(ops, positive_filter) -> List[tf.Tensor]:
    """Returns the input then output tensors of `ops` passing a filter, unique.

    Args:
      ops: a graph, an op or an iterable of ops.
      positive_filter: a function tensor -> bool, or True to keep all.

    Raises:
      TypeError: if `ops` cannot be converted to a list of ops.
    """
    ops = util.make_list_of_op(ops)
    ts = _get_input_ts(ops)
    util.concatenate_unique(ts, _get_output_ts(ops))
    if positive_filter is not True:
        ts = [t for t in ts if positive_filter(t)]
    return ts


def filter_ts_from_regex(ops, regex) -> List[tf.Tensor]:
    """Returns the tensors of `ops` whose name matches `regex` (re.search)."""
    ops = util.make_list_of_op(ops)
    regex_obj = make_regex(regex)
    return filter_ts(ops, positive_filter=lambda t: regex_obj.search(t.name))


def filter_ops(ops, positive_filter) -> List[tf.Operation]:
    """Returns the ops passing `positive_filter` (a function or True)."""
    ops = util.make_list_of_op(ops)
    if positive_filter is not True:
        ops = [op for op in ops if positive_filter(op)]
    return ops


def filter_ops_from_regex(ops, regex) -> List[tf.Operation]:
    """Returns the ops whose name matches `regex` (re.search, not anchored)."""
    ops = util.make_list_of_op(ops)
    regex_obj = make_regex(regex)
    return filter_ops(ops, lambda op: regex_obj.search(op.name))


def get_name_scope_ops(ops, scope: str) -> List[tf.Operation]:
    """Returns the ops named `scope` or under `scope/` ("/" at the end optional).

    Args:
      ops: a graph, an op or an iterable of ops.
      scope: the name scope (matched literally, not as a regex).
    """
    if scope and scope[-1] == "/":
        scope = scope[:-1]
    prefix = scope + "/"
    return filter_ops(
        ops, lambda op: op.name == scope or op.name.startswith(prefix))


def check_cios(control_inputs=False, control_outputs=None, control_ios=None
               ) -> Tuple[bool, Optional[util.ControlOutputs]]:
    """Validates and normalizes the control input/output flags.

    Args:
      control_inputs: whether to follow control inputs.
      control_outputs: a util.ControlOutputs, or None.
      control_ios: a util.ControlOutputs meaning both (then control_outputs
        must be None), or None.

    Returns:
      (control_inputs, control_outputs).

    Raises:
      TypeError: if a control outputs argument is not a util.ControlOutputs.
      ValueError: if both control_outputs and control_ios are given.
    """
    if control_ios is not None:
        if not isinstance(control_ios, util.ControlOutputs):
            raise TypeError("Expected a util.ControlOutputs for control_ios, "
                            "got: {}".format(type(control_ios)))
        if control_outputs is not None:
            raise ValueError("control_outputs should be None when using control_ios.")
        control_inputs = True
        control_outputs = control_ios
    elif control_outputs is not None:
        if not isinstance(control_outputs, util.ControlOutputs):
            raise TypeError("Expected a util.ControlOutputs for control_outputs, "
                            "got: {}".format(type(control_outputs)))
    if control_outputs is not None:
        control_outputs.update()
    return control_inputs, control_outputs


def _ops_ios(op, control_inputs, control_outputs):
    """Yields the ops connected to `op` (possibly with repeats)."""
    for t in op.inputs:
        yield t.op
    for t in op.outputs:
        yield from t.consumers()
    if control_outputs is not None:
        yield from control_outputs.get(op)
    if control_inputs:
        yield from op.control_inputs


def get_ops_ios(ops, control_inputs=False, control_outputs=None,
                control_ios=None) -> List[tf.Operation]:
    """Returns the ops connected to `ops`, unique, in order.

    Producers of inputs, consumers of outputs, then control outputs and
    control inputs if asked.

    Args:
      ops: an op or an iterable of ops.
      control_inputs, control_outputs, control_ios: see `check_cios`.
    """
    control_inputs, control_outputs = check_cios(
        control_inputs, control_outputs, control_ios)
    ops = util.make_list_of_op(ops)
    res = []
    seen = set()
    for op in ops:
        for other in _ops_ios(op, control_inputs, control_outputs):
            if other not in seen:
                seen.add(other)
                res.append(other)
    return res


def compute_boundary_ts(ops) -> Tuple[List[tf.Tensor], List[tf.Tensor], List[tf.Tensor]]:
    """Computes the boundary tensors of a set of ops.

    Args:
      ops: an op or an iterable of ops.

    Returns:
      (inputs, outputs, inside): inside = tensors both produced and consumed
      by `ops`; outputs = produced tensors except those consumed only by
      `ops`; inputs = consumed tensors not produced by `ops`.
    """
    ops = util.make_list_of_op(ops)
    input_ts = _get_input_ts(ops)
    output_ts = _get_output_ts(ops)
    output_ts_set = set(output_ts)
    ops_set = set(ops)

    inside_ts = []
    only_inside_ts = set()
    for t in input_ts:
        if t not in output_ts_set:
            continue
        inside_ts.append(t)
        if all(consumer in ops_set for consumer in t.consumers()):
            only_inside_ts.add(t)

    inside_ts_set = set(inside_ts)
    outside_output_ts = [t for t in output_ts if t not in only_inside_ts]
    outside_input_ts = [t for t in input_ts if t not in inside_ts_set]
    return outside_input_ts, outside_output_ts, inside_ts


def get_within_boundary_ops(ops, seed_ops, boundary_ops=(), inclusive=True,
                            control_inputs=False, control_outputs=None,
                            control_ios=None) -> List[tf.Operation]:
    """Returns the ops of `ops` reachable from the seeds without crossing the boundary.

    The walk goes through inputs and outputs (and control edges if asked) and
    never expands boundary ops.

    Args:
      ops: the ops to choose from (a graph or an iterable); the result is in
        their order.
      seed_ops: the starting ops.
      boundary_ops: ops where the walk stops.
      inclusive: include the boundary ops reached.
      control_inputs, control_outputs, control_ios: see `check_cios`.

    Raises:
      ValueError: if the seeds and the boundary overlap.
    """
    control_inputs, control_outputs = check_cios(
        control_inputs, control_outputs, control_ios)
    ops = util.make_list_of_op(ops)
    seed_ops = util.make_list_of_op(seed_ops, allow_graph=False)
    boundary_ops = set(util.make_list_of_op(boundary_ops))
    res = set(seed_ops)
    overlap = boundary_ops & res
    if overlap:
        raise ValueError("Boundary is intersecting with the seeds: {}".format(
            sorted(op.name for op in overlap)))
    queue = collections.deque(seed_ops)
    while queue:
        op = queue.popleft()
        for other in _ops_ios(op, control_inputs, control_outputs):
            if other in res:
                continue
            if other in boundary_ops:
                if inclusive:
                    res.add(other)
            else:
                res.add(other)
                queue.append(other)
    return [op for op in ops if op in res]


def _walk_seeds(seed_ops, tensor_to_ops):
    """Converts walk seeds (ops and/or tensors) to a unique list of ops."""
    if not util.is_iterable(seed_ops) or isinstance(seed_ops, str):
        seed_ops = [seed_ops]
    seed_ops = list(seed_ops)
    if not seed_ops:
        return []
    util.get_unique_graph(seed_ops)
    ops = []
    for seed in seed_ops:
        if isinstance(seed, tf.Tensor):
            ops.extend(tensor_to_ops(seed))
        else:
            ops.append(seed)
    return util.concatenate_unique([], ops)


def _walk(seed_ops, inclusive, within_ops, within_ops_fn, stop_at_ts, next_ops):
    """Breadth-first walk shared by the forward and backward walks."""
    if within_ops is not None:
        within_ops = set(util.make_list_of_op(within_ops, allow_graph=False))
        seed_ops = [op for op in seed_ops if op in within_ops]
    stop_at_ts = set(util.make_list_of_t(stop_at_ts))

    def is_within(op):
        return ((within_ops is None or op in within_ops) and
                (within_ops_fn is None or within_ops_fn(op)))

    result = list(seed_ops)
    visited = set(seed_ops)
    queue = collections.deque(seed_ops)
    while queue:
        op = queue.popleft()
        for new_op in next_ops(op, stop_at_ts):
            if new_op not in visited and is_within(new_op):
                visited.add(new_op)
                result.append(new_op)
                queue.append(new_op)
    if not inclusive:
        seeds = set(seed_ops)
        result = [op for op in result if op not in seeds]
    return result


def get_forward_walk_ops(seed_ops, inclusive=True, within_ops=None,
                         within_ops_fn: Optional[Callable] = None,
                         stop_at_ts=(), control_outputs=None) -> List[tf.Operation]:
    """Returns the ops reachable forward from the seeds, breadth-first.

    Args:
      seed_ops: ops and/or tensors; a tensor seeds its consumers.
      inclusive: keep the seed ops in the result.
      within_ops: only visit these ops (seeds outside are dropped); None for
        no restriction.
      within_ops_fn: only visit ops for which it returns True (seeds are not
        checked).
      stop_at_ts: tensors the walk does not follow.
      control_outputs: a util.ControlOutputs to also follow control outputs.

    Returns:
      A list of ops, seeds first, then in breadth-first order.

    Raises:
      TypeError: on bad arguments.
      ValueError: if the seeds belong to different graphs.
    """
    _, control_outputs = check_cios(False, control_outputs)
    seed_ops = _walk_seeds(seed_ops, lambda t: t.consumers())

    def next_ops(op, stop_at):
        for t in op.outputs:
            if t not in stop_at:
                yield from t.consumers()
        if control_outputs is not None:
            yield from control_outputs.get(op)

    return _walk(seed_ops, inclusive, within_ops, within_ops_fn, stop_at_ts, next_ops)


def get_backward_walk_ops(seed_ops, inclusive=True, within_ops=None,
                          within_ops_fn: Optional[Callable] = None,
                          stop_at_ts=(), control_inputs=False) -> List[tf.Operation]:
    """Returns the ops reachable backward from the seeds, breadth-first.

    Args:
      seed_ops: ops and/or tensors; a tensor seeds its producer.
      inclusive: keep the seed ops in the result.
      within_ops: only visit these ops (seeds outside are dropped); None for
        no restriction.
      within_ops_fn: only visit ops for which it returns True.
      stop_at_ts: tensors the walk does not follow.
      control_inputs: also follow control inputs.

    Returns:
      A list of ops, seeds first, then in breadth-first order.

    Raises:
      TypeError: on bad arguments.
      ValueError: if the seeds belong to different graphs.
    """
    seed_ops = _walk_seeds(seed_ops, lambda t: [t.op])

    def next_ops(op, stop_at):
        for t in op.inputs:
            if t not in stop_at:
                yield t.op
        if control_inputs:
            yield from op.control_inputs

    return _walk(seed_ops, inclusive, within_ops, within_ops_fn, stop_at_ts, next_ops)


def get_walks_intersection_ops(forward_seed_ops, backward_seed_ops,
                               forward_inclusive=True, backward_inclusive=True,
                               within_ops=None, within_ops_fn=None,
                               control_inputs=False, control_outputs=None,
                               control_ios=None) -> List[tf.Operation]:
    """Returns the forward-walk ops that are also in the backward walk.

    Args:
      forward_seed_ops: seeds of the forward walk.
      backward_seed_ops: seeds of the backward walk.
      forward_inclusive: keep the forward seeds.
      backward_inclusive: keep the backward seeds.
      within_ops, within_ops_fn: restrict both walks.
      control_inputs, control_outputs, control_ios: see `check_cios`.

    Returns:
      A list of ops in forward-walk order.
    """
    control_inputs, control_outputs = check_cios(
        control_inputs, control_outputs, control_ios)
    forward_ops = get_forward_walk_ops(
        forward_seed_ops, inclusive=forward_inclusive, within_ops=within_ops,
        within_ops_fn=within_ops_fn, control_outputs=control_outputs)
    backward_ops = set(get_backward_walk_ops(
        backward_seed_ops, inclusive=backward_inclusive, within_ops=within_ops,
        within_ops_fn=within_ops_fn, control_inputs=control_inputs))
    return [op for op in forward_ops if op in backward_ops]


def get_walks_union_ops(forward_seed_ops, backward_seed_ops,
                        forward_inclusive=True, backward_inclusive=True,
                        within_ops=None, within_ops_fn=None,
                        control_inputs=False, control_outputs=None,
                        control_ios=None) -> List[tf.Operation]:
    """Returns the forward walk then the backward-walk ops not already in it.

    Arguments as in `get_walks_intersection_ops`.
    """
    control_inputs, control_outputs = check_cios(
        control_inputs, control_outputs, control_ios)
    forward_ops = get_forward_walk_ops(
        forward_seed_ops, inclusive=forward_inclusive, within_ops=within_ops,
        within_ops_fn=within_ops_fn, control_outputs=control_outputs)
    backward_ops = get_backward_walk_ops(
        backward_seed_ops, inclusive=backward_inclusive, within_ops=within_ops,
        within_ops_fn=within_ops_fn, control_inputs=control_inputs)
    forward_set = set(forward_ops)
    return forward_ops + [op for op in backward_ops if op not in forward_set]


def _parse_select_kwargs(kwargs, extra_key):
    graph = None
    positive_filter = None
    restrict_regex = False
    for key, value in kwargs.items():
        if key == "graph":
            graph = value
            if graph is not None and not isinstance(graph, tf.Graph):
                raise TypeError("Expected a tf.Graph, got: {}".format(type(graph)))
        elif key == "positive_filter":
            positive_filter = value
        elif key == extra_key:
            restrict_regex = value
        elif key in ("restrict_ops_regex", "restrict_ts_regex"):
            pass
        else:
            raise ValueError("Wrong keyword argument: {}.".format(key))
    return graph, positive_filter, restrict_regex


def _select(args, kwargs, own_tag, other_tag, restrict_key, from_regex, make_list):
    graph, positive_filter, restrict_regex = _parse_select_kwargs(kwargs, restrict_key)
    res = []
    seen = set()

    def add(items):
        for item in items:
            if item not in seen and (positive_filter is None or positive_filter(item)):
                seen.add(item)
                res.append(item)

    for arg in args:
        if can_be_regex(arg):
            if graph is None:
                raise ValueError("Use the keyword argument 'graph' to use regex "
                                 "({!r}).".format(arg))
            regex = make_regex(arg)
            if regex.pattern.startswith(other_tag):
                continue
            if restrict_regex and not regex.pattern.startswith(own_tag):
                continue
            add(from_regex(graph, regex))
        else:
            add(make_list(arg))
    return res


def select_ops(*args, **kwargs) -> List[tf.Operation]:
    """Selects ops from ops, lists of ops and regexes (regexes need graph=).

    Args:
      *args: ops, iterables of ops (tensors ignored) or regexes; a regex
        starting with "(?#ts)" is skipped.
      **kwargs: graph (for regexes), positive_filter (a function op -> bool),
        restrict_ops_regex (only use regexes starting with "(?#ops)").

    Returns:
      A list of unique ops, in argument order.

    Raises:
      TypeError: if graph is not a tf.Graph or an argument has a bad type.
      ValueError: on an unknown keyword or a regex without graph.
    """
    return _select(args, kwargs, "(?#ops)", "(?#ts)", "restrict_ops_regex",
                   filter_ops_from_regex,
                   lambda arg: util.make_list_of_op(arg, ignore_ts=True))


def select_ts(*args, **kwargs) -> List[tf.Tensor]:
    """Selects tensors from tensors, lists of tensors and regexes.

    Args:
      *args: tensors, iterables of tensors (ops ignored) or regexes (matched
        against tensor names); a regex starting with "(?#ops)" is skipped.
      **kwargs: graph (for regexes), positive_filter (a function t -> bool),
        restrict_ts_regex (only use regexes starting with "(?#ts)").

    Returns:
      A list of unique tensors, in argument order.

    Raises:
      TypeError: if graph is not a tf.Graph or an argument has a bad type.
      ValueError: on an unknown keyword or a regex without graph.
    """
    return _select(args, kwargs, "(?#ts)", "(?#ops)", "restrict_ts_regex",
                   filter_ts_from_regex,
                   lambda arg: util.make_list_of_t(arg, ignore_ops=True))


def select_ops_and_ts(*args, **kwargs) -> Tuple[List[tf.Operation], List[tf.Tensor]]:
    """Selects ops and tensors: regexes go to ops unless they start with "(?#ts)".

    Returns:
      (ops, ts).
    """
    ops = select_ops(*args, restrict_ops_regex=False, **kwargs)
    ts = select_ts(*args, restrict_ts_regex=True, **kwargs)
    return ops, ts
