"""The public rewrite API, as in `tf.contrib.quantize`: the graph frontend.

Each function rewrites a `tf.compat.v1` graph in place (the default graph when
`input_graph` is None): it folds batch norms into the layers before them, then
inserts FakeQuant ops. Call the training variant after building the model and
loss and before `optimizer.minimize()`; build the eval graph separately (same
model code) and call the eval variant on it. Both return None.

This module wires the stages in the order the graph passes through them
(docs/architecture.md): `qat.prepare` normalises the graph, `qat.fold` folds
the batch norms, `qat.quantize.plan` decides the quantizers and
`qat.quantize.emit` builds them, with `qat.distribute` filling the planner's
and the emitter's replication hook.
"""
import dataclasses
from typing import Optional

import tensorflow as tf

from qat import prepare
from qat.distribute import DATA_PARALLEL
from qat.engine import config as config_lib
from qat.engine import preconditions
from qat.engine.recipes import RecipeLike
from qat.fold import fold_batch_norms as fold_lib
from qat.quantize import plan as plan_lib
from qat.quantize.plan.replication import Replication
from qat.quantize.emit import insert_quant_ops as emit_lib


@dataclasses.dataclass
class RewriteResult:
    """What one rewrite of a graph did: the fold's and the quantize pass's results."""
    fold: fold_lib.FoldResult
    quantize: emit_lib.QuantizeResult


# Not converted by autograph: a rewrite called inside a function autograph
# converts (a MirroredStrategy replica function) runs as plain Python.
@tf.autograph.experimental.do_not_convert
def rewrite_graph(graph: tf.Graph, config: config_lib.RewriteConfig,
                  replication: Replication = DATA_PARALLEL) -> RewriteResult:
    """Every stage, in order, on a resolved graph with a validated configuration.

    The frontends' common entry: `create_*_graph` on a tf.compat.v1 graph, and
    `qat.quantize_model` on the graph of a tf.function being traced.

    Args:
      graph: the graph to rewrite.
      config: the validated settings.
      replication: how replicas share ranges (`qat.distribute.DataParallel`:
        replicas in one graph, workers of a strategy).

    Raises:
      ValueError: optimizer ops in the graph, or an earlier rewrite with
        other settings; the graph is then unchanged. `qat.RecipeError` (a
        ValueError) for a recipe the graph's layers cannot take, raised
        after `qat.prepare`'s normalisation and before any other edit.
    """
    # Refuse before the fold pass edits anything.
    preconditions.check_no_optimizer_ops(graph)
    preconditions.check_previous_rewrite(graph, "fold", fold_lib.fold_record(config))
    preconditions.check_previous_rewrite(graph, "quantize", emit_lib.quantize_record(config))
    with graph.as_default():
        prepare.prepare_graph(graph)
        if config.recipe:  # A bad recipe is refused before the fold edits anything.
            plan_lib.check_recipe(graph, config)
        folded = fold_lib.fold_graph(graph, config)
        planned = plan_lib.plan_quantizers(graph, config, replication)
        return RewriteResult(folded, emit_lib.emit_quantizers(graph, config, planned,
                                                              replication))


@tf.autograph.experimental.do_not_convert
def _create_graph(input_graph: Optional[tf.Graph], caller: str,
                  **settings) -> None:
    graph = preconditions.resolve_graph(input_graph, caller)
    config = config_lib.RewriteConfig(**settings)
    preconditions.check_no_optimizer_ops(graph)
    if config.is_training:
        preconditions.warn_existing_gradients(graph)
    rewrite_graph(graph, config)


def create_training_graph(input_graph: Optional[tf.Graph] = None,
                          quant_delay: int = 0, recipe: RecipeLike = None) -> None:
    """Rewrites a training graph for quantization-aware training, in place.

    Folds batch norms (batch statistics throughout training) and inserts
    FakeQuant ops with 8-bit weights and activations.

    Args:
      input_graph: the graph to rewrite; the default graph when None.
      quant_delay: steps of float training before the FakeQuant outputs are
        used (the ranges learn meanwhile); 0: from the first step.
      recipe: what each layer gets (docs/choosing_what_to_quantize.md): a
        `qat.Recipe`, a list of rule dicts, JSON text or a JSON file's path;
        pass the same one to `create_eval_graph`.

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: if the graph already has optimizer ops (call this before
        `minimize()`), or for a bad `quant_delay`; `qat.RecipeError` for a
        recipe the graph's layers cannot take (the graph is unchanged).
    """
    _create_graph(input_graph, "create_training_graph", is_training=True,
                  quant_delay=quant_delay, recipe=recipe)


