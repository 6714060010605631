"""Folds batch norms into the layer before them (conv, depthwise, dense, transposed conv).

`fold_graph(graph, config)`, the pass of `qat.fold_batch_norms(graph,
is_training, freeze_batch_norm_delay=None)` (`qat.api` runs it after
`qat.prepare`'s layer calls), finds each batch norm by structure
(`qat.matching.batch_norm`, `qat.matching.layer_patterns.LAYER_CHAIN`),
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

  An atrous conv adds b_fold before its BatchToSpaceND instead (layer [->
  Squeeze] -> BiasAdd_Fold -> "<ctx>/BatchToSpaceND_Fold"): TFLite's CONV_2D
  then adds it and writes the tensor that carries the layer's range.

Training structure (is_training=True, batch norm using batch statistics).
DESIGN DECISION: the convolution is computed ONCE (PyTorch ConvBn style), not
twice like contrib (a float layer for the batch statistics plus the folded
one): a second convolution per layer would cost about as much as the whole
quantization overhead of a training step (docs/performance.md quotes the
figures). The 1/s that takes the layer back to the unfolded one is applied
to the WEIGHTS (weight-sized), not to the layer output
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
  `bias_add` and `frozen` are None. Nothing activation-sized is added
  (putting 1/s on the activations instead was measurably slower).

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

The rewrite: the new ops of every fold (`qat.fold.emit`; the functional
cond of use_cond is built in a scratch graph), the moved inputs of the layers,
of the batch norms' consumers and of the frozen moving-average updates form
one `qat.engine.rewrite.Rewrite`, checked before anything is edited.

Batch norms that cannot be folded (no layer before them, a layer output with
other consumers, unusual sharing, functional or v1 control flow, no moving
averages for a training batch norm) are left alone, logged with a warning and
listed in `FoldResult.skipped`. A batch norm whose layer already reads qat's
folded weights (marked by `qat.engine.marks`) is folded already: a second
call changes nothing.
"""
import dataclasses
from typing import List, Optional

from absl import logging
import tensorflow as tf

from qat.engine import config as config_lib
from qat.engine import marks
from qat.engine import preconditions
from qat.engine import rewrite as rewrite_lib
from qat.fold import emit as emit_lib
from qat.fold import plan as fold_plan
from qat.fold import wire
from qat.matching import batch_norm as bn_lib
from qat.matching import layer_patterns


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


def _already_folded(bn: bn_lib.BatchNorm) -> bool:
    """Whether qat already folded `bn`: its data comes through qat's fold ops.

    Eval folds feed the kept batch norm from div_fold; training folds make
    the layer before it read unscale_fold.
    """
    t = bn.input
    for _ in range(4):
        op = t.op
        if marks.made_by_qat(op, marks.FOLD):
            return True
        if op.type in layer_patterns.LAYER_TYPES:
            weights = op.inputs[1].op
            return marks.made_by_qat(weights, marks.FOLD)
        if not op.inputs:
            return False
        t = op.inputs[0]
    return False


def fold_record(config: config_lib.RewriteConfig, use_cond: bool = False) -> str:
    """The settings a fold records in the graph (see qat.engine.preconditions)."""
    return (f"is_training={config.is_training!r}, "
            f"freeze_bn_delay={config.freeze_bn_delay!r}, use_cond={use_cond!r}")


def fold_graph(graph: tf.Graph, config: config_lib.RewriteConfig,
               use_cond: bool = False) -> FoldResult:
    """The fold pass on a resolved graph with a validated configuration.

    Raises:
      ValueError: if the graph was folded with other settings;
        qat.engine.rewrite.RewriteError if the new ops fail their checks. The
        graph is then unchanged.
    """
    record = fold_record(config, use_cond)
    done = preconditions.check_previous_rewrite(graph, "fold", record)
    batch_norms, unreachable = bn_lib.find_batch_norms(graph)
    # Replaced by a rewrite (tf_keras's fused layer norm): nothing reads them.
    batch_norms = [bn for bn in batch_norms if not marks.is_replaced(bn.op)]
    skipped = [SkippedBatchNorm(name, reason) for name, reason in unreachable]
    plans = []
    after_no_layer = []
    for bn in batch_norms:
        if _already_folded(bn):
            continue
        try:
            plans.append(fold_plan.plan_fold(bn, config.is_training))
        except fold_plan.CannotFold as e:
            skipped.append(SkippedBatchNorm(bn.op.name, str(e)))
            if isinstance(e, fold_plan.NoLayerBefore):
                after_no_layer.append(bn)
    warned_together = {bn.op.name for bn in after_no_layer}
    for s in skipped:
        if s.name not in warned_together:
            logging.warning("fold_batch_norms: batch norm %s not folded: %s", s.name, s.reason)
    fold_plan.warn_after_no_layer(after_no_layer)

    rewrite = rewrite_lib.Rewrite(graph, marks.FOLD)
    freeze = None
    if config.freeze_bn_delay is not None and any(p.training for p in plans):
        freeze = wire.Freeze(rewrite, config.freeze_bn_delay)
    frozen = freeze.frozen if freeze is not None else None
    emitted = [emit_lib.emit(plan, rewrite.nodes, frozen if plan.training else None, use_cond)
               for plan in plans]
    outputs = [wire.wire(plan, e, rewrite, freeze, use_cond) for plan, e in zip(plans, emitted)]
    if not done:
        rewrite.add_to_collection(preconditions.REWRITES_COLLECTION,
                                  preconditions.record_rewrite("fold", record))
    ops = rewrite_lib.apply(rewrite)
    nodes = rewrite.nodes
    folded = []
    for plan, e, output in zip(plans, emitted, outputs):
        training_freeze = plan.training and freeze is not None
        folded.append(FoldedLayer(
            layer_op=plan.layer_op, batch_norm=plan.bn.op.name,
            weights=nodes.tensor(ops, e.weights),
            bias_add=ops[e.bias_add] if e.bias_add else None,
            output=nodes.tensor(ops, output) if output else plan.bn.output,
            training=plan.training,
            frozen=nodes.tensor(ops, frozen) if training_freeze else None))
    logging.info("fold_batch_norms: folded %d batch norms (%s), skipped %d.",
                 len(folded), "training" if config.is_training else "eval", len(skipped))
    return FoldResult(folded=folded, skipped=skipped)
