"""A sensitivity report and a greedy mixed-precision search for a trained quantized model.

Neither retrains: every candidate is the trained model quantized again with
another recipe, its learnt ranges copied, exported and measured on the
user's labelled eval set (`qat.tf2.recipe_candidates`), the way AIMET's
mixed-precision search evaluates candidates.

  recipe_sensitivity -> per layer, the cost when that layer alone gets 4-bit
                        weights or stays float (16-bit activations per layer
                        are not a choice: qat's export refuses them today)
  search_recipe      -> greedy from all-int8: layers lowered to 4-bit weights,
                        least sensitive first, while top-1 accuracy stays
                        within `budget` points of all-int8; the smallest file
                        within budget is the proposal, with the Pareto front
"""
import dataclasses
import json
from typing import Callable, List, Optional

from absl import logging
import numpy as np

from qat.engine import recipes
from qat.tf2 import recipe_candidates as candidates_lib

Progress = Callable[[int, int, candidates_lib.Evaluation], None]
SKIPPED_CHOICES = ("a16: per-layer 16-bit activations are not exported today "
                   "(qat.export raises RecipeError for them); not evaluated.")


@dataclasses.dataclass(frozen=True)
class SensitivityRow:
    """One layer and choice: the candidate's figures and its cost against all-int8."""
    layer: str
    choice: str
    evaluation: candidates_lib.Evaluation
    accuracy_delta: Optional[float]  # In points (percent), candidate minus all-int8.


