"""QAT for TensorFlow 2's own code: Keras 3 models, tf.Module, tf.function loops.

The frontend over `qat.api` for models written the TF 2 way: `quantize_model`
traces the model into a `tf.function` and rewrites that function's graph with
the graph path's passes (`qat.tf2.rewriter`). Importing it registers the
quantized Keras model class with each Keras (`qat.tf2.keras_registration`), so
`keras.models.load_model` reads quantized `.keras` files.
"""
from qat.tf2 import keras_registration
from qat.tf2.module import QuantizedModule
from qat.tf2.quantize_model import quantize_model

keras_registration.register()

__all__ = ["QuantizedModule", "quantize_model"]
