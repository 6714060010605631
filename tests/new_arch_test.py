"""Issue #21's building blocks through the zoo's procedure (tests/zoo_test.py).

Each case of tests/arch_cases.py is trained two steps, restored strictly into
its eval graph, exported by qat.export and TF's converter in uint8 and int8
with zero float compute ops, and compared with the eval graph within the
zoo's bounds (every layer within a step given TFLite's inputs, outputs
within zoo_test._MAX_DIFF_STEPS). The figures are logged.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from absl import logging  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
import arch_cases  # pylint: disable=g-import-not-at-top
import zoo_test  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

# Every case of tests/arch_cases.py.
_PASSING = ["tcn", "transformer", "convnext", "keras_layer_norm", "deeplab",
            "slim_atrous", "gelu_mlp", "layer_norm_mlp", "nn_attention"]


class NewArchTest(zoo_test.ZooChecks, parameterized.TestCase):

    @parameterized.named_parameters(*[(name, name) for name in _PASSING])
    def test_train_restore_export(self, name):
        self.assertIn(name, arch_cases.CASES)
        figures = self.check_train_restore_export(name)
        for label, (output_steps, own_steps) in figures.items():
            logging.info("%s %s: max output steps %.3f, worst own steps %.3f",
                         name, label, output_steps, own_steps)
            print(f"{name} {label}: max output steps {output_steps:.3f}, "
                  f"worst own steps {own_steps:.3f}")


    @parameterized.named_parameters(*[(name, name) for name in arch_cases.CASES])
    def test_coverage_leaves_nothing_float(self, name):
        """qat.report reads every tensor of the eval graph as integer."""
        graph, _, y = zoo_util.build_graph(name, training=False)
        with graph.as_default():
            qat.experimental_create_eval_graph(graph, symmetric_weights=True)
            coverage = report.coverage_report(graph, [y.op.name])
        self.assertEqual(coverage.float_tensors, [], name)


if __name__ == "__main__":
    absltest.main()
