"""Which tensors of the data path are left float, and why.

TFLite needs a range for every tensor an integer kernel reads or writes.
A tensor has one when a FakeQuant reads it, when it is inside a quantized
layer (the conv, bias add and activation that TFLite fuses into one op, up
to the layer's activation quantizer), or when its op keeps its input's scale
(max pool, reshape, ...) or has a fixed output range (softmax, logistic) and
its input has a range. Every other float tensor computed from the graph
inputs is reported, with the first reason that applies:

  control_flow       computed inside a functional If/While (a function body)
                     or a control-flow-v1 cond/while_loop: the rewrite does
                     not enter them;
  outside_scope      the op is outside the `scope` the rewrite was given;
  no_integer_kernel  TFLite has no integer kernel for the op type;
  float_input        it reads a tensor that is itself left float;
  no_range           none of the above: no FakeQuant reads it (the quantize
                     pass has no pattern for this op here).
"""
import dataclasses
from typing import List, Optional, Sequence, Set

import tensorflow as tf

from qat.engine import function_library
from qat.matching import layer_patterns
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import lookups
from qat.quantize.plan.ops import activation_patterns
from qat.quantize.plan.ops import patterns as quantize_patterns
from qat.tflite import graph_structure as structure

# TF op types whose TFLite builtins have int8/uint8 kernels.
INTEGER_KERNEL_TYPES = frozenset([
    "Conv2D", "DepthwiseConv2dNative", "MatMul", "BatchMatMulV2", "BatchMatMulV3",
    "Conv2DBackpropInput", "BiasAdd", "Add", "AddV2", "Sub", "Mul", "Relu", "Relu6",
    "LeakyRelu", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "MaxPool", "AvgPool", "Mean",
    "Sum", "ConcatV2", "Concat", "Reshape", "Squeeze", "ExpandDims", "Transpose", "Pad",
    "PadV2", "MirrorPad", "StridedSlice", "Slice", "ResizeBilinear", "ResizeNearestNeighbor",
    "Maximum", "Minimum", "Pack", "Unpack", "Split", "SplitV", "DepthToSpace",
    "SpaceToDepth", "BatchToSpaceND", "SpaceToBatchND", "Identity", "GatherV2", "Tile",
    "SquaredDifference", "Rsqrt", "Abs", "Neg", "Max", "Min", "ArgMax", "Elu", "Prelu",
    "HardSwish", "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
    "Einsum", "BatchMatMul", "Gelu",
])
# Ops TFLite gives a fixed output range (their input needs one).
FIXED_RANGE_TYPES = frozenset(["Softmax", "LogSoftmax", "Sigmoid", "Tanh"])
_PARAMETER_TYPES = frozenset(["Const", "ReadVariableOp"]) | structure.VARIABLE_TYPES


@dataclasses.dataclass
class FloatTensor:
    """A tensor of the data path with no range: TFLite would keep it float."""
    tensor: str
    op_type: str
    code: str      # One of the codes in the module docstring.
    reason: str    # Readable explanation.


@dataclasses.dataclass
class LayerTail:
    """The ops qat treats as one layer, from the layer op to its quantizer."""
    layer: tf.Operation
    ops: List[tf.Operation]
    quantizer: Optional[tf.Operation]   # The activation FakeQuant, if any.
    end: tf.Operation                   # The tail op whose output leaves the layer.


def _data_inputs(op: tf.Operation, path: Set[tf.Operation]) -> List[tf.Tensor]:
    return [i for i in op.inputs if i.op in path and i.dtype.is_floating]


def layer_tail(layer: tf.Operation, path: Set[tf.Operation], max_ops: int = 16) -> LayerTail:
    """Walks forward from a layer op to its activation quantizer.

    An op joins the tail when its type is a tail or activation type and all
    its data inputs come from the tail (parameters aside), as in the
    quantize pass: a residual add never joins.
    """
    walkable = quantize_patterns.TAIL_TYPES | quantize_patterns.ACTIVATION_TYPES
    tail = [layer]
    members = {layer}
    quantizer = None
    frontier = [layer]
    while frontier and len(tail) < max_ops:
        op = frontier.pop(0)
        for consumer in (c for out in op.outputs for c in out.consumers()):
            if consumer.type in structure.FAKE_QUANT_TYPES:
                quantizer = quantizer or consumer
                continue
            if (consumer in members or consumer not in path
                    or not (consumer.type in walkable
                            or quantize_patterns.is_tail_op(consumer))):
                continue
            if all(i.op in members for i in _data_inputs(consumer, path)):
                members.add(consumer)
                tail.append(consumer)
                frontier.append(consumer)
    end = tail[-1]
    for op in reversed(tail):
        if any(c not in members and c in path for out in op.outputs
               for c in out.consumers()):
            end = op
            break
    return LayerTail(layer, tail, quantizer, end)


