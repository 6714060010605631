"""Clamps by a constant written with tf.maximum / tf.minimum (qat/quantize/plan/ops/clamps.py).

`Maximum(x, 0)` is a RELU the converter fuses into the layer it alone reads;
other clamps (`Minimum(x, 6)`, `Maximum(x, -1)`) run in their input's scale.
Trained briefly, restored strictly, converted in both flavours with TF's
plain converter: no requantize, every range a TFLite tensor, every layer
within one step given TFLite's inputs (tests/converter_rewrites_test.py checks
survival with distinct ranges).
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import fixed_grid_util as util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat.export import range_survival  # pylint: disable=g-import-not-at-top
from qat.quantize.plan.ops import clamps  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def relu6_clamp(x, training):
    a = util.conv(x, 8, "a", None, training)  # pylint: disable=protected-access
    return util.conv(tf.minimum(tf.maximum(a, 0.0), 6.0), 4, "b", None, training)  # pylint: disable=protected-access


def n1_to_1_clamp(x, training):
    a = util.conv(x, 8, "a", None, training)  # pylint: disable=protected-access
    return util.conv(tf.maximum(tf.minimum(a, 0.5), -0.5), 4, "b", None, training)  # pylint: disable=protected-access


class ClampsTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(("relu6", relu6_clamp), ("n1_to_1", n1_to_1_clamp))
    def test_tflite_agrees(self, network):
        path, train_vars = util.calibrate(network, self.get_temp_dir())
        g, x, y = util.build(network, training=False)
        qat.experimental_create_eval_graph(g, symmetric_weights=True)
        self.assertContainsSubset(util.variables(g), train_vars)  # pylint: disable=protected-access
        with tf1.Session(graph=g) as sess:
            tf1.train.Saver().restore(sess, path)
            frozen = tf1.graph_util.convert_variables_to_constants(
                sess, g.as_graph_def(), [y.op.name])
        for flavour in ("uint8", "int8"):
            model = util.convert(frozen, x, y, flavour)
            report = range_survival.check_ranges(frozen, model, flavour=flavour)
            self.assertEmpty(report.differing, report.format())
            ops = [d["op_name"] for d in
                   tf.lite.Interpreter(model_content=model)._get_ops_details()]  # pylint: disable=protected-access
            self.assertNotIn("QUANTIZE", ops[1:], ops)
            util.check_layers(self, frozen, model, flavour)

    def test_what_each_clamp_is(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, (None, 4, 4, 8))
            y = tf1.placeholder(tf.float32, (None, 4, 4, 8))
            is_data = lambda t: t.op.type != "Const"
            self.assertEqual(clamps.RELU, clamps.converted_as(tf.maximum(x, 0.0).op, is_data))
            self.assertEqual(clamps.RELU, clamps.converted_as(tf.maximum(0.0, x).op, is_data))
            self.assertEqual(clamps.SAME_SCALE,
                             clamps.converted_as(tf.minimum(x, 6.0).op, is_data))
            self.assertEqual(clamps.SAME_SCALE,
                             clamps.converted_as(tf.maximum(x, -1.0).op, is_data))
            # Two activations, or a constant that grows x: not clamps.
            self.assertIsNone(clamps.converted_as(tf.maximum(x, y).op, is_data))
            self.assertIsNone(clamps.converted_as(
                tf.maximum(tf1.placeholder(tf.float32, (None, 1)), tf.zeros([1, 5])).op,
                is_data))


if __name__ == "__main__":
    tf.test.main()
