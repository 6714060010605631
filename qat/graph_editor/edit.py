"""Detaching, connecting and bypassing subgraphs (contrib r1.15 `graph_editor.edit`).

Differences from contrib: the placeholders made by `detach_inputs` keep the
shape of the tensor they stand for (contrib's had an unknown shape), and
`detach_outputs` pairs each placeholder with its output by position.
"""
from typing import List, Tuple

import tensorflow as tf

from qat.graph_editor import reroute
from qat.graph_editor import select
from qat.graph_editor import subgraph
from qat.graph_editor import util

__all__ = [
    "detach_control_inputs",
    "detach_control_outputs",
    "detach_inputs",
    "detach_outputs",
    "detach",
    "connect",
    "bypass",
]


def detach_control_inputs(sgv) -> None:
    """Removes the control inputs coming from outside the view.

    Args:
      sgv: anything `make_view` accepts.

    Raises:
      ValueError / RuntimeError: if the graph cannot be modified.
    """
    sgv = subgraph.make_view(sgv)
    if not sgv:
        return
    util.check_graph_modifiable(sgv.graph, "detach control inputs")
    ops = set(sgv.ops)
    for op in sgv.ops:
        cops = [cop for cop in op.control_inputs if cop not in ops]
        if cops:
            reroute.remove_control_inputs(op, cops)


def detach_control_outputs(sgv, control_outputs: util.ControlOutputs) -> None:
    """Removes the view's ops from the control inputs of the ops outside it.

    Args:
      sgv: anything `make_view` accepts.
      control_outputs: a util.ControlOutputs of the graph.

    Raises:
      TypeError: if control_outputs is not a util.ControlOutputs.
      ValueError / RuntimeError: if the graph cannot be modified.
    """
    if not isinstance(control_outputs, util.ControlOutputs):
        raise TypeError("Expected a util.ControlOutputs, got: {}".format(
            type(control_outputs)))
    control_outputs.update()
    sgv = subgraph.make_view(sgv)
    if not sgv:
        return
    util.check_graph_modifiable(sgv.graph, "detach control outputs")
    ops = set(sgv.ops)
    for op in sgv.ops:
        for cop in control_outputs.get(op):
            if cop not in ops:
                reroute.remove_control_inputs(cop, op)


def detach_inputs(sgv, control_inputs: bool = False) -> Tuple[subgraph.SubGraphView, List[tf.Tensor]]:
    """Replaces each input of the view by a new placeholder.

    The placeholders are named by `util.placeholder_name` ("geph__<op>_<i>" in
    the scope of the input's op) and have the input's dtype and shape.

    Args:
      sgv: anything `make_view` accepts; a view is updated in place.
      control_inputs: also remove control inputs coming from outside.

    Returns:
      (sgv, placeholders): the view, whose inputs are now the placeholders,
      and the placeholders in input order.

    Raises:
      ValueError / RuntimeError: if the graph cannot be modified.
    """
    sgv = subgraph.make_view(sgv)
    if not sgv:
        return sgv, []
    util.check_graph_modifiable(sgv.graph, "detach inputs")
    with sgv.graph.as_default():
        input_placeholders = [
            util.make_placeholder_from_tensor(input_t) for input_t in sgv.inputs
        ]
    reroute.swap_inputs(sgv, input_placeholders)
    if control_inputs:
        detach_control_inputs(sgv)
    return sgv, input_placeholders


def detach_outputs(sgv, control_outputs=None) -> Tuple[subgraph.SubGraphView, List[tf.Tensor]]:
    """Makes the consumers outside the view read new placeholders instead.

    Args:
      sgv: anything `make_view` accepts.
      control_outputs: a util.ControlOutputs to also detach control outputs,
        or None.

    Returns:
      (sgv_, placeholders): a view remapped to the (unique) outputs that had
      outside consumers, now read by nothing outside, and one placeholder
      per such output, in order.

    Raises:
      ValueError / RuntimeError: if the graph cannot be modified.
    """
    sgv = subgraph.make_view(sgv)
    if not sgv:
        return sgv, []
    util.check_graph_modifiable(sgv.graph, "detach outputs")
    ops = set(sgv.ops)
    unique = sgv.remap_outputs_make_unique()
    sgv_ = unique.remap_outputs([
        i for i, t in enumerate(unique.outputs)
        if any(op not in ops for op in t.consumers())
    ])
    with sgv_.graph.as_default():
        output_placeholders = [
            util.make_placeholder_from_tensor(t) for t in sgv_.outputs
        ]
    reroute.swap_outputs(sgv_, output_placeholders)
    if control_outputs is not None:
        detach_control_outputs(sgv_, control_outputs)
    return sgv_, output_placeholders


def detach(sgv, control_inputs=False, control_outputs=None, control_ios=None):
    """Detaches the inputs then the outputs of a view.

    Args:
      sgv: anything `make_view` accepts.
      control_inputs, control_outputs, control_ios: see `select.check_cios`.

    Returns:
      (sgv, input placeholders, output placeholders).
    """
    control_inputs, control_outputs = select.check_cios(
        control_inputs, control_outputs, control_ios)
    sgv = subgraph.make_view(sgv)
    _, detached_inputs = detach_inputs(sgv, control_inputs)
    _, detached_outputs = detach_outputs(sgv, control_outputs)
    return sgv, detached_inputs, detached_outputs


def connect(sgv0, sgv1, disconnect_first: bool = False) -> subgraph.SubGraphView:
    """Makes the inputs of sgv1 read the outputs of sgv0, by position.

    Args:
      sgv0: the producing view (anything `make_view` accepts).
      sgv1: the consuming view, updated in place.
      disconnect_first: detach sgv0's outputs from their consumers first.

    Returns:
      sgv1, whose inputs are now sgv0's outputs.

    Raises:
      ValueError: if the views have a different number of outputs/inputs,
        incompatible tensors, or different graphs.
    """
    sgv0 = subgraph.make_view(sgv0)
    sgv1 = subgraph.make_view(sgv1)
    util.check_graphs(sgv0, sgv1)
    if disconnect_first:
        detach_outputs(sgv0)
    sgv0_outputs = subgraph.SubGraphView(passthrough_ts=list(sgv0.outputs))
    reroute.reroute_inputs(sgv0_outputs, sgv1)
    return sgv1


def bypass(sgv) -> Tuple[subgraph.SubGraphView, List[tf.Tensor]]:
    """Bypasses a view: the consumers of its outputs read its inputs instead.

    The view's inputs are detached (replaced by placeholders). The view must
    have as many inputs as outputs, pairwise compatible.

    Args:
      sgv: anything `make_view` accepts; updated in place.

    Returns:
      (sgv, placeholders now feeding the view).

    Raises:
      ValueError: if inputs and outputs do not match (the graph is left
        unchanged), or the graph cannot be modified.
    """
    sgv = subgraph.make_view(sgv)
    sgv_inputs = list(sgv.inputs)
    # Check before detaching so bad input leaves the graph unchanged.
    reroute._check_ts_compatibility(sgv_inputs, list(sgv.outputs))  # pylint: disable=protected-access
    sgv, detached_inputs = detach_inputs(sgv)
    # Only outside consumers move (contrib also rewired ops inside the view).
    reroute.reroute_ts(sgv_inputs, list(sgv.outputs), cannot_modify=list(sgv.ops))
    return sgv, detached_inputs
