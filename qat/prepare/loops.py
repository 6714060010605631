"""Recurrent loops unrolled into the straight-line form TFLite runs in integers.

Why this module exists: a recurrent layer built as a loop (Keras `LSTM`,
`GRU`, `SimpleRNN` with `unroll=False`, TF1 `dynamic_rnn`) is one `While` op
whose body is a function: the passes cannot put a range inside it, and TF's
converter carries a loop's state across its `WHILE` in float32 (a QUANTIZE
and DEQUANTIZE per step inside the body, float ops beside them) or, with a
batch of unknown size, cannot convert the loop's tensor lists at all
(`TensorListReserve ... requires element_shape to be static`). Unrolled, the
loop is what `static_rnn` or `unroll=True` builds: every op has an integer
TFLite kernel, and the planner's recurrence rule
(`qat.quantize.plan.model.recurrences`) gives the steps one range per cell value,
as the loop would have.

`unroll_loops(graph)` unrolls every loop whose body computes a layer
(`qat.matching.loops`) and whose number of steps is known when the graph is
built: the body's ops once per step, named `<loop>/step_<k>/<op>`, the step
counters as constants, the tensor lists as lists of tensors
(`qat.prepare.tensor_lists`). The loop's readers read the last step's values;
the loop is left unconnected and marked (`qat.engine.marks.is_replaced`), and
in a `tf.function` being traced it is also left out of the function's control
outputs (`qat.engine.function_graphs.detach`), so neither TensorFlow nor its
converter keeps it. A loop whose number of steps depends on the data (a
sequence length that is not static) is refused with `UnknownStepsError`,
naming the loop, its layers and the fix; a loop whose body the unroller
cannot follow (nested control flow, a list op it does not know) with
`UnrollError`. Both are raised before the graph changes.
"""
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from qat.engine import function_graphs
from qat.engine import function_library
from qat.engine import marks
from qat.engine import node_attrs
from qat.engine import op_index
from qat.engine import rewrite as rewrite_lib
from qat.engine import static_values
from qat.matching import loop_finder
from qat.matching import loops
from qat.prepare import tensor_lists
from qat.prepare.tensor_lists import Ref, Static, TensorList

FIX = ("give the model a static sequence length: keras.Input((steps, features)), a "
       "placeholder or tf.TensorSpec of shape [None, steps, features] (the batch may stay "
       "None), or unroll the layer yourself (unroll=True, tf.compat.v1.nn.static_rnn)")


class UnrollError(ValueError):
    """A recurrent loop qat cannot unroll; the graph (or model) is unchanged.

    Raised by the rewrites (`create_training_graph`, `create_eval_graph`, ...)
    and by `quantize_model` for a loop whose body computes a layer but calls
    functions (a loop in the loop, a `tf.cond` in the cell) or uses a list op
    the unroller does not know; `UnknownStepsError`, a subclass, for one whose
    number of steps is not static. The message names the loop.
    """


class UnknownStepsError(UnrollError):
    """A recurrent loop whose number of steps is not known when the graph is built.

    A sequence length given at run time (`keras.Input((None, features))`)
    cannot be unrolled: give the model a static one (the batch may stay
    None). Also raised for a loop of more than 10,000 steps. The message
    names the loop and why its length is unknown.
    """


def unroll_loops(graph: tf.Graph) -> int:
    """Unrolls every recurrent loop of `graph` (see the module docstring).

    Args:
      graph: the graph to rewrite in place (training or eval; a tf.function's
        graph while it is traced). Loops unrolled before are left alone.

    Returns:
      How many loops were unrolled.

    Raises:
      UnknownStepsError: a recurrent loop's number of steps is not static.
      UnrollError: a recurrent loop the unroller cannot follow.
      qat.engine.rewrite.RewriteError: the new ops fail their checks.
      The graph is unchanged when any of these is raised.
    """
    library = function_library.library_of(graph)
    if _inline_loop_calls(graph, library):
        library = function_library.library_of(graph)
    found = loop_finder.recurrent_loops(graph, library)
    if not found:
        return 0
    values = static_values.StaticValues()
    planned = []
    for loop in found:
        count, why, steps = static_values.trip_count(loop, values)
        if count is None:
            raise UnknownStepsError(
                f"qat cannot quantize {loop.describe()}: {why}, so it cannot be unrolled into "
                f"the straight-line form TFLite runs in integers. Fix: {FIX}.")
        planned.append((loop, steps))
    rewrite = rewrite_lib.Rewrite(graph, marks.LOOP)
    unroller = _Unroller(rewrite, values)
    for loop, steps in planned:
        try:
            unroller.unroll(loop, steps)
        except tensor_lists.UnsupportedListError as e:
            raise UnrollError(f"qat cannot unroll {loop.describe()}: {e}. {FIX}.") from e
    rewrite_lib.apply(rewrite)
    for loop, _ in planned:
        for op in loop.ops:
            function_graphs.detach(op)
    return len(planned)


