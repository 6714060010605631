"""Handlers and bookkeeping of the graph editor's Transformer.

`transform.py` re-exports the public names; see its docstring for the
TF 2.21-specific behaviour of `copy_op_handler`.
"""
from copy import deepcopy
import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from qat.graph_editor import util

__all__ = [
    "replace_t_with_placeholder_handler",
    "keep_t_if_possible_handler",
    "assign_renamed_collections_handler",
    "transform_op_if_inside_handler",
    "copy_op_handler",
    "TransformerInfo",
]

_ENTER_OP_TYPES = frozenset(["Enter", "RefEnter"])


def replace_t_with_placeholder_handler(info: "_TmpInfo", t: tf.Tensor) -> tf.Tensor:
    """Transforms a tensor into a placeholder in the destination graph and scope.

    Args:
      info: the transform's temporary info.
      t: the tensor to replace.

    Returns:
      A new placeholder named after `t`, in `info.scope_` of `info.graph_`.
    """
    with info.graph_.as_default():
        return util.make_placeholder_from_tensor(t, scope=info.scope_)


def keep_t_if_possible_handler(info: "_TmpInfo", t: tf.Tensor) -> tf.Tensor:
    """Keeps `t` if the copy stays in its graph, else makes a placeholder.

    Args:
      info: the transform's temporary info.
      t: the tensor.

    Returns:
      `t` itself when the source and destination graphs are the same, a
      placeholder otherwise.
    """
    if info.graph is info.graph_:
        return t
    return replace_t_with_placeholder_handler(info, t)


def assign_renamed_collections_handler(info: "_TmpInfo", elem: Any, elem_: Any) -> None:
    """Adds `elem_` to the collections `elem` belongs to.

    Predefined collections (`tf.compat.v1.GraphKeys`) keep their name; other
    collection names are renamed like op names (source scope replaced by the
    destination scope).

    Args:
      info: the transform's temporary info.
      elem: the original op, tensor or variable.
      elem_: its transformed counterpart.
    """
    known_collection_names = info.predefined_collection_names
    for name in info.collections_of(elem):
        if name in known_collection_names:
            transformed_name = name
        else:
            transformed_name = info.new_name(name) if name.startswith(info.scope) else name
        info.graph_.add_to_collection(transformed_name, elem_)


def transform_op_if_inside_handler(info: "_TmpInfo", op: tf.Operation,
                                   keep_if_possible: bool = True
                                   ) -> Optional[tf.Operation]:
    """Returns the copy of `op` if it is in the view, `op` itself if possible.

    Args:
      info: the transform's temporary info.
      op: the op (a control input or an original op).
      keep_if_possible: keep `op` when it is outside the view and the copy
        stays in the same graph.

    Returns:
      The transformed op, `op`, or None (the op is dropped).
    """
    if op in info.ops:
        return info.transformed_ops[op]
    if keep_if_possible and info.graph is info.graph_:
        return op
    return None


def _unique_frame_name(info: "_TmpInfo", frame_name: str) -> str:
    """Returns the frame name of a copied control-flow-v1 loop."""
    if frame_name in info.frame_names:
        return info.frame_names[frame_name]
    if info.used_frame_names is None:
        info.used_frame_names = {
            op.get_attr("frame_name").decode()
            for op in info.graph_.get_operations() if op.type in _ENTER_OP_TYPES}
        info.used_frame_names.update(info.frame_names.values())
    if frame_name.startswith(info.scope):
        candidate = info.new_name(frame_name)
    else:
        candidate = info.scope_ + frame_name
    base, i = candidate, 0
    while candidate in info.used_frame_names:
        i += 1
        candidate = "{}_{}".format(base, i)
    info.used_frame_names.add(candidate)
    info.frame_names[frame_name] = candidate
    return candidate


