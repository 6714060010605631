"""Tensor lists of an unrolled loop, as Python lists of tensors.

A loop over a sequence reads its steps from a tensor list
(`TensorListFromTensor`: a `TensorArray.unstack`) and writes its outputs to
another (`TensorListReserve`, one `TensorListSetItem` per step, then
`TensorListStack`). Unrolled (`qat.prepare.loops`), every index is a
constant, so each list is a Python list of the tensors it holds: a read is
the element, a write replaces it, a stack is a `Pack` of the elements, and
an element of a `TensorListFromTensor` is a `StridedSlice` of its tensor.
TFLite has integer kernels for those; the converter cannot lower the list
ops of a batch of unknown size ("requires element_shape to be static").

`Values` are what the unroller passes around for every tensor: a `Ref` to a
tensor (a node of the rewrite, or an existing tensor), a `Static` value (a
step counter), or a `TensorList`.
"""
import dataclasses
from typing import Callable, List, Optional, Union

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

# The list ops an unrolled loop may read or write: tensor lists (control flow
# v2), and TensorArrays (v1), whose state is their float "flow" tensor.
TENSOR_ARRAY_TYPES = frozenset([
    "TensorArrayV3", "TensorArrayScatterV3", "TensorArrayReadV3", "TensorArrayWriteV3",
    "TensorArrayGatherV3", "TensorArraySizeV3"])
LIST_TYPES = frozenset([
    "TensorListReserve", "TensorListFromTensor", "TensorListGetItem", "TensorListSetItem",
    "TensorListStack", "TensorListLength", "TensorListPushBack", "TensorListGather"]
) | TENSOR_ARRAY_TYPES
# TensorArray outputs that are the array's state (its flow).
_FLOW_OUTPUTS = {"TensorArrayV3": 1, "TensorArrayScatterV3": 0, "TensorArrayWriteV3": 0}


def is_list(t: tf.Tensor) -> bool:
    """Whether `t` holds a list: a tensor list, or a TensorArray's flow."""
    return t.dtype == tf.variant or _FLOW_OUTPUTS.get(t.op.type) == t.value_index


class UnsupportedListError(ValueError):
    """A list op (or a use of a list) the unroller does not handle."""


@dataclasses.dataclass
class Ref:
    """A tensor: `name` as NodeDef inputs read it; `tensor` when it exists."""
    name: str
    tensor: Optional[tf.Tensor] = None


@dataclasses.dataclass
class Static:
    """A value known when the graph is built (a step counter)."""
    value: np.ndarray
    dtype: tf.DType


@dataclasses.dataclass
class TensorList:
    """A tensor list: its elements (None: not written yet)."""
    elements: List[Optional[Ref]]
    element_dtype: tf.DType


Value = Union[Ref, Static, TensorList]


