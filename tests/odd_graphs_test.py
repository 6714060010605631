"""Odd graphs users bring: gradients built before the rewrite, hand-made FakeQuants.

(Issue #12, items 3 and 4; the other items have tests of their own:
property_test, mixed_precision_test, control_flow_test,
partitioned_weights_test, engine_test, graph_editor_select_test,
onednn_leaky_relu_test.)
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.engine import marks  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def _conv_model(weights_fn=None):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 6, 6, 3], name="x")
        w = tf1.get_variable("conv/weights", [3, 3, 3, 4])
        if weights_fn is not None:
            w = weights_fn(w)
        y = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME", name="conv/Conv2D"), name="conv/Relu")
        loss = tf.reduce_mean(tf.square(y), name="loss")
    return g, loss


class OddGraphsTest(absltest.TestCase):

    def test_gradients_built_before_the_rewrite_are_named(self):
        g, loss = _conv_model()
        with g.as_default():
            grads = tf.gradients(loss, tf1.trainable_variables())
        with self.assertLogs(level="WARNING") as logs:
            qat.create_training_graph(g)
        message = "\n".join(logs.output)
        self.assertIn("gradient ops", message)
        self.assertIn(grads[0].op.name.split("/")[0], message)
        # The gradients keep their float path: no FakeQuant reads a gradient op.
        for op in g.get_operations():
            if op.type.startswith("FakeQuant"):
                self.assertNotIn("gradients", op.inputs[0].name, op.name)

    def test_hand_made_fake_quant_on_weights_is_reused(self):
        def hand_quantized(w):
            return tf.quantization.fake_quant_with_min_max_args(
                w, min=-1.0, max=1.0, narrow_range=True, name="conv/my_weights_quant")
        g, _ = _conv_model(hand_quantized)
        qat.create_training_graph(g)
        conv = g.get_operation_by_name("conv/Conv2D")
        self.assertEqual(conv.inputs[1].op.name, "conv/my_weights_quant")
        weight_fake_quants = [op.name for op in g.get_operations()
                              if op.type.startswith("FakeQuant")
                              and "weights" in op.inputs[0].name]
        self.assertEqual(weight_fake_quants, ["conv/my_weights_quant"])

    def test_second_call_reports_no_float_layers_of_its_own(self):
        """A second rewrite does not list qat's own quantizers as left float."""
        g, _ = _conv_model()
        qat.create_training_graph(g)
        result = qat.insert_quant_ops(g, is_training=True, quant_delay=0)
        self.assertEqual(result.quantizers, [])
        own = [item.name for item in result.left_float
               if marks.made_by_qat(g.get_operation_by_name(item.name))]
        self.assertEqual(own, [])
        # The loss's Square is loss arithmetic, not a model op: never reported.
        self.assertNotIn("Square", [item.name for item in result.left_float])

    def test_shape_ops_are_not_left_float(self):
        """A Shape of an activation (Dropout, a dynamic Reshape) reads no values."""
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
            w = tf1.get_variable("conv/weights", [3, 3, 3, 4])
            y = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME", name="conv/Conv2D"))
            flat = tf.reshape(y, tf.stack([tf.shape(y)[0], -1]), name="flat")
            tf.exp(flat, name="scores")  # A model output with no integer kernel.
            tf.reduce_mean(tf.square(flat), name="loss")
        result = qat.insert_quant_ops(g, is_training=True)
        self.assertTrue(any(op.type == "Shape" for op in g.get_operations()))
        left = {g.get_operation_by_name(item.name).type for item in result.left_float}
        self.assertNotIn("Shape", left)
        self.assertIn("Exp", left)
        self.assertNotIn("Square", left)  # Loss arithmetic: not on the inference path.


if __name__ == "__main__":
    absltest.main()
