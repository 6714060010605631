"""Folds batch norms into the layer before them (conv, depthwise, dense, transposed conv).

`fold_batch_norms(graph, is_training, freeze_batch_norm_delay=None)` finds each
batch norm by structure (`qat.matching.batch_norm`, `qat.matching.layer_patterns.LAYER_CHAIN`),
whatever its op names or scopes, and rewrites it in place. With

    s      = gamma * rsqrt(moving_variance + epsilon)     per output channel
    b_fold = beta - (moving_mean - layer_bias) * s

the layer op itself is kept (its name too) and reads the folded weights
`w * s` (`<ctx>/mul_fold`, the tensor the quantize pass quantizes as
`weights_quant`; depthwise weights are scaled in their [1, 1, in, mult]
layout, MatMul weights per column, or per row with transpose_b, transposed
conv weights [h, w, out, in] along axis 2; a Conv1D's Conv2D reads its
expanded weights and its Squeeze is rebuilt after BiasAdd_Fold as
"<ctx>/Squeeze_Fold"). `<ctx>` is
the layer op's name scope. 1/s is `divide_no_nan(1, stop_gradient(s))`
("<ctx>/scale_fold/inverse"): 0 where s == 0 (gamma == 0), so no NaN.

Eval structure (is_training=False, or a batch norm that already normalises
with moving statistics):

    layer(x, w*s) [-> BatchToSpaceND] = y
      y -> BiasAdd(b_fold) "<ctx>/BiasAdd_Fold" [-> Reshape "<ctx>/Reshape_Fold"]
          -> the batch norm's former consumers
      y -> Mul(y, 1/s) "<ctx>/div_fold" -> [old bias ->] old batch norm
          (no consumers left: never run unless its output is fetched, which
          still gives the unfolded value; moving-average updates of a
          batch-statistics batch norm keep computing what they did)

Training structure (is_training=True, batch norm using batch statistics).
DESIGN DECISION: the convolution is computed ONCE (PyTorch ConvBn style), not
twice like contrib (a float layer for the batch statistics plus the folded
one), because the quantize issue targets a QAT/float training step time <=
1.25 on MobileNetV2, and a second convolution per layer alone would cost
about that much. The 1/s that takes the layer back to the unfolded one is
applied to the WEIGHTS (weight-sized), not to the layer output
(activation-sized): per output channel, layer(x, fq(w*s) / s) =
layer(x, fq(w*s)) / s, so the layer output feeds the ORIGINAL batch norm
unchanged. Without quantization this is the unfolded layer in value (up to
float rounding) and gradient, so before the freeze the layer trains exactly
like the unfolded one. The one weight structure (with or without a delay):

    w -> Mul(w, s_w) "<ctx>/mul_fold" [-> weights_quant FakeQuant]
      -> Mul(., 1/s) "<ctx>/unscale_fold" (1/s in the weight layout, like s)
      -> layer(x, .) [-> BatchToSpaceND] = y

`qat.matching.layer_patterns.weight_input` recognises the unscale multiply by
structure (`UNSCALED_WEIGHTS`) and returns mul_fold (or its quantized value),
so the quantize pass puts `weights_quant` between mul_fold and unscale_fold.

Without a freeze delay (freeze_batch_norm_delay=None, what
`create_training_graph` uses) the batch norm never switches to its moving
statistics, so nothing else is built and the layer's tail is the unfolded
one:

    y [-> Identity] [-> original bias op] [-> Reshape] -> ORIGINAL batch
      norm (batch statistics; its moving-average updates keep reading its
      batch statistics) -> its consumers, unchanged

  The quantize pass walks this tail to the activation or residual add as in
  an unfolded graph. `FoldedLayer.output` is the batch norm's output;
  `bias_add` and `frozen` are None. Nothing activation-sized is added.
  Measured side by side (tools/bench_train_step.py, MobileNetV2 96x96,
  batch 16, 2-core CPU, TensorFlow's FakeQuant gradient then): QAT/float
  1.25-1.30 with 1/s on the weights, 1.35-1.36 with it on the activations.

With a freeze delay the tail chooses between the batch norm and the folded
output y * s + b_fold = layer(x, fq(w*s)) + b_fold:

    y -> ... -> ORIGINAL batch norm = bn_out
    y -> Mul(y, s) "<ctx>/rescale_fold" -> BiasAdd(b_fold) "<ctx>/BiasAdd_Fold"
        [-> Reshape "<ctx>/Reshape_Fold"] = folded (moving statistics)
    Select(frozen, folded, bn_out) "<ctx>/select_fold"
        -> the batch norm's former consumers

  `frozen` is `fake_quantization_step > freeze_batch_norm_delay` (the shared
  counter of `qat.engine.step_counter`), so the first `freeze_batch_norm_delay`
  runs use batch statistics. From the freeze on the moving-average updates
  are switched off: the delta of each AssignSub / AssignSubVariableOp update
  is multiplied by `1 - frozen` (`<update scope>/freeze_fold`); an Assign /
  AssignVariableOp of a new value assigns the current value instead.

  Gradients. Before the freeze, the paths of s through w*s and through 1/s
  cancel exactly, and gamma gets its gradient from the original batch norm;
  so 1/s (and the s of rescale_fold) is under stop_gradient and mul_fold
  uses s_w = `where(frozen, s, stop_gradient(s))` ("<ctx>/scale_fold/select";
  just stop_gradient(s) without a delay): after the freeze gamma and beta
  learn through w*s and b_fold, as in contrib. select_fold is TF1's Select,
  whose kernel just forwards the chosen input for a scalar condition
  (SelectV2 broadcasts and copies, ~4x a multiply); it has a cheaper
  registered gradient ("QatFoldSelect": the incoming gradient times frozen /
  1 - frozen). A graph re-imported in a process that builds its gradients
  needs `qat.fold_batch_norms` imported (it registers that gradient).

  Step time: the rescale_fold / BiasAdd_Fold that the Select needs run on
  every activation even before the freeze. `use_cond=True` replaces the
  Select by a functional cond "<ctx>/select_fold" (a StatelessIf with
  inputs frozen, y, b_fold, s, bn_out; true branch rescale_fold ->
  BiasAdd_Fold [-> Reshape_Fold], false branch Identity), so only one branch
  runs; the tail is then layer [-> BatchToSpaceND] -> If -> Identity
  (tf.cond's output) -> consumers.

Speed of the rewrite: the new ops of every fold are written as NodeDefs and
added with one `import_graph_def` (`qat.engine.node_batch`), named as the Python
constructors would name them; only the functional cond (use_cond) and the
freeze of the moving-average updates use Python op constructors.

Batch norms that cannot be folded (no layer before them, a layer output with
other consumers, unusual sharing, functional or v1 control flow, no moving
averages for a training batch norm) are left alone, logged with a warning and
listed in `FoldResult.skipped`. Every batch norm is validated before the
first edit. Folded batch norms are remembered in a graph collection, so a
second call changes nothing.
"""
import dataclasses
from typing import List, Optional

