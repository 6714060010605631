"""Grouped convolutions (tf_keras `Conv2D(groups=g)`) are layers.

tf_keras computes a grouped Conv2D as a call of an XLA-compiled function;
qat puts the Conv2D in the graph (qat.prepare.layer_calls), so its batch norm is
folded (training and eval) and its weights are quantized. Checked here on a
small block (groups 4, groups == channels with a channel multiplier of 2, a
strided grouped conv with a bias and no batch norm) and, through the zoo's
procedure (tests/zoo_test.py's ZooChecks: training, strict restore, fully
integer TFLite in both flavours through qat.export and TF's converter, every
layer within one step given TFLite's inputs), on the block and on tf_keras
RegNetX002 and RegNetY002 (group convs with squeeze-excite) at 32x32.

TensorFlow's CPU kernels compute a grouped Conv2D fused with its bias, and its
gradient, only with oneDNN (docs/known_limits.md), so this file turns it on.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.engine import marks  # pylint: disable=g-import-not-at-top
from qat.matching import layer_calls  # pylint: disable=g-import-not-at-top
from qat.matching import layer_patterns  # pylint: disable=g-import-not-at-top
import zoo_test  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1
layers = keras.layers


def grouped_block(x):
    net = layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(x)
    net = layers.BatchNormalization(name="stem_bn")(net)
    net = layers.ReLU(name="stem_relu")(net)
    net = layers.Conv2D(16, 3, padding="same", groups=4, use_bias=False, name="group")(net)
    net = layers.BatchNormalization(name="group_bn")(net)
    net = layers.ReLU(name="group_relu")(net)
    # groups == channels, as tf_keras ConvNeXt writes its depthwise convs.
    net = layers.Conv2D(32, 3, padding="same", groups=16, name="depthwise")(net)
    net = layers.BatchNormalization(name="depthwise_bn")(net)
    net = layers.ReLU(name="depthwise_relu")(net)
    net = layers.Conv2D(16, 3, strides=2, groups=2, name="group_bias")(net)
    net = layers.ReLU(name="group_bias_relu")(net)
    net = layers.GlobalAveragePooling2D(name="pool")(net)
    return layers.Dense(10, name="logits")(net)


zoo_util.EXTRA_CASES.update({
    "grouped_block": zoo_util.Case(grouped_block, (16, 16, 3)),
    "regnet_x002": zoo_util.Case(zoo_util._app(keras.applications.RegNetX002),  # pylint: disable=protected-access
                                 (32, 32, 3), (0.0, 255.0)),
    "regnet_y002": zoo_util.Case(zoo_util._app(keras.applications.RegNetY002),  # pylint: disable=protected-access
                                 (32, 32, 3), (0.0, 255.0)),
    "regnet_x002_logits": zoo_util.Case(zoo_util._app(  # pylint: disable=protected-access
        keras.applications.RegNetX002, classifier_activation=None), (32, 32, 3), (0.0, 255.0)),
    "regnet_y002_logits": zoo_util.Case(zoo_util._app(  # pylint: disable=protected-access
        keras.applications.RegNetY002, classifier_activation=None), (32, 32, 3), (0.0, 255.0)),
})
_GROUPED_LAYERS = ("group", "depthwise", "group_bias")


def _build(training):
    g, x, y = zoo_util.build_graph("grouped_block", training=training)
    return g, x, y


class GroupedConvTest(zoo_test.ZooChecks, parameterized.TestCase):

    @parameterized.parameters(True, False)
    def test_folded_and_quantized(self, training):
        g, x, y = _build(training)
        with g.as_default():
            calls = [op for op in g.get_operations()
                     if op.type in layer_calls.LAYER_CALL_TYPES]
            self.assertLen(calls, len(_GROUPED_LAYERS))
            fold = qat.fold_batch_norms(g, is_training=training)
            self.assertEmpty(fold.skipped)
            self.assertLen(fold.folded, 3)
            folded = {f.layer_op.name.split("/")[0] for f in fold.folded}
            self.assertEqual(folded, {"stem", "group", "depthwise"})
            result = qat.insert_quant_ops(g, is_training=training, symmetric_weights=True)
            self.assertEmpty(result.left_float)
            for call in calls:
                self.assertTrue(marks.is_replaced(call), call.name)
                self.assertEmpty(call.outputs[0].consumers())
            for name in _GROUPED_LAYERS:
                conv = g.get_operation_by_name(f"{name}/Conv2D")
                self.assertTrue(marks.made_by_qat(conv, marks.LAYER_CALL))
                weights = layer_patterns.weight_input(conv)
                self.assertTrue(weights.op.type.startswith("FakeQuantWithMinMaxVars"),
                                f"{name}: {weights.op.type}")
            before = g.as_graph_def()
            qat.fold_batch_norms(g, is_training=training)
            qat.insert_quant_ops(g, is_training=training, symmetric_weights=True)
            self.assertEqual(len(g.as_graph_def().node), len(before.node))  # idempotent
            if training:
                grads = tf.gradients(tf.reduce_sum(y), tf1.trainable_variables())
                self.assertNotIn(None, grads)
            inputs = zoo_util.make_inputs("grouped_block", 4)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                outputs = sess.run([y] + (grads if training else []), {x: inputs})
        self.assertTrue(all(np.all(np.isfinite(o)) for o in outputs))

    def test_eval_fold_exact(self):
        """The eval fold of a grouped conv computes what the unfolded layer does."""
        g, x, y = _build(False)
        inputs = zoo_util.make_inputs("grouped_block", 4)
        with g.as_default(), tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            moving = [v for v in tf1.global_variables() if "moving" in v.name]
            for v in moving:  # Statistics other than the initial 0 / 1.
                sess.run(v.assign(np.random.RandomState(1).uniform(
                    0.5, 2.0, v.shape).astype(np.float32)))
            unfolded = sess.run(y, {x: inputs})
            qat.fold_batch_norms(g, is_training=False)
            folded = sess.run(y, {x: inputs})
        np.testing.assert_allclose(folded, unfolded, rtol=1e-4, atol=1e-4)

    def test_per_channel_int8(self):
        """Per-channel weights (TFLite int8's scheme): one integer grouped CONV_2D each."""
        g, x, y = _build(False)
        inputs = zoo_util.make_inputs("grouped_block", 4)
        with g.as_default():
            qat.experimental_create_eval_graph(g, per_channel_weights=True)
            for name in _GROUPED_LAYERS:
                weights = layer_patterns.weight_input(g.get_operation_by_name(f"{name}/Conv2D"))
                self.assertEqual(weights.op.type, "FakeQuantWithMinMaxVarsPerChannel", name)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                model = zoo_util.convert_with_tf(sess, x, y, "int8", (0.0, 1.0))
                frozen = export.freeze_session(sess, [y.op.name])
        export.check_fully_integer(model, frozen, label="grouped_block int8 per channel")
        self.assert_each_layer_agrees(frozen, x, y, inputs, "int8", model)
        ops = [op["op_name"] for op in Interpreter(model_content=model)._get_ops_details()]  # pylint: disable=protected-access
        self.assertEqual(ops.count("CONV_2D"), 4, ops)  # stem + the three grouped convs
        self.assertNotIn("DEPTHWISE_CONV_2D", ops)

    def test_only_a_body_of_one_layer_is_replaced(self):
        """A call whose body is one Conv2D of its two inputs is that layer; more is not."""
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 8, 8, 4], name="x")
            w = tf1.get_variable("w", [3, 3, 2, 4])

            @tf.function
            def conv(t, kernel):
                return tf.nn.conv2d(t, kernel, 1, "SAME", name="inner_conv")

            @tf.function
            def conv_relu(t, kernel):
                return tf.nn.relu(tf.nn.conv2d(t, kernel, 1, "SAME", name="inner_conv_relu"))

            kernel = w.read_value()  # A tensor: the call then reads no resource.
            tf.identity(conv(x, kernel), name="a")
            tf.identity(conv_relu(x, kernel), name="b")
            result = qat.insert_quant_ops(g, is_training=False)
        inlined = [op for op in g.get_operations() if marks.made_by_qat(op, marks.LAYER_CALL)]
        self.assertEqual([op.type for op in inlined], ["Conv2D"])
        quantized = g.get_operation_by_name("a").inputs[0].op  # Its activation range.
        self.assertTrue(quantized.type.startswith("FakeQuant"), quantized.type)
        self.assertIs(quantized.inputs[0].op, inlined[0])
        self.assertIn(g.get_operation_by_name("b").inputs[0].op.type,
                      layer_calls.LAYER_CALL_TYPES)
        self.assertEqual([item.name.rpartition("/")[2] for item in result.left_float],
                         ["inner_conv_relu"])

    @parameterized.named_parameters(("block", "grouped_block"),
                                    ("regnet_x002", "regnet_x002"),
                                    ("regnet_y002", "regnet_y002"),
                                    ("regnet_x002_logits", "regnet_x002_logits"),
                                    ("regnet_y002_logits", "regnet_y002_logits"))
    def test_train_restore_export(self, name):
        figures = self.check_train_restore_export(name)
        print(name, figures)


if __name__ == "__main__":
    absltest.main()
