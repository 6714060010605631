"""One candidate recipe of a trained quantized model, built and measured without retraining.

A candidate is the all-int8 recipe with some layers changed (4-bit weights,
or float). It is quantized again from the trained model's float model
(`qat.quantize_model(qm.model, recipe=candidate)`: the float weights are the
trained ones, shared with `qm`), given `qm`'s learnt activation ranges where
a range of the same name exists, exported to TFLite by `qat.export` and run
on the user's labelled eval set: top-1 accuracy, output SQNR against the
float model, file size, float op count. `qat.tf2.recipe_search` drives it.
"""
import dataclasses
import os
import re
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from qat import export
from qat.engine import recipes
from qat.export import parity
from qat.tf2.quantize_model import quantize_model

INT8 = "int8"
WEIGHTS_4BIT = "w4"
FLOAT = "float"
CHOICES = (INT8, WEIGHTS_4BIT, FLOAT)
# The rule each choice adds for its layer (int8: no rule).
_CHOICE_RULES = {WEIGHTS_4BIT: {"weight_bits": 4}, FLOAT: {"float": True}}
# Every layer 8-bit weights and activations: where the candidates start.
ALL_INT8_RULES = ({"weight_bits": 8, "activation_bits": 8},)
_UNIQUE_SUFFIX = re.compile(r"_[0-9]+$")
_NOT_QUANTIZED = ("{} is not a Keras model from qat.quantize_model; pass the trained quantized "
                  "model (qm = qat.quantize_model(model, ...), after QAT).")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One candidate and what its TFLite model measured.

    `choices` holds the layers not at int8 ({layer: "w4" or "float"}); an
    `error` (a recipe or export refused) leaves the figures None.
    """
    choices: Dict[str, str]
    recipe: recipes.Recipe
    accuracy: Optional[float] = None
    sqnr_db: Optional[float] = None
    size_bytes: Optional[int] = None
    float_ops: Optional[int] = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe_choices(self) -> str:
        return ", ".join(f"{layer}={choice}" for layer, choice in sorted(self.choices.items())) \
            or "all int8"

    def to_config(self) -> Dict:
        return {"choices": dict(self.choices), "recipe": self.recipe.to_config(),
                "accuracy": self.accuracy, "sqnr_db": self.sqnr_db,
                "size_bytes": self.size_bytes, "float_ops": self.float_ops,
                "error": self.error}


def layer_name(scope: str) -> str:
    """The Keras layer name of a layer's traced scope (`functional_1/conv1_1` -> `conv1`)."""
    last = scope.rsplit("/", 1)[-1]
    return _UNIQUE_SUFFIX.sub("", last) or last


def quantized_like(qm, recipe: recipes.RecipeLike):
    """`qm`'s float model quantized again with `recipe` and `qm`'s other options,
    holding `qm`'s learnt activation ranges.

    Args:
      qm: a trained model from `qat.quantize_model` (a Keras model of it).
      recipe: the candidate's recipe.

    Returns:
      The new quantized model (its float weights are `qm.model`'s, shared).

    Raises:
      RecipeError: the recipe cannot apply to the model.
      TypeError: `qm` is not a model from `qat.quantize_model`.
    """
    if not hasattr(qm, "quantize_options") or not hasattr(qm, "qat_ranges"):
        raise TypeError(_NOT_QUANTIZED.format(type(qm).__name__))
    options = qm.quantize_options.to_config()
    options["recipe"] = recipes.as_recipe(recipe)
    candidate = quantize_model(
        qm.model, list(qm.rewriter.call.signature), **options)
    learnt = {v.name: v for v in qm.qat_ranges.ordered}
    for variable in candidate.qat_ranges.ordered:
        source = learnt.get(variable.name)
        if source is not None and source.shape == variable.shape:
            variable.assign(source)
    return candidate


