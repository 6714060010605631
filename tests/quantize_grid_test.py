"""The quantize grid (2304 cases; graph structure only).

activation x residual x quant_delay x variables x scope x layer x batch norm x
training/eval. Each case builds a tiny graph, runs
experimental_create_training_graph (or the eval variant) and checks which
FakeQuant ops exist, what they read and feed, the delay wiring, and that a
second rewrite changes nothing (see quantize_grid_util.py). Bazel runs it in
shards (tests/BUILD); pytest runs every case.
"""
import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

import quantize_grid_util as grid_util

tf.compat.v1.disable_eager_execution()


class QuantizeGridTest(grid_util.GridChecks, parameterized.TestCase):

    @parameterized.named_parameters(grid_util.grid())
    def test_case(self, *case):
        self.check_case(*case)


if __name__ == "__main__":
    absltest.main()
