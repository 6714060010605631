"""Adds many new ops to a graph with one GraphDef import.

TensorFlow's Python op constructors cost a fraction of a millisecond to a
millisecond each (dispatch, type inference in Python, name scopes); a pass
that adds ten ops per layer to a network of fifty layers spends most of its
time there. `NodeBatch` instead collects NodeDefs and adds them with one
`import_graph_def` (done in C++). Names are reserved with
`Graph.unique_name`, so the ops get the names the Python constructors would
have given them; existing tensors are read through the import's `input_map`.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2


class NodeBatch(object):
    """NodeDefs waiting to be added to `graph` with one import.

    Args:
      graph: the graph the ops are added to.
    """

    def __init__(self, graph: tf.Graph):
        self._graph = graph
        self._gdef = graph_pb2.GraphDef()
        self._ext: Dict[str, tf.Tensor] = {}
        self._ext_ids: Dict[int, str] = {}
        self._nodes: List[str] = []
        self._shared: Dict[tuple, str] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def unique_name(self, name: str) -> str:
        """Reserves the name the Python constructors would give `name`.

        Args:
          name: the full op name wanted (no name scope is prepended).

        Returns:
          `name`, or `name_<i>` when taken.
        """
        return self._graph.unique_name(name, mark_as_used=True)

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
            tf.TensorShape, a TensorProto (`value`), or a list of ints.

        Returns:
          `name`.
        """
        node = self._gdef.node.add()
        node.name = name
        node.op = op
        node.input.extend(inputs)
        node.input.extend("^" + c for c in control)
        if device:
            node.device = device
        for key, value in attrs.items():
            attr = node.attr[key]
            if isinstance(value, tf.DType):
                attr.type = value.as_datatype_enum
            elif isinstance(value, bool):
                attr.b = value
            elif isinstance(value, int):
                attr.i = value
            elif isinstance(value, str):
                attr.s = value.encode()
            elif isinstance(value, bytes):
                attr.s = value
            elif isinstance(value, tf.TensorShape):
                attr.shape.CopyFrom(value.as_proto())
            elif isinstance(value, (list, tuple)):
                attr.list.i.extend(int(v) for v in value)
            else:
                attr.tensor.CopyFrom(value)
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

    def build(self) -> Dict[str, tf.Operation]:
        """Imports the nodes into the graph.

        Returns:
          The new ops by the names given to `node`.

        Raises:
          ValueError: if the import fails (TensorFlow's message).
        """
        if not self._nodes:
            return {}
        graph = self._graph
        with graph.as_default(), graph.control_dependencies(None):
            ops = tf.graph_util.import_graph_def(
                self._gdef, input_map=self._ext, return_elements=self._nodes,
                name="")
        return dict(zip(self._nodes, ops))

    def tensor(self, ops: Dict[str, tf.Operation], ref: Optional[str]) -> Optional[tf.Tensor]:
        """The tensor `ref` (`name` or `name:<i>`) after `build`."""
        if ref is None:
            return None
        name, _, index = ref.partition(":")
        return ops[name].outputs[int(index or 0)]
