"""Rerouting tensors in place (contrib r1.15 `graph_editor.reroute`).

A reroute changes which tensor an op input slot reads, in the live graph
(`Operation._update_input`). All the changes of a call are planned and
checked first, then applied: on bad input the graph is left unchanged. The
work is linear in the consumers of the tensors involved.
"""
import enum
from typing import List, Tuple

import tensorflow as tf

from qat.graph_editor import subgraph
from qat.graph_editor import util

__all__ = [
    "swap_ts",
    "reroute_ts",
    "swap_inputs",
    "reroute_inputs",
    "swap_outputs",
    "reroute_outputs",
    "swap_ios",
    "reroute_ios",
    "remove_control_inputs",
    "add_control_inputs",
]


class _RerouteMode(enum.Enum):
    SWAP = "swap"
    A2B = "a2b"  # the consumers of b now read a

    def directions(self) -> Tuple[bool, bool]:
        return (True, True) if self is _RerouteMode.SWAP else (True, False)


def _check_ts_compatibility(ts0, ts1) -> None:
    """Raises ValueError unless ts0[i] can replace ts1[i] (and back)."""
    if len(ts0) != len(ts1):
        raise ValueError("ts0 and ts1 have different sizes: {} != {}".format(
            len(ts0), len(ts1)))
    for t0, t1 in zip(ts0, ts1):
        if t0.dtype.base_dtype != t1.dtype.base_dtype:
            raise ValueError("Dtypes {} of {} and {} of {} are not compatible; "
                             "reroute only tensors of the same dtype.".format(
                                 t0.dtype.name, t0.name, t1.dtype.name, t1.name))
        if not t0.get_shape().is_compatible_with(t1.get_shape()):
            raise ValueError("Shapes {} of {} and {} of {} are not compatible; "
                             "reroute only tensors of compatible shapes.".format(
                                 t0.get_shape(), t0.name, t1.get_shape(), t1.name))


def _plan_reroute(t_new, t_old, can_modify, cannot_modify, planned, plan) -> None:
    """Plans that the allowed consumers of `t_old` read `t_new` instead."""
    for consumer in t_old.consumers():
        if can_modify is not None and consumer not in can_modify:
            continue
        if cannot_modify is not None and consumer in cannot_modify:
            continue
        for i, t in enumerate(consumer.inputs):
            if t is t_old and (consumer, i) not in planned:
                planned.add((consumer, i))
                plan.append((consumer, i, t_new))


def _check_ref_inputs(plan) -> None:
    """A slot that takes a reference (e.g. Assign's ref) needs a ref tensor."""
    for consumer, i, t_new in plan:
        if t_new.dtype._is_ref_dtype:  # pylint: disable=protected-access
            continue
        old = consumer.inputs[i]
        if old.dtype._is_ref_dtype and util.input_slot_is_ref(consumer, i):  # pylint: disable=protected-access
            raise ValueError(
                "Input {} of {} ({}) takes a reference; {} is not a reference "
                "tensor and cannot replace {}.".format(
                    i, consumer.name, consumer.type, t_new.name, old.name))


def _reroute_ts(ts0, ts1, mode: _RerouteMode, can_modify=None, cannot_modify=None) -> int:
    a2b, b2a = mode.directions()
    ts0 = util.make_list_of_t(ts0, allow_graph=False)
    ts1 = util.make_list_of_t(ts1, allow_graph=False)
    _check_ts_compatibility(ts0, ts1)
    if not ts0:
        return 0
    graph = util.get_unique_graph(ts0 + ts1)
    util.check_graph_modifiable(graph, "reroute tensors")
    if cannot_modify is not None:
        cannot_modify = set(util.make_list_of_op(cannot_modify, allow_graph=False))
    if can_modify is not None:
        can_modify = set(util.make_list_of_op(can_modify, allow_graph=False))

    # Plan against the graph as it is now, so swaps and repeated tensors are
    # well defined: each input slot is changed at most once.
    planned = set()
    plan = []
    for t0, t1 in zip(ts0, ts1):
        if t0 is t1:
            continue
        if a2b:
            _plan_reroute(t0, t1, can_modify, cannot_modify, planned, plan)
        if b2a:
            _plan_reroute(t1, t0, can_modify, cannot_modify, planned, plan)
    _check_ref_inputs(plan)
    for consumer, i, t_new in plan:
        consumer._update_input(i, t_new)  # pylint: disable=protected-access
    return len(plan)


