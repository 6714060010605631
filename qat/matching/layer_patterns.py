"""Layer and batch-norm patterns, declared once as data for fold and quantize.

Everything here is a `qat.matching.matcher` pattern object (or a tuple of op types)
plus tiny accessor helpers; the passes own the logic. Names bound by the
patterns (look them up with `MatchResult.get_op(name)` / `get_tensor(name)`):

LAYER_CHAIN, rooted at the tensor a batch norm reads (the "pre-BN" tensor)::

    [SpaceToBatchND ->] layer ("layer", weights: "weights")
        [[-> Squeeze ("atrous_squeeze")] -> BatchToSpaceND ("batch_to_space")]
                                                    atrous convolution (a
                                                    dilated Conv1D squeezes
                                                    first)
        [-> Squeeze ("squeeze")]                    Conv1D (ExpandDims -> Conv2D)
        [-> Identity ("layer_identity")]
        [-> BiasAdd | Add | AddV2 ("bias_add", vector: "bias")]
        [-> Reshape ("reshape")]                    MatMul feeding a 4-D BN

  The layer ops are Conv2D, MatMul, DepthwiseConv2dNative and the transposed
  convolution Conv2DBackpropInput (input_sizes, weights, data); weights and
  biases are "parameters": a ReadVariableOp (resource variable), an Identity
  of a VariableV2 (ref variable, the `/read` op), a Const, or the ConcatV2
  of such reads that a PartitionedVariable is read as, or a Cast of a read
  (mixed precision), each optionally behind one Identity; weights also
  behind the ExpandDims of a Conv1D. Whether a bias really is a per-channel
  vector is for
  the pass to check (shapes are not part of the pattern).

UNSCALED_WEIGHTS, the weights of a layer after a training fold
(`qat.fold_batch_norms`), rooted at the op the layer reads as weights::

    Mul("unscale", w*s [quantized]: "scaled_weights",
        [Reshape(] [Cast(] DivNoNan(Const 1, StopGradient(s)) [)] [)])

  `weight_input` returns "scaled_weights" for such a layer.

FUSED_BATCH_NORM: FusedBatchNorm / V2 / V3 ("batch_norm") reading
  "bn_input", "gamma", "beta", "mean", "variance" (inputs 0..4).

UNFUSED_BATCH_NORM, the arithmetic of `tf.nn.batch_normalization` (also what
`tf.compat.v1.layers.batch_normalization(fused=False)` and tf_keras
`BatchNormalization(fused=False)` emit)::

    inv    = Rsqrt(AddV2(variance, epsilon)) [* gamma]        ("rsqrt", "inv")
    output = AddV2(Mul(bn_input, inv),                         ("scaled")
                   Sub(beta, Mul(mean, inv)) | Mul(Neg(mean), inv))  ("offset")

  Root "batch_norm" is the final AddV2; "gamma"/"beta" are unbound without
  scale/center.

The quantize pass adds its activation / residual patterns in the section at
the end of this file. A function call that computes one layer:
`qat.matching.layer_calls`.
"""
from typing import List, Optional

import tensorflow as tf

from qat.engine import marks
from qat.engine import op_index
from qat.matching.matcher import GraphMatcher, OneofPattern, OpTypePattern

# The ops whose weights are folded and quantized.
LAYER_TYPES = ("Conv2D", "MatMul", "DepthwiseConv2dNative")
# Transposed convolutions: folded too; also the gradient of a Conv2D, so not
# a layer by type alone (the quantize pass tells gradient ops apart).
TRANSPOSED_CONV_TYPES = ("Conv2DBackpropInput",)
FOLDABLE_TYPES = LAYER_TYPES + TRANSPOSED_CONV_TYPES
# Layers when their input 1 is weights (`is_weighted_einsum`); not folded.
EINSUM_TYPES = ("Einsum",)
# Layers too when their input 1 is weights: Keras 3 computes EinsumDense
# (MultiHeadAttention's projections) as a batch matmul with the kernel.
BATCH_MATMUL_TYPES = ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
WEIGHTED_OPERAND_TYPES = EINSUM_TYPES + BATCH_MATMUL_TYPES
FUSED_BATCH_NORM_TYPES = ("FusedBatchNorm", "FusedBatchNormV2",
                          "FusedBatchNormV3")