from absl import logging
import tensorflow as tf

from qat.matching import batch_norm as bn_lib
from qat.fold import plan as fold_plan
from qat.matching import layer_patterns
from qat.engine import node_batch
from qat.engine import step_counter
from qat.graph_editor import util as ge_util

# Names of the batch-norm ops already folded (strings).
FOLDED_BATCH_NORMS_COLLECTION = "qat_folded_batch_norms"


@dataclasses.dataclass
class FoldedLayer:
    """One folded layer.

    Attributes:
      layer_op: the Conv2D / MatMul / DepthwiseConv2dNative op (kept, now
        reading the folded weights).
      batch_norm: the name of the folded batch-norm op.
      weights: the folded weights `w * s` (`layer_patterns.weight_input`:
        `layer_op.inputs[1]` in eval, unscale_fold's input 0 in training).
      bias_add: the BiasAdd adding `b_fold` to the layer output (None for
        the training structure without a freeze delay, where there is none,
        and with use_cond, where it is inside the If op's true branch).
      output: the tensor the batch norm's consumers now read (the batch
        norm's own output for the training structure without a delay).
      training: True for the training structure (batch statistics until the
        freeze), False for the eval structure.
      frozen: for the training structure with a freeze delay, the bool
        tensor that is True once the batch norm is frozen; None otherwise.
    """
    layer_op: tf.Operation
    batch_norm: str
    weights: tf.Tensor
    bias_add: Optional[tf.Operation]
    output: tf.Tensor
    training: bool
    frozen: Optional[tf.Tensor] = None


@dataclasses.dataclass
class SkippedBatchNorm:
    """A batch norm left alone, and why."""
    name: str
    reason: str


@dataclasses.dataclass
class FoldResult:
    """What `fold_batch_norms` did: folded layers and skipped batch norms."""
    folded: List[FoldedLayer]
    skipped: List[SkippedBatchNorm]


_SELECT_GRADIENT = "QatFoldSelect"
# Scope of the constants the folds share (epsilon, 1, reshape shapes).
_CONSTANTS_SCOPE = "fold_batch_norms/constants/"


