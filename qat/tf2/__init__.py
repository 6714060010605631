"""QAT for TensorFlow 2's own code: Keras 3 models, tf.Module, tf.function loops.

The frontend over `qat.api` for models written the TF 2 way: `quantize_model`
traces the model into a `tf.function` and rewrites that function's graph with
the graph path's passes (`qat.tf2.rewriter`).
"""
from qat.tf2.module import QuantizedModule
from qat.tf2.quantize_model import quantize_model

__all__ = ["QuantizedModule", "quantize_model"]
