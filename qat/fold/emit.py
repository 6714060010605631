"""The new ops of one batch-norm fold, written as NodeDefs.

`emit` adds the folded weights, the scale and its inverse, the folded bias
and the training tail of one `qat.fold.plan.FoldPlan` to a `NodeBatch`; the
structures are described in `qat.fold.fold_batch_norms`. Nothing here edits
the graph.
"""
import dataclasses
from typing import List, Optional

import tensorflow as tf

from qat.engine import node_batch
from qat.fold import plan as fold_plan
from qat.matching import layer_patterns

# The registered gradient of select_fold (see fold_batch_norms).
SELECT_GRADIENT = "QatFoldSelect"
# Scope of the constants the folds share (epsilon, 1, reshape shapes).
_CONSTANTS_SCOPE = "fold_batch_norms/constants/"


@dataclasses.dataclass
class Emitted:
    """Names of one fold's new ops in the NodeBatch (see `_emit`)."""
    weights: str
    unscaled: str                    # unscale_fold (training) or div_fold (eval)
    bn_consumers: List[tf.Operation]
    b_fold: Optional[str] = None
    bias_add: Optional[str] = None
    folded: Optional[str] = None     # BiasAdd_Fold [-> Reshape_Fold]
    select: Optional[str] = None
    rescale: Optional[str] = None    # s in the layer output's layout


