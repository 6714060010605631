"""Adds many new ops to a graph with one GraphDef import.

TensorFlow's Python op constructors cost a fraction of a millisecond to a
millisecond each (dispatch, type inference in Python, name scopes); a pass
that adds ten ops per layer to a network of fifty layers spends most of its
time there. `NodeBatch` instead collects NodeDefs and adds them with one
`import_graph_def` (done in C++). Existing tensors are read through the
import's `input_map`. Ops that are easier to write with TensorFlow's Python
constructors (a functional cond, a chain of math ops) are built in a scratch
graph (`python_ops`) and join the same import.

Nothing touches the graph before `build`: names are reserved in the batch and
only marked as used in the graph when the ops are added; `check` imports the
NodeDefs into an empty scratch graph first, where TensorFlow checks op types,
attributes, dtypes and shapes. Every node carries the mark of `qat.engine.marks`.
"""
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import ops as tf_ops

from qat.engine import graph_import
from qat.engine import marks

_SCRATCH_INPUT = "qat_scratch_input_"

# An input of `NodeBatch.python_ops`: an existing tensor, or a node of the
# batch as (`name:<i>`, dtype, shape).
Input = Union[tf.Tensor, Tuple[str, tf.DType, Sequence[Optional[int]]]]


# (build_fn, input signature) -> (scratch GraphDef, output names) of
# `python_ops(..., reusable=True)`, built under _REUSABLE_SCOPE.
_REUSABLE: Dict[tuple, Tuple[graph_pb2.GraphDef, List[str]]] = {}
_REUSABLE_SCOPE = "qat_reusable_scope"


def _scratch_ops(scope: str, signature: Sequence[Tuple[tf.DType, tf.TensorShape]],
                 build_fn: Callable[..., Sequence[tf.Tensor]]
                 ) -> Tuple[graph_pb2.GraphDef, List[str]]:
    """`build_fn` on stand-ins `<_SCRATCH_INPUT><k>`, in a scratch graph.

    Returns:
      The scratch graph's GraphDef (stand-ins included) and the names
      (`name:<i>`) of the tensors `build_fn` returned.
    """
    stand_in_def = graph_import.empty_graph_def()
    for k, (dtype, shape) in enumerate(signature):
        graph_import.add_stand_in(stand_in_def, "%s%d" % (_SCRATCH_INPUT, k), dtype, shape)
    scratch = tf.Graph()
    with scratch.as_default():
        stand_ins = tf.graph_util.import_graph_def(
            stand_in_def, name="",
            return_elements=["%s%d:0" % (_SCRATCH_INPUT, k) for k in range(len(signature))])
        with tf.name_scope(scope + "/"):
            outputs = list(build_fn(*stand_ins))
    result = (scratch.as_graph_def(),
              ["%s:%d" % (t.op.name, t.value_index) for t in outputs])
    del stand_ins, outputs
    tf_ops.dismantle_graph(scratch)  # Freed now, not by a later full collection.
    return result


def _rescoped(name: str, old: str, new: str) -> str:
    """`name` with its leading scope `old` replaced by `new`."""
    if name == old or name.startswith(old + "/") or name.startswith(old + ":"):
        return new + name[len(old):]
    return name


# How many `<name>_<i>` candidates `NodeBatch.unique_name` tries at most: a
# rewrite must never loop forever, whatever the graph's names are.
MAX_NAME_TRIES = 1_000_000


# graph -> (ops seen, the lower-cased names and scopes of those ops).
_USED_SCOPES: "weakref.WeakKeyDictionary[tf.Graph, Tuple[int, Set[str]]]" = (
    weakref.WeakKeyDictionary())


def _used_scopes(graph: tf.Graph) -> Set[str]:
    """Every op name of `graph` and each of its scopes, lower-cased.

    A scope whose ops were named explicitly (`name="conv/act_quant/max"`) is
    not in the graph's names-in-use table, so the names are read from the
    ops; ops are only ever added, so the set grows with the graph.
    """
    seen, used = _USED_SCOPES.get(graph, (0, set()))
    ops = graph.get_operations()
    for op in ops[seen:]:
        name = op.name.lower()
        while name and name not in used:
            used.add(name)
            name = name.rpartition("/")[0]
    _USED_SCOPES[graph] = (len(ops), used)
    return used