def copy_op_handler(info: "_TmpInfo", op: tf.Operation, new_inputs: List[tf.Tensor],
                    copy_shape: bool = False,
                    nodedef_fn: Optional[Callable[[Any], Any]] = None
                    ) -> Tuple[tf.Operation, List[tf.Tensor]]:
    """Copies `op` into `info.graph_` with the given inputs.

    Args:
      info: the transform's temporary info.
      op: the op to copy.
      new_inputs: the inputs of the copy (one tensor per input of `op`).
      copy_shape: also copy the static shapes of `op`'s outputs (by default
        shapes are inferred from the new inputs).
      nodedef_fn: if given, called with the copy's `NodeDef` (already renamed)
        and returns the `NodeDef` to build; it may change attributes or the
        device but must keep the op type's signature.

    Returns:
      A tuple (new op, its outputs).

    Raises:
      TypeError: if `new_inputs` is not a list of tensors.
      ValueError: if TensorFlow refuses the copy (message names the op).
    """
    if isinstance(new_inputs, bool):
        raise TypeError("the `new_inputs` argument must be an iterable.")
    new_inputs = list(new_inputs)
    node_def_ = deepcopy(op.node_def)
    name_ = info.graph_.unique_name(info.new_name(op.name))
    node_def_.name = name_
    if op.type in _ENTER_OP_TYPES:
        frame_name = node_def_.attr["frame_name"].s.decode()
        node_def_.attr["frame_name"].s = _unique_frame_name(info, frame_name).encode()
    if "shared_name" in node_def_.attr and node_def_.attr["shared_name"].s == op.name.encode():
        node_def_.attr["shared_name"].s = name_.encode()
    if nodedef_fn is not None:
        node_def_ = nodedef_fn(node_def_)
    # Ref-typed inputs (TF 1 variables) must be declared explicitly.
    input_types_ = [t.dtype for t in new_inputs]
    try:
        op_ = tf.Operation.from_node_def(
            node_def_, info.graph_, inputs=new_inputs,
            output_types=[t.dtype for t in op.outputs], input_types=input_types_,
            original_op=op._original_op)  # pylint: disable=protected-access
    except (ValueError, TypeError, tf.errors.OpError) as e:
        raise ValueError("Cannot copy op {!r} (type {}) to {!r}: {}".format(
            op.name, op.type, name_, e)) from e
    if copy_shape:
        for t, t_ in zip(op.outputs, op_.outputs):
            t_.set_shape(t.get_shape())
    return op_, list(op_.outputs)