def create_eval_graph(input_graph: Optional[tf.Graph] = None, recipe: RecipeLike = None) -> None:
    """Rewrites an eval graph to match a `create_training_graph` one, in place.

    Batch norms are folded with their moving statistics and the FakeQuant ops
    read the range variables learnt in training (same variable names, so a
    training checkpoint restores into it).

    Args:
      input_graph: the graph to rewrite; the default graph when None.
      recipe: the training graph's recipe (the same ranges are made).

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: if the graph has optimizer ops; `qat.RecipeError` for a
        recipe the graph's layers cannot take.
    """
    _create_graph(input_graph, "create_eval_graph", is_training=False, recipe=recipe)


def experimental_create_training_graph(input_graph: Optional[tf.Graph] = None,
                                       weight_bits: int = 8,
                                       activation_bits: int = 8,
                                       symmetric: bool = False,
                                       quant_delay: int = 0,
                                       freeze_bn_delay: Optional[int] = None,
                                       scope: Optional[str] = None,
                                       symmetric_weights: bool = False,
                                       per_channel_weights: bool = False,
                                       recipe: RecipeLike = None) -> None:
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
      recipe: what each layer gets, overriding the options above per layer
        (docs/choosing_what_to_quantize.md): a `qat.Recipe`, a list of rule
        dicts, JSON text or a JSON file's path.

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: for bad bit widths or delays, optimizer ops in the graph,
        or a graph qat already rewrote with other settings; `qat.RecipeError`
        for a bad recipe (the graph is unchanged).
      TypeError: for a scope that is not a string, or a symmetric_weights or
        per_channel_weights that is not a bool.
    """
    _create_graph(input_graph, "experimental_create_training_graph",
                  is_training=True, weight_bits=weight_bits,
                  activation_bits=activation_bits, symmetric=symmetric,
                  quant_delay=quant_delay, freeze_bn_delay=freeze_bn_delay,
                  scope=scope, symmetric_weights=symmetric_weights,
                  per_channel_weights=per_channel_weights, recipe=recipe)


def experimental_create_eval_graph(input_graph: Optional[tf.Graph] = None,
                                   weight_bits: int = 8,
                                   activation_bits: int = 8,
                                   symmetric: bool = False,
                                   quant_delay: Optional[int] = None,
                                   scope: Optional[str] = None,
                                   symmetric_weights: bool = False,
                                   per_channel_weights: bool = False,
                                   recipe: RecipeLike = None) -> None:
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
      recipe: the training graph's recipe.

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: for bad bit widths, optimizer ops in the graph, or a graph
        qat already rewrote with other settings (e.g. its training rewrite);
        `qat.RecipeError` for a bad recipe (the graph is unchanged).
      TypeError: for a scope that is not a string, or a symmetric_weights or
        per_channel_weights that is not a bool.
    """
    _create_graph(input_graph, "experimental_create_eval_graph",
                  is_training=False, weight_bits=weight_bits,
                  activation_bits=activation_bits, symmetric=symmetric,
                  quant_delay=quant_delay, scope=scope,
                  symmetric_weights=symmetric_weights,
                  per_channel_weights=per_channel_weights, recipe=recipe)



