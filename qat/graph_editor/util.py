"""Utility functions of the graph editor (contrib r1.15 `graph_editor.util`).

Lists of ops and tensors, control outputs, placeholder naming, tree helpers
(from `_containers`) and scope helpers, working on live TF 2 `tf.Graph`s (graph mode).
"""
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

# pylint: disable=unused-import
from qat.graph_editor._containers import ListView
from qat.graph_editor._containers import concatenate_unique
from qat.graph_editor._containers import flatten_tree
from qat.graph_editor._containers import is_iterable
from qat.graph_editor._containers import transform_tree
from qat.graph_editor._checks import _check_not_func_graph
from qat.graph_editor._checks import check_graph_modifiable
from qat.graph_editor._placeholders import make_placeholder_from_dtype_and_shape
from qat.graph_editor._placeholders import make_placeholder_from_tensor
from qat.graph_editor._placeholders import placeholder_name
from qat.graph_editor._placeholders import scope_basename
from qat.graph_editor._placeholders import scope_dirname
from qat.graph_editor._placeholders import scope_finalize
# pylint: enable=unused-import

__all__ = [
    "make_list_of_op",
    "get_tensors",
    "make_list_of_t",
    "get_generating_ops",
    "get_consuming_ops",
    "ControlOutputs",
    "placeholder_name",
    "make_placeholder_from_tensor",
    "make_placeholder_from_dtype_and_shape",
]

# Collections `tf.compat.v1.GraphKeys` defines; the transformer treats them
# as predefined (they are not copied as user collections).
_TF_PREDEFINED_COLLECTION_NAMES = None


def check_graphs(*args) -> None:
    """Raises ValueError unless all the arguments' `.graph` agree (None ignored).

    Args:
      *args: objects with a `graph` attribute (ops, tensors, SubGraphViews).

    Raises:
      ValueError: if two arguments belong to different graphs.
    """
    graph = None
    for i, obj in enumerate(args):
        obj_graph = getattr(obj, "graph", None)
        if obj_graph is None:
            continue
        if graph is None:
            graph = obj_graph
        elif obj_graph is not graph:
            raise ValueError(
                "Argument[{}] ({}) belongs to another graph than the previous "
                "arguments.".format(i, _describe(obj)))


def _describe(obj) -> str:
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) else type(obj).__name__


def get_unique_graph(tops, check_types=None, none_if_empty: bool = False):
    """Returns the unique graph of a list of ops/tensors.

    Args:
      tops: a tf.Graph, or an iterable of ops/tensors.
      check_types: the allowed types of the items (op and tensor when None).
      none_if_empty: return None instead of raising for an empty `tops`.

    Returns:
      The graph all the items belong to.

    Raises:
      TypeError: if `tops` is not iterable or an item has the wrong type.
      ValueError: if the items belong to different graphs or to a FuncGraph,
        or `tops` is empty and `none_if_empty` is False.
    """
    if isinstance(tops, tf.Graph):
        return tops
    if not is_iterable(tops):
        raise TypeError("{} is not iterable".format(type(tops)))
    if check_types is None:
        check_types = (tf.Operation, tf.Tensor)
    elif not is_iterable(check_types):
        check_types = (check_types,)
    else:
        check_types = tuple(check_types)
    graph = None
    for item in tops:
        if not isinstance(item, check_types):
            raise TypeError("Expected a type in ({}), got: {} ({!r})".format(
                ", ".join(t.__name__ for t in check_types), type(item), item))
        if graph is None:
            graph = item.graph
        elif item.graph is not graph:
            raise ValueError(
                "{} does not belong to the same graph as the other items; "
                "use ops and tensors of one graph.".format(_describe(item)))
    if graph is None and not none_if_empty:
        raise ValueError("Can't find the unique graph of an empty list")
    if graph is not None:
        # FuncGraph tensors are unhashable and compare element-wise.
        _check_not_func_graph(graph, "select")
    return graph


