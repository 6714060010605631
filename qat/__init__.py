"""qat: quantization-aware training for TensorFlow 2 graph-mode models.

`tf.contrib.quantize` and `tf.contrib.graph_editor` for `tf.compat.v1` graphs,
rebuilt on TensorFlow 2.21. The stages a graph passes through, one room each
(docs/architecture.md, "Layout"), over graph_editor, engine and matching:

  prepare -> fold -> quantize.plan -> quantize.emit (distribute: replicas)
  -> api (the functions below) -> tflite (reading models)
  -> export (`from qat import export`; needs the ai-edge-litert extra)
  -> report (`from qat import report`: coverage, per-layer numerics,
     TensorBoard range summaries, plots with the optional matplotlib)

The public rewrite API below keeps contrib's names and signatures.
"""

__version__ = "0.1.0"

from qat import graph_editor
from qat import report
from qat.clients import gradient_checkpointing
from qat.api import create_eval_graph
from qat.api import create_training_graph
from qat.api import experimental_create_eval_graph
from qat.api import experimental_create_training_graph
from qat.api import fold_batch_norms
from qat.api import insert_quant_ops
from qat.tf2 import quantize_model

__all__ = [
    "__version__",
    "graph_editor",
    "gradient_checkpointing",
    "report",
    "create_training_graph",
    "create_eval_graph",
    "experimental_create_training_graph",
    "experimental_create_eval_graph",
    "fold_batch_norms",
    "insert_quant_ops",
    "quantize_model",
]
