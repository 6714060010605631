"""The public rewrite API, as in `tf.contrib.quantize`.

Each function rewrites a `tf.compat.v1` graph in place (the default graph when
`input_graph` is None): it folds batch norms into the layers before them, then
inserts FakeQuant ops. Call the training variant after building the model and
loss and before `optimizer.minimize()`; build the eval graph separately (same
model code) and call the eval variant on it. Both return None.
"""
from typing import Optional

import tensorflow as tf

from qat.fold import fold_batch_norms as fold_lib
from qat.quantize import quantizer_batch
from qat.quantize import insert_quant_ops as quantize

# Bit widths the experimental API accepts (TFLite kernels go up to 8 bits).
_MIN_BITS = 2
_MAX_BITS = 8


def _resolve_graph(input_graph: Optional[tf.Graph], caller: str) -> tf.Graph:
    if input_graph is None:
        if tf.executing_eagerly():
            raise RuntimeError(
                f"qat.{caller}() was called in eager mode, outside any graph. It "
                "rewrites a tf.compat.v1 graph: build the model inside "
                "`with tf.Graph().as_default() as g:` and call "
                f"qat.{caller}(g) (or call "
                "tf.compat.v1.disable_eager_execution() at program start).")
        input_graph = tf.compat.v1.get_default_graph()
    if not isinstance(input_graph, tf.Graph):
        raise TypeError(
            f"qat.{caller}(): input_graph must be a tf.Graph or None, got "
            f"{type(input_graph).__name__}.")
    if isinstance(input_graph, tf.__internal__.FuncGraph):
        raise ValueError(
            f"qat.{caller}() got the graph of a tf.function ({input_graph.name}); "
            "it rewrites tf.compat.v1 graphs: build the model in a tf.Graph.")
    if input_graph.finalized:
        raise RuntimeError(
            f"qat.{caller}(): the graph is finalized (a Session, "
            "MonitoredSession or Supervisor finalized it), so it cannot be "
            "rewritten. Call it after building the model and before creating "
            "the session.")
    return input_graph


def _check_bits(weight_bits: int, activation_bits: int) -> None:
    quantizer_batch.validate_num_bits(weight_bits, "weight_bits", _MIN_BITS, _MAX_BITS)
    quantizer_batch.validate_num_bits(activation_bits, "activation_bits", _MIN_BITS,
                                _MAX_BITS)


def _check_delay(value, what: str) -> None:
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be None or an int >= 0, got {value!r}.")


def _create_graph(input_graph: Optional[tf.Graph], caller: str,
                  is_training: bool, weight_bits: int = 8,
                  activation_bits: int = 8, symmetric: bool = False,
                  quant_delay: Optional[int] = None,
                  freeze_bn_delay: Optional[int] = None,
                  scope: Optional[str] = None,
                  symmetric_weights: bool = False) -> None:
    graph = _resolve_graph(input_graph, caller)
    _check_bits(weight_bits, activation_bits)
    _check_delay(quant_delay, "quant_delay")
    _check_delay(freeze_bn_delay, "freeze_bn_delay")
    if scope is not None and not isinstance(scope, str):
        raise TypeError(f"qat.{caller}(): scope must be a string or None, got "
                        f"{type(scope).__name__}.")
    if not isinstance(symmetric_weights, bool):
        raise TypeError(f"qat.{caller}(): symmetric_weights must be a bool, got "
                        f"{type(symmetric_weights).__name__}.")
    # Refuse before the fold pass edits anything.
    quantize.check_no_optimizer_ops(graph)
    with graph.as_default():
        fold_lib.fold_batch_norms(graph, is_training=is_training,
                                  freeze_batch_norm_delay=freeze_bn_delay)
        quantize.insert_quant_ops(
            graph, is_training=is_training, weight_bits=weight_bits,
            activation_bits=activation_bits, symmetric=symmetric,
            quant_delay=quant_delay, scope=scope,
            symmetric_weights=symmetric_weights)


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
                                       symmetric_weights: bool = False) -> None:
    """`create_training_graph` with bit widths, symmetry, delays and scope.

    For an int8 TFLite model (`optimizations=[tf.lite.Optimize.DEFAULT]`),
    pass `symmetric_weights=True` here and to
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

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: for bad bit widths or delays, or optimizer ops in the graph.
      TypeError: for a scope that is not a string or a symmetric_weights
        that is not a bool.
    """
    _create_graph(input_graph, "experimental_create_training_graph",
                  is_training=True, weight_bits=weight_bits,
                  activation_bits=activation_bits, symmetric=symmetric,
                  quant_delay=quant_delay, freeze_bn_delay=freeze_bn_delay,
                  scope=scope, symmetric_weights=symmetric_weights)


def experimental_create_eval_graph(input_graph: Optional[tf.Graph] = None,
                                   weight_bits: int = 8,
                                   activation_bits: int = 8,
                                   symmetric: bool = False,
                                   quant_delay: Optional[int] = None,
                                   scope: Optional[str] = None,
                                   symmetric_weights: bool = False) -> None:
    """`create_eval_graph` with bit widths, symmetry and scope.

    Use the same `weight_bits`, `activation_bits`, `symmetric`,
    `symmetric_weights` and `scope` as for the training graph: the eval
    FakeQuant ops read the ranges training learnt.

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

    Raises:
      RuntimeError: in eager mode without a graph, or for a finalized graph.
      ValueError: for bad bit widths, or optimizer ops in the graph.
      TypeError: for a scope that is not a string or a symmetric_weights
        that is not a bool.
    """
    _create_graph(input_graph, "experimental_create_eval_graph",
                  is_training=False, weight_bits=weight_bits,
                  activation_bits=activation_bits, symmetric=symmetric,
                  quant_delay=quant_delay, scope=scope,
                  symmetric_weights=symmetric_weights)


fold_batch_norms = fold_lib.fold_batch_norms
insert_quant_ops = quantize.insert_quant_ops