def emit(plan: fold_plan.FoldPlan, batch: node_batch.NodeBatch, frozen: Optional[str],
         use_cond: bool) -> Emitted:
    """Adds one fold's new ops to `batch` as NodeDefs (no graph edit yet).

    `frozen` is the batch's freeze condition node (training structure with a
    delay), else None. The names follow what the Python constructors would
    give.
    """
    bn, layer_op = plan.bn, plan.layer_op
    ctx = layer_op.name.rpartition("/")[0]
    prefix = (ctx + "/") if ctx else ""
    dtype = layer_op.outputs[0].dtype.base_dtype
    # The batch norm's statistics: float32 also for float16 / bfloat16 layers.
    stat_dtype = bn.mean.dtype.base_dtype
    device = layer_op.device
    ext = batch.external

    def node(name, op, inputs, **attrs):
        return batch.node(batch.unique_name(name), op, inputs, device=device, **attrs)

    def shared(name, value, value_dtype):
        return batch.shared_const(_CONSTANTS_SCOPE + name, value, value_dtype)

    def flat(ref, rank, scope):
        if rank == 1:
            return ref
        return node(scope + "/Reshape", "Reshape", [ref, shared("shape", [-1], tf.int32)],
                    T=stat_dtype, Tshape=tf.int32)

    to_layer_dtype, to_stat_dtype = _mixed_precision_casts(node, stat_dtype, dtype, prefix)

    def statistic(t, variable, scope):
        if t is not None:
            return flat(ext(t), t.shape.rank, scope)
        if variable.dtype == tf.resource:
            read = node(prefix + "ReadVariableOp", "ReadVariableOp", [ext(variable)],
                        dtype=stat_dtype)
        else:
            read = node(prefix + "Identity", "Identity", [ext(variable)], T=stat_dtype)
        return flat(read, variable.shape.rank, scope)

    scale = batch.unique_name(prefix + "scale_fold")
    variance = statistic(bn.moving_variance, bn.variance_variable, scale)
    if isinstance(bn.epsilon, tf.Tensor):
        epsilon = ext(bn.epsilon)
    else:
        epsilon = shared("epsilon", bn.epsilon, stat_dtype)
    s = node(scale + "/Rsqrt", "Rsqrt",
             [node(scale + "/add", "AddV2", [variance, epsilon], T=stat_dtype)], T=stat_dtype)
    if bn.gamma is not None:
        s = node(scale + "/mul", "Mul", [s, flat(ext(bn.gamma), bn.gamma.shape.rank, scale)],
                 T=stat_dtype)
    s_stopped = node(scale + "/StopGradient", "StopGradient", [s], T=stat_dtype)
    s_weights = s
    if plan.training:
        # Before the freeze the original batch norm gets gamma's gradient
        # directly; the scale's paths through w*s and 1/s cancel exactly, so
        # both are cut. After the freeze gamma and the moving variance act
        # through w*s.
        s_weights = s_stopped
        if frozen is not None:
            s_weights = node(scale + "/select", "SelectV2", [frozen, s, s_stopped],
                             T=stat_dtype)
    weights = layer_patterns.weight_input(layer_op)

    def weight_layout(vector):
        """`vector` (per output channel) reshaped to multiply the weights."""
        if layer_op.type == "DepthwiseConv2dNative":
            if weights.shape[2:].is_fully_defined():
                shape = shared("shape", weights.shape[2:].as_list(), tf.int32)
            else:
                begin, end, stride = [shared("shape", [v], tf.int32) for v in (2, 0, 1)]
                shape = node(prefix + "strided_slice", "StridedSlice",
                             [node(prefix + "Shape", "Shape", [ext(weights)], T=dtype,
                                   out_type=tf.int32), begin, end, stride],
                             T=tf.int32, Index=tf.int32, end_mask=1)
            return node(prefix + "Reshape", "Reshape", [vector, shape], T=dtype,
                        Tshape=tf.int32)
        if ((layer_op.type == "MatMul" and layer_op.get_attr("transpose_b"))
                or layer_op.type in layer_patterns.TRANSPOSED_CONV_TYPES):
            # Output channels on axis 0 of [out, in], axis 2 of [h, w, out, in].
            return node(prefix + "Reshape", "Reshape",
                        [vector, shared("shape", [-1, 1], tf.int32)], T=dtype,
                        Tshape=tf.int32)
        return vector

    def activation_layout(vector):
        """`vector` (per output channel) reshaped to multiply the layer output."""
        if plan.channels_first:
            return node(prefix + "Reshape", "Reshape",
                        [vector, shared("shape", [-1, 1, 1], tf.int32)], T=dtype,
                        Tshape=tf.int32)
        return vector

    emitted = Emitted(weights=node(prefix + "mul_fold", "Mul",
                                   [ext(weights), weight_layout(to_layer_dtype(s_weights))],
                                   T=dtype),
                      unscaled="", bn_consumers=list(bn.output.consumers()))
    # 1 / stop_gradient(s), 0 where s == 0 (gamma == 0): no NaN, no gradient.
    inverse = to_layer_dtype(node(scale + "/inverse", "DivNoNan",
                                  [shared("one", 1.0, stat_dtype), s_stopped], T=stat_dtype))
    # What BiasAdd_Fold reads: y (eval) or y * s (training, after the freeze).
    folded_input = None if plan.training else ext(plan.layer_output)
    # Eval atrous conv: b_fold is added before the BatchToSpaceND (rebuilt
    # after it), so TFLite's CONV_2D adds it and its output carries the
    # layer's range; BatchToSpaceND keeps that scale.
    bts = plan.batch_to_space if not plan.training else None
    if bts is not None:
        folded_input = ext(bts.inputs[0])
    if plan.training:
        # The layer reads fq(w*s) / s (per output channel, weight-sized):
        # its output is the unfolded layer's, which feeds the ORIGINAL batch
        # norm unchanged (no activation-sized multiply).
        emitted.unscaled = node(prefix + "unscale_fold", "Mul",
                                [emitted.weights, weight_layout(inverse)], T=dtype)
        if frozen is not None:
            # After the freeze: y * s + b_fold = layer(x, fq(w*s)) + b_fold.
            emitted.rescale = activation_layout(to_layer_dtype(s_stopped))
            if not use_cond:
                folded_input = node(prefix + "rescale_fold", "Mul",
                                    [ext(plan.layer_output), emitted.rescale], T=dtype)
    if not plan.training or frozen is not None:
        bias_scope = batch.unique_name(prefix + "bias_fold")
        centred = statistic(bn.moving_mean, bn.mean_variable, bias_scope)
        if plan.bias is not None:
            centred = node(bias_scope + "/sub", "Sub",
                           [centred, to_stat_dtype(ext(plan.bias))], T=stat_dtype)
        centred = node(bias_scope + "/mul", "Mul", [centred, s], T=stat_dtype)
        if bn.beta is not None:
            beta = flat(ext(bn.beta), bn.beta.shape.rank, bias_scope)
            b_fold = node(bias_scope + "/sub_1", "Sub", [beta, centred], T=stat_dtype)
        else:
            b_fold = node(bias_scope + "/Neg", "Neg", [centred], T=stat_dtype)
        emitted.b_fold = to_layer_dtype(b_fold)
        if not (plan.training and use_cond):
            emitted.bias_add = node(prefix + "BiasAdd_Fold", "BiasAdd",
                                    [folded_input, emitted.b_fold], T=dtype,
                                    data_format="NCHW" if plan.channels_first else "NHWC")
            emitted.folded = emitted.bias_add
            if bts is not None:
                emitted.folded = node(
                    prefix + "BatchToSpaceND_Fold", "BatchToSpaceND",
                    [emitted.bias_add, ext(bts.inputs[1]), ext(bts.inputs[2])], T=dtype,
                    Tblock_shape=bts.get_attr("Tblock_shape"), Tcrops=bts.get_attr("Tcrops"))
            if plan.squeeze is not None:
                emitted.folded = node(prefix + "Squeeze_Fold", "Squeeze",
                                      [emitted.bias_add], T=dtype,
                                      squeeze_dims=plan.squeeze.get_attr("squeeze_dims"))
            if plan.reshape is not None:
                emitted.folded = node(prefix + "Reshape_Fold", "Reshape",
                                      [emitted.folded, ext(plan.reshape.inputs[1])],
                                      T=dtype, Tshape=plan.reshape.inputs[1].dtype)
    if not plan.training:
        # Keep the original batch norm (and its moving-average updates) fed
        # with the unscaled layer output: exact, and computed only when
        # something still reads it (a fetch of the old output).
        emitted.unscaled = node(prefix + "div_fold", "Mul",
                                [ext(plan.layer_output), activation_layout(inverse)], T=dtype)
    if plan.training and frozen is not None and not use_cond:
        emitted.select = batch.node(
            batch.unique_name(prefix + "select_fold"), "Select",
            [frozen, emitted.folded, ext(bn.output)], device=bn.op.device, T=dtype,
            _gradient_op_type=SELECT_GRADIENT)
    return emitted


def _mixed_precision_casts(node, stat_dtype: tf.DType, layer_dtype: tf.DType, prefix: str):
    """(to_layer_dtype, to_stat_dtype): NodeBatch refs cast between the two.

    A float16 / bfloat16 layer (mixed precision) feeds a batch norm that keeps
    its statistics in float32: the fold computes the scale and bias in
    float32 and casts them to the layer's dtype where they meet the weights
    or the layer output. With one dtype both are the identity (no op added).
    """
    def cast(src, dst):
        def apply(ref):
            if src == dst:
                return ref
            return node(prefix + "Cast_Fold", "Cast", [ref], SrcT=src, DstT=dst,
                        Truncate=False)
        return apply

    return cast(stat_dtype, layer_dtype), cast(layer_dtype, stat_dtype)
