"""Op-type data the quantize pass recognises structure with.

The layer ops themselves come from `qat.matching.layer_patterns` (shared with the fold
pass); this module lists what the quantize pass walks through after them.
"""
from qat.engine import marks
from qat.matching import layer_patterns

# Transposed convolutions (contrib never quantized them): Conv2DBackpropInput
# (input_sizes, filter, data). Their weights are input 1 like the others.
TRANSPOSED_CONV_TYPES = frozenset(layer_patterns.TRANSPOSED_CONV_TYPES)
LAYER_TYPES = (frozenset(layer_patterns.LAYER_TYPES) | TRANSPOSED_CONV_TYPES
               | frozenset(layer_patterns.WEIGHTED_OPERAND_TYPES))


def data_input(layer_op):
    """The activation tensor a layer op reads."""
    if layer_op.type in TRANSPOSED_CONV_TYPES:
        return layer_op.inputs[2]
    return layer_op.inputs[0]

# Activations fused into the layer at inference; their output gets act_quant.
ACTIVATION_TYPES = frozenset(["Relu", "Relu6", "Identity", "LeakyRelu"])

# Ops that can sit between a layer op and its activation: bias adds, atrous
# BatchToSpaceND, batch norms (fused, unfused arithmetic, batch statistics).
# The fold pass's own tail ops (rescale, folded bias add, select_fold, its
# functional cond) are recognised by qat's mark instead (`is_tail_op`). An
# Identity joins between a layer and its bias add (`layer_identity`); one
# after the tail's end is not part of it (`TAIL_END_TYPES`). A tail op only
# joins a layer's tail when every data input it has comes from that layer's
# tail (the others are parameters), so residual adds never join.
TAIL_TYPES = frozenset([
    "BiasAdd", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div",
    "Neg", "Identity",
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
    "Mean", "SquaredDifference", "StopGradient",
    "Squeeze", "Rsqrt", "Sqrt", "Reciprocal", "Reshape", "BatchToSpaceND",
    "Maximum", "Minimum", "Square", "ExpandDims",
    # Unfoldable batch norms of Keras graphs sit inside If ops.
    "If", "StatelessIf",
])


def is_tail_op(op) -> bool:
    """Whether `op` can be part of a layer's tail (see TAIL_TYPES)."""
    return op.type in TAIL_TYPES or marks.made_by_qat(op, marks.FOLD)

# The ops a tail may end with: a bias add, a batch norm (fused, its
# arithmetic's final add or scale, one inside an If) or an atrous conv's
# BatchToSpaceND; qat's fold ops too (`is_tail_end`). Anything else after
# them (Squeeze, Reshape, Identity, global pooling, loss arithmetic) reads
# the layer output and is not part of it.
TAIL_END_TYPES = frozenset([
    "BiasAdd", "Add", "AddV2", "Mul", "RealDiv", "Div",
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
    "BatchToSpaceND", "If", "StatelessIf",
])


def is_tail_end(op) -> bool:
    """Whether a layer's tail may end with `op` (see TAIL_END_TYPES)."""
    return op.type in TAIL_END_TYPES or marks.made_by_qat(op, marks.FOLD)


RESIDUAL_ADD_TYPES = frozenset(["Add", "AddV2"])

# Reductions whose axes decide whether they are batch statistics (tail) or
# per-example statistics (layer norm) after a layer.
REDUCTION_TYPES = frozenset(["Mean"])

# Fused batch norms; one that follows no layer gets its own range.
BATCH_NORM_TYPES = frozenset(["FusedBatchNorm", "FusedBatchNormV2",
                              "FusedBatchNormV3"])

# Ops TFLite runs with the scale of their input: the layer-input walk goes
# back through them to find the tensor that needs a range.
SAME_SCALE_TYPES = frozenset([
    "Reshape", "Pad", "PadV2", "MaxPool", "SpaceToBatchND", "BatchToSpaceND",
    "Identity", "Squeeze", "ExpandDims", "Transpose", "StridedSlice",
    "DepthToSpace", "SpaceToDepth", "StopGradient", "PreventGradient",
])

# Outputs that need their own range besides layer outputs.
CONCAT_TYPES = frozenset(["ConcatV2", "Concat"])
# Ops whose inputs and output TFLite keeps in one scale (CONCATENATION, PACK,
# SELECT_V2 of two values): they and what they read share one range
# (`qat.quantize.plan.ranges.shared_ranges`).
GROUP_SCALE_TYPES = frozenset(["ConcatV2", "Concat", "Pack", "Select", "SelectV2"])
MEAN_TYPES = frozenset(["Mean"])

# Loss kernels: what they read is a model output (the logits), what they
# compute is not on the inference path.
LOSS_KERNEL_TYPES = frozenset(["SparseSoftmaxCrossEntropyWithLogits",
                               "SoftmaxCrossEntropyWithLogits"])

# Graph inputs (data sources that are not layer outputs).
INPUT_TYPES = frozenset(["Placeholder", "PlaceholderWithDefault",
                         "IteratorGetNext"])

# Consumers that never need the quantized value.
METADATA_TYPES = frozenset(["Shape", "ShapeN", "Size", "Rank"])


def is_state_update(op) -> bool:
    """True for ops that write a variable (moving-average updates)."""
    return op.type.startswith("Assign") or op.type in (
        "ScatterUpdate", "ResourceScatterUpdate")


_GRADIENT_ONLY_TYPES = frozenset([
    "Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter",
    "DepthwiseConv2dNativeBackpropInput", "BroadcastGradientArgs"])


def is_gradient_kernel(op) -> bool:
    """True for ops that only gradient computations create.

    Conv2DBackpropInput is not one: it is also the forward op of transposed
    convolutions.
    """
    return is_gradient_kernel_type(op.type)


def is_gradient_kernel_type(op_type: str) -> bool:
    """`is_gradient_kernel` for an op type name.

    Args:
      op_type: an op type, e.g. "ReluGrad".

    Returns:
      True for the types only gradient computations create.
    """
    return op_type.endswith("Grad") or op_type in _GRADIENT_ONLY_TYPES
