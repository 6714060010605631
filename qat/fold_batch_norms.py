"""Folds batch norms into the Conv2D / MatMul / DepthwiseConv2dNative before them.

`fold_batch_norms(graph, is_training, freeze_batch_norm_delay=None)` finds each
batch norm by structure (`qat.batch_norm`, `qat.layer_patterns.LAYER_CHAIN`),
whatever its op names or scopes, and rewrites it in place. With

    s      = gamma * rsqrt(moving_variance + epsilon)     per output channel
    b_fold = beta - (moving_mean - layer_bias) * s

the layer op itself is kept (its name too) and its weight input is replaced
by `w * s` (`<ctx>/mul_fold`, the tensor the quantize pass quantizes as
`weights_quant`; depthwise weights are scaled in their [1, 1, in, mult]
layout, MatMul weights per column, or per row with transpose_b). `<ctx>` is
the layer op's name scope.

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
about that much. y = layer(x, w*s) is scaled back by 1/s to feed the
ORIGINAL batch norm, which is exact in value and gradient, so before the
freeze the layer trains exactly like the unfolded one:

    layer(x, w*s) [-> BatchToSpaceND] = y
      y -> Mul(y, 1/s) "<ctx>/div_fold" [-> Identity] [-> original bias op]
          [-> Reshape] -> ORIGINAL batch norm (batch statistics; its moving
          average updates keep reading its batch statistics) = bn_out
      y -> BiasAdd(b_fold) "<ctx>/BiasAdd_Fold" [-> Reshape "<ctx>/Reshape_Fold"]
          = folded (moving statistics)
      SelectV2(frozen, folded, bn_out) "<ctx>/select_fold"
          -> the batch norm's former consumers

  1/s is `divide_no_nan(1, s)`: 0 where s == 0 (gamma == 0), so no NaN.
  `frozen` is `fake_quantization_step > freeze_batch_norm_delay` (the shared
  counter of `qat.step_counter`; a constant False when the delay is None), so
  the first `freeze_batch_norm_delay` runs use batch statistics. From the
  freeze on the moving-average updates are switched off: the delta of each
  AssignSub / AssignSubVariableOp update is multiplied by `1 - frozen`
  (`<update scope>/freeze_fold`); an Assign / AssignVariableOp of a new value
  assigns the current value instead.

  Gradients. Before the freeze, the paths of s through w*s and through 1/s
  cancel exactly, and gamma gets its gradient from the original batch norm;
  so 1/s is under stop_gradient and the weights use
  `where(frozen, s, stop_gradient(s))` ("<ctx>/scale_fold/select"): after the
  freeze gamma and beta learn through w*s and b_fold, as in contrib. The
  SelectV2 has a cheaper registered gradient ("QatFoldSelect": the incoming
  gradient times frozen / 1 - frozen). A graph re-imported in a process
  that builds its gradients needs `qat.fold_batch_norms` imported (it
  registers that gradient).

  Step time: the SelectV2 and the BiasAdd_Fold it needs run on every
  activation even before the freeze; that is most of the fold's cost
  (MobileNetV2 float training step, CPU: ~1.35-1.45x unfolded; without them
  ~1.01x). `use_cond=True` replaces the SelectV2 by a functional cond
  "<ctx>/select_fold" (a StatelessIf with inputs frozen, y, b_fold, bn_out;
  true branch BiasAdd_Fold [-> Reshape_Fold], false branch Identity), so only
  one branch runs (~1.1x); the tail is then layer [-> BatchToSpaceND] -> If
  -> Identity (tf.cond's output) -> consumers.

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

from qat import batch_norm as bn_lib
from qat import layer_patterns
from qat import step_counter
from qat.graph_editor import reroute
from qat.graph_editor import util as ge_util
from qat.matcher import GraphMatcher

# Names of the batch-norm ops already folded (strings).
FOLDED_BATCH_NORMS_COLLECTION = "qat_folded_batch_norms"


@dataclasses.dataclass
class FoldedLayer:
    """One folded layer.

    Attributes:
      layer_op: the Conv2D / MatMul / DepthwiseConv2dNative op (kept, now
        reading the folded weights).
      batch_norm: the name of the folded batch-norm op.
      weights: the folded weights `w * s` (`layer_op.inputs[1]`).
      bias_add: the BiasAdd adding `b_fold` to the layer output (None with
        use_cond in training: it is inside the If op's true branch).
      output: the tensor the batch norm's consumers now read.
      training: True for the training structure (batch statistics until the
        freeze), False for the eval structure.
      frozen: for the training structure, the bool tensor that is True once
        the batch norm is frozen; None otherwise.
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


class _CannotFold(Exception):
    pass


_SELECT_GRADIENT = "QatFoldSelect"


def _fold_select_grad(op: tf.Operation, grad: tf.Tensor):
    """Gradient of select_fold: its branches have the output's shape.

    Scaling by the scalar condition is cheaper than SelectV2's generic
    gradient (zeros_like, two selects and broadcast reductions).
    """
    chosen = tf.cast(op.inputs[0], grad.dtype)
    return None, grad * chosen, grad * (1.0 - chosen)


try:
    tf.RegisterGradient(_SELECT_GRADIENT)(_fold_select_grad)
except KeyError:  # Module re-imported (e.g. importlib.reload): already there.
    pass


@dataclasses.dataclass
class _Plan:
    bn: bn_lib.BatchNorm
    layer_op: tf.Operation
    layer_output: tf.Tensor          # layer op or BatchToSpaceND output
    old_consumers: List[tf.Operation]  # consumers of layer_output (old path)
    bias: Optional[tf.Tensor]
    reshape: Optional[tf.Operation]
    channels_first: bool
    training: bool                   # training structure


def _data_format(op: tf.Operation) -> str:
    try:
        value = op.get_attr("data_format")
    except ValueError:
        return "NHWC"
    return value.decode() if isinstance(value, bytes) else value


def _names(ops) -> str:
    return ", ".join(sorted(op.name for op in ops))


def _plan(bn: bn_lib.BatchNorm, is_training: bool) -> _Plan:
    """Validates one batch norm; raises _CannotFold with the reason."""
    match = GraphMatcher(layer_patterns.LAYER_CHAIN).match_op(bn.input.op)
    if match is None or bn.input.value_index != 0:
        raise _CannotFold(
            "no Conv2D / MatMul / DepthwiseConv2dNative layer with variable or "
            "constant weights before it (input %s)" % bn.input.name)
    layer_op = match.get_op("layer")
    for op in (layer_op, bn.op):
        if op._control_flow_context is not None:  # pylint: disable=protected-access
            raise _CannotFold("%s is inside a v1 tf.cond / tf.while_loop" % op.name)
    chain = [layer_op]
    for name in ("batch_to_space", "layer_identity", "bias_add", "reshape"):
        op = match.get_op(name)
        if op is not None:
            chain.append(op)
    for op, nxt in zip(chain[:-1], chain[1:]):
        consumers = op.outputs[0].consumers()
        if consumers != [nxt]:
            raise _CannotFold("the output of %s has other consumers (%s)"
                              % (op.name, _names(c for c in consumers if c is not nxt)))
    outside = [c for c in bn.input.consumers() if c not in bn.ops]
    if outside:
        raise _CannotFold("its input %s also feeds %s" % (bn.input.name, _names(outside)))
    layer_output = match.get_tensor("layer_output")
    # Validated above: every consumer of layer_output is on the old path.
    old_consumers = list(layer_output.consumers())

    channels_first = (layer_op.type != "MatMul"
                      and _data_format(layer_op).startswith("NC"))
    channels = layer_patterns.output_channels(layer_op)
    reshape = match.get_op("reshape")
    if bn.fused and reshape is None and _data_format(bn.op).startswith("NC") != channels_first:
        raise _CannotFold("its data_format differs from the layer %s" % layer_op.name)
    if bn.fused and reshape is not None and _data_format(bn.op) != "NHWC":
        raise _CannotFold("a reshaped layer output needs an NHWC batch norm")
    if layer_op.type == "MatMul" and layer_op.outputs[0].shape.rank not in (None, 2):
        raise _CannotFold("unexpected MatMul output rank")

    bias = match.get_tensor("bias")
    bias_add = match.get_op("bias_add")
    if bias is not None:
        if bias.shape.rank != 1 or (channels is not None and bias.shape[0] not in (None, channels)):
            raise _CannotFold("%s does not add a per-channel vector" % bias_add.name)
        if bias_add.type == "BiasAdd":
            if _data_format(bias_add).startswith("NC") != channels_first:
                raise _CannotFold("%s has a different data_format than the layer"
                                  % bias_add.name)
        elif channels_first:
            raise _CannotFold("%s adds a vector to a channels-first output" % bias_add.name)
    for what in ("gamma", "beta", "moving_mean", "moving_variance"):
        t = getattr(bn, what)
        if t is None or channels is None:
            continue
        n = t.shape.num_elements()
        if n not in (None, 0, channels):
            raise _CannotFold("its %s has %d elements, the layer %s has %d output "
                              "channels" % (what, n, layer_op.name, channels))
    if not bn.has_moving_statistics():
        raise _CannotFold(
            "it normalises with batch statistics but no moving-average update "
            "of a moving mean and variance was found (ambiguous or missing)")
    return _Plan(bn=bn, layer_op=layer_op, layer_output=layer_output,
                 old_consumers=old_consumers, bias=bias, reshape=reshape,
                 channels_first=channels_first,
                 training=is_training and bn.uses_batch_statistics)


def _read(variable: tf.Tensor, dtype) -> tf.Tensor:
    if variable.dtype == tf.resource:
        return tf.raw_ops.ReadVariableOp(resource=variable, dtype=dtype)
    return tf.identity(variable)


def _flat(t: tf.Tensor) -> tf.Tensor:
    return t if t.shape.rank == 1 else tf.reshape(t, [-1])


def _per_channel(v: tf.Tensor, channels_first: bool) -> tf.Tensor:
    """`v` [C] shaped to broadcast over a layer output."""
    return tf.reshape(v, [-1, 1, 1]) if channels_first else v


class _Freeze(object):
    """The shared `frozen` condition and the 1 - frozen factor per dtype."""

    def __init__(self, graph: tf.Graph, delay: Optional[int]):
        with graph.name_scope("fold_batch_norms/"):
            if delay is None:
                self.frozen = tf.constant(False, name="frozen")
            else:
                step = step_counter.get_or_create_quantization_step(graph)
                self.frozen = tf.greater(step, tf.cast(delay, tf.int64), name="frozen")
        self._graph = graph
        self._keep = {}
        self.delay = delay

    def keep(self, dtype) -> tf.Tensor:
        if dtype not in self._keep:
            with self._graph.name_scope("fold_batch_norms/"):
                self._keep[dtype] = tf.cast(tf.logical_not(self.frozen), dtype,
                                            name="keep_updates")
        return self._keep[dtype]


def _apply(plan: _Plan, graph: tf.Graph, freeze_factory, use_cond: bool) -> FoldedLayer:
    bn, layer_op = plan.bn, plan.layer_op
    ctx = layer_op.name.rpartition("/")[0]
    scope = (ctx + "/") if ctx else ""
    bn_consumers = list(bn.output.consumers())
    dtype = layer_op.outputs[0].dtype.base_dtype
    weights = layer_patterns.weight_input(layer_op)
    with graph.name_scope(scope or None), graph.device(layer_op.device):
        moving_mean = bn.moving_mean
        if moving_mean is None:
            moving_mean = _read(bn.mean_variable, dtype)
        moving_variance = bn.moving_variance
        if moving_variance is None:
            moving_variance = _read(bn.variance_variable, dtype)
        with graph.name_scope("scale_fold"):
            s = tf.math.rsqrt(_flat(moving_variance) + bn.epsilon)
            if bn.gamma is not None:
                s = s * _flat(bn.gamma)
        freeze = freeze_factory() if plan.training else None
        s_weights = s
        if freeze is not None:
            # Before the freeze the original batch norm gets gamma's gradient
            # directly; the scale's paths through w*s and y/s cancel exactly,
            # so both are cut (no gradient reduction over y/s). After the
            # freeze gamma and the moving variance act through w*s.
            s_weights = tf.where(freeze.frozen, s, tf.stop_gradient(s), name="scale_fold/select")
        if layer_op.type == "DepthwiseConv2dNative":
            w_scale = tf.reshape(s_weights, tf.shape(weights)[2:])
        elif layer_op.type == "MatMul" and layer_op.get_attr("transpose_b"):
            w_scale = tf.reshape(s_weights, [-1, 1])
        else:
            w_scale = s_weights
        folded_w = tf.multiply(weights, w_scale, name="mul_fold")
        with graph.name_scope("bias_fold"):
            centred = _flat(moving_mean)
            if plan.bias is not None:
                centred = centred - plan.bias
            b_fold = (_flat(bn.beta) - centred * s if bn.beta is not None
                      else tf.negative(centred * s))
        layer_op._update_input(1, folded_w)  # pylint: disable=protected-access
        layer_output = plan.layer_output

        def make_folded():
            out = tf.nn.bias_add(layer_output, b_fold,
                                 data_format="NCHW" if plan.channels_first else None,
                                 name="BiasAdd_Fold")
            if plan.reshape is not None:
                return out.op, tf.reshape(out, plan.reshape.inputs[1], name="Reshape_Fold")
            return out.op, out

        bias_add, folded = None, None
        if not (plan.training and use_cond):
            bias_add, folded = make_folded()
        frozen = None
        # Keep the original batch norm (and its moving-average updates) fed
        # with the unscaled layer output: exact, and computed only when
        # something still reads it (training, or a fetch of the old output).
        inv_s = tf.stop_gradient(tf.math.divide_no_nan(tf.ones_like(s), s),
                                 name="scale_fold/inverse")
        unscaled = tf.multiply(plan.layer_output, _per_channel(inv_s, plan.channels_first),
                               name="div_fold")
        reroute.reroute_ts(unscaled, plan.layer_output, can_modify=plan.old_consumers)
    output = folded
    if plan.training:
        frozen = freeze.frozen
        with graph.name_scope(scope or None), graph.device(bn.op.device):
            if use_cond:
                bn_out = bn.output
                output = tf.cond(frozen, lambda: make_folded()[1],
                                 lambda: tf.identity(bn_out), name="select_fold")
            else:
                with graph.gradient_override_map({"SelectV2": _SELECT_GRADIENT}):
                    output = tf.where(frozen, folded, bn.output, name="select_fold")
        if freeze.delay is not None:
            for update in bn.updates:
                _freeze_update(update, bn, freeze, graph)
    reroute.reroute_ts(output, bn.output, can_modify=bn_consumers)
    graph.add_to_collection(FOLDED_BATCH_NORMS_COLLECTION, bn.op.name)
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
        statistics and stops updating them; None: never.
      use_cond: training structure only: choose between the batch-norm and
        the folded output with a functional `tf.cond` (an If op whose true
        branch holds BiasAdd_Fold) instead of a SelectV2, so only one branch
        runs. Measured ~1.1x instead of ~1.35-1.45x float training step time
        on MobileNetV2 (CPU, tools/bench_fold.py --step_time_steps).

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
            plans.append(_plan(bn, is_training))
        except _CannotFold as e:
            skipped.append(SkippedBatchNorm(bn.op.name, str(e)))
    for s in skipped:
        logging.warning("fold_batch_norms: batch norm %s not folded: %s", s.name, s.reason)

    freeze = []

    def freeze_factory():
        if not freeze:
            freeze.append(_Freeze(graph, freeze_batch_norm_delay))
        return freeze[0]

    folded = []
    with graph.as_default(), graph.control_dependencies(None):
        for plan in plans:
            folded.append(_apply(plan, graph, freeze_factory, use_cond))
    logging.info("fold_batch_norms: folded %d batch norms (%s), skipped %d.",
                 len(folded), "training" if is_training else "eval", len(skipped))
    return FoldResult(folded=folded, skipped=skipped)
