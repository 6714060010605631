"""qat.quantize.plan.ops.activation_patterns: the spellings of GELU and hard-swish it recognises."""
import math

import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

from qat.quantize.plan.ops import activation_patterns

tf1 = tf.compat.v1

_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _tanh_gelu(x, cube):
    return 0.5 * x * (1.0 + tf.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * cube(x))))


_GELUS = {
    "tf_nn_gelu": lambda x: tf.nn.gelu(x),
    "tf_nn_gelu_approximate": lambda x: tf.nn.gelu(x, approximate=True),
    "erf_half_x_first": lambda x: 0.5 * x * (1.0 + tf.math.erf(x / _SQRT_2)),
    "erf_x_half_times_gate": lambda x: x * (0.5 * (1.0 + tf.math.erf(x * (1.0 / _SQRT_2)))),
    "erf_product_halved": lambda x: (x * (1.0 + tf.math.erf(x / _SQRT_2))) * 0.5,
    "tanh_pow": lambda x: _tanh_gelu(x, lambda t: tf.pow(t, 3.0)),
    "tanh_cube_by_mul": lambda x: _tanh_gelu(x, lambda t: t * (t * t)),
}

_HARD_SWISHES = {
    "times_sixth": lambda x: x * tf.nn.relu6(x + 3.0) * (1.0 / 6.0),
    "divided": lambda x: x * tf.nn.relu6(x + 3.0) / 6.0,
    "hard_sigmoid": lambda x: x * (tf.nn.relu6(x + 3.0) / 6.0),
}


class ActivationPatternsTest(parameterized.TestCase):

    def _match(self, build):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 8], name="x")
            out = build(x)
        return x, out, activation_patterns.match_whole_activation(out.op)

    @parameterized.named_parameters(*_GELUS.items())
    def test_gelu(self, build):
        x, out, found = self._match(build)
        self.assertIsNotNone(found)
        activation, matched_x, interior = found
        self.assertEqual(activation.tflite_op, "GELU")
        self.assertIs(matched_x, x)
        self.assertNotIn(out.op, interior)
        self.assertNotIn(x.op, interior)

    @parameterized.named_parameters(*_HARD_SWISHES.items())
    def test_hard_swish(self, build):
        x, _, found = self._match(build)
        self.assertIsNotNone(found)
        self.assertEqual(found[0].tflite_op, "HARD_SWISH")
        self.assertIs(found[1], x)

    @parameterized.named_parameters(
        ("swish", lambda x: x * tf.sigmoid(x)),
        ("gelu_of_another_tensor", lambda x: 0.5 * x * (1.0 + tf.math.erf(tf.nn.relu(x) / _SQRT_2))),
        ("hard_sigmoid_alone", lambda x: tf.nn.relu6(x + 3.0) / 6.0),
    )
    def test_other_formulas_are_not_whole_activations(self, build):
        _, _, found = self._match(build)
        self.assertIsNone(found)


if __name__ == "__main__":
    absltest.main()