# Ops that hold or read a variable's value.
VARIABLE_READ_TYPES = ("ReadVariableOp",)
REF_VARIABLE_TYPES = ("VariableV2", "Variable")


def _direct_parameter() -> OneofPattern:
    """A variable read or a constant."""
    return OneofPattern([
        OpTypePattern("ReadVariableOp"),
        OpTypePattern("Identity", inputs=[OpTypePattern("|".join(REF_VARIABLE_TYPES))]),
        OpTypePattern("Const"),
    ])


# A PartitionedVariable (`get_variable(..., partitioner=...)`) is read as
# ConcatV2(shard reads..., axis): up to this many shards are recognised.
MAX_PARTITIONED_SHARDS = 16


def _partitioned_parameter() -> OneofPattern:
    """The value of a PartitionedVariable: ConcatV2 of 2.. shard reads."""
    return OneofPattern([
        OpTypePattern("ConcatV2", inputs=[_direct_parameter() for _ in range(shards)]
                      + [OpTypePattern("Const")])
        for shards in range(2, MAX_PARTITIONED_SHARDS + 1)])


# Ops that only change a parameter's shape, their other inputs constant: the
# converter folds them into the constant (Keras 3 reads a conv bias as
# Squeeze(Reshape(b, [1, 1, 1, c])), EinsumDense's kernel reshaped to 2-D).
RESHAPING_TYPES = ("Reshape", "Squeeze", "ExpandDims")
# How many of them may sit between a parameter and its reader.
MAX_PARAMETER_RESHAPES = 2


def _reshaped(inner: OneofPattern) -> OneofPattern:
    """`inner`, or `inner` behind up to MAX_PARAMETER_RESHAPES reshapes."""
    found = inner
    for _ in range(MAX_PARAMETER_RESHAPES):
        found = OneofPattern([
            inner,
            OpTypePattern("Reshape|ExpandDims", inputs=[found, OpTypePattern("Const")]),
            OpTypePattern("Squeeze", inputs=[found]),
        ])
    return found


def _parameter(name: str) -> OneofPattern:
    """A weight or bias: a variable read, a constant or a partitioned
    variable's shards concatenated, maybe behind Identity and reshapes by
    constants."""
    direct = OneofPattern([
        _direct_parameter(),
        _partitioned_parameter(),
        # Mixed precision (tf_keras mixed_float16 / mixed_bfloat16): a float32
        # variable read cast to the layer's float16 / bfloat16.
        OpTypePattern("Cast", inputs=[_direct_parameter()]),
    ])
    return OneofPattern([_reshaped(direct),
                         OpTypePattern("Identity", inputs=[direct])],
                        name=name)


_WEIGHT = _parameter("weight_parameter")
# Conv1D reads its [k, in, out] weights expanded to [1, k, in, out].
WEIGHTS = OneofPattern([OpTypePattern("ExpandDims", inputs=[_WEIGHT, "*"]),
                        _WEIGHT], name="weights")
BIAS = _parameter("bias")

LAYER = OneofPattern([
    OpTypePattern("|".join(LAYER_TYPES), inputs=["*", WEIGHTS]),
    OpTypePattern("|".join(TRANSPOSED_CONV_TYPES), inputs=["*", WEIGHTS, "*"]),
], name="layer")
# A dilated Conv1D squeezes before the BatchToSpaceND ("atrous_squeeze").
ATROUS_LAYER = OpTypePattern("BatchToSpaceND", name="batch_to_space", inputs=[
    OneofPattern([OpTypePattern("Squeeze", name="atrous_squeeze", inputs=[LAYER]),
                  LAYER]), "*", "*"])