class TransformerInfo(object):
    """The result of a transformation: maps between originals and copies."""

    def __init__(self, info: "_TmpInfo"):
        self._graph = info.graph
        self._scope = info.scope
        self._graph_ = info.graph_
        self._scope_ = info.scope_
        self._transformed_ops = info.transformed_ops
        self._transformed_ts = info.transformed_ts
        self._original_ops = None
        self._original_ts = None

    @property
    def graph(self) -> tf.Graph:
        """The source graph."""
        return self._graph

    @property
    def scope(self) -> str:
        """The source scope."""
        return self._scope

    @property
    def graph_(self) -> tf.Graph:
        """The destination graph."""
        return self._graph_

    @property
    def scope_(self) -> str:
        """The destination scope."""
        return self._scope_

    def _maps(self, top, reverse: bool):
        if isinstance(top, str):
            is_op = ":" not in top
        elif isinstance(top, tf.Operation):
            is_op = True
        elif isinstance(top, tf.Tensor):
            is_op = False
        else:
            raise TypeError("Expected a tf.Operation, a tf.Tensor or a name, got: "
                            "{}".format(type(top)))
        if not reverse:
            return self._transformed_ops if is_op else self._transformed_ts
        if self._original_ops is None or len(self._original_ops) != len(self._transformed_ops):
            self._original_ops = {v: k for k, v in self._transformed_ops.items()}
        if self._original_ts is None or len(self._original_ts) != len(self._transformed_ts):
            self._original_ts = {v: k for k, v in self._transformed_ts.items()}
        return self._original_ops if is_op else self._original_ts

    def _lookup(self, top, reverse: bool, missing_fn):
        mapping = self._maps(top, reverse)
        if isinstance(top, str):
            for key, value in mapping.items():
                if key.name == top:
                    return value
        elif top in mapping:
            return mapping[top]
        return None if missing_fn is None else missing_fn(top)

    def transformed(self, original, missing_fn: Optional[Callable[[Any], Any]] = None):
        """Returns the transformed counterparts of `original`.

        Args:
          original: an op, a tensor, an op or tensor name, or a nested structure
            (list, tuple, namedtuple, dict, OrderedDict) of those.
          missing_fn: called with an element that has no counterpart; its
            result is used instead of None.

        Returns:
          The same structure with each element replaced by its copy (None when
          missing and no `missing_fn`).
        """
        return util.transform_tree(
            original, functools.partial(self._lookup, reverse=False, missing_fn=missing_fn))

    def original(self, transformed, missing_fn: Optional[Callable[[Any], Any]] = None):
        """Returns the originals of `transformed` (the inverse of `transformed`).

        Args:
          transformed: an op, tensor, name, or a nested structure of those.
          missing_fn: called with an element that has no original.

        Returns:
          The same structure with each element replaced by its original.
        """
        return util.transform_tree(
            transformed, functools.partial(self._lookup, reverse=True, missing_fn=missing_fn))

    def __str__(self):
        lines = ["Transform result info:"]
        if self._graph is self._graph_:
            lines.append("  Within graph[{}]".format(id(self._graph)))
        else:
            lines.append("  graph[{}] => graph[{}]".format(id(self._graph), id(self._graph_)))
        lines.append("  Relative to source scope: {!r}".format(self._scope))
        lines.append("  Scope destination: {!r}".format(self._scope_))
        lines.append("  Operations mapping:")
        for op, op_ in sorted(self._transformed_ops.items(), key=lambda kv: kv[0].name):
            lines.append("    {} => {}".format(op.name, op_.name))
        return "\n".join(lines)


class _TmpInfo(object):
    """Transient state of one transformation (handed to the handlers)."""

    def __init__(self, sgv, dst_graph: tf.Graph, dst_scope: str, src_scope: str):
        self.sgv = sgv
        self.sgv_inputs_set = frozenset(sgv.inputs)
        self.ops = frozenset(sgv.ops)
        self.graph = sgv.graph
        self.scope = src_scope
        self.graph_ = dst_graph
        self.scope_ = dst_scope
        self.transformed_ops: Dict[tf.Operation, tf.Operation] = {}
        self.transformed_ts: Dict[tf.Tensor, tf.Tensor] = {}
        self.collections = {key: self.graph.get_collection(key)
                            for key in self.graph.get_all_collection_keys()}
        self.predefined_collection_names = frozenset(util.get_predefined_collection_names())
        self._collections_by_id = None
        self.frame_names: Dict[str, str] = {}
        self.used_frame_names = None
        # The graph is copied op by op in creation order; inputs of a
        # control-flow-v1 loop that do not exist yet are temporary
        # placeholders, replaced once the whole view is copied.
        self.tmp_cyclic_ts = []

    def collections_of(self, elem) -> List[str]:
        """Names of the collections holding `elem` (by identity, O(1))."""
        if self._collections_by_id is None:
            by_id = {}
            for name, items in self.collections.items():
                for item in items:
                    names = by_id.setdefault(id(item), [])
                    if name not in names:
                        names.append(name)
            self._collections_by_id = by_id
        return self._collections_by_id.get(id(elem), [])

    def new_name(self, name: str) -> str:
        """Renames `name` from the source scope to the destination scope.

        Raises:
          ValueError: if `name` is not under the source scope.
        """
        if not name.startswith(self.scope):
            raise ValueError("{} does not belong to source scope: {}.".format(name, self.scope))
        return self.scope_ + name[len(self.scope):]
