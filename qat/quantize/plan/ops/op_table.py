"""TFLite's integer op requirements, declared as data for the quantize planner.

The planner (`qat.quantize.plan`) decides, for every float tensor on the data
path, whether it needs a range from the kind of the op that produces it and
of the ops that read it. The kinds follow TFLite's 8-bit quantization spec
(see docs/what_gets_a_range.md, whose op table lists these sets):

* OWN_RANGE: integer kernels whose output has its own scale (ADD, SUB, MUL,
  MEAN, SUM, CONCATENATION, LEAKY_RELU, SQUARED_DIFFERENCE, RSQRT (layer
  norm's arithmetic), ...): the output
  gets a range, every float data input must have one.
* FUSABLE_ACTIVATIONS: activations TFLite fuses into the layer or the
  ADD / SUB before them (RELU, RELU6). Fused only when the activation is the
  sole reader of that output: the range then goes after the activation.
  Otherwise the activation is an op of its own with its own output range.
* FIXED_RANGE: LOGISTIC, TANH, SOFTMAX, LOG_SOFTMAX: the converter imposes
  the output scale, so the output gets no learnt range.
* SAME_SCALE: ops whose output shares the input's scale (pools, RESHAPE,
  SQUEEZE, PAD, TRANSPOSE, SLICE, ...): never a range on their output, the
  range belongs to the tensor they read.
* Anything else on the data path has no integer kernel in this table and is
  reported as left in float (`Planner.left_float`).

Structures matched as a whole (patterns, in `qat.matching.matcher` style):

* Activations written as several ops that the converter turns into one
  integer op when nothing is quantized inside (HARD_SWISH, GELU): declared in
  `qat.quantize.plan.ops.activation_patterns`; only their output gets a range.
* Dropout and drop path, `Select(random >= rate, x * scale, 0)` and
  `x * random mask` with its scale: exist in training graphs only; looked
  through (like a same-scale op) so that training and eval graphs plan, and
  name, the same ranges (`qat.quantize.plan.ops.dropout_patterns`).
"""
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import function_library

OWN_RANGE_TYPES = frozenset([
    "Add", "AddV2", "BiasAdd", "Sub", "Mul", "Mean", "Sum", "ConcatV2",
    "Concat", "LeakyRelu", "SquaredDifference", "Relu", "Relu6",
    "Maximum", "Minimum", "Rsqrt",
    # A matmul of two activations (attention's scores and context), whose
    # data inputs both need ranges; one with a weight operand is a layer.
    "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
    # PACK (`tf.stack`: a recurrent layer's outputs of every step), one scale
    # for its inputs and output as CONCATENATION (`shared_ranges`).
    "Pack",
    # SELECT_V2 of two activations (a masked recurrent step keeps its state:
    # where(mask, new, previous)): one scale for both and the output, as
    # CONCATENATION; its condition is no value. With a constant it is the
    # other value's same-scale op (`converter_rewrites.is_constant_select`).
    "Select", "SelectV2",
])

# Reductions: a reduction to a scalar is loss arithmetic, not a model op.
REDUCTION_TYPES = frozenset(["Mean", "Sum"])

# Name kind of the range on an OWN_RANGE output (`<op scope>/<kind>`).
RANGE_NAMES = {
    "Add": "add_quant", "AddV2": "add_quant", "BiasAdd": "add_quant",
    "Sub": "sub_quant", "Mul": "mul_quant", "Mean": "mean_quant",
    "Sum": "sum_quant", "ConcatV2": "concat_quant", "Concat": "concat_quant",
    "SquaredDifference": "squared_difference_quant",
    "LeakyRelu": "leaky_relu_quant", "Rsqrt": "rsqrt_quant",
    "BatchMatMul": "matmul_quant", "BatchMatMulV2": "matmul_quant",
    "BatchMatMulV3": "matmul_quant", "Einsum": "einsum_quant",
    "Pack": "pack_quant", "Select": "select_quant", "SelectV2": "select_quant",
}
# Ops whose input 0 is a condition, not a value.
CONDITION_TYPES = frozenset(["Select", "SelectV2"])
DEFAULT_RANGE_NAME = "act_quant"

FUSABLE_ACTIVATION_TYPES = frozenset(["Relu", "Relu6"])
# Activations: an add reading one is named post_activation_bypass_quant.
ACTIVATION_TYPES = frozenset(["Relu", "Relu6", "LeakyRelu"])

# Producers TFLite fuses a RELU / RELU6 into (besides layers).
FUSING_TYPES = frozenset(["Add", "AddV2", "Sub", "Mul", "BiasAdd"])

FIXED_RANGE_TYPES = frozenset(["Sigmoid", "Tanh", "Softmax", "LogSoftmax"])

SAME_SCALE_TYPES = frozenset([
    "Reshape", "Pad", "PadV2", "MirrorPad", "MaxPool", "AvgPool",
    "SpaceToBatchND", "BatchToSpaceND", "Identity", "IdentityN", "Squeeze",
    "ExpandDims", "Transpose", "StridedSlice", "Slice", "DepthToSpace",
    "SpaceToDepth", "ResizeBilinear", "ResizeNearestNeighbor", "GatherV2",
    "Split", "SplitV", "Unpack", "Tile",
    # REVERSE_V2 (a bidirectional layer's backward outputs in time order).
    "ReverseV2",
    "StopGradient", "PreventGradient",
    # REDUCE_MAX / REDUCE_MIN (global max pooling): the input's scale.
    "Max", "Min",
])

# Ops that run functions: what is inside is invisible to the planner.
FUNCTIONAL_TYPES = function_library.CALL_TYPES

# A whole recurrent layer in one op (cuDNN's: Keras 3 LSTM / GRU traced where a
# GPU is visible, tf.compat.v1 cudnn_rnn): TFLite has no kernel for it and qat
# cannot see its steps; named in `left_float` with what to do instead.
FUSED_RECURRENCE_TYPES = frozenset(["CudnnRNN", "CudnnRNNV2", "CudnnRNNV3"])

# Random draws (op type prefixes): dropout masks, noise.
RANDOM_PREFIXES = ("Random", "StatelessRandom", "TruncatedNormal",
                   "StatelessTruncatedNormal", "Multinomial")


def same_scale_input(op: tf.Operation, index: int) -> int:
    """Which input of a same-scale op output `index` takes its scale from."""
    if op.type == "IdentityN":
        return index
    if op.type in ("Split",):
        return 1
    if op.type in ("Select", "SelectV2") and len(op.inputs) == 3:
        # where(mask, x, c) or where(mask, c, x): x's scale.
        return 2 if tensor_util.constant_value(op.inputs[1]) is not None else 1
    return 0
