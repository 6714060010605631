"""Functional `While` loops of recurrent layers: their bodies and trip counts.

TensorFlow 2 builds a loop (`tf.while_loop`: Keras `LSTM` / `GRU` /
`SimpleRNN` with `unroll=False`, TF1 `dynamic_rnn`) as one `While` /
`StatelessWhile` op whose condition and body are functions of the graph's
library, in graph mode too. A *recurrent loop* is one whose body computes a
layer (a MatMul or conv reading weights). These are graph facts for
`qat.prepare.loops`, which unrolls such a loop when its number of steps is
known when the graph is built:

* `Loop.body` / `Loop.cond`: the functions as plain graphs (one Placeholder
  per loop variable, in order), which `qat.prepare.loops` reads op by op;
* `Loop.counters`: the loop variables whose values at every step are known
  (a step counter, the maximum number of iterations): their initial values
  are constants and the body computes them from constants and counters only;
* `trip_count`: the number of steps, found by running the condition and the
  counters' updates on those values, or None with the reason (the condition
  reads a value of the data: a sequence length given at run time).
"""
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import function_pb2
from tensorflow.python.framework import function_def_to_graph
from tensorflow.python.framework import tensor_util

from qat.matching import layer_patterns

LOOP_TYPES = frozenset(["While", "StatelessWhile"])
# Op types that call functions (nested control flow in a body).
CALL_TYPES = frozenset(["If", "StatelessIf", "While", "StatelessWhile", "Case",
                        "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"])
# The layer types that make a loop recurrent.
LAYER_TYPES = frozenset(layer_patterns.LAYER_TYPES) | {"Conv2DBackpropInput"}
# Dtypes no counter has (tensor lists, variable handles).
_HANDLE_DTYPES = (tf.variant, tf.resource)
# How many steps a loop may have (a loop of more is refused).
MAX_STEPS = 10000


