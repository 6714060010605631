"""Which batch norms the fold pass can fold, and how (validation only).

`plan_fold(bn, is_training)` checks one recognised batch norm (`qat.matching.batch_norm`)
against the layer before it (`qat.matching.layer_patterns.LAYER_CHAIN`) without
changing the graph, and returns a `FoldPlan` for `qat.fold_batch_norms`, or
raises `CannotFold` with the reason (`NoLayerBefore` when no layer precedes
it, reported in one warning for all by `warn_after_no_layer`).
"""
import dataclasses
from typing import List, Optional, Sequence

from absl import logging
import tensorflow as tf

from qat.matching import batch_norm as bn_lib
from qat.matching import layer_patterns
from qat.matching.matcher import GraphMatcher


# Built once: the layer patterns (partitioned and cast weights included) are
# large, and a matcher indexes its pattern's names when it is made.
_LAYER_CHAIN_MATCHER = GraphMatcher(layer_patterns.LAYER_CHAIN)


class CannotFold(Exception):
    """A batch norm the fold pass leaves alone; the message says why."""


class NoLayerBefore(CannotFold):
    """A batch norm after no foldable layer (after a pool, a concat, an add)."""


_NO_LAYER = ("no Conv2D / MatMul / DepthwiseConv2dNative / transposed conv layer "
             "with variable or constant weights before")


@dataclasses.dataclass
class FoldPlan:
    """What the fold of one validated batch norm edits."""
    bn: bn_lib.BatchNorm
    layer_op: tf.Operation
    layer_output: tf.Tensor          # layer op or BatchToSpaceND output
    old_consumers: List[tf.Operation]  # consumers of layer_output (old path)
    bias: Optional[tf.Tensor]
    reshape: Optional[tf.Operation]
    squeeze: Optional[tf.Operation]  # Conv1D: Conv2D -> Squeeze
    channels_first: bool
    training: bool                   # training structure
    # Atrous conv: the BatchToSpaceND after the layer.
    batch_to_space: Optional[tf.Operation] = None


def data_format(op: tf.Operation) -> str:
    """The op's data_format attribute ("NHWC" when it has none)."""
    try:
        value = op.get_attr("data_format")
    except ValueError:
        return "NHWC"
    return value.decode() if isinstance(value, bytes) else value


def _names(ops) -> str:
    return ", ".join(sorted(op.name for op in ops))


