"""The public rewrite API, as in `tf.contrib.quantize`.

Each function rewrites a `tf.compat.v1` graph in place (the default graph when
`input_graph` is None): it folds batch norms into the layers before them, then
inserts FakeQuant ops. Call the training variant after building the model and
loss and before `optimizer.minimize()`; build the eval graph separately (same
model code) and call the eval variant on it. Both return None.
"""
import dataclasses
from typing import Optional

import tensorflow as tf

from qat.engine import config as config_lib
from qat.engine import preconditions
from qat.fold import fold_batch_norms as fold_lib
from qat.quantize import insert_quant_ops as quantize
from qat.quantize import embeddings
from qat.quantize import layer_norm


@dataclasses.dataclass
class RewriteResult:
    """What one rewrite of a graph did: the fold's and the quantize pass's results."""
    fold: fold_lib.FoldResult
    quantize: quantize.QuantizeResult


def rewrite_graph(graph: tf.Graph, config: config_lib.RewriteConfig) -> RewriteResult:
    """Every pass, in order, on a resolved graph with a validated configuration.

    The frontends' common entry: `create_*_graph` on a tf.compat.v1 graph, and
    `qat.quantize_model` on the graph of a tf.function being traced.

    Raises:
      ValueError: optimizer ops in the graph, or an earlier rewrite with
        other settings; the graph is then unchanged.
    """
    # Refuse before the fold pass edits anything.
    preconditions.check_no_optimizer_ops(graph)
    preconditions.check_previous_rewrite(graph, "fold", fold_lib.fold_record(config))
    preconditions.check_previous_rewrite(graph, "quantize", quantize.quantize_record(config))
    with graph.as_default():
        layer_norm.unfuse_layer_norms(graph)
        embeddings.split_resource_gathers(graph)
        folded = fold_lib.fold_graph(graph, config)
        return RewriteResult(folded, quantize.quantize_graph(graph, config))


def _create_graph(input_graph: Optional[tf.Graph], caller: str,
                  **settings) -> None:
    graph = preconditions.resolve_graph(input_graph, caller)
    config = config_lib.RewriteConfig(**settings)
    preconditions.check_no_optimizer_ops(graph)
    if config.is_training:
        preconditions.warn_existing_gradients(graph)
    rewrite_graph(graph, config)


def create_training_graph(input_graph: Optional[tf.Graph] = None,
                          quant_delay: int = 0) -> None:
    """Rewrites a training graph for quantization-aware training, in place.

    Folds batch norms (batch statistics throughout training) and inserts
    FakeQuant ops with 8-bit weights and activations.

    Args:
      input_graph: the graph to rewrite; the default graph when None.
      quant_delay: steps of float training before the FakeQuant outputs are
        used (the ranges learn meanwhile); 0: from the first step.

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: if the graph already has optimizer ops (call this before
        `minimize()`), or for a bad `quant_delay`.
    """
    _create_graph(input_graph, "create_training_graph", is_training=True,
                  quant_delay=quant_delay)


def create_eval_graph(input_graph: Optional[tf.Graph] = None) -> None:
    """Rewrites an eval graph to match a `create_training_graph` one, in place.

    Batch norms are folded with their moving statistics and the FakeQuant ops
    read the range variables learnt in training (same variable names, so a
    training checkpoint restores into it).

    Args:
      input_graph: the graph to rewrite; the default graph when None.

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: if the graph has optimizer ops.
    """
    _create_graph(input_graph, "create_eval_graph", is_training=False)