@dataclasses.dataclass(frozen=True)
class SensitivityReport:
    """`recipe_sensitivity`'s table, and the all-int8 model it is measured against."""
    reference: candidates_lib.Evaluation
    rows: List[SensitivityRow]
    skipped: str = SKIPPED_CHOICES

    def format(self) -> str:
        """The table as text, one row per layer and choice."""
        ref = self.reference
        lines = [f"all-int8: top-1 {100 * ref.accuracy:.2f}%, SQNR {ref.sqnr_db:.1f} dB, "
                 f"{ref.size_bytes} bytes",
                 f"{'layer':<24} {'choice':<6} {'d top-1':>8} {'SQNR dB':>8} {'bytes':>8}"]
        for row in self.rows:
            e = row.evaluation
            if e.ok:
                lines.append(f"{row.layer:<24} {row.choice:<6} {row.accuracy_delta:>+8.2f} "
                             f"{e.sqnr_db:>8.1f} {e.size_bytes:>8}")
            else:
                lines.append(f"{row.layer:<24} {row.choice:<6} not possible: {e.error}")
        lines.append(f"skipped: {self.skipped}")
        return "\n".join(lines)

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The table as JSON: the reference, every row, the skipped choice."""
        return json.dumps({"reference": self.reference.to_config(), "skipped": self.skipped,
                           "rows": [{"layer": r.layer, "choice": r.choice,
                                     "accuracy_delta": r.accuracy_delta,
                                     **r.evaluation.to_config()} for r in self.rows]},
                          indent=indent)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """`search_recipe`'s answer.

    `proposal` is the smallest file within budget; `pareto` the evaluated
    candidates no other beats on both size and accuracy (smallest first);
    `evaluations` every candidate the search measured, in order.
    """
    proposal: recipes.Recipe
    proposed: candidates_lib.Evaluation
    reference: candidates_lib.Evaluation
    budget: float
    pareto: List[candidates_lib.Evaluation]
    evaluations: List[candidates_lib.Evaluation]
    sensitivity: SensitivityReport

    def format(self) -> str:
        """The Pareto table as text, the proposal marked '*'."""
        lines = [f"budget: {self.budget:g} points of all-int8's top-1 "
                 f"{100 * self.reference.accuracy:.2f}%; {len(self.evaluations)} candidates",
                 f"  {'bytes':>8} {'top-1 %':>8} {'float ops':>9}  choices"]
        for e in self.pareto:
            mark = "*" if e is self.proposed else " "
            lines.append(f"{mark} {e.size_bytes:>8} {100 * e.accuracy:>8.2f} {e.float_ops:>9}  "
                         f"{e.describe_choices()}")
        return "\n".join(lines)

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps({"budget": self.budget, "proposal": self.proposal.to_config(),
                           "reference": self.reference.to_config(),
                           "pareto": [e.to_config() for e in self.pareto],
                           "evaluations": [e.to_config() for e in self.evaluations]},
                          indent=indent)


def recipe_sensitivity(qm, images: np.ndarray, labels: np.ndarray,
                       output_dir: Optional[str] = None,
                       progress: Optional[Progress] = None,
                       evaluator: Optional[candidates_lib.CandidateEvaluator] = None
                       ) -> SensitivityReport:
    """Per layer, what 4-bit weights or a float layer costs, that layer alone.

    Args:
      qm: the trained model from `qat.quantize_model` (after QAT).
      images, labels: a labelled eval set (inputs as the model takes them,
        integer labels).
      output_dir: where the candidates' .tflite files go (temporary if None).
      progress: called as progress(index, total, evaluation) after each
        candidate (index from 1); each is also logged (absl, INFO). In
        `search_recipe`, `total` is the most candidates it may measure
        (sensitivity, then one per layer).
      evaluator: a `CandidateEvaluator` to reuse (it holds the eval set).

    Returns:
      The `SensitivityReport`: all-int8 and one row per layer and choice (a
      choice the recipe or the export refuses is a row with its error).

    Raises:
      ValueError, TypeError: as `CandidateEvaluator`.
    """
    evaluator = evaluator or candidates_lib.CandidateEvaluator(qm, images, labels, output_dir)
    plan = [(layer, choice) for layer in evaluator.layers
            for choice in (candidates_lib.WEIGHTS_4BIT, candidates_lib.FLOAT)]
    total = len(plan) + 1
    reference = _measured(evaluator, {}, 1, total, progress)
    if not reference.ok:
        raise ValueError(f"the all-int8 model does not export: {reference.error}")
    rows = []
    for index, (layer, choice) in enumerate(plan, start=2):
        evaluation = _measured(evaluator, {layer: choice}, index, total, progress)
        delta = 100 * (evaluation.accuracy - reference.accuracy) if evaluation.ok else None
        rows.append(SensitivityRow(layer, choice, evaluation, delta))
    return SensitivityReport(reference, rows)


def search_recipe(qm, images: np.ndarray, labels: np.ndarray, budget: float = 1.0,
                  output_dir: Optional[str] = None, recipe_path: Optional[str] = None,
                  plot_path: Optional[str] = None, progress: Optional[Progress] = None
                  ) -> SearchResult:
    """Greedy search from all-int8 for the smallest file within an accuracy budget.

    The sensitivity report (`recipe_sensitivity`) orders the layers whose
    4-bit weights export, least accuracy lost first (then highest SQNR); each
    in turn is lowered to 4-bit weights and kept there while top-1 accuracy
    stays within `budget` points of all-int8's.

    Args:
      qm, images, labels, output_dir, progress: as in `recipe_sensitivity`.
      budget: accuracy the proposal may lose against all-int8, in percentage
        points (1.0: from 91.0% down to 90.0%).
      recipe_path: where to write the proposed recipe's JSON (`Recipe.save`).
      plot_path: where to draw the Pareto front (PNG; needs matplotlib).

    Returns:
      The `SearchResult`.

    Raises:
      ValueError: a negative budget; as `recipe_sensitivity`.
      ImportError: `plot_path` without matplotlib.
    """
    if budget < 0:
        raise ValueError(f"budget is the accuracy (points) the search may lose; got {budget}.")
    evaluator = candidates_lib.CandidateEvaluator(qm, images, labels, output_dir)
    lowerable = len(evaluator.layers)
    total = 2 * lowerable + 1 + lowerable

    def counted(index, _, evaluation):
        if progress:
            progress(index, total, evaluation)

    report = recipe_sensitivity(qm, images, labels, progress=counted, evaluator=evaluator)
    reference = report.reference
    floor = reference.accuracy - budget / 100.0
    order = sorted((r for r in report.rows if r.choice == candidates_lib.WEIGHTS_4BIT
                    and r.evaluation.ok),
                   key=lambda r: (-r.evaluation.accuracy, -r.evaluation.sqnr_db))
    evaluations = [reference] + [r.evaluation for r in report.rows]
    chosen = {}
    index = len(evaluations)
    for row in order:
        index += 1
        trial = dict(chosen, **{row.layer: candidates_lib.WEIGHTS_4BIT})
        evaluation = _measured(evaluator, trial, index, total, counted)
        evaluations.append(evaluation)
        if evaluation.ok and evaluation.accuracy >= floor:
            chosen = trial
    measured = [e for e in evaluations if e.ok]
    within = [e for e in measured if e.accuracy >= floor]
    proposed = min(within, key=lambda e: (e.size_bytes, -e.accuracy))
    result = SearchResult(proposed.recipe, proposed, reference, budget, pareto_front(measured),
                          evaluations, report)
    if recipe_path:
        proposed.recipe.save(recipe_path)
    if plot_path:
        plot_pareto(result, plot_path)
    return result


def pareto_front(evaluations: List[candidates_lib.Evaluation]) -> List[candidates_lib.Evaluation]:
    """The measured candidates no other is as small and as accurate as, and
    better in one (one of each size and accuracy), smallest file first."""
    front, seen = [], set()
    for e in sorted(evaluations, key=lambda e: (e.size_bytes, -e.accuracy)):
        key = (e.size_bytes, e.accuracy)
        if key in seen:
            continue
        if not any(o.size_bytes <= e.size_bytes and o.accuracy >= e.accuracy and
                   (o.size_bytes, o.accuracy) != key for o in evaluations):
            front.append(e)
            seen.add(key)
    return front


def plot_pareto(result: SearchResult, path: str) -> str:
    """Draws every candidate (size against top-1) and the Pareto front to a PNG.

    Raises:
      ImportError: matplotlib is not installed.
    """
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError("the Pareto plot draws with matplotlib: pip install matplotlib "
                          "(or leave plot_path unset).") from e
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    figure, axes = pyplot.subplots(figsize=(6, 4))
    points = [e for e in result.evaluations if e.ok]
    axes.scatter([e.size_bytes for e in points], [100 * e.accuracy for e in points],
                 s=12, color="0.6", label="candidates")
    axes.plot([e.size_bytes for e in result.pareto], [100 * e.accuracy for e in result.pareto],
              "o-", label="Pareto front")
    axes.scatter([result.proposed.size_bytes], [100 * result.proposed.accuracy], s=80,
                 marker="*", color="red", zorder=3, label="proposal")
    axes.axhline(100 * result.reference.accuracy - result.budget, ls="--", color="0.4",
                 label=f"budget ({result.budget:g} points)")
    axes.set_xlabel("TFLite file size (bytes)")
    axes.set_ylabel("top-1 accuracy (%)")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    pyplot.close(figure)
    return path


def _measured(evaluator, choices, index, total, progress) -> candidates_lib.Evaluation:
    evaluation = evaluator.evaluate(choices)
    if evaluation.ok:
        logging.info("recipe search: candidate %d/%d (%s): top-1 %.2f%%, SQNR %.1f dB, "
                     "%d bytes, %d float ops", index, total, evaluation.describe_choices(),
                     100 * evaluation.accuracy, evaluation.sqnr_db, evaluation.size_bytes,
                     evaluation.float_ops)
    else:
        logging.info("recipe search: candidate %d/%d (%s): not possible: %s", index, total,
                     evaluation.describe_choices(), evaluation.error)
    if progress:
        progress(index, total, evaluation)
    return evaluation