def _fold_select_grad(op: tf.Operation, grad: tf.Tensor):
    """Gradient of select_fold: its branches have the output's shape.

    Scaling by the scalar condition is cheaper than Select's generic
    gradient (zeros_like and two selects).
    """
    chosen = tf.cast(op.inputs[0], grad.dtype)
    return None, grad * chosen, grad * (1.0 - chosen)


try:
    tf.RegisterGradient(_SELECT_GRADIENT)(_fold_select_grad)
except KeyError:  # Module re-imported (e.g. importlib.reload): already there.
    pass


def _read(variable: tf.Tensor, dtype) -> tf.Tensor:
    if variable.dtype == tf.resource:
        return tf.raw_ops.ReadVariableOp(resource=variable, dtype=dtype)
    return tf.identity(variable)


class _Freeze(object):
    """The shared `frozen` condition and the 1 - frozen factor per dtype."""

    def __init__(self, graph: tf.Graph, delay: int):
        with graph.name_scope("fold_batch_norms/"):
            step = step_counter.get_or_create_quantization_step(graph)
            self.frozen = tf.greater(step, tf.cast(delay, tf.int64), name="frozen")
        self._graph = graph
        self._keep = {}

    def keep(self, dtype) -> tf.Tensor:
        if dtype not in self._keep:
            with self._graph.name_scope("fold_batch_norms/"):
                self._keep[dtype] = tf.cast(tf.logical_not(self.frozen), dtype,
                                            name="keep_updates")
        return self._keep[dtype]


@dataclasses.dataclass
class _Emitted:
    """Names of one fold's new ops in the NodeBatch (see `_emit`)."""
    weights: str
    unscaled: str                    # unscale_fold (training) or div_fold (eval)
    bn_consumers: List[tf.Operation]
    b_fold: Optional[str] = None
    bias_add: Optional[str] = None
    folded: Optional[str] = None     # BiasAdd_Fold [-> Reshape_Fold]
    select: Optional[str] = None
    rescale: Optional[str] = None    # s in the layer output's layout


def _emit(plan: fold_plan.FoldPlan, batch: node_batch.NodeBatch, frozen: Optional[tf.Tensor],
          use_cond: bool) -> _Emitted:
    """Adds one fold's new ops to `batch` as NodeDefs (no graph edit yet).

    `frozen` is the freeze condition (training structure with a delay), else
    None. The names follow what the Python constructors would give.
    """
    bn, layer_op = plan.bn, plan.layer_op
    ctx = layer_op.name.rpartition("/")[0]
    prefix = (ctx + "/") if ctx else ""
    dtype = layer_op.outputs[0].dtype.base_dtype
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
                    T=dtype, Tshape=tf.int32)

    def statistic(t, variable, scope):
        if t is not None:
            return flat(ext(t), t.shape.rank, scope)
        if variable.dtype == tf.resource:
            read = node(prefix + "ReadVariableOp", "ReadVariableOp", [ext(variable)],
                        dtype=dtype)
        else:
            read = node(prefix + "Identity", "Identity", [ext(variable)], T=dtype)
        return flat(read, variable.shape.rank, scope)

    scale = batch.unique_name(prefix + "scale_fold")
    variance = statistic(bn.moving_variance, bn.variance_variable, scale)
    if isinstance(bn.epsilon, tf.Tensor):
        epsilon = ext(bn.epsilon)
    else:
        epsilon = shared("epsilon", bn.epsilon, dtype)
    s = node(scale + "/Rsqrt", "Rsqrt",
             [node(scale + "/add", "AddV2", [variance, epsilon], T=dtype)], T=dtype)
    if bn.gamma is not None:
        s = node(scale + "/mul", "Mul", [s, flat(ext(bn.gamma), bn.gamma.shape.rank, scale)],
                 T=dtype)
    s_stopped = node(scale + "/StopGradient", "StopGradient", [s], T=dtype)
    s_weights = s
    if plan.training:
        # Before the freeze the original batch norm gets gamma's gradient
        # directly; the scale's paths through w*s and 1/s cancel exactly, so
        # both are cut. After the freeze gamma and the moving variance act
        # through w*s.
        s_weights = s_stopped
        if frozen is not None:
            s_weights = node(scale + "/select", "SelectV2", [ext(frozen), s, s_stopped],
                             T=dtype)
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

    emitted = _Emitted(weights=node(prefix + "mul_fold", "Mul",
                                    [ext(weights), weight_layout(s_weights)], T=dtype),
                       unscaled="", bn_consumers=list(bn.output.consumers()))
    # 1 / stop_gradient(s), 0 where s == 0 (gamma == 0): no NaN, no gradient.
    inverse = node(scale + "/inverse", "DivNoNan", [shared("one", 1.0, dtype), s_stopped],
                   T=dtype)
    # What BiasAdd_Fold reads: y (eval) or y * s (training, after the freeze).
    folded_input = None if plan.training else ext(plan.layer_output)
    if plan.training:
        # The layer reads fq(w*s) / s (per output channel, weight-sized):
        # its output is the unfolded layer's, which feeds the ORIGINAL batch
        # norm unchanged (no activation-sized multiply).
        emitted.unscaled = node(prefix + "unscale_fold", "Mul",
                                [emitted.weights, weight_layout(inverse)], T=dtype)
        if frozen is not None:
            # After the freeze: y * s + b_fold = layer(x, fq(w*s)) + b_fold.
            emitted.rescale = activation_layout(s_stopped)
            if not use_cond:
                folded_input = node(prefix + "rescale_fold", "Mul",
                                    [ext(plan.layer_output), emitted.rescale], T=dtype)
    if not plan.training or frozen is not None:
        bias_scope = batch.unique_name(prefix + "bias_fold")
        centred = statistic(bn.moving_mean, bn.mean_variable, bias_scope)
        if plan.bias is not None:
            centred = node(bias_scope + "/sub", "Sub", [centred, ext(plan.bias)], T=dtype)
        centred = node(bias_scope + "/mul", "Mul", [centred, s], T=dtype)
        if bn.beta is not None:
            beta = flat(ext(bn.beta), bn.beta.shape.rank, bias_scope)
            emitted.b_fold = node(bias_scope + "/sub_1", "Sub", [beta, centred], T=dtype)
        else:
            emitted.b_fold = node(bias_scope + "/Neg", "Neg", [centred], T=dtype)
        if not (plan.training and use_cond):
            emitted.bias_add = node(prefix + "BiasAdd_Fold", "BiasAdd",
                                    [folded_input, emitted.b_fold], T=dtype,
                                    data_format="NCHW" if plan.channels_first else "NHWC")
            emitted.folded = emitted.bias_add
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
            [ext(frozen), emitted.folded, ext(bn.output)], device=bn.op.device, T=dtype,
            _gradient_op_type=_SELECT_GRADIENT)
    return emitted


