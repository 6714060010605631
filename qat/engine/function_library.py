"""A graph's function library and the ops that call its functions.

TensorFlow keeps the bodies of functional control flow (`If`, `While`,
`Case`) and of function calls (`PartitionedCall`) as FunctionDefs in the
graph's library; the calling op names them in function attributes (`then_branch`,
`body`, `f`, `branches`). Every pass that looks into those bodies reads the
same facts, kept here once:

* `CALL_TYPES` (and its parts `CONDITIONAL_TYPES`, `LOOP_TYPES`,
  `CASE_TYPES`, `FUNCTION_CALL_TYPES`): the op types that call functions;
* `library_of(graph)`: {function name: FunctionDef};
* `called_functions(attrs)`: the functions a node's attributes name.
"""
from typing import Dict, List, Mapping

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import function_pb2

# `tf.cond` in TF 2 control flow.
CONDITIONAL_TYPES = frozenset(["If", "StatelessIf"])
# `tf.while_loop` in TF 2 control flow.
LOOP_TYPES = frozenset(["While", "StatelessWhile"])
# `tf.switch_case`.
CASE_TYPES = frozenset(["Case", "StatelessCase"])
# A call of one function (a `tf.function` called in a graph, a Keras layer call).
FUNCTION_CALL_TYPES = frozenset(["PartitionedCall", "StatefulPartitionedCall"])
# Every op type that calls functions of the library through function attributes.
CALL_TYPES = CONDITIONAL_TYPES | LOOP_TYPES | CASE_TYPES | FUNCTION_CALL_TYPES


def library_of(graph: tf.Graph) -> Dict[str, function_pb2.FunctionDef]:
    """The function library of `graph`.

    Args:
      graph: the graph (not modified; a graph without functions is not
        serialized).

    Returns:
      {function name: FunctionDef}, empty when the graph has no function.
    """
    if not graph._functions:  # pylint: disable=protected-access
        return {}
    return {f.signature.name: f for f in graph.as_graph_def().library.function}


def called_functions(attrs: Mapping[str, attr_value_pb2.AttrValue]) -> List[str]:
    """The names of the functions a node's attributes refer to.

    Args:
      attrs: a NodeDef's `attr` map (or `dict(op.node_def.attr)`).

    Returns:
      The function names of its function attributes and function-list
      attributes (a `Case`'s branches), in attribute order. A direct call,
      whose op type is the function's name, is not included.
    """
    names = []
    for attr in attrs.values():
        if attr.HasField("func"):
            names.append(attr.func.name)
        elif attr.HasField("list"):
            names.extend(f.name for f in attr.list.func)
    return names
