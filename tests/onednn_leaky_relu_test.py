"""Conv2D + BiasAdd + Add + LeakyRelu stays exact with oneDNN's fusions off.

TensorFlow bug (not qat's): with oneDNN on, the Conv2D + BiasAdd + Add +
LeakyRelu fusion drops alpha, so such graphs compute wrong float results, with
or without qat (docs/known_limits.md). An eval fold produces exactly that
pattern from conv -> batch norm -> residual add -> LeakyRelu. With
TF_ENABLE_ONEDNN_OPTS=0, set here before TensorFlow is imported, the float
graph matches a NumPy reference, the folded graph matches the unfolded one,
and in the quantized eval graph each LeakyRelu applies its alpha.
"""
import os

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

ALPHA = 0.2


def _conv_same(x, w):
    """NumPy 3x3 SAME, stride 1 NHWC convolution."""
    pad = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    out = np.zeros(x.shape[:3] + (w.shape[3],), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nhwc,co->nhwo",
                             pad[:, i:i + x.shape[1], j:j + x.shape[2], :], w[i, j])
    return out


def _leaky(a):
    return np.where(a > 0, a, ALPHA * a)


def _build(batch_norm):
    rng = np.random.RandomState(0)
    w = rng.normal(0, 0.5, [3, 3, 4, 4]).astype(np.float32)
    b = rng.normal(0, 0.5, [4]).astype(np.float32)
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 6, 6, 4], name="x")
        y = tf.nn.conv2d(x, tf.compat.v1.get_variable(
            "w", initializer=w), 1, "SAME")
        if batch_norm:
            y = tf.compat.v1.layers.batch_normalization(
                y, training=False, fused=True,
                moving_mean_initializer=tf.compat.v1.constant_initializer(0.3),
                moving_variance_initializer=tf.compat.v1.constant_initializer(2.0),
                gamma_initializer=tf.compat.v1.constant_initializer(1.5),
                beta_initializer=tf.compat.v1.constant_initializer(-0.2))
        else:
            y = tf.nn.bias_add(y, tf.compat.v1.get_variable("b", initializer=b))
        y = tf.nn.leaky_relu(y + x, alpha=ALPHA)
        out = tf.identity(y, name="out")
    return g, x, out, w, b


class OneDnnLeakyReluTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.x = np.random.RandomState(1).uniform(-2, 2, [2, 6, 6, 4]).astype(np.float32)

    def _run(self, g, fetches, feed):
        with g.as_default():
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            return sess.run(fetches, feed)

    def test_float_graph_matches_numpy(self):
        g, x, out, w, b = _build(batch_norm=False)
        expected = _leaky(_conv_same(self.x, w) + b + self.x)
        np.testing.assert_allclose(self._run(g, out, {x: self.x}), expected,
                                   rtol=1e-5, atol=1e-5)

    def test_eval_fold_is_exact(self):
        g, x, out, w, _ = _build(batch_norm=True)
        with g.as_default():
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            unfolded = sess.run(out, {x: self.x})
            result = qat.fold_batch_norms(g, is_training=False)
            self.assertLen(result.folded, 1)
            folded = sess.run(out, {x: self.x})
        scale = 1.5 / np.sqrt(2.0 + 1e-3)
        expected = _leaky(_conv_same(self.x, w) * scale + (-0.2 - 0.3 * scale) + self.x)
        np.testing.assert_allclose(unfolded, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(folded, unfolded, rtol=1e-5, atol=1e-5)

    def test_quantized_eval_graph_applies_alpha(self):
        g, x, out, _, _ = _build(batch_norm=True)
        qat.create_eval_graph(g)
        leaky = [op for op in g.get_operations() if op.type == "LeakyRelu"]
        self.assertLen(leaky, 1)
        pre, post = self._run(g, [leaky[0].inputs[0], leaky[0].outputs[0]], {x: self.x})
        self.assertLess(pre.min(), -0.5)  # The negative side is exercised.
        np.testing.assert_allclose(post, _leaky(pre), rtol=1e-6, atol=1e-6)


if __name__ == "__main__":
    absltest.main()
