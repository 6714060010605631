"""Issue #21's fine-tune at test size: a 40+-layer network trained, not two steps.

tools/finetune_digits.py's network (DenseNet-style chained concatenations, an
Inception-style block with an average-pool branch, average-pool transitions,
tf_keras MultiHeadAttention, LayerNormalization and a GELU MLP) on the
upsampled digits, float then QAT fine-tune, eval graph restored with a strict
Saver, exported to int8 TFLite: its accuracy is within 1 point of float, it
is fully integer, and every layer is within one step of the eval graph given
TFLite's inputs to that layer. The tool's default run is longer (docs/performance.md);
this one uses fewer epochs.
"""
import math
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

from tools import finetune_digits  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

_CONFIG = finetune_digits.Config(float_epochs=10, fine_tune_epochs=2)


class FineTuneDigitsTest(absltest.TestCase):

    def test_int8_tflite_within_one_point_of_float(self):
        counts = finetune_digits.count_layers(_CONFIG)
        self.assertGreaterEqual(counts["total"], 40, counts)
        self.assertGreaterEqual(counts["layer_norms"], 1, counts)
        self.assertEqual(counts["attention_einsums"], 4, counts)
        self.assertGreaterEqual(counts["concats"], 2, counts)
        self.assertGreaterEqual(counts["average_pools"], 2, counts)
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        # The strict restore happens in finetune_digits.eval_session (a plain
        # Saver().restore, which raises on any missing variable).
        figures = finetune_digits.run(_CONFIG, workdir)
        print(finetune_digits.format_layers(figures.numerics))
        self.assertGreater(figures.float_acc, 90.0)
        self.assertGreaterEqual(figures.int8_acc, figures.float_acc - 1.0)
        self.assertTrue(figures.fully_integer)
        self.assertTrue(finetune_digits.has_shared_ranges())
        rows = figures.numerics.rows
        self.assertGreaterEqual(figures.checked_rows, zoo_util.MIN_MATCHED_ROWS * len(rows))
        self.assertIsNotNone(rows[-1].tflite_tensor, "the model output")
        for row in rows:
            if row.tflite_tensor is not None and not math.isnan(row.max_own_steps):
                self.assertLessEqual(row.max_own_steps, zoo_util.MAX_OWN_STEPS,
                                     f"{row.name}\n{figures.numerics.format()}")


if __name__ == "__main__":
    absltest.main()