def _reroute(new: tf.Tensor, old: tf.Tensor, consumers: List[tf.Operation]) -> None:
    """Makes `consumers` read `new` wherever they read `old`."""
    for op in consumers:
        for i, t in enumerate(op.inputs):
            if t is old:
                op._update_input(i, new)  # pylint: disable=protected-access


def _finish(plan: fold_plan.FoldPlan, emitted: _Emitted, batch: node_batch.NodeBatch, ops,
            graph: tf.Graph, freeze: Optional[_Freeze], use_cond: bool) -> FoldedLayer:
    """Wires one fold's imported ops into the graph."""
    bn, layer_op = plan.bn, plan.layer_op
    folded_w = batch.tensor(ops, emitted.weights)
    if plan.training:
        # The layer reads unscale_fold = w*s / s; its consumers are unchanged.
        layer_op._update_input(1, batch.tensor(ops, emitted.unscaled))  # pylint: disable=protected-access
    else:
        layer_op._update_input(1, folded_w)  # pylint: disable=protected-access
        _reroute(batch.tensor(ops, emitted.unscaled), plan.layer_output, plan.old_consumers)
    output = batch.tensor(ops, emitted.select or emitted.folded)
    if output is None:
        output = bn.output
    frozen = freeze.frozen if (plan.training and freeze is not None) else None
    if frozen is not None and use_cond:
        b_fold = batch.tensor(ops, emitted.b_fold)
        rescale = batch.tensor(ops, emitted.rescale)
        ctx = layer_op.name.rpartition("/")[0]
        layer_output = plan.layer_output

        def folded_branch():
            out = tf.multiply(layer_output, rescale, name="rescale_fold")
            out = tf.nn.bias_add(out, b_fold,
                                 data_format="NCHW" if plan.channels_first else None,
                                 name="BiasAdd_Fold")
            if plan.squeeze is not None:
                out = tf.squeeze(out, plan.squeeze.get_attr("squeeze_dims"),
                                 name="Squeeze_Fold")
            if plan.reshape is not None:
                out = tf.reshape(out, plan.reshape.inputs[1], name="Reshape_Fold")
            return out

        bn_out = bn.output
        with graph.name_scope((ctx + "/") if ctx else None), graph.device(bn.op.device):
            output = tf.cond(frozen, folded_branch, lambda: tf.identity(bn_out),
                             name="select_fold")
    if frozen is not None:
        for update in bn.updates:
            _freeze_update(update, bn, freeze, graph)
    if output is not bn.output:
        _reroute(output, bn.output, emitted.bn_consumers)
    graph.add_to_collection(FOLDED_BATCH_NORMS_COLLECTION, bn.op.name)
    bias_add = ops[emitted.bias_add] if emitted.bias_add else None
    return FoldedLayer(layer_op=layer_op, batch_norm=bn.op.name, weights=folded_w,
                       bias_add=bias_add, output=output, training=plan.training,
                       frozen=frozen)


