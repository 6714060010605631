"""Issue #37: the property suites' training families, bounded.

Networks trained as users train them (tools/property/training_runs.py,
converter_training_runs.py): RMSProp with slim's defaults or SGD at learning
rate 1, a NaN or infinite batch fed mid-training (through the loss alone,
through a step that skips non-finite gradients, or through a step),
training-only auxiliary heads and drop paths, and observers (summaries,
prints, asserts, metrics). Every range is finite and holds 0 after every
step; a non-finite batch leaves the ranges as they were and is counted;
training-only branches leave the eval and export graphs' ranges as they are;
observers add no range and no `left_float` entry; and the converter family's
eval graph, restored strictly from the training checkpoint, is the integer
model. Each fixed run is a regression seed; a few random runs of each family
follow. `tools/property/check.py --families=training` runs any number.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import hypothesis  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

from tools.property import converter_training_runs  # pylint: disable=g-import-not-at-top
from tools.property import training_runs  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

# Random runs per family: the fixed runs carry the regressions.
MAX_EXAMPLES = 3
_REWRITE = training_runs.example_runs()
_CONVERTER = converter_training_runs.example_runs()


def _settings():
    return hypothesis.settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None,
                               database=None, phases=[hypothesis.Phase.generate],
                               suppress_health_check=list(hypothesis.HealthCheck))


class TrainingPropertyTest(parameterized.TestCase):

    def _assert_holds(self, family, run):
        violated = family.violations(run)
        self.assertEqual(violated, {}, f"{run.describe()}\n{run!r}")

    @parameterized.named_parameters(*sorted(_REWRITE.items()))
    def test_rewrite_run_holds_every_invariant(self, run):
        self._assert_holds(training_runs, run)

    @parameterized.named_parameters(*sorted(_CONVERTER.items()))
    def test_converter_run_holds_every_invariant(self, run):
        self._assert_holds(converter_training_runs, run)

    @_settings()
    @hypothesis.given(run=training_runs.training_runs())
    def test_random_rewrite_runs(self, run):
        self._assert_holds(training_runs, run)

    @_settings()
    @hypothesis.given(run=converter_training_runs.training_runs())
    def test_random_converter_runs(self, run):
        self._assert_holds(converter_training_runs, run)


if __name__ == "__main__":
    absltest.main()
