"""qat: quantization-aware training for TensorFlow 2 graph-mode models.

`tf.contrib.quantize` and `tf.contrib.graph_editor` for `tf.compat.v1` graphs,
rebuilt on TensorFlow 2.21.
"""

__version__ = "0.1.0"

from qat import graph_editor

__all__ = [
    "__version__",
    "graph_editor",
]