@dataclasses.dataclass
class Loop:
    """One loop: a `While` op and its functions, or a TF1 loop's frame
    (`qat.matching.frames`), in one form.

    Attributes:
      name: the loop's name (the While op's; a TF1 loop's name scope).
      kind: what it is, for messages ("While", "TF1 while loop").
      inputs: the graph's tensors that are the loop variables' first values
        (then the values a TF1 loop reads unchanged).
      outputs: the graph's tensors that are their last values (None where
        the graph has none).
      ops: the ops of the graph the loop is (the While op; a frame's ops).
      device: the device of the loop.
      body: the body as a plain graph; `body_inputs` are its Placeholders
        (one per loop variable) and `body_outputs` the loop variables' next
        values, in loop-variable order.
      cond: the condition likewise (`cond_inputs`, `cond_output`).
      counters: loop-variable indices whose values are known at every step.
      layers: names of the layer ops in the body (and functions it calls).
    """
    name: str
    kind: str
    inputs: List[tf.Tensor]
    outputs: List[Optional[tf.Tensor]]
    ops: List[tf.Operation]
    device: str
    body: tf.Graph
    body_inputs: List[tf.Tensor]
    body_outputs: List[tf.Tensor]
    cond: tf.Graph
    cond_inputs: List[tf.Tensor]
    cond_output: tf.Tensor
    counters: Set[int] = dataclasses.field(default_factory=set)
    layers: List[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        """The loop and the layers it computes, for messages."""
        return f"the {self.kind} '{self.name}' (layers {', '.join(self.layers)})"


def library_of(graph: tf.Graph) -> Dict[str, function_pb2.FunctionDef]:
    """{function name: FunctionDef} of `graph` (empty without functions)."""
    if not graph._functions:  # pylint: disable=protected-access
        return {}
    return {f.signature.name: f for f in graph.as_graph_def().library.function}


def _called(node_attrs) -> List[str]:
    names = []
    for attr in node_attrs.values():
        if attr.HasField("func"):
            names.append(attr.func.name)
        elif attr.HasField("list"):
            names.extend(f.name for f in attr.list.func)
    return names


def body_layers(op: tf.Operation, library: Dict[str, function_pb2.FunctionDef]) -> List[str]:
    """The layer ops in the functions `op` calls (through nested calls)."""
    pending = _called(dict(op.node_def.attr))
    seen, found = set(), []
    while pending:
        name = pending.pop(0)
        if name in seen or name not in library:
            continue
        seen.add(name)
        for node in library[name].node_def:
            if node.op in LAYER_TYPES:
                found.append(node.name)
            pending.extend(_called(node.attr))
            if node.op in library:
                pending.append(node.op)
    return found


def calls_recurrent_loop(op: tf.Operation, library: Dict[str, function_pb2.FunctionDef]
                         ) -> bool:
    """Whether `op` is a function call whose body runs a loop computing a
    layer (tf_keras's `LSTM` / `GRU` in a tf.function: `standard_lstm`)."""
    if op.type not in ("PartitionedCall", "StatefulPartitionedCall"):
        return False
    fdef = library.get(op.get_attr("f").name)
    if fdef is None:
        return False
    for node in fdef.node_def:
        if node.op in LOOP_TYPES and any(
                library.get(name) is not None and any(
                    n.op in LAYER_TYPES for n in library[name].node_def)
                for name in _called(node.attr)):
            return True
    return False


def function_graph_def(fdef: function_pb2.FunctionDef, shapes):
    """`fdef` as a GraphDef (a Placeholder per argument, named after it) and
    {output argument: "node:index"}."""
    graph_def, names = function_def_to_graph.function_def_to_graph_def(fdef, shapes)
    return graph_def, {arg.name: names[fdef.ret[arg.name]] for arg in fdef.signature.output_arg}


def _function_graph(fdef: function_pb2.FunctionDef, shapes
                    ) -> Tuple[tf.Graph, List[tf.Tensor], List[tf.Tensor]]:
    """A FunctionDef as a plain graph: (graph, its inputs, its outputs), without
    control inputs."""
    graph_def, names = function_def_to_graph.function_def_to_graph_def(fdef, shapes)
    for node in graph_def.node:  # They order a step's variable reads; values do not need them.
        data = [i for i in node.input if not i.startswith("^")]
        del node.input[:]
        node.input.extend(data)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    inputs = [graph.get_tensor_by_name(arg.name + ":0") for arg in fdef.signature.input_arg]
    outputs = [graph.get_tensor_by_name(names[fdef.ret[arg.name]])
               for arg in fdef.signature.output_arg]
    return graph, inputs, outputs


def loop_of(op: tf.Operation, library: Dict[str, function_pb2.FunctionDef]) -> Loop:
    """The `Loop` of a While op (its functions read from `library`)."""
    shapes = [t.shape for t in op.inputs]
    body, body_inputs, body_outputs = _function_graph(library[op.get_attr("body").name], shapes)
    cond, cond_inputs, cond_outputs = _function_graph(library[op.get_attr("cond").name], shapes)
    return Loop(op.name, f"{op.type} loop", list(op.inputs), list(op.outputs), [op], op.device,
                body, body_inputs, body_outputs, cond, cond_inputs, cond_outputs[0],
                layers=body_layers(op, library))


class StaticValues(object):
    """Values of tensors known when the graph is built (`value(t)`, or None).

    Constants, shapes (a static dimension of a partly known shape too) and
    stateless ops of known inputs, evaluated once in a scratch graph.
    """

    def __init__(self):
        self._memo: Dict[tf.Tensor, Optional[np.ndarray]] = {}

    def value(self, t: tf.Tensor) -> Optional[np.ndarray]:
        stack = [t]
        while stack:
            top = stack[-1]
            if top in self._memo:
                stack.pop()
                continue
            missing = [i for i in self._needs(top) if i not in self._memo]
            if missing:
                stack.extend(missing)
                continue
            self._memo[top] = self._compute(top)
            stack.pop()
        return self._memo[t]

    @staticmethod
    def _needs(t: tf.Tensor) -> List[tf.Tensor]:
        op = t.op
        if op.type in ("Const", "Shape", "Placeholder") or _stateful(op) or (
                op.type == "StridedSlice" and op.inputs[0].op.type == "Shape"):
            return list(op.inputs[1:]) if op.type == "StridedSlice" else []
        return list(op.inputs)

    def _compute(self, t: tf.Tensor) -> Optional[np.ndarray]:
        op = t.op
        try:
            value = tensor_util.constant_value(t)
        except (TypeError, ValueError):
            value = None
        if value is not None:
            return np.asarray(value)
        if op.type == "StridedSlice" and op.inputs[0].op.type == "Shape":
            return self._shape_slice(op)
        if (op.type in ("Placeholder", "Shape") or _stateful(op) or op.type in CALL_TYPES
                or any(o.dtype in _HANDLE_DTYPES for o in op.outputs)):
            return None
        inputs = [self._memo.get(i) for i in op.inputs]
        if any(v is None for v in inputs):
            return None
        return evaluate(op, inputs)[t.value_index]

    def _shape_slice(self, op: tf.Operation) -> Optional[np.ndarray]:
        """`tf.shape(x)[k]` where dimension k of x is static."""
        dims = op.inputs[0].op.inputs[0].shape
        begin, end, strides = (self._memo.get(i) for i in op.inputs[1:])
        if (dims.rank is None or begin is None or end is None or strides is None
                or op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask")):
            return None
        marker = np.arange(dims.rank).astype(op.inputs[0].dtype.as_numpy_dtype)
        picked = evaluate(op, [marker, begin, end, strides])[0]
        values = [dims[int(k)] for k in np.ravel(picked)]
        if any(v is None for v in values):
            return None
        return np.asarray(values, op.outputs[0].dtype.as_numpy_dtype).reshape(np.shape(picked))


def _stateful(op: tf.Operation) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):
        return True


def evaluate(op: tf.Operation, inputs: List[np.ndarray]) -> List[np.ndarray]:
    """Runs the stateless `op` on `inputs` in a scratch graph."""
    node = tf.compat.v1.NodeDef()
    node.CopyFrom(op.node_def)
    node.name = "op"
    del node.input[:]
    node.ClearField("device")
    for key in [k for k in node.attr if k.startswith("_")]:  # Colocation with other nodes.
        del node.attr[key]
    graph = tf.Graph()
    with graph.as_default():
        graph_def = graph.as_graph_def()
        for k, (t, v) in enumerate(zip(op.inputs, inputs)):
            const = graph_def.node.add()
            const.name = "input_%d" % k
            const.op = "Const"
            const.attr["dtype"].type = t.dtype.as_datatype_enum
            const.attr["value"].tensor.CopyFrom(
                tf.make_tensor_proto(np.asarray(v, t.dtype.as_numpy_dtype)))
            node.input.append(const.name)
        graph_def.node.add().CopyFrom(node)
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as sess:
            return sess.run([graph.get_tensor_by_name("op:%d" % k)
                             for k in range(len(op.outputs))])


def static_ops(graph: tf.Graph, known: Set[tf.Tensor]) -> Set[tf.Operation]:
    """The ops of `graph` computed from constants and `known` placeholders only."""
    found: Set[tf.Operation] = set()
    for op in graph.get_operations():  # Imported: in topological order.
        if op.type == "Placeholder":
            if op.outputs[0] in known:
                found.add(op)
            continue
        if (_stateful(op) or op.type in CALL_TYPES
                or any(o.dtype in _HANDLE_DTYPES for o in op.outputs)):
            continue
        if all(i.op in found for i in op.inputs):
            found.add(op)
    return found


def _read_placeholders(t: tf.Tensor) -> Set[tf.Operation]:
    """The Placeholder ops `t` is computed from."""
    stack, seen, found = [t.op], set(), set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type == "Placeholder":
            found.add(op)
        stack.extend(i.op for i in op.inputs)
    return found


def find_counters(loop: Loop, values: StaticValues) -> None:
    """Sets `loop.counters` (see the module docstring)."""
    counters = {k for k, t in enumerate(loop.inputs)
                if t.dtype not in _HANDLE_DTYPES and values.value(t) is not None}
    while True:
        known = {loop.body_inputs[k] for k in counters}
        static = static_ops(loop.body, known)
        kept = {k for k in counters if loop.body_outputs[k].op in static}
        if kept == counters:
            break
        counters = kept
    loop.counters = counters


def trip_count(loop: Loop, values: StaticValues
               ) -> Tuple[Optional[int], str, List[Dict[tf.Tensor, np.ndarray]]]:
    """The loop's number of steps and the counters' values at each step.

    Returns:
      (steps, "", [{body tensor: value} per step, for every body tensor
      computed from counters and constants]) or (None, why, []).
    """
    find_counters(loop, values)
    known_cond = {loop.cond_inputs[k] for k in loop.counters}
    if loop.cond_output.op not in static_ops(loop.cond, known_cond):
        read = _read_placeholders(loop.cond_output)
        unknown = sorted({loop.inputs[k].name for k, t in enumerate(loop.cond_inputs)
                          if k not in loop.counters and t.op in read})
        return None, ("its condition reads a value that is only known when the model runs "
                      f"({', '.join(unknown)}: a sequence length that is not static)"), []
    known_body = {loop.body_inputs[k] for k in loop.counters}
    static = [op for op in loop.body.get_operations()
              if op in static_ops(loop.body, known_body) and op.type != "Placeholder"]
    fetches = [t for op in static for t in op.outputs]
    state = {k: values.value(loop.inputs[k]) for k in loop.counters}
    steps: List[Dict[tf.Tensor, np.ndarray]] = []
    with tf.compat.v1.Session(graph=loop.cond) as cond_sess, \
            tf.compat.v1.Session(graph=loop.body) as body_sess:
        for _ in range(MAX_STEPS + 1):
            go = cond_sess.run(loop.cond_output,
                               {loop.cond_inputs[k]: v for k, v in state.items()})
            if not bool(go):
                return len(steps), "", steps
            if len(steps) == MAX_STEPS:
                break
            feed = {loop.body_inputs[k]: v for k, v in state.items()}
            fetched = body_sess.run(fetches, feed) if fetches else []
            step = dict(zip(fetches, fetched))
            step.update({loop.body_inputs[k]: v for k, v in state.items()})
            steps.append(step)
            state = {k: step[loop.body_outputs[k]] for k in loop.counters}
    return None, f"it runs more than {MAX_STEPS} steps", []