def make_list_of_op(ops, check_graph: bool = True, allow_graph: bool = True,
                    ignore_ts: bool = False) -> List[tf.Operation]:
    """Converts ops to a list of `tf.Operation`.

    Args:
      ops: a tf.Graph (all its ops), a single op, or an iterable of ops.
      check_graph: check that all the ops belong to the same graph.
      allow_graph: accept a tf.Graph.
      ignore_ts: silently drop tensors instead of raising TypeError.

    Returns:
      A new list of ops.

    Raises:
      TypeError: if `ops` is a graph and `allow_graph` is False, or an item is
        not an op (nor a tensor with `ignore_ts`).
      ValueError: if the ops belong to different graphs.
    """
    if isinstance(ops, tf.Graph):
        if allow_graph:
            return ops.get_operations()
        raise TypeError("allow_graph is False: cannot convert a tf.Graph.")
    if not is_iterable(ops) or isinstance(ops, (str, bytes)):
        ops = [ops]
    ops = list(ops)
    if not ops:
        return []
    if check_graph:
        get_unique_graph(ops, check_types=None if ignore_ts else tf.Operation)
    else:
        allowed = (tf.Operation, tf.Tensor) if ignore_ts else tf.Operation
        for op in ops:
            if not isinstance(op, allowed):
                raise TypeError("Expected a tf.Operation, got: {}".format(type(op)))
    return [op for op in ops if isinstance(op, tf.Operation)]


def get_tensors(graph: tf.Graph) -> List[tf.Tensor]:
    """Returns all the output tensors of the ops of `graph`, in op order.

    Raises:
      TypeError: if `graph` is not a tf.Graph.
    """
    if not isinstance(graph, tf.Graph):
        raise TypeError("Expected a graph, got: {}".format(type(graph)))
    ts = []
    for op in graph.get_operations():
        ts += op.outputs
    return ts


def make_list_of_t(ts, check_graph: bool = True, allow_graph: bool = True,
                   ignore_ops: bool = False) -> List[tf.Tensor]:
    """Converts tensors to a list of `tf.Tensor`.

    Args:
      ts: a tf.Graph (all its tensors), a single tensor, or an iterable.
      check_graph: check that all the tensors belong to the same graph.
      allow_graph: accept a tf.Graph.
      ignore_ops: silently drop ops instead of raising TypeError.

    Returns:
      A new list of tensors.

    Raises:
      TypeError: if `ts` is a graph and `allow_graph` is False, or an item is
        not a tensor (nor an op with `ignore_ops`).
      ValueError: if the tensors belong to different graphs.
    """
    if isinstance(ts, tf.Graph):
        if allow_graph:
            return get_tensors(ts)
        raise TypeError("allow_graph is False: cannot convert a tf.Graph.")
    if not is_iterable(ts) or isinstance(ts, (str, bytes)):
        ts = [ts]
    ts = list(ts)
    if not ts:
        return []
    if check_graph:
        get_unique_graph(ts, check_types=None if ignore_ops else tf.Tensor)
    else:
        allowed = (tf.Operation, tf.Tensor) if ignore_ops else tf.Tensor
        for t in ts:
            if not isinstance(t, allowed):
                raise TypeError("Expected a tf.Tensor, got: {}".format(type(t)))
    return [t for t in ts if isinstance(t, tf.Tensor)]


def get_generating_ops(ts) -> List[tf.Operation]:
    """Returns the ops generating `ts` (one per tensor, duplicates kept).

    Args:
      ts: a tensor or an iterable of tensors.

    Raises:
      TypeError: if `ts` cannot be converted to a list of tensors.
    """
    ts = make_list_of_t(ts, allow_graph=False)
    return [t.op for t in ts]


def get_consuming_ops(ts) -> List[tf.Operation]:
    """Returns the ops consuming `ts`, each once, in order.

    Args:
      ts: a tensor or an iterable of tensors.

    Raises:
      TypeError: if `ts` cannot be converted to a list of tensors.
    """
    ts = make_list_of_t(ts, allow_graph=False)
    ops = []
    seen = set()
    for t in ts:
        for op in t.consumers():
            if op not in seen:
                seen.add(op)
                ops.append(op)
    return ops