LAYER_OUTPUT = OneofPattern([ATROUS_LAYER, LAYER], name="layer_output")
_SQUEEZED = OneofPattern([
    OpTypePattern("Squeeze", name="squeeze", inputs=[LAYER_OUTPUT]),
    LAYER_OUTPUT,
])
_LAYER_IDENTITY = OneofPattern([
    OpTypePattern("Identity", name="layer_identity", inputs=[_SQUEEZED]),
    _SQUEEZED,
])
_BIASED = OneofPattern([
    OpTypePattern("BiasAdd", name="bias_add", inputs=[_LAYER_IDENTITY, BIAS]),
    OpTypePattern("Add|AddV2", name="bias_add", inputs=[_LAYER_IDENTITY, BIAS],
                  ordered_inputs=False),
    _LAYER_IDENTITY,
])
# Rooted at the op producing the batch norm's input.
LAYER_CHAIN = OneofPattern([
    OpTypePattern("Reshape", name="reshape", inputs=[_BIASED, "*"]),
    _BIASED,
])

# The training fold's weights (`qat.fold_batch_norms`): the layer reads
# Mul(w*s [-> weights_quant], 1/s) with 1/s = DivNoNan(1, StopGradient(s)),
# reshaped to the weight layout for depthwise and transpose_b MatMul weights.
_INVERSE_SCALE = OpTypePattern("DivNoNan", inputs=[
    OpTypePattern("Const"), OpTypePattern("StopGradient")])
# Mixed precision: 1/s is computed in float32 and cast to the layer's dtype.
_LAYER_DTYPE_INVERSE_SCALE = OneofPattern([
    OpTypePattern("Cast", inputs=[_INVERSE_SCALE]), _INVERSE_SCALE])
UNSCALED_WEIGHTS = OpTypePattern("Mul", name="unscale", inputs=[
    OpTypePattern("*", name="scaled_weights"),
    OneofPattern([OpTypePattern("Reshape", inputs=[_LAYER_DTYPE_INVERSE_SCALE, "*"]),
                  _LAYER_DTYPE_INVERSE_SCALE])])
_UNSCALED_WEIGHTS_MATCHER = GraphMatcher(UNSCALED_WEIGHTS)

FUSED_BATCH_NORM = OpTypePattern(
    "|".join(FUSED_BATCH_NORM_TYPES), name="batch_norm",
    inputs=[OpTypePattern("*", name="bn_input"),
            OpTypePattern("*", name="gamma"),
            OpTypePattern("*", name="beta"),
            OpTypePattern("*", name="mean"),
            OpTypePattern("*", name="variance")])


def _unfused_batch_norm() -> OpTypePattern:
    bn_input = OpTypePattern("*", name="bn_input")
    mean = OpTypePattern("*", name="mean")
    rsqrt = OpTypePattern("Rsqrt", name="rsqrt", inputs=[
        OpTypePattern("Add|AddV2", inputs=[
            OpTypePattern("*", name="variance"),
            OpTypePattern("Const", name="epsilon")])])
    inv = OneofPattern([
        OpTypePattern("Mul", inputs=[rsqrt, OpTypePattern("*", name="gamma")],
                      ordered_inputs=False),
        rsqrt,
    ], name="inv")
    scaled = OpTypePattern("Mul", name="scaled", inputs=[bn_input, inv],
                           ordered_inputs=False)
    offset = OneofPattern([
        OpTypePattern("Sub", inputs=[
            OpTypePattern("*", name="beta"),
            OpTypePattern("Mul", inputs=[mean, inv], ordered_inputs=False)]),
        OpTypePattern("Mul", inputs=[OpTypePattern("Neg", inputs=[mean]), inv],
                      ordered_inputs=False),
    ], name="offset")
    return OpTypePattern("Add|AddV2", name="batch_norm",
                         inputs=[scaled, offset], ordered_inputs=False)


UNFUSED_BATCH_NORM = _unfused_batch_norm()


