"""The sensitivity report and the recipe search on a trained Keras 3 digits CNN (issue #42).

A four-layer CNN (conv, 1x1 squeeze conv, flatten, dense, logits) after float
training and one epoch of QAT: every layer has a row for each choice, the
search's proposal is within its budget and no larger than all-int8, the
Pareto table is non-dominated, and the recipe's JSON, quantized again,
exports to the size the table reports.
"""
import json
import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

import digits_util
import qat
from qat.tf2 import recipe_candidates
import tf2_util

BUDGET = 2.0  # Points of top-1.


def _cnn():
    k = tf2_util.keras()
    k.utils.set_random_seed(0)
    inputs = k.Input((8, 8, 1))
    x = k.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1")(inputs)
    x = k.layers.Conv2D(16, 1, activation="relu", name="squeeze")(x)
    x = k.layers.Flatten(name="flat")(x)
    x = k.layers.Dense(32, activation="relu", name="fc")(x)
    return k.Model(inputs, k.layers.Dense(10, name="logits")(x))


def _fit(model, x, y, epochs):
    k = tf2_util.keras()
    model.compile(k.optimizers.Adam(1e-2),
                  k.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=epochs, batch_size=32, shuffle=False, verbose=0)


class RecipeSearchTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (x, y), (x_test, y_test) = digits_util.digits_split()
        cls.images, cls.labels = x_test[:200], y_test[:200]
        model = _cnn()
        _fit(model, x, y, epochs=8)
        cls.qm = qat.quantize_model(model, per_channel_weights=True)
        _fit(cls.qm, x, y, epochs=1)
        cls.out = tempfile.mkdtemp()
        cls.progress = []
        cls.result = qat.search_recipe(
            cls.qm, cls.images, cls.labels, budget=BUDGET, output_dir=cls.out,
            recipe_path=os.path.join(cls.out, "recipe.json"),
            plot_path=os.path.join(cls.out, "pareto.png"),
            progress=lambda index, total, e: cls.progress.append((index, total)))
        print(cls.result.sensitivity.format())
        print(cls.result.format())

    def test_sensitivity_rows_cover_every_layer(self):
        report = self.result.sensitivity
        self.assertGreater(report.reference.accuracy, 0.8, report.format())
        self.assertEqual({(r.layer, r.choice) for r in report.rows},
                         {(layer, choice) for layer in ("conv1", "squeeze", "fc", "logits")
                          for choice in ("w4", "float")})
        by_row = {(r.layer, r.choice): r.evaluation for r in report.rows}
        for layer in ("conv1", "squeeze", "fc", "logits"):  # 4-bit weights export everywhere.
            e = by_row[(layer, "w4")]
            self.assertTrue(e.ok, e.error)
            self.assertLess(e.size_bytes, report.reference.size_bytes, layer)
            self.assertEqual(e.float_ops, 0)
        # A float first or last layer exports (float ops at the model's edge); a
        # float layer between two integer ones is refused (TF's converter makes
        # it integer), and the row says so.
        for layer in ("conv1", "logits"):
            e = by_row[(layer, "float")]
            self.assertTrue(e.ok, e.error)
            self.assertGreater(e.float_ops, 0, layer)
        for layer in ("squeeze", "fc"):
            self.assertIn("FloatOpError", by_row[(layer, "float")].error)
        self.assertIn("16-bit", report.skipped)
        table = json.loads(report.to_json())
        self.assertLen(table["rows"], 8)
        self.assertIn("not possible", report.format())

    def test_search_proposal_within_budget_and_not_larger(self):
        result, reference = self.result, self.result.reference
        self.assertGreaterEqual(result.proposed.accuracy, reference.accuracy - BUDGET / 100)
        self.assertLessEqual(result.proposed.size_bytes, reference.size_bytes)
        self.assertNotEmpty(result.proposed.choices, result.format())  # Something lowered.
        self.assertIn(result.proposed, result.pareto)
        self.assertEqual(self.progress, [(i, self.progress[0][1])
                                         for i in range(1, len(result.evaluations) + 1)])

    def test_pareto_entries_are_non_dominated(self):
        measured = [e for e in self.result.evaluations if e.ok]
        for e in self.result.pareto:
            for other in measured:
                dominates = (other.size_bytes <= e.size_bytes and other.accuracy >= e.accuracy
                             and (other.size_bytes < e.size_bytes or other.accuracy > e.accuracy))
                self.assertFalse(dominates, f"{other.describe_choices()} dominates "
                                            f"{e.describe_choices()}")
        sizes = [e.size_bytes for e in self.result.pareto]
        self.assertEqual(sizes, sorted(sizes))

    def test_recipe_json_round_trips_to_the_reported_size(self):
        loaded = qat.Recipe.load(os.path.join(self.out, "recipe.json"))
        self.assertEqual(loaded, self.result.proposal)
        self.assertEqual(qat.Recipe.from_json(loaded.to_json()), loaded)
        size = recipe_candidates.exported_size(self.qm, loaded)
        self.assertEqual(size, self.result.proposed.size_bytes)
        with open(os.path.join(self.out, "pareto.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_bad_input_is_refused(self):
        with self.assertRaisesRegex(ValueError, "as many images as labels"):
            qat.recipe_sensitivity(self.qm, self.images, self.labels[:3])
        with self.assertRaisesRegex(TypeError, "not a Keras model from qat.quantize_model"):
            qat.recipe_sensitivity(self.qm.model, self.images, self.labels)
        with self.assertRaisesRegex(ValueError, "budget"):
            qat.search_recipe(self.qm, self.images, self.labels, budget=-1)

    def test_command_refuses_an_eval_file_without_labels(self):
        data = os.path.join(self.out, "no_labels.npz")
        np.savez(data, images=self.images)
        tool = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "tools", "qat_recipe_search.py")
        run = subprocess.run([sys.executable, tool, "--model=unused.keras", f"--eval_data={data}",
                              f"--output_dir={os.path.join(self.out, 'cli')}"],
                             capture_output=True, text=True, timeout=300, check=False)
        self.assertEqual(run.returncode, 1, run.stderr[-2000:])
        self.assertIn("has no ['labels']", run.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.out, "cli")))


if __name__ == "__main__":
    absltest.main()
