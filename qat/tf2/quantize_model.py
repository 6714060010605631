"""`qat.quantize_model`: QAT for TF 2 code (Keras 3, tf.Module, tf.function)."""
from typing import Optional, Sequence

import tensorflow as tf

from qat.engine import recipes
from qat.tf2 import calls
from qat.tf2 import keras_models
from qat.tf2 import module as module_lib
from qat.tf2 import options as options_lib
from qat.tf2 import replicas


def quantize_model(model,
                   input_signature: Optional[Sequence[tf.TensorSpec]] = None,
                   *,
                   weight_bits: int = 8,
                   activation_bits: int = 8,
                   symmetric: bool = False,
                   quant_delay: int = 0,
                   freeze_bn_delay: Optional[int] = None,
                   scope: Optional[str] = None,
                   symmetric_weights: bool = True,
                   per_channel_weights: bool = False,
                   recipe: recipes.RecipeLike = None):
    """Returns `model` with quantization-aware training and eval rewrites.

    The model is traced into a `tf.function` and its graph rewritten by the
    passes `create_training_graph` / `create_eval_graph` run on tf.compat.v1
    graphs: batch norms folded into the layers before them, FakeQuant ops on
    weights and activations where TFLite's integer kernels read them. Layers
    are recognised by graph structure, so Keras 3, tf_keras, `tf.Module`s and
    plain functions of `tf.Variable`s all work.

    Example::

        qm = qat.quantize_model(model)           # after float training
        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, qm(x, training=True))
            grads = tape.gradient(loss, qm.trainable_variables)
            optimizer.apply_gradients(zip(grads, qm.trainable_variables))
        ...
        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [qm.inference_function()])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.inference_input_type = tf.int8
        int8_model = converter.convert()

    Args:
      model: a Keras 3 or tf_keras model (Sequential, functional or
        subclassed), a `tf.Module`, or a callable of tensors whose weights are
        `tf.Variable`s. A `tf.function` (a `tf.Module`'s decorated `__call__`
        included) is traced through its Python function.
      input_signature: one `tf.TensorSpec` per input (None for the batch
        dimension). Optional where the model states its inputs (a built
        functional or Sequential Keras model, a `tf.function` with an input
        signature).
      weight_bits: weight bit width, 2..8.
      activation_bits: activation bit width, 2..8.
      symmetric: symmetric ranges for weights and activations.
      quant_delay: the FakeQuant outputs are used from the training call
        (`training=True`, counted by qat's step counter from 1) whose count
        reaches it; 0: from the first.
      freeze_bn_delay: training steps after which batch norms use their
        moving statistics and stop updating them; None: never.
      scope: only layers whose op names start with it are quantized.
      symmetric_weights: symmetric narrow-range weights (int8 zero point 0),
        what int8 TFLite needs; the default here, as TF 2's converter makes
        int8 models.
      per_channel_weights: TFLite int8's own scheme: one symmetric range per
        output channel of convolutions.
      recipe: what each layer gets, overriding the options above per layer
        (docs/choosing_what_to_quantize.md): a `qat.Recipe`, a list of rule
        dicts, JSON text or a JSON file's path. Kept in `.keras` files.

    Returns:
      The quantized model `qm`: for a Keras model, a Keras model of the same
      Keras (`compile`, `fit`, `evaluate`, `save_weights` work, and
      `qm.save("x.keras")`: `keras.models.load_model` rebuilds the model from
      its config and quantizes it again with these options); otherwise a
      `tf.Module`. `qm(*inputs, training=True)` (Keras: `qm(x, training=True)`)
      runs the training rewrite, `training=False` the eval rewrite; both are
      differentiable and callable eagerly or inside a `tf.function`.
      `qm.trainable_variables` are the model's own variables (training `qm`
      trains `model`); the ranges are non-trainable variables of `qm`.
      `qm.inference_function()` is the eval rewrite as a concrete function
      for `tf.lite.TFLiteConverter.from_concrete_functions`. A training batch
      whose min or max is NaN or infinite at a range leaves the range as it
      was; `qm.skipped_batches()` counts such batches per range and warns once
      of each range that skipped any.

      A Keras model under a `mixed_float16` / `mixed_bfloat16` policy is
      traced computing in float32 (the eval function and the export are
      its float32 twin's), and in training its quantized layers compute in
      their layers' dtype (`qat.tf2.precision`); `qm` keeps the model's
      policy, so `compile` adds Keras's loss scaling.

      Under a `tf.distribute.MirroredStrategy` (call `quantize_model` inside
      `strategy.scope()`, or on a model built there), the ranges are
      mirrored and `qm(x, training=True)` in `strategy.run` keeps one range
      per tensor for all replicas: the min of the replicas' batch mins and
      the max of their batch maxes, then one moving-average step
      (`qat.tf2.replicas`).

    Raises:
      ValueError: no input signature where the model states none, a model
        that refuses its signature, reads no variable, or has nothing to
        quantize; bad bit widths or delays; `qat.RecipeError` (a
        ValueError) for a recipe the model's layers cannot take.
      TypeError: a model that is not callable, a signature entry that is not
        a `tf.TensorSpec`, flags of the wrong type.
    """
    options = options_lib.QuantizeOptions(
        weight_bits=weight_bits, activation_bits=activation_bits, symmetric=symmetric,
        quant_delay=quant_delay, freeze_bn_delay=freeze_bn_delay, scope=scope,
        symmetric_weights=symmetric_weights, per_channel_weights=per_channel_weights,
        recipe=recipe)
    configs = options.rewrite_configs()
    call = calls.model_call(model, input_signature)
    if calls.is_keras_model(model):
        return keras_models.quantize(model, call, options)
    # Under tf.distribute: qat's variables mirrored as the model's are.
    with replicas.creation_scope(model):
        return module_lib.QuantizedModule(model, call, configs)