class ControlOutputs(object):
    """The control outputs of the ops of a graph.

    `get(op)` reads the live graph, so it is always current; `get_all()`
    returns a dict built on first use and rebuilt by `update()`.
    """

    def __init__(self, graph: tf.Graph):
        if not isinstance(graph, tf.Graph):
            raise TypeError("Expected a tf.Graph, got: {}".format(type(graph)))
        self._graph = graph
        self._control_outputs = None
        self._version = None

    def update(self) -> "ControlOutputs":
        """Rebuilds the op -> control outputs dict (call after edits)."""
        self._control_outputs = None
        return self

    def _build(self) -> Dict[tf.Operation, List[tf.Operation]]:
        result = {}
        for op in self._graph.get_operations():
            for control_input in op.control_inputs:
                result.setdefault(control_input, []).append(op)
        self._version = self._graph.version
        return result

    def get_all(self) -> Dict[tf.Operation, List[tf.Operation]]:
        """Returns a dict op -> list of ops having it as control input."""
        if self._control_outputs is None or self._version != self._graph.version:
            self._control_outputs = self._build()
        return self._control_outputs

    def get(self, op: tf.Operation) -> Tuple[tf.Operation, ...]:
        """Returns the ops having `op` as a control input (() if none)."""
        if op.graph is not self._graph:
            return ()
        return tuple(op._control_outputs)  # pylint: disable=protected-access

    @property
    def graph(self) -> tf.Graph:
        return self._graph


def get_predefined_collection_names() -> List[str]:
    """Returns the names of the collections `tf.compat.v1.GraphKeys` defines."""
    global _TF_PREDEFINED_COLLECTION_NAMES
    if _TF_PREDEFINED_COLLECTION_NAMES is None:
        keys = tf.compat.v1.GraphKeys
        # VARIABLES is a deprecated alias of GLOBAL_VARIABLES ("variables"),
        # and reading it logs a deprecation warning.
        _TF_PREDEFINED_COLLECTION_NAMES = sorted({
            getattr(keys, name) for name in dir(keys)
            if not name.startswith("_") and name != "VARIABLES"
            and isinstance(getattr(keys, name), str)
        })
    return list(_TF_PREDEFINED_COLLECTION_NAMES)


def find_corresponding_elem(target, dst_graph: tf.Graph, dst_scope: str = "",
                            src_scope: str = ""):
    """Returns the op/tensor of `dst_graph` corresponding to `target` by name.

    The name of `target` has `src_scope` replaced by `dst_scope`.

    Args:
      target: an op or a tensor.
      dst_graph: the graph to look in.
      dst_scope: the destination scope.
      src_scope: the source scope.

    Returns:
      The corresponding op or tensor.

    Raises:
      TypeError: if `target` is neither an op nor a tensor.
      KeyError / ValueError: if no element has the corresponding name.
    """
    src_name = target.name
    if src_scope:
        src_scope = scope_finalize(src_scope)
        if not src_name.startswith(src_scope):
            raise ValueError("{} does not start with {}".format(src_name, src_scope))
        src_name = src_name[len(src_scope):]
    dst_name = src_name
    if dst_scope:
        dst_name = scope_finalize(dst_scope) + dst_name
    if isinstance(target, tf.Tensor):
        return dst_graph.get_tensor_by_name(dst_name)
    if isinstance(target, tf.Operation):
        return dst_graph.get_operation_by_name(dst_name)
    raise TypeError("Expected tf.Tensor or tf.Operation, got: {}".format(type(target)))


def find_corresponding(targets, dst_graph: tf.Graph, dst_scope: str = "",
                       src_scope: str = ""):
    """Maps `find_corresponding_elem` over a tree of ops/tensors."""
    def func(top):
        return find_corresponding_elem(top, dst_graph, dst_scope, src_scope)
    return transform_tree(targets, func)


def get_temp_name(graph: tf.Graph, base: str) -> str:
    """Returns an op name not used in `graph`, from `base` (not reserved)."""
    return graph.unique_name(base, mark_as_used=False)


def input_slot_is_ref(op: tf.Operation, index: int) -> bool:
    """Returns True if input slot `index` of `op` takes a reference (TF 1 variable) tensor."""
    # Walk the op def's input args to find the one holding slot `index`.
    pos = 0
    for arg in op.op_def.input_arg:
        if arg.number_attr:
            n = op.get_attr(arg.number_attr)
        elif arg.type_list_attr:
            n = len(op.get_attr(arg.type_list_attr))
        else:
            n = 1
        if pos <= index < pos + n:
            return arg.is_ref
        pos += n
    return False