def plan_fold(bn: bn_lib.BatchNorm, is_training: bool) -> FoldPlan:
    """Validates one batch norm.

    Args:
      bn: the batch norm.
      is_training: whether the training structure is wanted (used for batch
        norms normalising with batch statistics).

    Returns:
      The `FoldPlan`.

    Raises:
      CannotFold: with the reason, if it cannot be folded.
    """
    if bn.input.op.type in ("Switch", "RefSwitch"):
        raise CannotFold(
            "it reads its input through %s, a TF1 tf.cond on a tensor (a tf_keras learning phase "
            "that is not fixed, or is_training as a tensor), which hides the layer before it; build "
            "the model with a fixed learning phase: tf.compat.v1.keras.backend.set_learning_phase(1) "
            "(0 for the eval graph) before building it, or training=True or False as a Python "
            "bool" % bn.input.op.name)
    match = _LAYER_CHAIN_MATCHER.match_op(bn.input.op)
    if match is None or bn.input.value_index != 0:
        raise NoLayerBefore("%s it (input %s)" % (_NO_LAYER, bn.input.name))
    layer_op = match.get_op("layer")
    for op in (layer_op, bn.op):
        if op._control_flow_context is not None:  # pylint: disable=protected-access
            raise CannotFold("%s is inside a v1 tf.cond / tf.while_loop" % op.name)
    chain = [layer_op]
    for name in ("atrous_squeeze", "batch_to_space", "squeeze", "layer_identity", "bias_add",
                 "reshape"):
        op = match.get_op(name)
        if op is not None:
            chain.append(op)
    for op, nxt in zip(chain[:-1], chain[1:]):
        consumers = op.outputs[0].consumers()
        if consumers != [nxt]:
            raise CannotFold("the output of %s has other consumers (%s)"
                              % (op.name, _names(c for c in consumers if c is not nxt)))
    outside = [c for c in bn.input.consumers() if c not in bn.ops]
    if outside:
        raise CannotFold("its input %s also feeds %s" % (bn.input.name, _names(outside)))
    layer_output = match.get_tensor("layer_output")
    # Validated above: every consumer of layer_output is on the old path.
    old_consumers = list(layer_output.consumers())

    channels_first = (layer_op.type != "MatMul"
                      and data_format(layer_op).startswith("NC"))
    channels = layer_patterns.output_channels(layer_op)
    reshape = match.get_op("reshape")
    squeeze = match.get_op("squeeze")
    if squeeze is not None and (channels_first or reshape is not None):
        raise CannotFold("a squeezed layer output needs an NHWC layer and no "
                         "reshape before the batch norm")
    if bn.fused and reshape is None and data_format(bn.op).startswith("NC") != channels_first:
        raise CannotFold("its data_format differs from the layer %s" % layer_op.name)
    if bn.fused and reshape is not None and data_format(bn.op) != "NHWC":
        raise CannotFold("a reshaped layer output needs an NHWC batch norm")
    if layer_op.type == "MatMul" and layer_op.outputs[0].shape.rank not in (None, 2):
        raise CannotFold("unexpected MatMul output rank")

    bias = match.get_tensor("bias")
    bias_add = match.get_op("bias_add")
    if bias is not None:
        if bias.shape.rank != 1 or (channels is not None and bias.shape[0] not in (None, channels)):
            raise CannotFold("%s does not add a per-channel vector" % bias_add.name)
        if bias_add.type == "BiasAdd":
            if data_format(bias_add).startswith("NC") != channels_first:
                raise CannotFold("%s has a different data_format than the layer"
                                  % bias_add.name)
        elif channels_first:
            raise CannotFold("%s adds a vector to a channels-first output" % bias_add.name)
    for what in ("gamma", "beta", "moving_mean", "moving_variance"):
        t = getattr(bn, what)
        if t is None or channels is None:
            continue
        n = t.shape.num_elements()
        if n not in (None, 0, channels):
            raise CannotFold("its %s has %d elements, the layer %s has %d output "
                              "channels" % (what, n, layer_op.name, channels))
    if not bn.has_moving_statistics():
        raise CannotFold(
            "it normalises with batch statistics but no moving-average update "
            "of a moving mean and variance was found (ambiguous or missing)")
    return FoldPlan(bn=bn, layer_op=layer_op, layer_output=layer_output,
                 old_consumers=old_consumers, bias=bias, reshape=reshape,
                 squeeze=squeeze, batch_to_space=match.get_op("batch_to_space"),
                 channels_first=channels_first,
                 training=is_training and bn.uses_batch_statistics)


def warn_after_no_layer(batch_norms: Sequence[bn_lib.BatchNorm], shown: int = 3) -> None:
    """One warning for the batch norms that follow no layer (`NoLayerBefore`).

    Common by design (DenseNet and pre-activation ResNets put a batch norm
    after every concat or add): one line per batch norm would bury the
    warnings that matter.

    Args:
      batch_norms: those batch norms.
      shown: how many to name.
    """
    if not batch_norms:
        return
    examples = "; ".join("%s (input %s)" % (bn.op.name, bn.input.name)
                         for bn in batch_norms[:shown])
    more = " and %d more" % (len(batch_norms) - shown) if len(batch_norms) > shown else ""
    logging.warning(
        "fold_batch_norms: %d batch norm(s) not folded: %s them. insert_quant_ops still "
        "gives them ranges (in eval graphs as a 1x1 depthwise conv). %s%s. "
        "FoldResult.skipped lists them all.",
        len(batch_norms), _NO_LAYER, examples, more)