def _freeze_update(update: bn_lib.MovingAverageUpdate, bn: bn_lib.BatchNorm,
                   freeze: _Freeze, graph: tf.Graph) -> None:
    op = update.op
    value = op.inputs[1]
    scope = op.name.rpartition("/")[0]
    with graph.name_scope((scope + "/") if scope else None), graph.device(op.device):
        if update.is_delta:
            new = tf.multiply(value, freeze.keep(value.dtype.base_dtype), name="freeze_fold")
        else:
            is_mean = (bn.mean_variable is not None
                       and bn_lib.same_tensor(update.variable, bn.mean_variable))
            current = bn.moving_mean if is_mean else bn.moving_variance
            if current is None:
                current = _read(update.variable, value.dtype.base_dtype)
            new = tf.where(freeze.frozen, current, value, name="freeze_fold")
    op._update_input(1, new)  # pylint: disable=protected-access


def fold_batch_norms(graph: Optional[tf.Graph] = None,
                     is_training: bool = True,
                     freeze_batch_norm_delay: Optional[int] = None,
                     use_cond: bool = False) -> FoldResult:
    """Folds every foldable batch norm of `graph` into the layer before it.

    Args:
      graph: the graph to rewrite in place; the default graph when None.
      is_training: build the training structure (batch statistics until the
        freeze) instead of the eval structure. See the module docstring.
      freeze_batch_norm_delay: number of steps (runs advancing the shared
        `fake_quantization_step`) after which training uses the moving
        statistics and stops updating them; None: never (the batch norms'
        consumers then keep reading them: no select is built).
      use_cond: training structure with a freeze delay only: choose between
        the batch-norm and the folded output with a functional `tf.cond` (an
        If op whose true branch holds BiasAdd_Fold) instead of a Select, so
        only one branch runs (float training step time x1.14 instead of
        x1.24 on MobileNetV2, CPU, tools/bench_fold.py --step_time_steps=15).
        Without a delay there is nothing to choose and it changes nothing.

    Returns:
      A `FoldResult`: `folded` lists a `FoldedLayer` per folded batch norm,
      `skipped` the batch norms left alone with the reason (also logged).

    Raises:
      RuntimeError: if the graph is finalized.
      ValueError: if `graph` is a FuncGraph or the delay is negative.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    ge_util.check_graph_modifiable(graph, "fold batch norms of")
    if freeze_batch_norm_delay is not None and freeze_batch_norm_delay < 0:
        raise ValueError("freeze_batch_norm_delay must be >= 0 or None, got %r"
                         % (freeze_batch_norm_delay,))
    done = set(graph.get_collection(FOLDED_BATCH_NORMS_COLLECTION))
    batch_norms, unreachable = bn_lib.find_batch_norms(graph)
    skipped = [SkippedBatchNorm(name, reason) for name, reason in unreachable]
    plans = []
    for bn in batch_norms:
        if bn.op.name in done:
            continue
        try:
            plans.append(fold_plan.plan_fold(bn, is_training))
        except fold_plan.CannotFold as e:
            skipped.append(SkippedBatchNorm(bn.op.name, str(e)))
    for s in skipped:
        logging.warning("fold_batch_norms: batch norm %s not folded: %s", s.name, s.reason)

    folded = []
    with graph.as_default(), graph.control_dependencies(None), graph.name_scope(None):
        freeze = None
        if freeze_batch_norm_delay is not None and any(p.training for p in plans):
            freeze = _Freeze(graph, freeze_batch_norm_delay)
        frozen = freeze.frozen if freeze is not None else None
        batch = node_batch.NodeBatch(graph)
        emitted = [_emit(plan, batch, frozen if plan.training else None, use_cond)
                   for plan in plans]
        ops = batch.build()
        for plan, e in zip(plans, emitted):
            folded.append(_finish(plan, e, batch, ops, graph, freeze, use_cond))
    logging.info("fold_batch_norms: folded %d batch norms (%s), skipped %d.",
                 len(folded), "training" if is_training else "eval", len(skipped))
    return FoldResult(folded=folded, skipped=skipped)
