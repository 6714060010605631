"""fold_batch_norms on tf_keras MobileNetV2 and ResNet50 graphs (weights=None).

Each graph is built once per test class (training and inference learning
phase), folded, and checked: every batch norm folded, outputs unchanged.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tf_keras

from qat.api import fold_batch_norms

_BATCH = 2


def _build(constructor, size, training):
    """The model on a placeholder, in graph mode, with a fixed learning phase.

    Setting the learning phase (the graph-mode equivalent of calling the model
    with training=True/False) keeps the batch norms out of functional If ops.
    """
    g = tf.Graph()
    with g.as_default():
        tf_keras.backend.set_learning_phase(1 if training else 0)
        x = tf.compat.v1.placeholder(tf.float32, [_BATCH, size, size, 3], name="images")
        model = constructor(input_tensor=x, weights=None)
        logits = model.output.op.inputs[0]  # The BiasAdd before the softmax.
    return g, x, model.output, logits


def _random_values(sess, graph, seed):
    """Random moving statistics / gammas / betas; the weights keep their init."""
    rng = np.random.RandomState(seed)
    with graph.as_default():
        variables = tf.compat.v1.global_variables()
        values = dict(zip([v.name for v in variables], sess.run(variables)))
        for v in variables:
            shape = v.shape.as_list()
            if "moving_mean" in v.name or "beta" in v.name:
                values[v.name] = rng.normal(0.0, 0.1, shape).astype(np.float32)
            elif "moving_variance" in v.name or "gamma" in v.name:
                values[v.name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
            else:
                continue
            v.load(values[v.name], sess)
    return values


def _load(sess, graph, values):
    with graph.as_default():
        sess.run(tf.compat.v1.global_variables_initializer())
        for v in tf.compat.v1.global_variables():
            if v.name in values:
                v.load(values[v.name], sess)


def _rel_err(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12)


class _KerasFoldTestBase(object):
    CONSTRUCTOR = None
    SIZE = None
    NUM_BATCH_NORMS = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.images = np.random.RandomState(0).uniform(
            -1.0, 1.0, [_BATCH, cls.SIZE, cls.SIZE, 3]).astype(np.float32)
        cls.results = {}
        for training in (False, True):
            g, x, probs, logits = _build(cls.CONSTRUCTOR, cls.SIZE, training)
            bn_count = len([op for op in g.get_operations()
                            if op.type.startswith("FusedBatchNorm")])
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                values = _random_values(sess, g, seed=1)
                before = sess.run([probs, logits], {x: cls.images})
            result = fold_batch_norms(g, is_training=training, freeze_batch_norm_delay=1000)
            with tf.compat.v1.Session(graph=g) as sess:
                _load(sess, g, values)
                after = sess.run([probs, logits], {x: cls.images})
            cls.results[training] = (bn_count, result, before, after)

    def _check(self, training, tolerance):
        bn_count, result, before, after = self.results[training]
        self.assertEqual(bn_count, self.NUM_BATCH_NORMS)
        self.assertEmpty(result.skipped)
        self.assertLen(result.folded, self.NUM_BATCH_NORMS)
        self.assertTrue(all(f.training == training for f in result.folded))
        for got, expected in zip(after, before):
            self.assertTrue(np.all(np.isfinite(got)))
            self.assertLess(_rel_err(got, expected), tolerance)

    def test_eval_mode_every_batch_norm_folded_outputs_unchanged(self):
        self._check(training=False, tolerance=1e-4)

    def test_training_mode_every_batch_norm_folded_outputs_unchanged(self):
        # Before the freeze the training fold computes the batch-statistics
        # output of the unfolded model. Looser than eval: y = layer(x, w*s) / s
        # rounds differently from layer(x, w), and normalising with batch
        # statistics of few values (ResNet50's last blocks see 2x2 maps of 2
        # images) amplifies that over 50 layers (measured ~2.5e-4).
        self._check(training=True, tolerance=1e-3)


class MobileNetV2FoldTest(_KerasFoldTestBase, tf.test.TestCase):
    CONSTRUCTOR = staticmethod(tf_keras.applications.MobileNetV2)
    SIZE = 96
    NUM_BATCH_NORMS = 52


class ResNet50FoldTest(_KerasFoldTestBase, tf.test.TestCase):
    CONSTRUCTOR = staticmethod(tf_keras.applications.ResNet50)
    SIZE = 64
    NUM_BATCH_NORMS = 53


if __name__ == "__main__":
    absltest.main()