class NodeBatch(object):
    """NodeDefs waiting to be added to `graph` with one import.

    Args:
      graph: the graph the ops are added to.
      mark: the `qat.engine.marks` role of the new ops (a node's own `_qat`
        attribute wins).
    """

    def __init__(self, graph: tf.Graph, mark: str = marks.FOLD):
        self._graph = graph
        self._mark = mark
        self._mark_bytes = mark.encode()
        self._gdef = graph_import.empty_graph_def()
        self._ext: Dict[str, tf.Tensor] = {}
        self._ext_ids: Dict[int, str] = {}
        self._nodes: List[str] = []
        self._shared: Dict[tuple, str] = {}
        self._reserved: Set[str] = set()
        self._used: Optional[Set[str]] = None
        self._serialized_bytes = b""
        self._serialized_for: Optional[tuple] = None

    def __len__(self) -> int:
        return len(self._nodes)

    def _serialized(self) -> bytes:
        """The batch's GraphDef serialized (once for `check` and `build`)."""
        key = (len(self._nodes), len(self._gdef.library.function))
        if self._serialized_for != key:
            self._serialized_bytes = self._gdef.SerializeToString()
            self._serialized_for = key
        return self._serialized_bytes

    @property
    def graph(self) -> tf.Graph:
        return self._graph

    def _taken(self, name: str) -> bool:
        key = name.lower()
        if key in self._reserved:
            return True
        if graph_import.name_in_use(self._graph, key):
            return True  # Used by an op or name scope of the graph.
        if self._used is None:
            self._used = _used_scopes(self._graph)
        return key in self._used

    def unique_name(self, name: str) -> str:
        """Reserves the name the Python constructors would give `name`.

        The name is free in the graph (no op and no scope of that name) and
        in the batch; the graph's names-in-use table is only updated by
        `build`.

        Args:
          name: the full op or scope name wanted (no name scope is prepended).

        Returns:
          `name`, or `name_<i>` when taken.
        """
        candidate, i = name, 0
        while self._taken(candidate):
            i += 1
            if i > MAX_NAME_TRIES:
                raise RuntimeError(
                    f"No free name for '{name}' after {MAX_NAME_TRIES} tries "
                    f"('{name}_1' ... '{candidate}' are all taken).")
            candidate = "%s_%d" % (name, i)
        self._reserved.add(candidate.lower())
        return candidate

    def external(self, t: tf.Tensor) -> str:
        """The name NodeDef inputs use for the existing tensor `t`."""
        key = id(t)
        if key not in self._ext_ids:
            name = "qat_batch_input_%d:0" % len(self._ext_ids)
            self._ext_ids[key] = name
            self._ext[name] = t
        return self._ext_ids[key]

    def node(self, name: str, op: str, inputs: Sequence[str] = (),
             device: str = "", control: Sequence[str] = (), **attrs) -> str:
        """Adds a NodeDef; returns its name (input `name` or `name:<i>`).

        Args:
          name: the op's full name, unique (see `unique_name`).
          op: the op type.
          inputs: input names: other nodes of the batch (`name` or
            `name:<i>`) or `external(t)`.
          device: the device string.
          control: names of nodes of the batch this one has control
            dependencies on.
          **attrs: attributes: a tf.DType, a bool, an int, bytes / str, a
            tf.TensorShape, a TensorProto (`value`), a list of ints, or an
            AttrValue (copied as it is).

        Returns:
          `name`.
        """
        node = self._gdef.node.add()
        node.name = name
        node.op = op
        node.input.extend(inputs)
        if control:
            node.input.extend("^" + c for c in control)
        if device:
            node.device = graph_import.canonical_device(device)
        attr = node.attr
        if marks.ATTR not in attrs:
            attr[marks.ATTR].s = self._mark_bytes
        attr["_class"].list.SetInParent()  # See graph_import.no_colocation.
        for key, value in attrs.items():
            kind = type(value)
            if kind is attr_value_pb2.AttrValue:
                attr[key].CopyFrom(value)
            elif kind is tf.DType:
                attr[key].type = value.as_datatype_enum
            elif kind is bool:
                attr[key].b = value
            elif kind is int:
                attr[key].i = value
            elif kind is str:
                attr[key].s = value.encode()
            elif kind is bytes:
                attr[key].s = value
            elif isinstance(value, tf.TensorShape):
                attr[key].shape.CopyFrom(value.as_proto())
            elif isinstance(value, (list, tuple)):
                attr[key].list.i.extend(int(v) for v in value)
            elif isinstance(value, (bool, np.bool_)):
                attr[key].b = bool(value)
            elif isinstance(value, (int, np.integer)):
                attr[key].i = int(value)
            elif isinstance(value, tf.DType):
                attr[key].type = value.as_datatype_enum
            else:
                attr[key].tensor.CopyFrom(value)
        self._nodes.append(name)
        return name

    def const(self, name: str, value, dtype: tf.DType, device: str = "") -> str:
        """Adds a Const node holding `value` as `dtype`."""
        array = np.asarray(value, dtype.as_numpy_dtype)
        return self.node(name, "Const", device=device, dtype=dtype,
                         value=tf.make_tensor_proto(array, dtype))

    def shared_const(self, name: str, value, dtype: tf.DType) -> str:
        """A Const node shared by every user of the same value in the batch.

        Args:
          name: the full name wanted for it, if it is new (made unique).
          value: its value.
          dtype: its dtype.

        Returns:
          The node's name.
        """
        array = np.asarray(value, dtype.as_numpy_dtype)
        key = (dtype, array.shape, array.tobytes())
        if key not in self._shared:
            self._shared[key] = self.const(self.unique_name(name), array, dtype)
        return self._shared[key]

    def python_ops(self, scope: str, inputs: Sequence[Input],
                   build_fn: Callable[..., Sequence[tf.Tensor]],
                   device: str = "", mark: Optional[str] = None,
                   reusable: bool = False) -> List[str]:
        """Ops built with TensorFlow's Python constructors, added with the batch.

        `build_fn` runs in a scratch graph, under the name scope `scope`
        (made unique), on stand-ins for `inputs` with their dtypes and
        shapes; its ops (and the functions they call) join this batch.

        Args:
          scope: the name scope wanted for the ops.
          inputs: what `build_fn` reads: existing tensors, or nodes of this
            batch given as (`name:<i>`, dtype, shape).
          build_fn: called with one stand-in per input; returns tensors.
          device: the device string of the new ops.
          mark: their `qat.engine.marks` role (default: the batch's).
          reusable: `build_fn` depends on nothing but its inputs' dtypes and
            shapes (a module-level function): its ops are built once per
            process for each input signature and copied after that, which
            saves the Python constructors' cost.

        Returns:
          The names (`name:<i>`) of the tensors `build_fn` returned.
        """
        scope = self.unique_name(scope)
        mark = (mark or self._mark).encode()
        refs = {}
        signature = []
        for k, item in enumerate(inputs):
            name = "%s%d" % (_SCRATCH_INPUT, k)
            if isinstance(item, tf.Tensor):
                signature.append((item.dtype, tf.TensorShape(item.shape)))
                refs[name] = self.external(item)
            else:
                ref, dtype, shape = item
                signature.append((dtype, tf.TensorShape(shape)))
                refs[name] = ref if ":" in ref else ref + ":0"
        if reusable:
            key = (build_fn, tuple((d, tuple(sh.as_list()) if sh.rank is not None else None)
                                   for d, sh in signature))
            if key not in _REUSABLE:
                _REUSABLE[key] = _scratch_ops(_REUSABLE_SCOPE, signature, build_fn)
            graph_def, outputs = _REUSABLE[key]
            rename = lambda name: _rescoped(name, _REUSABLE_SCOPE, scope)
        else:
            graph_def, outputs = _scratch_ops(scope, signature, build_fn)
            rename = lambda name: name
        known = {f.signature.name for f in self._gdef.library.function}
        for function in graph_def.library.function:
            if function.signature.name not in known:
                self._gdef.library.function.add().CopyFrom(function)
        for scratch_node in graph_def.node:
            if scratch_node.name in refs:
                continue
            node = self._gdef.node.add()
            node.CopyFrom(scratch_node)
            node.name = rename(node.name)
            for i, name in enumerate(node.input):
                control = name.startswith("^")
                op_name, _, index = name.lstrip("^").partition(":")
                if op_name in refs:
                    if control:
                        node.input[i] = "^" + refs[op_name].partition(":")[0]
                        continue
                    if index not in ("", "0"):
                        raise ValueError(f"Stand-in {op_name} has one output.")
                    node.input[i] = refs[op_name]
                else:
                    node.input[i] = rename(name.lstrip("^"))
                    if control:
                        node.input[i] = "^" + node.input[i]
            if device:
                node.device = graph_import.canonical_device(device)
            if marks.ATTR not in node.attr:
                node.attr[marks.ATTR].s = mark
            graph_import.no_colocation(node)
            self._nodes.append(node.name)
        return [rename(name) for name in outputs]

    def check(self, outputs: Sequence[str] = ()) -> Dict[str, tf.TensorSpec]:
        """Imports the nodes into an empty scratch graph, changing nothing.

        Args:
          outputs: nodes (`name` or `name:<i>`) whose scratch tensors the
            caller wants, e.g. to compare dtypes and shapes.

        Returns:
          {ref: the dtype and shape the real tensor will have} for `outputs`.

        Raises:
          ValueError: TensorFlow's message for a bad node.
        """
        if not self._nodes:
            return {}
        graph_def = graph_import.empty_graph_def()
        for name, t in self._ext.items():
            graph_import.add_stand_in(graph_def, name[:-len(":0")], t.dtype, t.shape)
        refs = [r if ":" in r else r + ":0" for r in outputs]
        # Serialized GraphDefs concatenate into their merge: the stand-ins
        # and the batch's nodes, without copying the nodes.
        found = graph_import.import_checked(
            graph_def.SerializeToString() + self._serialized(), refs)
        return {ref: found[full] for ref, full in zip(outputs, refs)}

    def build(self) -> Dict[str, tf.Operation]:
        """Imports the nodes into the graph.

        TensorFlow's import adds all of them or, on failure, none.

        Returns:
          The new ops by the names given to `node`.

        Raises:
          ValueError: if the import fails (TensorFlow's message).
        """
        if not self._nodes:
            return {}
        graph = self._graph
        ops = graph_import.import_nodes(graph, self._gdef, self._serialized(), self._ext, self._nodes)
        for name in self._reserved.union(n.lower() for n in self._nodes):
            graph_import.mark_name_used(graph, name)
        return ops

    def tensor(self, ops: Dict[str, tf.Operation], ref: Optional[str]) -> Optional[tf.Tensor]:
        """The tensor `ref` (`name` or `name:<i>`) after `build`."""
        if ref is None:
            return None
        name, _, index = ref.partition(":")
        return ops[name].outputs[int(index or 0)]
