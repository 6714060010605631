"""Layers the rewrite cannot reach: inside the functions of functional control flow.

TensorFlow 2 builds `tf.cond` as an `If` / `StatelessIf` op, `tf.while_loop`
as a `While` / `StatelessWhile` op, and a `tf.function` called from a graph as
a `PartitionedCall` / `StatefulPartitionedCall` op; tf_keras models without a
fixed learning phase put each batch norm (and what follows) in such an `If`.
The ops of those bodies live in FunctionDefs of the graph's function library,
not in the graph, so neither the fold nor the quantize pass sees them: a
Conv2D inside a `tf.cond` branch would silently stay float.

`find_function_layers(graph)` lists every such layer (following nested calls:
a function whose body calls another function, a `While` inside an `If`
branch) so the caller can warn about each one by name. The workaround, given
in `FunctionLayer.describe()` and docs/known_limits.md: build the model
with a fixed learning phase (`training=True/False` as a Python bool,
`tf_keras.backend.set_learning_phase`), or call
`tf.compat.v1.disable_control_flow_v2()` before building the model so that
conds and loops are built from graph ops (Switch/Merge, Enter/Exit), which the
passes do see; a `tf.function` is called as its Python function instead.
"""
import dataclasses
from typing import Dict, List, Sequence, Set, Tuple

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import function_pb2

from qat.engine import function_library
from qat.engine import marks
from qat.matching import layer_patterns

# The layer types whose weights the rewrite quantizes (transposed convs too).
DEFAULT_LAYER_TYPES = tuple(layer_patterns.LAYER_TYPES) + ("Conv2DBackpropInput",)

WORKAROUND = (
    "build the model with a fixed learning phase (training=True/False as a "
    "Python bool, or tf_keras.backend.set_learning_phase) and without "
    "tf.cond/tf.while_loop around layers, or call "
    "tf.compat.v1.disable_control_flow_v2() before building the model; call a "
    "tf.function's Python function directly (f.python_function) instead of "
    "the tf.function")


@dataclasses.dataclass(frozen=True)
class FunctionLayer:
    """A layer op inside a function body that the rewrite cannot edit.

    Attributes:
      call_op: name of the graph op that calls the function (through nested
        functions, the outermost one, which is in the graph).
      call_type: that op's type (If, While, StatefulPartitionedCall, ...).
      function: name of the FunctionDef whose body holds the layer.
      layer: the layer's node name inside that function.
      layer_type: the layer's op type.
    """
    call_op: str
    call_type: str
    function: str
    layer: str
    layer_type: str

    def describe(self) -> str:
        """A one-line warning naming the layer, why it stays float, and the fix."""
        return (f"layer {self.layer} ({self.layer_type}) in function {self.function}, "
                f"called by the {self.call_type} op {self.call_op}, is left float: "
                f"the rewrite cannot edit function bodies; {WORKAROUND}")


def _calls(node_op: str, attrs, library: Dict[str, function_pb2.FunctionDef]
           ) -> List[str]:
    names = function_library.called_functions(attrs)
    if node_op in library:  # A direct call: the op type is the function name.
        names.append(node_op)
    return names


def find_function_layers(graph: tf.Graph,
                         layer_types: Sequence[str] = DEFAULT_LAYER_TYPES
                         ) -> List[FunctionLayer]:
    """Lists the layers inside functions called from `graph`'s ops.

    Args:
      graph: the graph to scan (not modified).
      layer_types: the op types that count as layers.

    Returns:
      One `FunctionLayer` per (calling graph op, layer node), in graph order;
      a function called from two graph ops is reported for each call, a layer
      reached twice through one call (both branches calling one function)
      once. Empty when the graph calls no function.
    """
    library = function_library.library_of(graph)
    if not library:
        return []  # No function to look into.
    wanted = frozenset(layer_types)
    found = []
    for op in graph.get_operations():
        if marks.is_replaced(op):
            continue  # A layer call qat put in the graph (qat.prepare.layer_calls).
        attrs: Dict[str, attr_value_pb2.AttrValue] = dict(op.node_def.attr)
        pending = _calls(op.type, attrs, library)
        if not pending:
            continue
        visited = set()
        reported: Set[Tuple[str, str]] = set()
        while pending:
            fname = pending.pop(0)
            if fname in visited or fname not in library:
                continue
            visited.add(fname)
            for node in library[fname].node_def:
                if node.op in wanted and (fname, node.name) not in reported:
                    reported.add((fname, node.name))
                    found.append(FunctionLayer(op.name, op.type, fname, node.name,
                                               node.op))
                pending.extend(_calls(node.op, node.attr, library))
    return found