def _inline_loop_calls(graph: tf.Graph, library) -> int:
    """Puts the body of each function call that runs a recurrent loop in the
    graph (tf_keras's `LSTM` / `GRU` in a tf.function call `standard_lstm`),
    so its loop can be unrolled; the call is left unconnected and marked."""
    calls = [op for op in op_index.ops_of_types(graph, function_library.FUNCTION_CALL_TYPES)
             if loops.calls_recurrent_loop(op, library) and not marks.is_replaced(op)]
    if not calls:
        return 0
    rewrite = rewrite_lib.Rewrite(graph, marks.LOOP)
    nodes = rewrite.nodes
    for call in calls:
        fdef = library[call.get_attr("f").name]
        graph_def, outputs = loops.function_graph_def(fdef, [t.shape for t in call.inputs])
        args = {arg.name: nodes.external(t) for arg, t in zip(fdef.signature.input_arg,
                                                                call.inputs)}
        body = [node for node in graph_def.node if node.name not in args]
        # Not `<call>/<node>`: the name TensorFlow gives the same node inlining the call.
        names = {node.name: nodes.unique_name(f"{call.name}_inlined/{node.name}")
                 for node in body}

        def mapped(ref: str) -> str:
            control = ref.startswith("^")
            name, _, index = ref.lstrip("^").partition(":")
            if name in args:
                return args[name]
            new = names[name]
            return "^" + new if control else (f"{new}:{index}" if index else new)

        for node in body:
            data = [mapped(i) for i in node.input if not i.startswith("^")]
            control = [mapped(i)[1:] for i in node.input if i.startswith("^")]
            attrs = node_attrs.public_attrs(node.attr)
            nodes.node(names[node.name], node.op, data, device=call.device, control=control,
                       **attrs)
        for out, arg in zip(call.outputs, fdef.signature.output_arg):
            source = outputs[arg.name].split(":")[0]
            new = (call.inputs[[a.name for a in fdef.signature.input_arg].index(source)]
                   if source in args else mapped(outputs[arg.name]))
            rewrite.reroute_consumers(out, new, out.consumers())
        rewrite.set_attr(call, marks.REPLACED_BY_ATTR,
                         attr_value_pb2.AttrValue(s=call.name.encode()))
    rewrite_lib.apply(rewrite)
    for call in calls:
        function_graphs.detach(call)
    return len(calls)


