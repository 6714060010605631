"""The ops of a graph by type: one index per graph, extended as ops are added.

Many passes look for structures most graphs lack (While/If loops, function
calls, TF1 frames, constant fills, fused layer norms, resource gathers,
observers). Scanning `graph.get_operations()` for each costs every user the
whole graph once per pass, and reading `op.type` is a call into TensorFlow's
C API each time (about 3 us an op: tens of milliseconds a scan on a 10k-op
graph). This index reads each op's type once: the first question about a
graph builds it in one pass over its ops, later questions extend it by the
ops added since (TensorFlow never removes an op from a graph, and
`get_operations()` lists the ops in the order they were made). The passes
then decide from it, and a graph without the structure costs nothing.

Only the type is indexed: it never changes. Whatever can change (an op's
inputs, the `_qat_replaced_by` mark) is still read from the op.
"""
from typing import Dict, FrozenSet, Iterable, List

import tensorflow as tf


class _Index(object):
    """{op type: ops of that type, in graph order} for the first `count` ops."""

    def __init__(self):
        self.count = 0
        self.version = -1
        self.by_type: Dict[str, List[tf.Operation]] = {}

    def update(self, graph: tf.Graph) -> "_Index":
        version = graph.version
        if version != self.version:
            ops = graph.get_operations()
            by_type = self.by_type
            for op in ops[self.count:]:
                by_type.setdefault(op.type, []).append(op)
            self.count = len(ops)
            self.version = version
        return self


# The graph's attribute holding its index. Not a table keyed by graph: the
# index holds the graph's ops, which hold the graph, so a table would keep
# every graph it saw alive; an attribute of the graph goes with it.
_ATTRIBUTE = "_qat_op_index"


def _index(graph: tf.Graph) -> _Index:
    index = getattr(graph, _ATTRIBUTE, None)
    if index is None:
        index = _Index()
        setattr(graph, _ATTRIBUTE, index)
    return index.update(graph)


def ops_of_types(graph: tf.Graph, types: Iterable[str]) -> List[tf.Operation]:
    """The ops of `graph` whose type is one of `types`, in graph order.

    Args:
      graph: the graph to look in (its ops added so far).
      types: op type names, e.g. `("While", "StatelessWhile")`.

    Returns:
      A new list of the matching ops, in the order `graph.get_operations()`
      lists them.
    """
    by_type = _index(graph).by_type
    lists = [by_type[t] for t in set(types) if t in by_type]
    if len(lists) == 1:
        return list(lists[0])
    found = [op for ops in lists for op in ops]
    found.sort(key=lambda op: op._id)  # pylint: disable=protected-access
    return found


def op_types(graph: tf.Graph) -> FrozenSet[str]:
    """The op types `graph` has.

    Args:
      graph: the graph to look in.

    Returns:
      The type names of its ops (each once).
    """
    return frozenset(_index(graph).by_type)


def has_types(graph: tf.Graph, types: Iterable[str]) -> bool:
    """Whether `graph` has an op of one of `types`.

    Args:
      graph: the graph to look in.
      types: op type names.

    Returns:
      True when at least one op of `graph` has one of the types.
    """
    by_type = _index(graph).by_type
    return any(t in by_type for t in types)
