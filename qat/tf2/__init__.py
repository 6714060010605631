"""QAT for TensorFlow 2's own code: Keras 3 models, tf.Module, tf.function loops.

The frontend over `qat.api` for models written the TF 2 way: `quantize_model`
traces the model into a `tf.function` and rewrites that function's graph with
the graph path's passes (`qat.tf2.rewriter`). Importing it registers the
quantized Keras model class with each Keras (`qat.tf2.keras_registration`), so
`keras.models.load_model` reads quantized `.keras` files.

  quantize_model     -> `quantize_model`: what a model is, checked, wrapped
  calls              -> how a model is called, its signature
  rewriter           -> a training and an eval tf.function whose traces run
                        `api.rewrite_graph`
  xla_outputs        -> a nested call's outputs under XLA, and their gradient
  ranges             -> the variables, made once by the plan
  replicas           -> MirroredStrategy: per-replica traces, one all-reduce
  precision          -> mixed precision: traced in float32, quantized layers
                        trained in the policy's dtype (`lower_layers`)
  recurrent_kernels  -> Keras recurrent layers traced on their generic path
  module             -> `QuantizedModule`, the quantized model as a tf.Module
  keras_models       -> the quantized model as a Keras model of the same Keras
  options            -> quantize_model's options, kept with the model
  keras_files        -> its .keras config: model config, signature, options
  keras_registration -> its class registered with each Keras when imported
  recipe_candidates  -> a trained model quantized again with another recipe,
                        its ranges copied, exported and measured
  recipe_search      -> `recipe_sensitivity` and `search_recipe`: per-layer
                        costs, a greedy search within an accuracy budget
"""
from qat.tf2 import keras_registration
from qat.tf2.module import QuantizedModule
from qat.tf2.quantize_model import quantize_model

keras_registration.register()

__all__ = ["QuantizedModule", "quantize_model"]