class _Unroller(object):
    """Writes the steps of loops as NodeDefs of one rewrite."""

    def __init__(self, rewrite: rewrite_lib.Rewrite, values: static_values.StaticValues):
        self.rewrite = rewrite
        self.nodes = rewrite.nodes
        self.values = values
        # Tensors of the graph the unrolled loops replace -> their values.
        self.outer: Dict[tf.Tensor, tensor_lists.Value] = {}
        self.device = ""
        self.scope = "unrolled_loop"

    def constant(self, value: Static) -> Ref:
        return Ref(self.nodes.shared_const(self.scope + "/unrolled_const", value.value, value.dtype))

    def _list_ops(self) -> tensor_lists.ListOps:
        return tensor_lists.ListOps(self.nodes, self.constant, self.device)

    # --- The graph's tensors ------------------------------------------------------------

    def _outer_value(self, t: tf.Tensor) -> tensor_lists.Value:
        """The value of a tensor of the graph a loop reads."""
        if t in self.outer:
            return self.outer[t]
        op = t.op
        if tensor_lists.is_list(t):
            if op.type == "Identity":
                value = self._outer_value(op.inputs[0])
            elif op.type in tensor_lists.LIST_TYPES:
                value = self._list_ops().evaluate(
                    op, [self._outer_value(i) for i in op.inputs], op.inputs[0].shape,
                    op.name + "/unrolled")[t.value_index]
            else:
                raise tensor_lists.UnsupportedListError(
                    f"the list {t.name} comes from {op.type}, which the unroller does not follow")
        else:
            # A float value stays the graph's tensor (a zero initial state, which
            # the planner quantizes as the state); counters and sizes are constants.
            static = (None if t.dtype == tf.resource or t.dtype.is_floating
                      else self.values.value(t))
            value = (Static(static, t.dtype) if static is not None
                     else Ref(self.nodes.external(t), t))
        self.outer[t] = value
        return value

    def _input_name(self, value: tensor_lists.Value, reader: str) -> str:
        if isinstance(value, Static):
            return self.constant(value).name
        if isinstance(value, TensorList):
            raise tensor_lists.UnsupportedListError(f"{reader} reads a tensor list")
        return value.name

    # --- One loop -------------------------------------------------------------------------

    def unroll(self, loop: loops.Loop, steps: List[Dict[tf.Tensor, np.ndarray]]) -> None:
        self.device = loop.device
        self.scope = loop.name
        state = [self._outer_value(t) for t in loop.inputs]
        first = None
        for k, known in enumerate(steps):
            env: Dict[tf.Tensor, tensor_lists.Value] = {}
            for i, placeholder in enumerate(loop.body_inputs):
                env[placeholder] = (Static(known[placeholder], placeholder.dtype)
                                    if placeholder in known else state[i])
            emitted: Dict[tf.Operation, str] = {}
            for op in loop.body.get_operations():
                if op.type == "Placeholder":
                    continue
                if op.outputs and all(o in known for o in op.outputs):
                    env.update((o, Static(known[o], o.dtype)) for o in op.outputs)
                    continue
                name = self._step_name(loop, k, op)
                if op.type in tensor_lists.LIST_TYPES or op.type == "Identity" and (
                        isinstance(env[op.inputs[0]], TensorList)):
                    outputs = (self._list_ops().evaluate(
                        op, [env[i] for i in op.inputs], op.inputs[0].shape, name)
                        if op.type != "Identity" else [env[op.inputs[0]]])
                    env.update(zip(op.outputs, outputs))
                    continue
                if op.type == "NoOp":
                    continue
                if op.type in function_library.CALL_TYPES:
                    raise tensor_lists.UnsupportedListError(
                        f"its body calls a function ({op.name}, {op.type}): nested control "
                        "flow is not unrolled")
                emitted[op] = self._emit(op, env, emitted, name)
                first = first or emitted[op]
                env.update((o, Ref("%s:%d" % (emitted[op], o.value_index)))
                           for o in op.outputs)
            state = [env[t] for t in loop.body_outputs]
        self._replace(loop, state, first)

    def _step_name(self, loop: loops.Loop, k: int, op: tf.Operation) -> str:
        prefix = loop.name + "/"
        relative = op.name[len(prefix):] if op.name.startswith(prefix) else op.name
        return f"{loop.name}/step_{k}/{relative}"

    def _emit(self, op: tf.Operation, env, emitted: Dict[tf.Operation, str], name: str) -> str:
        inputs = [self._input_name(env[i], op.name) for i in op.inputs]
        attrs = node_attrs.public_attrs(op.node_def.attr)
        control = [emitted[c] for c in op.control_inputs if c in emitted]
        return self.nodes.node(self.nodes.unique_name(name), op.type, inputs,
                               device=self.device, control=control, **attrs)

    # --- The loop's readers ---------------------------------------------------------------

    def _replace(self, loop: loops.Loop, final: List[tensor_lists.Value],
                 first: Optional[str]) -> None:
        """Moves the loop's readers onto the last step's values; marks it replaced."""
        for out, value in zip(loop.outputs, final):
            if out is not None:
                self._replace_tensor(out, value)
        for op in loop.ops:
            self.rewrite.set_attr(op, marks.REPLACED_BY_ATTR,
                                  attr_value_pb2.AttrValue(s=(first or "").encode()))

    def _replace_tensor(self, t: tf.Tensor, value: tensor_lists.Value) -> None:
        self.outer[t] = value
        consumers = [c for c in t.consumers() if not marks.is_replaced(c)]
        if not isinstance(value, TensorList):
            new = value.tensor if isinstance(value, Ref) and value.tensor is not None else (
                self._input_name(value, t.name))
            if new is not t:
                self.rewrite.reroute_consumers(t, new, consumers)
            return
        for c in consumers:
            if c.type == "Identity":
                outputs = [value]
            elif c.type in tensor_lists.LIST_TYPES:
                outputs = self._list_ops().evaluate(
                    c, [self._outer_value(i) if i is not t else value for i in c.inputs],
                    c.inputs[0].shape, c.name + "/unrolled")
            else:
                raise tensor_lists.UnsupportedListError(
                    f"{c.name} ({c.type}) reads the list {t.name} the loop writes")
            for out, out_value in zip(c.outputs, outputs):
                self._replace_tensor(out, out_value)
            self.rewrite.set_attr(c, marks.REPLACED_BY_ATTR,
                                  attr_value_pb2.AttrValue(s=t.name.encode()))
