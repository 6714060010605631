"""Control flow support of the graph editor's Transformer.

* v2 (functional `If`, `While`, ...): the functions an op calls are added to
  the destination graph's library (`copy_functions`).
* v1 (`Switch`/`Merge`/`Enter`/`Exit`): the ops are copied one by one; then the
  Python `ControlFlowContext` objects (`WhileContext`, `CondContext`) of every
  loop or cond copied whole are rebuilt for the copies
  (`restore_control_flow_contexts`), through their protos with every name
  mapped to its copy, so `tf.gradients` works on the copies as on the
  originals.
"""
import logging
from typing import Iterable, List

import tensorflow as tf
from tensorflow.core.protobuf import control_flow_pb2
from tensorflow.python.ops import control_flow_ops

from qat.graph_editor import _walks


def _function_names_in_attrs(attrs) -> List[str]:
    names = []
    for value in attrs.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def copy_functions(src_graph: tf.Graph, dst_graph: tf.Graph,
                   ops: Iterable[tf.Operation]) -> None:
    """Adds the functions `ops` call (transitively) to `dst_graph`'s library.

    Raises:
      ValueError: if a called function is not in `src_graph`'s library.
    """
    pending = []
    for op in ops:
        for name in _function_names_in_attrs(op.node_def.attr):
            pending.append((name, op.name))
    seen = set()
    order = []
    while pending:
        name, user = pending.pop()
        if name in seen or dst_graph._is_function(name):  # pylint: disable=protected-access
            continue
        seen.add(name)
        function = src_graph._get_function(name)  # pylint: disable=protected-access
        if function is None:
            raise ValueError(
                "Cannot copy op {!r}: it calls function {!r}, which is not in the "
                "library of its graph (a function of an enclosing tf.function "
                "cannot be copied; build the model in a tf.Graph).".format(user, name))
        order.append(function)
        for node_def in function.cached_definition.node_def:
            for nested in _function_names_in_attrs(node_def.attr):
                pending.append((nested, user))
    # Callees first, so that each function's dependencies are present.
    for function in reversed(order):
        dst_graph._add_function(function)  # pylint: disable=protected-access


class _Unmapped(Exception):
    pass


class _Renamer(object):
    """Maps names of a source context to the names of the copies."""

    def __init__(self, info):
        self.info = info

    def element(self, name: str, internal: bool) -> str:
        info = self.info
        try:
            elem = info.graph.as_graph_element(name)
        except (KeyError, ValueError) as e:
            raise _Unmapped(name) from e
        mapped = (info.transformed_ts if isinstance(elem, tf.Tensor)
                  else info.transformed_ops).get(elem)
        if mapped is not None:
            return mapped.name
        if not internal and info.graph is info.graph_:
            return name
        raise _Unmapped(name)

    def context_name(self, name: str, is_while: bool) -> str:
        info = self.info
        if is_while:
            if name not in info.frame_names:
                raise _Unmapped(name)
            return info.frame_names[name]
        return info.new_name(name) if name.startswith(info.scope) else info.scope_ + name

    def values_def(self, values_def) -> None:
        external = dict(values_def.external_values)
        values = [self.element(v, internal=v not in external) for v in values_def.values]
        del values_def.values[:]
        values_def.values.extend(values)
        values_def.ClearField("external_values")
        for k, v in external.items():
            values_def.external_values[self.element(k, internal=False)] = \
                self.element(v, internal=True)

    def context_def(self, context_def) -> None:
        """Renames a ControlFlowContextDef in place."""
        if context_def.HasField("while_ctxt"):
            ctxt = context_def.while_ctxt
            ctxt.context_name = self.context_name(ctxt.context_name, True)
            if ctxt.maximum_iterations_name:
                ctxt.maximum_iterations_name = self.element(
                    ctxt.maximum_iterations_name, internal=False)
            for field in ("pivot_for_pred_name", "pivot_for_body_name", "pivot_name"):
                setattr(ctxt, field, self.element(getattr(ctxt, field), internal=True))
            for field in ("loop_exit_names", "loop_enter_names"):
                names = [self.element(n, internal=True) for n in getattr(ctxt, field)]
                del getattr(ctxt, field)[:]
                getattr(ctxt, field).extend(names)
        elif context_def.HasField("cond_ctxt"):
            ctxt = context_def.cond_ctxt
            ctxt.context_name = self.context_name(ctxt.context_name, False)
            ctxt.pred_name = self.element(ctxt.pred_name, internal=False)
            ctxt.pivot_name = self.element(ctxt.pivot_name, internal=True)
        else:
            raise _Unmapped(str(context_def.WhichOneof("ctxt")))
        self.values_def(ctxt.values_def)
        for nested in ctxt.nested_contexts:
            self.context_def(nested)


def outermost_contexts(ops) -> list:
    """Returns the outermost v1 control-flow contexts (loops, conds) of `ops`, once each."""
    roots = {}
    for op in ops:
        context = op._control_flow_context  # pylint: disable=protected-access
        if context is None:
            continue
        while context.outer_context is not None:
            context = context.outer_context
        roots[id(context)] = context
    return list(roots.values())


def restore_control_flow_contexts(info) -> None:
    """Rebuilds the v1 control-flow contexts of the loops/conds copied whole.

    A context whose ops were only partly copied is left out (its copies keep
    no context: they run, but `tf.gradients` cannot differentiate through
    them).
    """
    for root in outermost_contexts(info.transformed_ops):
        if not isinstance(root, (control_flow_ops.WhileContext, control_flow_ops.CondContext)):
            continue
        context_def = control_flow_pb2.ControlFlowContextDef()
        with info.graph.as_default():
            root.to_control_flow_context_def(context_def)
        try:
            _Renamer(info).context_def(context_def)
        except _Unmapped as e:
            logging.info("Control-flow context %s not fully copied (%s): its copies "
                         "have no context and cannot be differentiated.", root.name, e)
            continue
        with info.graph_.as_default():
            control_flow_ops.from_control_flow_context_def(context_def)


def _context_ops(graph: tf.Graph, context) -> List[tf.Operation]:
    """The ops of a v1 control-flow context and of the contexts nested in it."""
    # pylint: disable=protected-access
    result = []
    stack = [context]
    while stack:
        ctx = stack.pop()
        external = ctx._external_values
        for name in sorted(ctx._values):
            if name not in external:
                result.append(graph.get_operation_by_name(name.split(":")[0]))
        stack.extend(ctx._nested_contexts)
    return result


def add_control_flow_ops(ops: List[tf.Operation], control_ios) -> None:
    """Completes `ops` with the whole control-flow-v1 loops and conds they are in.

    Copying part of a `while_loop` frame gives a malformed graph, and a
    partial copy of a loop or a cond cannot be differentiated, so every op of
    the outermost enclosing contexts (and, for loops, every op between their
    Enter and Exit ops) is added.
    """
    new_ops = []
    for context in outermost_contexts(ops):
        new_ops += _context_ops(ops[0].graph, context)
        if context.IsWhileContext():
            new_ops += _walks.get_walks_intersection_ops(
                [enter_t.op for enter_t in context.loop_enters],
                [exit_t.op for exit_t in context.loop_exits],
                control_ios=control_ios)
    ops_set = set(ops)
    for op in new_ops:
        if op not in ops_set:
            ops_set.add(op)
            ops.append(op)