def explain(op: tf.Operation, scope: Optional[str], float_names: Set[str],
            path: Set[tf.Operation]) -> FloatTensor:
    """Returns the FloatTensor record of `op`'s output with its reason."""
    tensor = op.outputs[0].name
    if op.type in function_library.CALL_TYPES:
        return FloatTensor(tensor, op.type, "control_flow",
                           f"computed inside a functional {op.type} op (a function body the "
                           "rewrite does not enter; with tf_keras, fix the learning phase)")
    if (op.type in structure.V1_CONTROL_FLOW_TYPES
            or getattr(op, "_control_flow_context", None) is not None):
        return FloatTensor(tensor, op.type, "control_flow",
                           "inside a control-flow-v1 cond/while_loop")
    if scope and not op.name.startswith(scope):
        return FloatTensor(tensor, op.type, "outside_scope", f"outside scope {scope!r}")
    if op.type not in INTEGER_KERNEL_TYPES:
        return FloatTensor(tensor, op.type, "no_integer_kernel",
                           f"TFLite has no integer kernel for {op.type}")
    float_inputs = [i.name for i in _data_inputs(op, path) if i.name in float_names]
    if float_inputs:
        return FloatTensor(tensor, op.type, "float_input",
                           f"its input {float_inputs[0]!r} is float")
    return FloatTensor(tensor, op.type, "no_range",
                       f"no FakeQuant reads it: the quantize pass has no pattern for this "
                       f"{op.type}")


def _is_parameter(op: tf.Operation) -> bool:
    return op.type in _PARAMETER_TYPES or (
        op.outputs and layer_patterns.is_parameter(op.outputs[0]))


def find_float_tensors(graph: tf.Graph, path: Set[tf.Operation],
                       tails: Sequence[LayerTail], scope: Optional[str] = None
                       ) -> List[FloatTensor]:
    """Lists the float tensors of the data path that have no range.

    Args:
      graph: the graph.
      path: `structure.data_path(graph, outputs)`.
      tails: `layer_tail` of every layer on the path.
      scope: the rewrite's scope, if it had one.

    Returns:
      One FloatTensor per unranged tensor, in topological order.
    """
    ranged: Set[str] = set()
    fused: Set[tf.Operation] = set()      # Inside a quantized layer: ranged.
    unreported: Set[tf.Operation] = set()  # Inside an unquantized layer: its end is reported.
    for tail in tails:
        if tail.quantizer is not None:
            # A functional If/While in the tail (an unfoldable batch norm) is
            # no part of the fused TFLite op: it is reported.
            fused.update(op for op in tail.ops
                         if op.type not in function_library.CALL_TYPES)
        else:
            unreported.update(op for op in tail.ops if op is not tail.end)
    for op in graph.get_operations():
        if op.type in structure.FAKE_QUANT_TYPES:
            ranged.add(op.inputs[0].name)
            ranged.add(op.outputs[0].name)
    for op in path:
        # Activations written as several ops (GELU, hard-swish): TFLite runs
        # each as one integer op, nothing inside has a range of its own.
        found_activation = activation_patterns.match_whole_activation(op)
        if found_activation is not None:
            fused.update(found_activation[2])
    found: List[FloatTensor] = []
    float_names: Set[str] = set()
    for op in structure.topological_order(path, graph):
        if op.type in structure.FAKE_QUANT_TYPES or op in unreported:
            continue
        if op.type in structure.INPUT_TYPES or op.type in structure.METADATA_TYPES:
            continue
        if _is_parameter(op) or not op.outputs or not op.outputs[0].dtype.is_floating:
            continue
        out = op.outputs[0].name
        if out in ranged or op in fused or plan_graph.is_quantized_output(op.outputs[0]):
            ranged.add(out)
            continue
        inputs = _data_inputs(op, path)
        keeps_range = (op.type in structure.SAME_SCALE_TYPES
                       or op.type in FIXED_RANGE_TYPES)
        if keeps_range and inputs and all(i.name in ranged or i.op.type in
                                          structure.INPUT_TYPES for i in inputs[:1]):
            ranged.add(out)
            continue
        if (op.type in lookups.GATHER_TYPES and lookups.lookup_table(op) is not None
                and op.inputs[0].name in ranged):
            ranged.add(out)  # GATHER: the table's scale.
            continue
        record = explain(op, scope, float_names, path)
        found.append(record)
        float_names.add(out)
    return found