def fold_batch_norms(graph: Optional[tf.Graph] = None,
                     is_training: bool = True,
                     freeze_batch_norm_delay: Optional[int] = None,
                     use_cond: bool = False) -> fold_lib.FoldResult:
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
        only one branch runs (faster steps before the freeze;
        `bench/bench_fold.py --step_time_steps=N` measures both tails).
        Without a delay there is nothing to choose and it changes nothing.

    Returns:
      A `FoldResult`: `folded` lists a `FoldedLayer` per folded batch norm,
      `skipped` the batch norms left alone with the reason (also logged).

    Raises:
      RuntimeError: in eager mode without a graph, or if the graph is
        finalized.
      ValueError: for the graph of a tf.function, a delay that is not an int
        >= 0, or a graph already folded with other settings. A refused call
        leaves the graph unchanged.
      TypeError: for flags that are not bools.
    """
    graph = preconditions.resolve_graph(graph, "fold_batch_norms")
    config_lib.check_delay(freeze_batch_norm_delay, "freeze_batch_norm_delay")
    config = config_lib.RewriteConfig(is_training=is_training,
                                      freeze_bn_delay=freeze_batch_norm_delay)
    if not isinstance(use_cond, bool):
        raise TypeError(f"use_cond must be a bool, got {type(use_cond).__name__}.")
    preconditions.check_no_optimizer_ops(graph)
    # Refuse a graph folded with other settings before anything is edited.
    preconditions.check_previous_rewrite(graph, "fold", fold_lib.fold_record(config, use_cond))
    prepare.layer_calls.inline_layer_calls(graph)  # tf_keras's grouped convs.
    return fold_lib.fold_graph(graph, config, use_cond)


def insert_quant_ops(graph: Optional[tf.Graph] = None,
                     is_training: bool = True,
                     weight_bits: int = 8,
                     activation_bits: int = 8,
                     symmetric: bool = False,
                     per_channel: bool = False,
                     ema_decay: float = 0.999,
                     quant_delay: Optional[int] = None,
                     scope: Optional[str] = None,
                     vars_collection: Optional[str] = (
                         tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES),
                     symmetric_weights: bool = False,
                     ) -> emit_lib.QuantizeResult:
    """Inserts FakeQuant ops into `graph` in place (see the module docstring).

    Run after `fold_batch_norms` and before the optimizer's `minimize()`.
    Running it again on a rewritten graph changes nothing.

    Args:
      graph: the graph to rewrite; the default graph when None.
      is_training: True for a training graph (range variables are updated),
        False for an eval graph (FakeQuant ops read the variables).
      weight_bits: bit width of weights, 2..8.
      activation_bits: bit width of activations, 2..8.
      symmetric: symmetric ranges for weights and activations.
      per_channel: one weight range per output channel.
      ema_decay: decay of the activation range moving averages.
      quant_delay: FakeQuant outputs are used once the quantization step
        reaches this many steps; None or 0: from the start.
      scope: only quantize layers (and other ops) whose name starts with it.
      vars_collection: extra collection for the range variables.
      symmetric_weights: symmetric (narrow-range) weight ranges even when
        `symmetric` is False: int8 weights get a zero point of 0, which the
        int8 TFLite kernels require; activation ranges stay as `symmetric`
        says (asymmetric by default, no bit wasted after a ReLU).

    Returns:
      A `QuantizeResult`: the quantizers built and what was left float.

    Raises:
      ValueError: on bad arguments, if the graph already has optimizer
        update ops, or was quantized with other settings. The graph is left
        unchanged.
      TypeError: for flags of the wrong type.
      RuntimeError: in eager mode without a graph, or if the graph is
        finalized.
    """
    graph = preconditions.resolve_graph(graph, "insert_quant_ops")
    config = config_lib.RewriteConfig(
        is_training=is_training, weight_bits=weight_bits,
        activation_bits=activation_bits, symmetric=symmetric,
        per_channel=per_channel, ema_decay=ema_decay, quant_delay=quant_delay,
        scope=scope, vars_collection=vars_collection,
        symmetric_weights=symmetric_weights)
    preconditions.check_no_optimizer_ops(graph)
    # Refuse a graph quantized with other settings before anything is edited.
    preconditions.check_previous_rewrite(graph, "quantize", emit_lib.quantize_record(config))
    prepare.layer_calls.inline_layer_calls(graph)  # tf_keras's grouped convs.
    planned = plan_lib.plan_quantizers(graph, config, DATA_PARALLEL)
    return emit_lib.emit_quantizers(graph, config, planned, DATA_PARALLEL)