def swap_ts(ts0, ts1, can_modify=None, cannot_modify=None) -> int:
    """Swaps the consumers of ts0[i] and ts1[i] for each i.

    Args:
      ts0: a tensor or a list of tensors.
      ts1: a tensor or a list of tensors, as long as ts0.
      can_modify: only these ops may be modified (None: any).
      cannot_modify: these ops may not be modified.

    Returns:
      The number of input slots changed.

    Raises:
      TypeError: if ts0/ts1 are not tensors.
      ValueError: on different lengths, incompatible dtypes or shapes (named
        in the message), tensors of different graphs, or a FuncGraph.
      RuntimeError: if the graph is finalized.
    """
    return _reroute_ts(ts0, ts1, _RerouteMode.SWAP, can_modify, cannot_modify)


def reroute_ts(ts0, ts1, can_modify=None, cannot_modify=None) -> int:
    """Makes the consumers of ts1[i] read ts0[i] instead, for each i.

    Pairs with ts0[i] is ts1[i] are skipped. ts0[i] keeps its own consumers.

    Args:
      ts0: a tensor or a list of tensors (the new inputs).
      ts1: a tensor or a list of tensors, as long as ts0 (the replaced ones).
      can_modify: only these ops may be modified (None: any).
      cannot_modify: these ops may not be modified.

    Returns:
      The number of input slots changed.

    Raises:
      TypeError: if ts0/ts1 are not tensors.
      ValueError: on different lengths, incompatible dtypes or shapes (named
        in the message), tensors of different graphs, or a FuncGraph.
      RuntimeError: if the graph is finalized.
    """
    return _reroute_ts(ts0, ts1, _RerouteMode.A2B, can_modify, cannot_modify)


def _reroute_sgv_remap(sgv0, sgv1, mode: _RerouteMode) -> None:
    """Updates the views' inputs in place to mirror an input reroute."""
    # pylint: disable=protected-access
    a2b, b2a = mode.directions()

    def update_passthrough_outputs(dst, src):
        # A passthrough output of dst follows its input to src's tensor.
        passthroughs = set(dst._passthrough_ts)
        for i, t in enumerate(dst._output_ts):
            if t in passthroughs:
                ii = subgraph._index_of(dst._input_ts, t)
                dst._output_ts[i] = src._input_ts[ii]

    if a2b:
        update_passthrough_outputs(sgv1, sgv0)
    if b2a:
        update_passthrough_outputs(sgv0, sgv1)

    if a2b and b2a:
        sgv0._input_ts, sgv1._input_ts = sgv1._input_ts, sgv0._input_ts
        sgv0._passthrough_ts, sgv1._passthrough_ts = (
            sgv1._passthrough_ts, sgv0._passthrough_ts)
    elif a2b:
        sgv1._input_ts = list(sgv0._input_ts)
        sgv1._passthrough_ts = list(sgv0._passthrough_ts)
    # pylint: enable=protected-access


def _views(sgv0, sgv1):
    sgv0 = subgraph.make_view(sgv0)
    sgv1 = subgraph.make_view(sgv1)
    util.check_graphs(sgv0, sgv1)
    return sgv0, sgv1


def _reroute_sgv_inputs(sgv0, sgv1, mode: _RerouteMode):
    sgv0, sgv1 = _views(sgv0, sgv1)
    can_modify = list(sgv0.ops) + list(sgv1.ops)
    # The consumers of passthroughs read the views' inputs too.
    can_modify += util.get_consuming_ops(list(sgv0.passthroughs))
    can_modify += util.get_consuming_ops(list(sgv1.passthroughs))
    _reroute_ts(sgv0.inputs, sgv1.inputs, mode, can_modify=can_modify)
    _reroute_sgv_remap(sgv0, sgv1, mode)
    return sgv0, sgv1


def _reroute_sgv_outputs(sgv0, sgv1, mode: _RerouteMode):
    sgv0, sgv1 = _views(sgv0, sgv1)
    cannot_modify = list(sgv0.ops) + list(sgv1.ops)
    _reroute_ts(sgv0.outputs, sgv1.outputs, mode, cannot_modify=cannot_modify)
    return sgv0, sgv1


