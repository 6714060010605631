"""Selecting ops and tensors (contrib r1.15 `graph_editor.select`).

Filters, boundaries, selection by regex, and the graph walks (defined in
`_walks`, re-exported here as contrib had them).
"""
import re
from typing import List, Tuple

import tensorflow as tf

from qat.graph_editor import util
# pylint: disable=unused-import
from qat.graph_editor._walks import _ops_ios
from qat.graph_editor._walks import check_cios
from qat.graph_editor._walks import get_backward_walk_ops
from qat.graph_editor._walks import get_forward_walk_ops
from qat.graph_editor._walks import get_walks_intersection_ops
from qat.graph_editor._walks import get_walks_union_ops
from qat.graph_editor._walks import get_within_boundary_ops
# pylint: enable=unused-import

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
