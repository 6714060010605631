"""TFLite's integer op requirements, declared as data for the quantize planner.

The planner (`qat.quantize.plan`) decides, for every float tensor on the data
path, whether it needs a range from the kind of the op that produces it and
of the ops that read it. The kinds follow TFLite's 8-bit quantization spec
(see docs/what_gets_a_range.md, whose op table lists these sets):

* OWN_RANGE: integer kernels whose output has its own scale (ADD, SUB, MUL,
  MEAN, SUM, CONCATENATION, LEAKY_RELU, SQUARED_DIFFERENCE, ...): the output
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

* HARD_SWISH, `x * relu6(x + 3) / 6` in its usual spellings: the converter
  turns it into one integer HARD_SWISH op when nothing is quantized inside,
  so only its output gets a range.
* DROPOUT, `Select(random >= rate, x * scale, 0)`: exists in training graphs
  only; looked through (like a same-scale op) so that training and eval
  graphs plan, and name, the same ranges.
"""
from typing import List, Optional, Set

import tensorflow as tf

from qat.matching.matcher import GraphMatcher, OneofPattern, OpTypePattern

OWN_RANGE_TYPES = frozenset([
    "Add", "AddV2", "BiasAdd", "Sub", "Mul", "Mean", "Sum", "ConcatV2",
    "Concat", "LeakyRelu", "SquaredDifference", "Relu", "Relu6",
    "Maximum", "Minimum",
])

# Reductions: a reduction to a scalar is loss arithmetic, not a model op.
REDUCTION_TYPES = frozenset(["Mean", "Sum"])

# Name kind of the range on an OWN_RANGE output (`<op scope>/<kind>`).
RANGE_NAMES = {
    "Add": "add_quant", "AddV2": "add_quant", "BiasAdd": "add_quant",
    "Sub": "sub_quant", "Mul": "mul_quant", "Mean": "mean_quant",
    "Sum": "sum_quant", "ConcatV2": "concat_quant", "Concat": "concat_quant",
    "SquaredDifference": "squared_difference_quant",
    "LeakyRelu": "leaky_relu_quant",
}
DEFAULT_RANGE_NAME = "act_quant"

FUSABLE_ACTIVATION_TYPES = frozenset(["Relu", "Relu6"])
# Activations: an add reading one is named post_activation_bypass_quant.
ACTIVATION_TYPES = frozenset(["Relu", "Relu6", "LeakyRelu"])

# Producers TFLite fuses a RELU / RELU6 into (besides layers).
FUSING_TYPES = frozenset(["Add", "AddV2", "Sub", "BiasAdd"])

FIXED_RANGE_TYPES = frozenset(["Sigmoid", "Tanh", "Softmax", "LogSoftmax"])

SAME_SCALE_TYPES = frozenset([
    "Reshape", "Pad", "PadV2", "MirrorPad", "MaxPool", "AvgPool",
    "SpaceToBatchND", "BatchToSpaceND", "Identity", "IdentityN", "Squeeze",
    "ExpandDims", "Transpose", "StridedSlice", "Slice", "DepthToSpace",
    "SpaceToDepth", "ResizeBilinear", "ResizeNearestNeighbor", "GatherV2",
    "Split", "SplitV", "Unpack", "Tile",
    "StopGradient", "PreventGradient",
])

# Ops that run functions: what is inside is invisible to the planner.
FUNCTIONAL_TYPES = frozenset([
    "If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall",
    "StatefulPartitionedCall", "Case", "StatelessCase",
])

_RANDOM_PREFIXES = ("Random", "StatelessRandom", "TruncatedNormal",
                    "StatelessTruncatedNormal", "Multinomial")


def _hard_swish() -> OneofPattern:
    x = OpTypePattern("*", name="x")
    relu6 = OpTypePattern("Relu6", name="relu6", inputs=[
        OpTypePattern("Add|AddV2", name="plus_three",
                      inputs=[x, OpTypePattern("Const")],
                      ordered_inputs=False)])
    sixth = OneofPattern([
        OpTypePattern("Mul", inputs=[relu6, OpTypePattern("Const")],
                      ordered_inputs=False),
        OpTypePattern("RealDiv|Div", inputs=[relu6, OpTypePattern("Const")]),
    ], name="hard_sigmoid")
    inner = OpTypePattern("Mul", name="x_relu6", inputs=[x, relu6],
                          ordered_inputs=False)
    return OneofPattern([
        OpTypePattern("Mul", inputs=[x, sixth], ordered_inputs=False),
        OpTypePattern("Mul", inputs=[inner, OpTypePattern("Const")],
                      ordered_inputs=False),
        OpTypePattern("RealDiv|Div", inputs=[inner, OpTypePattern("Const")]),
    ], name="hard_swish")


HARD_SWISH = _hard_swish()
_HARD_SWISH_MATCHER = GraphMatcher(HARD_SWISH)

DROPOUT = OpTypePattern("Select|SelectV2", name="dropout", inputs=[
    OpTypePattern("GreaterEqual", name="keep_mask", inputs=["*", "*"]),
    OpTypePattern("Mul|RealDiv", name="dropout_scale",
                  inputs=[OpTypePattern("*", name="dropout_input"), "*"]),
    "*"])
_DROPOUT_MATCHER = GraphMatcher(DROPOUT)


def _depends_on_random(t: tf.Tensor, depth: int = 6) -> bool:
    frontier = [t.op]
    for _ in range(depth):
        nxt = []
        for op in frontier:
            if op.type.startswith(_RANDOM_PREFIXES):
                return True
            nxt.extend(i.op for i in op.inputs)
        frontier = nxt
    return False


def hard_swish_ops(op: tf.Operation) -> Optional[List[tf.Operation]]:
    """The interior ops of a hard-swish ending at `op`, or None.

    Args:
      op: a candidate output op (Mul / RealDiv).

    Returns:
      The ops between the input x and `op` (that must get no range), or None
      when `op` does not end a hard-swish.
    """
    if op.type not in ("Mul", "RealDiv", "Div"):
        return None
    # Cheap pre-check: a Relu6 one or two ops up.
    if not any(i.op.type == "Relu6" or any(
            j.op.type == "Relu6" for j in i.op.inputs) for i in op.inputs):
        return None
    match = _HARD_SWISH_MATCHER.match_op(op)
    if match is None:
        return None
    names = ("plus_three", "relu6", "hard_sigmoid", "x_relu6")
    inner = [match.get_op(n) for n in names if match.get_op(n) is not None]
    if match.get_op("hard_sigmoid") is op:
        return None
    return [o for o in inner if o is not op]


def dropout_ops(op: tf.Operation) -> Optional[Set[tf.Operation]]:
    """The dropout ops ending at `op` (the Select and its scale), or None.

    A Select keeping `x * scale` where a random mask is set is dropout: it
    exists only in training graphs.
    """
    if op.type not in ("Select", "SelectV2"):
        return None
    match = _DROPOUT_MATCHER.match_op(op)
    if match is None or not _depends_on_random(match.get_tensor("keep_mask")):
        return None
    scale = match.get_op("dropout_scale")
    if len(scale.outputs[0].consumers()) != 1:
        return None
    return {op, scale}


def same_scale_input(op: tf.Operation, index: int) -> int:
    """Which input of a same-scale op output `index` takes its scale from."""
    if op.type == "IdentityN":
        return index
    if op.type in ("Split",):
        return 1
    return 0