def _reroute_sgv(sgv0, sgv1, mode: _RerouteMode):
    _reroute_sgv_outputs(sgv0, sgv1, mode)
    return _reroute_sgv_inputs(sgv0, sgv1, mode)


def swap_inputs(sgv0, sgv1):
    """Swaps the inputs of two subgraph views.

    Args:
      sgv0, sgv1: anything `make_view` accepts; views are updated in place.

    Returns:
      (sgv0, sgv1), the updated views.

    Raises:
      ValueError / TypeError: see `reroute_ts`; different graphs.
    """
    return _reroute_sgv_inputs(sgv0, sgv1, _RerouteMode.SWAP)


def reroute_inputs(sgv0, sgv1):
    """Makes the ops of sgv1 read sgv0's inputs instead of their own.

    Only the views' ops and the consumers of their passthroughs change.

    Returns:
      (sgv0, sgv1), the updated views.
    """
    return _reroute_sgv_inputs(sgv0, sgv1, _RerouteMode.A2B)


def swap_outputs(sgv0, sgv1):
    """Swaps the outside consumers of the outputs of two views.

    Returns:
      (sgv0, sgv1).
    """
    return _reroute_sgv_outputs(sgv0, sgv1, _RerouteMode.SWAP)


def reroute_outputs(sgv0, sgv1):
    """Makes the outside consumers of sgv1's outputs read sgv0's outputs.

    Ops inside either view are not modified.

    Returns:
      (sgv0, sgv1).
    """
    return _reroute_sgv_outputs(sgv0, sgv1, _RerouteMode.A2B)


def swap_ios(sgv0, sgv1):
    """Swaps the outputs then the inputs of two views.

    Returns:
      (sgv0, sgv1), the updated views.
    """
    return _reroute_sgv(sgv0, sgv1, _RerouteMode.SWAP)


def reroute_ios(sgv0, sgv1):
    """Reroutes the outputs then the inputs of sgv0 to sgv1.

    Returns:
      (sgv0, sgv1), the updated views.
    """
    return _reroute_sgv(sgv0, sgv1, _RerouteMode.A2B)


def _check_control_args(op, cops) -> List[tf.Operation]:
    if not isinstance(op, tf.Operation):
        raise TypeError("Expected a tf.Operation, got: {}".format(type(op)))
    cops = util.make_list_of_op(cops, allow_graph=False)
    for cop in cops:
        if cop.graph is not op.graph:
            raise ValueError("{} and {} belong to different graphs.".format(
                cop.name, op.name))
    return cops


def remove_control_inputs(op: tf.Operation, cops) -> None:
    """Removes control inputs from `op`.

    Args:
      op: the op.
      cops: an op or a list of ops, all control inputs of `op`.

    Raises:
      TypeError: if op is not a tf.Operation.
      ValueError: if one of cops is not a control input of op (the graph is
        left unchanged), or the graph is a FuncGraph.
      RuntimeError: if the graph is finalized.
    """
    cops = _check_control_args(op, cops)
    current = list(op.control_inputs)
    current_set = set(current)
    for cop in cops:
        if cop not in current_set:
            raise ValueError("{} is not a control input of {}".format(cop.name, op.name))
    if not cops:
        return
    util.check_graph_modifiable(op.graph, "remove control inputs")
    removed = set(cops)
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    op._add_control_inputs([c for c in current if c not in removed])  # pylint: disable=protected-access


def add_control_inputs(op: tf.Operation, cops) -> None:
    """Adds control inputs to `op`.

    Args:
      op: the op.
      cops: an op or a list of ops, none already a control input of `op`.

    Raises:
      TypeError: if op is not a tf.Operation.
      ValueError: if one of cops already is a control input of op (the graph
        is left unchanged), belongs to another graph, or the graph is a
        FuncGraph.
      RuntimeError: if the graph is finalized.
    """
    cops = _check_control_args(op, cops)
    current_set = set(op.control_inputs)
    for cop in cops:
        if cop in current_set:
            raise ValueError("{} is already a control input of {}".format(
                cop.name, op.name))
    if not cops:
        return
    util.check_graph_modifiable(op.graph, "add control inputs")
    op._add_control_inputs(cops)  # pylint: disable=protected-access
