"""A ReLU that never fires: its range keeps the next layer's int32 bias representable.

A layer whose ReLU is dead in training has the batch range [0, 0]. TFLite's
converter widens an empty range to about 1e-6, so the next layer's bias scale
(input scale x weight scale) is tiny and its int32 bias overflows: that layer
is many steps off the eval graph. An empty activation batch range becomes
`range_updates.EMPTY_RANGE_WIDTH` wide; these tests check the rule on one quantizer
and end to end with TensorFlow's plain converter in both flavours.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.engine import step_counter  # pylint: disable=g-import-not-at-top
from qat.export import range_survival  # pylint: disable=g-import-not-at-top
from qat.quantize.emit import quantizer_batch  # pylint: disable=g-import-not-at-top
from qat.quantize.emit import range_updates  # pylint: disable=g-import-not-at-top
from tests import zoo_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
tf1.disable_eager_execution()

_INPUT_RANGE = (-1.0, 1.0)


def _conv(x, name, channels, bias, relu):
    with tf1.variable_scope(name):
        w = tf1.get_variable("weights", [1, 1, x.shape[-1], channels],
                             initializer=tf1.random_normal_initializer(stddev=0.5, seed=1))
        b = tf1.get_variable("biases", [channels],
                             initializer=tf1.constant_initializer(bias))
        y = tf.nn.bias_add(tf.nn.conv2d(x, w, [1, 1, 1, 1], "SAME"), b)
        return tf.nn.relu(y) if relu else y


def _dead_relu_net():
    """conv + ReLU with a huge negative bias (dead by construction), then a conv with a bias."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="input")
        h = _conv(x, "dead", 4, bias=-100.0, relu=True)
        y = _conv(h, "next", 4, bias=0.75, relu=False)
        y = tf.identity(y, name="output")
    return g, x, y


def _inputs(n, seed):
    return np.random.RandomState(seed).uniform(*_INPUT_RANGE, [n, 8, 8, 3]).astype(np.float32)


class QuantizerTest(tf.test.TestCase):

    def _ranges(self, batches, nonnegative):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [4], name="x")
            t = tf.nn.relu(x) if nonnegative else x
            batch = quantizer_batch.QuantizerBatch(graph)
            step = step_counter.get_or_create_quantization_step(graph)
            batch.add(quantizer_batch.QuantizerSpec(
                t, "net/act_quant", moving_average=True, init_from_first_batch=True), step)
            y = batch.build()[0]
            variables = {v.op.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                for values in batches:
                    sess.run(y, {x: values})
                return sess.run([variables["net/act_quant/min"], variables["net/act_quant/max"]])

    def test_dead_relu_gets_the_minimum_width(self):
        lo, hi = self._ranges([[-3.0, -1.0, -2.0, -0.5]] * 3, nonnegative=True)
        self.assertEqual(lo, 0.0)
        self.assertAllClose(hi, range_updates.EMPTY_RANGE_WIDTH, rtol=1e-6)

    def test_empty_signed_range_widens_at_the_top(self):
        lo, hi = self._ranges([[0.0, 0.0, 0.0, 0.0]] * 2, nonnegative=False)
        self.assertEqual(lo, 0.0)
        self.assertAllClose(hi, range_updates.EMPTY_RANGE_WIDTH, rtol=1e-6)

    def test_narrow_live_range_keeps_its_resolution(self):
        # A layer norm's variance can be this narrow: it is not widened.
        lo, hi = self._ranges([[-1e-4, 0.0, 1e-4, 0.0]] * 2, nonnegative=False)
        self.assertAllClose([lo, hi], [-1e-4, 1e-4], rtol=1e-5)

    def test_wide_ranges_unchanged(self):
        lo, hi = self._ranges([[-0.5, 0.0, 2.0, 1.0]], nonnegative=False)
        self.assertAllClose([lo, hi], [-0.5, 2.0])


class DeadReluTest(parameterized.TestCase, tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._dir = tempfile.mkdtemp()
        cls._checkpoint = os.path.join(cls._dir, "model")
        g, x, y = _dead_relu_net()
        with g.as_default():
            qat.experimental_create_training_graph(g, symmetric_weights=True)
            loss = tf.reduce_mean(tf.square(y - 1.0))
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train_op = tf1.train.GradientDescentOptimizer(1e-3).minimize(loss)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                for step in range(3):
                    sess.run(train_op, {x: _inputs(4, step)})
                tf1.train.Saver().save(sess, cls._checkpoint)
                relu_max = [v for v in tf1.global_variables()
                            if v.op.name.startswith("dead/") and v.op.name.endswith("/max")]
                cls._relu_max = dict(zip([v.op.name for v in relu_max], sess.run(relu_max)))

    def test_dead_relu_range_is_not_empty(self):
        self.assertGreaterEqual(float(self._relu_max["dead/act_quant/max"]),
                                range_updates.EMPTY_RANGE_WIDTH * (1 - 1e-6))

    @parameterized.parameters("uint8", "int8")
    def test_next_layer_agrees_with_tflite(self, flavour):
        g, x, y = _dead_relu_net()
        with g.as_default():
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            sess = tf1.Session(graph=g)
            tf1.train.Saver().restore(sess, self._checkpoint)
        with sess:
            model = zoo_util.convert_with_tf(sess, x, y, flavour, _INPUT_RANGE)
            frozen = tf1.graph_util.convert_variables_to_constants(
                sess, sess.graph.as_graph_def(), [y.op.name])
        survival = range_survival.check_ranges(frozen, model)
        self.assertEmpty(survival.lost, survival.format())
        agreement = zoo_util.layer_agreement(frozen, x, y, _inputs(8, 9), flavour, model)
        self.assertTrue(agreement.checked, agreement.numerics.format())
        worst = agreement.worst
        self.assertLessEqual(worst.max_own_steps, zoo_util.MAX_OWN_STEPS,
                             f"{flavour}: {worst.name}\n{agreement.numerics.format()}")


if __name__ == "__main__":
    absltest.main()
