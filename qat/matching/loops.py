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
* the number of steps, found by running the condition and the counters'
  updates on those values, is the constant evaluator's
  (`qat.engine.static_values.trip_count`); finding the recurrent loops of a
  graph (While ops and TF1 frames) is `qat.matching.loop_finder`'s.
"""
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf
from tensorflow.core.framework import function_pb2
from tensorflow.python.framework import function_def_to_graph

from qat.engine import function_library
from qat.matching import layer_patterns

# The layer types that make a loop recurrent.
LAYER_TYPES = frozenset(layer_patterns.LAYER_TYPES) | {"Conv2DBackpropInput"}


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


def body_layers(op: tf.Operation, library: Dict[str, function_pb2.FunctionDef]) -> List[str]:
    """The layer ops in the functions `op` calls (through nested calls)."""
    pending = function_library.called_functions(dict(op.node_def.attr))
    seen, found = set(), []
    while pending:
        name = pending.pop(0)
        if name in seen or name not in library:
            continue
        seen.add(name)
        for node in library[name].node_def:
            if node.op in LAYER_TYPES:
                found.append(node.name)
            pending.extend(function_library.called_functions(node.attr))
            if node.op in library:
                pending.append(node.op)
    return found


def calls_recurrent_loop(op: tf.Operation, library: Dict[str, function_pb2.FunctionDef]
                         ) -> bool:
    """Whether `op` is a function call whose body runs a loop computing a
    layer (tf_keras's `LSTM` / `GRU` in a tf.function: `standard_lstm`)."""
    if op.type not in function_library.FUNCTION_CALL_TYPES:
        return False
    fdef = library.get(op.get_attr("f").name)
    if fdef is None:
        return False
    for node in fdef.node_def:
        if node.op in function_library.LOOP_TYPES and any(
                library.get(name) is not None and any(
                    n.op in LAYER_TYPES for n in library[name].node_def)
                for name in function_library.called_functions(node.attr)):
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
