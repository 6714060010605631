"""qat: quantization-aware training for TF 2.21 graphs, Keras 3 and TF 2 code, to integer TFLite.

Two ways in, one engine: `tf.compat.v1` graphs (`create_training_graph` /
`create_eval_graph`, `tf.contrib.quantize`'s API, and `qat.graph_editor`,
`tf.contrib.graph_editor`'s), and TF 2 code (`quantize_model`): Keras 3 and
tf_keras models, `tf.GradientTape` loops in `tf.function`s, `tf.Module`s.
The stages a graph passes through, one room each
(docs/architecture.md, "Layout"), over graph_editor, engine and matching:

  prepare -> fold -> quantize.plan -> quantize.emit (distribute: replicas)
  -> api (the functions below) -> tflite (reading models)
  -> export (`from qat import export`; needs the ai-edge-litert extra)
  -> report (`from qat import report`: coverage, per-layer numerics,
     TensorBoard range summaries, plots with the optional matplotlib)

The public rewrite API below keeps contrib's names and signatures. The
errors a rewrite raises for a recurrent loop it cannot unroll
(`UnrollError`, `UnknownStepsError`) and for a TF 2 model whose later call
builds layers the first trace did not have (`UnplannedRangeError`) are
exported here to be caught. `Recipe` says what each layer gets (float,
8-bit, 4-bit weights, 16-bit activations; `recipe=` on the rewrites and
`quantize_model`); a recipe that cannot apply raises `RecipeError`.
`recipe_sensitivity` and `search_recipe` measure, on a labelled eval set,
what other recipes of a trained model would cost, exported without
retraining (docs/choosing_what_to_quantize.md).
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
from qat.engine.recipes import Recipe
from qat.engine.recipes import RecipeError
from qat.prepare.loops import UnknownStepsError
from qat.prepare.loops import UnrollError
from qat.tf2 import quantize_model
from qat.tf2.recipe_search import recipe_sensitivity
from qat.tf2.recipe_search import search_recipe
from qat.tf2.ranges import UnplannedRangeError

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
    "recipe_sensitivity",
    "search_recipe",
    "Recipe",
    "RecipeError",
    "UnknownStepsError",
    "UnplannedRangeError",
    "UnrollError",
]