class CandidateEvaluator:
    """Builds, exports and measures candidates of one trained quantized model.

    Args:
      qm: the trained model from `qat.quantize_model`.
      images: the eval set's inputs (examples first), as the model takes them.
      labels: their integer class labels.
      output_dir: where the candidates' .tflite files go (a temporary folder
        when None).

    Raises:
      ValueError: images and labels of different lengths, or an empty set.
      TypeError: as `quantized_like`.
    """

    def __init__(self, qm, images: np.ndarray, labels: np.ndarray,
                 output_dir: Optional[str] = None):
        if not hasattr(qm, "quantize_options") or not hasattr(qm, "qat_ranges"):
            raise TypeError(_NOT_QUANTIZED.format(type(qm).__name__))
        images, labels = np.asarray(images), np.asarray(labels).reshape(-1)
        if not len(labels) or len(images) != len(labels):
            raise ValueError(f"the eval set needs as many images as labels and at least one: "
                             f"got {len(images)} images, {len(labels)} labels.")
        self.qm, self.images, self.labels = qm, images, labels
        self.output_dir = output_dir or tempfile.mkdtemp(prefix="qat_recipe_search_")
        self.reference = np.asarray(qm.model(images, training=False), np.float32)
        self.count = 0
        probe = quantized_like(qm, list(ALL_INT8_RULES))
        self.layers: List[str] = []
        self.kinds: Dict[str, str] = {}
        for layer in probe.layer_precisions:
            name = layer_name(layer.info.name)
            if name not in self.kinds:
                self.layers.append(name)
                self.kinds[name] = layer.info.kind
        if not self.layers:
            raise ValueError("the quantized model has no layers a recipe selects.")

    def recipe_of(self, choices: Mapping[str, str]) -> recipes.Recipe:
        """The all-int8 recipe with `choices` ({layer: "w4" or "float"})."""
        rules = [dict(rule) for rule in ALL_INT8_RULES]
        for layer in self.layers:
            choice = choices.get(layer, INT8)
            if choice not in CHOICES:
                raise ValueError(f"layer {layer!r}: choice {choice!r} is not one of {CHOICES}.")
            if choice != INT8:
                rules.append({"layers": re.escape(layer), **_CHOICE_RULES[choice]})
        unknown = sorted(set(choices) - set(self.layers))
        if unknown:
            raise ValueError(f"no layer named {unknown} in the model; its layers: {self.layers}.")
        return recipes.Recipe(rules)

    def evaluate(self, choices: Mapping[str, str]) -> Evaluation:
        """Builds the candidate, exports it and measures its TFLite model.

        A recipe the model refuses (`RecipeError`) or an export that fails
        (`qat.export.ExportError`: a float layer TF's converter makes integer,
        say) is an Evaluation with `error` set.
        """
        choices = {k: v for k, v in choices.items() if v != INT8}
        recipe = self.recipe_of(choices)
        self.count += 1
        try:
            candidate = quantized_like(self.qm, recipe)
            exported = export.export_model(candidate, self.output_dir,
                                           name=f"candidate_{self.count}")
        except (recipes.RecipeError, export.ExportError) as e:
            return Evaluation(choices, recipe, error=f"{type(e).__name__}: {e}")
        outputs = parity.run_tflite(exported.model, self.images)
        flat_out = outputs.reshape(len(outputs), -1)
        flat_ref = self.reference.reshape(len(self.reference), -1)
        noise = float(np.sum((flat_ref - flat_out) ** 2))
        signal = float(np.sum(flat_ref ** 2))
        sqnr = float("inf") if noise == 0 else 10.0 * float(np.log10(max(signal, 1e-30) / noise))
        accuracy = float(np.mean(np.argmax(flat_out, 1) == self.labels))
        return Evaluation(choices, recipe, accuracy=accuracy, sqnr_db=sqnr,
                          size_bytes=exported.size_bytes,
                          float_ops=len(export.find_float_ops(exported.report)))

    def file_of(self, index: int) -> str:
        """The .tflite path of the `index`-th candidate evaluated (1-based)."""
        return os.path.join(self.output_dir, f"candidate_{index}_int8.tflite")


def exported_size(qm, recipe: recipes.RecipeLike, output_dir: Optional[str] = None) -> int:
    """The TFLite file size, in bytes, of `qm` quantized again with `recipe`
    (`quantized_like`) and exported by `qat.export.export_model`."""
    candidate = quantized_like(qm, recipe)
    exported = export.export_model(candidate, output_dir or tempfile.mkdtemp(), name="recipe")
    return exported.size_bytes


def layers_of(evaluations: Sequence[Evaluation]) -> List[str]:
    """Every layer named in the evaluations' choices, sorted."""
    return sorted({layer for e in evaluations for layer in e.choices})
