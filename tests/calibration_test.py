"""calibration_util.calibrate_to_convergence: a converged calibration for test models."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
import calibration_util  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1
layers = keras.layers


def _net(x):
    net = layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv0")(x)
    net = layers.BatchNormalization(name="conv0_bn")(net)
    net = layers.ReLU(name="conv0_relu")(net)
    net = layers.Dropout(0.5, name="drop")(net)  # A new mask every run.
    net = layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv1")(net)
    net = layers.BatchNormalization(name="conv1_bn")(net)
    net = layers.ReLU(name="conv1_relu")(net)
    net = layers.GlobalAveragePooling2D(name="pool")(net)
    return layers.Dense(10, name="logits")(net)


zoo_util.EXTRA_CASES["calibration_net"] = zoo_util.Case(_net, (8, 8, 3))


class CalibrationTest(absltest.TestCase):

    def _session(self):
        g, x, y = zoo_util.build_graph("calibration_net", training=True)
        with g.as_default():
            qat.experimental_create_training_graph(g, symmetric_weights=True)
            sess = tf1.Session(graph=g)
            sess.run(tf1.global_variables_initializer())
        return g, x, y, sess

    def test_ranges_settle_on_the_batch(self):
        g, x, y, sess = self._session()
        feed = {x: zoo_util.make_inputs("calibration_net", 8, seed=2)}
        with sess:
            result = calibration_util.calibrate_to_convergence(sess, y, feed)
            self.assertLessEqual(result.move, calibration_util.CALIBRATION_TOLERANCE)
            self.assertLessEqual(result.rounds, calibration_util.CALIBRATION_MAX_ROUNDS)
            # The first conv's activation range is its output's range on the batch.
            quant = g.get_operation_by_name("conv0/act_quant/min")
            lo, hi = sess.run([g.get_tensor_by_name("conv0/act_quant/min/Read/ReadVariableOp:0"),
                               g.get_tensor_by_name("conv0/act_quant/max/Read/ReadVariableOp:0")])
            raw = None
            for op in g.get_operations():
                if op.type.startswith("FakeQuantWithMinMaxVars") and op.inputs[1].op.inputs[0].op is quant:
                    raw = sess.run(op.inputs[0], feed)
            self.assertIsNotNone(raw)
            self.assertAlmostEqual(hi, max(float(np.max(raw)), 0.0), places=5)
            self.assertAlmostEqual(lo, min(float(np.min(raw)), 0.0), places=5)

    def test_too_few_rounds_fail_clearly(self):
        _, x, y, sess = self._session()
        feed = {x: zoo_util.make_inputs("calibration_net", 8, seed=2)}
        with sess, self.assertRaisesRegex(calibration_util.CalibrationNotConverged,
                                          "did not converge in 1 rounds"):
            calibration_util.calibrate_to_convergence(sess, y, feed, max_rounds=1)

    def test_needs_a_training_graph(self):
        g, x, y = zoo_util.build_graph("calibration_net", training=False)
        with g.as_default():
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            with tf1.Session() as sess, self.assertRaisesRegex(ValueError, "create_training_graph"):
                sess.run(tf1.global_variables_initializer())
                calibration_util.calibrate_to_convergence(
                    sess, y, {x: zoo_util.make_inputs("calibration_net", 2)})


if __name__ == "__main__":
    absltest.main()