class ListOps(object):
    """Evaluates list ops on `Value`s, adding the tensor ops they become.

    Args:
      nodes: the rewrite's `NodeBatch`.
      constant: makes a `Ref` of a `Static` (a shared Const node).
      device: the device of the new ops.
    """

    def __init__(self, nodes, constant: Callable[[Static], Ref], device: str):
        self._nodes = nodes
        self._constant = constant
        self._device = device

    def evaluate(self, op: tf.Operation, inputs: List[Value], shape: tf.TensorShape,
                 name: str) -> List[Value]:
        """The values of `op`'s outputs.

        Args:
          op: a `LIST_TYPES` op (of the loop body or the graph).
          inputs: the values of its inputs.
          shape: the static shape of its input 0 (`TensorListFromTensor`).
          name: the name scope of the ops it becomes.

        Raises:
          UnsupportedListError: an index that is not static, an element read
            before it is written, an op outside `LIST_TYPES`.
        """
        kind = op.type
        if kind in TENSOR_ARRAY_TYPES:
            return self._tensor_array(op, inputs, name)
        if kind == "TensorListReserve":
            count = int(self._static(op, inputs[1]))
            return [TensorList([None] * count, op.get_attr("element_dtype"))]
        if kind == "TensorListFromTensor":
            count = tf.compat.dimension_value(shape[0]) if shape.rank else None
            if count is None:
                raise UnsupportedListError(
                    f"{op.name} ({kind}) reads a tensor whose first dimension (the steps) is "
                    "not static")
            dtype = op.get_attr("element_dtype")
            return [TensorList([self._row(inputs[0], k, dtype, f"{name}/element_{k}")
                                for k in range(count)], dtype)]
        tensor_list = self._list(op, inputs[0])
        if kind == "TensorListGetItem":
            return [self._element(op, tensor_list, self._static(op, inputs[1]))]
        if kind == "TensorListSetItem":
            index = int(self._static(op, inputs[1]))
            elements = list(tensor_list.elements)
            if index >= len(elements):
                if not (op.node_def.attr["resize_if_index_out_of_bounds"].b):
                    raise UnsupportedListError(f"{op.name} writes index {index} of a list of "
                                               f"{len(elements)}")
                elements += [None] * (index + 1 - len(elements))
            elements[index] = self._ref(op, inputs[2])
            return [TensorList(elements, tensor_list.element_dtype)]
        if kind == "TensorListPushBack":
            return [TensorList(list(tensor_list.elements) + [self._ref(op, inputs[1])],
                               tensor_list.element_dtype)]
        if kind == "TensorListLength":
            return [Static(np.asarray(len(tensor_list.elements), np.int32), tf.int32)]
        if kind == "TensorListStack":
            return [self._pack(op, [self._element(op, tensor_list, k)
                                    for k in range(len(tensor_list.elements))], name,
                               tensor_list.element_dtype)]
        if kind == "TensorListGather":
            indices = np.ravel(self._static(op, inputs[1]))
            return [self._pack(op, [self._element(op, tensor_list, k) for k in indices], name,
                               tensor_list.element_dtype)]
        raise UnsupportedListError(f"{op.name}: the list op {kind} is not supported")

    def _tensor_array(self, op: tf.Operation, inputs: List[Value], name: str) -> List[Value]:
        """A TensorArray op: the array is its flow input (the last), the
        handle only names it."""
        kind = op.type
        if kind == "TensorArrayV3":
            count = int(self._static(op, inputs[0]))
            return [Ref(""), TensorList([None] * count, op.get_attr("dtype"))]
        array = self._list(op, inputs[-1])
        if kind == "TensorArrayReadV3":
            return [self._element(op, array, self._static(op, inputs[1]))]
        if kind == "TensorArraySizeV3":
            return [Static(np.asarray(len(array.elements), np.int32), tf.int32)]
        if kind == "TensorArrayGatherV3":
            indices = np.ravel(self._static(op, inputs[1]))
            return [self._pack(op, [self._element(op, array, k) for k in indices], name,
                               array.element_dtype)]
        elements = list(array.elements)
        if kind == "TensorArrayWriteV3":
            index = int(self._static(op, inputs[1]))
            if index >= len(elements):
                raise UnsupportedListError(f"{op.name} writes index {index} of a TensorArray "
                                           f"of {len(elements)}")
            elements[index] = self._ref(op, inputs[2])
        else:  # TensorArrayScatterV3: row k of the value to index indices[k].
            for k, index in enumerate(np.ravel(self._static(op, inputs[1]))):
                if not 0 <= int(index) < len(elements):
                    raise UnsupportedListError(f"{op.name} writes index {index} of a "
                                               f"TensorArray of {len(elements)}")
                elements[int(index)] = self._row(inputs[2], k, array.element_dtype,
                                                 f"{name}/element_{int(index)}")
        return [TensorList(elements, array.element_dtype)]

    @staticmethod
    def _static(op: tf.Operation, value: Value) -> np.ndarray:
        if not isinstance(value, Static):
            raise UnsupportedListError(
                f"{op.name} ({op.type}) reads an index or size that is not known when the "
                "graph is built")
        return value.value

    @staticmethod
    def _list(op: tf.Operation, value: Value) -> TensorList:
        if not isinstance(value, TensorList):
            raise UnsupportedListError(f"{op.name} ({op.type}) reads a list the unroller "
                                       "could not follow")
        return value

    def _ref(self, op: tf.Operation, value: Value) -> Ref:
        if isinstance(value, Static):
            return self._constant(value)
        if isinstance(value, TensorList):
            raise UnsupportedListError(f"{op.name} ({op.type}) stores a list in a list")
        return value

    @staticmethod
    def _element(op: tf.Operation, tensor_list: TensorList, index) -> Ref:
        index = int(index)
        if not 0 <= index < len(tensor_list.elements) or tensor_list.elements[index] is None:
            raise UnsupportedListError(
                f"{op.name} ({op.type}) reads element {index} of a list of "
                f"{len(tensor_list.elements)} before it is written")
        return tensor_list.elements[index]

    def _row(self, tensor: Value, k: int, dtype: tf.DType, name: str) -> Ref:
        """Element k of a list made from `tensor`: tensor[k]."""
        if not isinstance(tensor, Ref):
            raise UnsupportedListError(f"{name}: a list of a constant is not supported")
        nodes = self._nodes
        begin = nodes.shared_const(name + "/begin", np.asarray([k], np.int32), tf.int32)
        end = nodes.shared_const(name + "/end", np.asarray([k + 1], np.int32), tf.int32)
        strides = nodes.shared_const(name + "/strides", np.asarray([1], np.int32), tf.int32)
        node = nodes.node(nodes.unique_name(name), "StridedSlice",
                          [tensor.name, begin, end, strides], device=self._device, T=dtype,
                          Index=tf.int32, begin_mask=0, end_mask=0, ellipsis_mask=0,
                          new_axis_mask=0, shrink_axis_mask=1)
        return Ref(node)

    def _pack(self, op: tf.Operation, elements: List[Ref], name: str, dtype: tf.DType) -> Ref:
        if not elements:
            raise UnsupportedListError(f"{op.name} ({op.type}) stacks an empty list")
        nodes = self._nodes
        node = nodes.node(nodes.unique_name(name), "Pack", [e.name for e in elements],
                          device=self._device, T=dtype,
                          N=len(elements), axis=attr_value_pb2.AttrValue(i=0))
        return Ref(node)
