"""Graph walks of the graph editor (re-exported by `select`).

Breadth-first with sets and a deque: linear in the ops and edges visited.
"""
import collections
from typing import Callable, List, Optional, Tuple

import tensorflow as tf

from qat.graph_editor import util


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
    """Breadth-first walk shared by the forward and backward walks.

    As in contrib, an empty `within_ops` keeps the seeds and visits nothing
    else; a non-empty one also drops the seeds outside it.
    """
    if within_ops is not None:
        within_ops = set(util.make_list_of_op(within_ops, allow_graph=False))
        if within_ops:
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
        no restriction; empty: the seeds only (contrib's behaviour).
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
        no restriction; empty: the seeds only (contrib's behaviour).
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