def is_weighted_einsum(op: tf.Operation) -> bool:
    """An Einsum or batch matmul of an activation and weights (EinsumDense,
    MultiHeadAttention's projections: tf_keras writes an Einsum, Keras 3 a
    BatchMatMulV2 with the kernel reshaped to 2-D): a layer. One of two
    activations (attention scores) is not."""
    if (op.type not in WEIGHTED_OPERAND_TYPES or len(op.inputs) != 2
            or is_parameter(op.inputs[0])):
        return False
    weights = op.inputs[1]
    # Quantized already (a report on a rewritten graph): FakeQuant(weights, ...).
    while weights.op.type.startswith("FakeQuantWithMinMax"):
        weights = weights.op.inputs[0]
    return is_parameter(weights)


def layer_ops(graph: tf.Graph) -> List[tf.Operation]:
    """Returns every Conv2D, MatMul, DepthwiseConv2dNative and weighted Einsum.

    Layers a rewrite replaced (the steps of a loop it unrolled,
    `qat.prepare.loops`: unconnected) are not among them.

    Args:
      graph: the graph to scan.

    Returns:
      The layer ops in creation order.
    """
    wanted = frozenset(LAYER_TYPES)
    return [op for op in op_index.ops_of_types(graph, wanted.union(WEIGHTED_OPERAND_TYPES))
            if (op.type in wanted or is_weighted_einsum(op)) and not marks.is_replaced(op)]


def weight_input(layer_op: tf.Operation) -> tf.Tensor:
    """Returns the weight tensor of a layer op: the one to quantize.

    That is its input 1, except when the layer reads it through the training
    fold's per-channel unscale (`UNSCALED_WEIGHTS`, `Mul(w * s, 1 / s)`):
    then it is the multiply's first input, the folded weight `w * s` (or
    its quantized value once the quantize pass ran). After an eval fold the
    layer reads `w * s` directly.

    Args:
      layer_op: a Conv2D, MatMul, DepthwiseConv2dNative, transposed conv or
        weighted Einsum op.

    Returns:
      The filter / right-hand matrix tensor.

    Raises:
      ValueError: if `layer_op` is not a layer op.
    """
    if layer_op.type not in FOLDABLE_TYPES + WEIGHTED_OPERAND_TYPES:
        raise ValueError("%s (%s) is not a layer op; expected one of %s."
                         % (layer_op.name, layer_op.type, ", ".join(FOLDABLE_TYPES)))
    direct = layer_op.inputs[1]
    if direct.op.type == "Mul":
        match = _UNSCALED_WEIGHTS_MATCHER.match_op(direct.op)
        if match is not None:
            return match.get_tensor("scaled_weights")
    return direct


def is_parameter(tensor: tf.Tensor) -> bool:
    """True if `tensor` is a variable read or a constant (maybe via Identity,
    maybe reshaped by constants: `RESHAPING_TYPES`)."""
    op = tensor.op
    for _ in range(MAX_PARAMETER_RESHAPES):
        if op.type not in RESHAPING_TYPES or not all(
                i.op.type == "Const" for i in op.inputs[1:]):
            break
        op = op.inputs[0].op
    if op.type == "Identity" and op.inputs[0].op.type in (
            "ReadVariableOp", "Identity", "Const"):
        op = op.inputs[0].op
    if op.type in ("ReadVariableOp", "Const"):
        return True
    return op.type == "Identity" and op.inputs[0].op.type in REF_VARIABLE_TYPES


def output_channels(layer_op: tf.Operation) -> Optional[int]:
    """The static number of output channels of a layer op, None if unknown."""
    w_shape = weight_input(layer_op).shape
    if w_shape.rank is None:
        return None
    if layer_op.type == "DepthwiseConv2dNative":
        if w_shape[2] is None or w_shape[3] is None:
            return None
        return w_shape[2] * w_shape[3]
    if layer_op.type == "MatMul" and layer_op.get_attr("transpose_b"):
        return w_shape[0]
    if layer_op.type in TRANSPOSED_CONV_TYPES:
        return w_shape[2]  # [h, w, out, in]
    return w_shape[-1]


# --- Activations and residual adds (quantize pass) --------------------------
# Add the quantize pass's patterns here, as data like the ones above.