def experimental_create_training_graph(input_graph: Optional[tf.Graph] = None,
                                       weight_bits: int = 8,
                                       activation_bits: int = 8,
                                       symmetric: bool = False,
                                       quant_delay: int = 0,
                                       freeze_bn_delay: Optional[int] = None,
                                       scope: Optional[str] = None,
                                       symmetric_weights: bool = False,
                                       per_channel_weights: bool = False) -> None:
    """`create_training_graph` with bit widths, symmetry, delays and scope.

    For an int8 TFLite model (`optimizations=[tf.lite.Optimize.DEFAULT]`),
    pass `per_channel_weights=True` (TFLite int8's own scheme) or
    `symmetric_weights=True` (one range per weight tensor) here and to
    `experimental_create_eval_graph`: the int8 kernels refuse weights whose
    zero point is not 0, which asymmetric weight ranges give.

    Args:
      input_graph: the graph to rewrite; the default graph when None.
      weight_bits: weight bit width, 2..8.
      activation_bits: activation bit width, 2..8.
      symmetric: symmetric ranges for weights and activations.
      quant_delay: steps before the FakeQuant outputs are used.
      freeze_bn_delay: steps after which batch norms use their moving
        statistics and stop updating them; None: never.
      scope: only layers whose op names start with it are quantized.
      symmetric_weights: symmetric narrow-range weights (int8 zero point 0,
        what int8 TFLite needs) while activations follow `symmetric`.
      per_channel_weights: TFLite int8's own scheme: symmetric narrow-range
        weights (zero point 0) with one range per output channel for
        convolutions and depthwise convolutions (the range variables
        `<layer>/weights_quant/min|max` are vectors of the output
        channels), one range for matmuls (TFLite's FULLY_CONNECTED weights
        are per-tensor) and transposed convolutions; activations follow
        `symmetric`. Exports to int8 only (TFLite's uint8 kernels take no
        per-channel weights).

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: for bad bit widths or delays, optimizer ops in the graph,
        or a graph qat already rewrote with other settings.
      TypeError: for a scope that is not a string, or a symmetric_weights or
        per_channel_weights that is not a bool.
    """
    _create_graph(input_graph, "experimental_create_training_graph",
                  is_training=True, weight_bits=weight_bits,
                  activation_bits=activation_bits, symmetric=symmetric,
                  quant_delay=quant_delay, freeze_bn_delay=freeze_bn_delay,
                  scope=scope, symmetric_weights=symmetric_weights,
                  per_channel_weights=per_channel_weights)


def experimental_create_eval_graph(input_graph: Optional[tf.Graph] = None,
                                   weight_bits: int = 8,
                                   activation_bits: int = 8,
                                   symmetric: bool = False,
                                   quant_delay: Optional[int] = None,
                                   scope: Optional[str] = None,
                                   symmetric_weights: bool = False,
                                   per_channel_weights: bool = False) -> None:
    """`create_eval_graph` with bit widths, symmetry and scope.

    Use the same `weight_bits`, `activation_bits`, `symmetric`,
    `symmetric_weights`, `per_channel_weights` and `scope` as for the
    training graph: the eval FakeQuant ops read the ranges training learnt
    (a per-channel checkpoint restored into a per-tensor eval graph, or the
    reverse, makes the weight FakeQuant ops fail at the first run).

    Args:
      input_graph: the graph to rewrite; the default graph when None.
      weight_bits: weight bit width, 2..8.
      activation_bits: activation bit width, 2..8.
      symmetric: symmetric ranges.
      quant_delay: like training, for an eval graph that must stay float for
        the first steps (evaluating it advances the step counter); None: no
        delay.
      scope: only layers whose op names start with it are quantized.
      symmetric_weights: symmetric narrow-range weights (int8 zero point 0)
        while activations follow `symmetric`.
      per_channel_weights: TFLite int8's own scheme, as in
        `experimental_create_training_graph`.

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: for bad bit widths, optimizer ops in the graph, or a graph
        qat already rewrote with other settings (e.g. its training rewrite).
      TypeError: for a scope that is not a string, or a symmetric_weights or
        per_channel_weights that is not a bool.
    """
    _create_graph(input_graph, "experimental_create_eval_graph",
                  is_training=False, weight_bits=weight_bits,
                  activation_bits=activation_bits, symmetric=symmetric,
                  quant_delay=quant_delay, scope=scope,
                  symmetric_weights=symmetric_weights,
                  per_channel_weights=per_channel_weights)


fold_batch_norms = fold_lib.fold_batch_norms
insert_quant_ops = quantize.insert_quant_ops
