"""The 1x1-conv classifier head of TF-Slim models, and loss arithmetic.

A conv (or dense) layer with a bias and no activation whose output a
Squeeze, Reshape or Identity reads, after dropout: TF-Slim's MobileNet,
ResNet and Inception heads. The layer output has one range, after the bias,
in the training and in the eval graph alike (so the training checkpoint
restores into the eval graph with a plain Saver), every reader reads it
quantized, and TFLite runs the head as one integer CONV_2D. Loss arithmetic
(`reduce_mean(square(logits - 1))`) gets no range and no warning.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl import logging  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import compat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top

compat.enable_slim()
import tf_slim as slim  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
tf1.disable_eager_execution()

_CASES = [(f"{bias}_{'inside' if inside else 'outside'}", bias, inside)
          for bias in ("slim", "bias_add", "plus") for inside in (True, False)]


def _head(net, bias):
    if bias == "slim":
        return slim.conv2d(net, 10, [1, 1], activation_fn=None,
                           normalizer_fn=None, scope="logits")
    with tf1.variable_scope("logits"):
        w = tf1.get_variable("weights", [1, 1, int(net.shape[-1]), 10])
        b = tf1.get_variable("biases", [10],
                             initializer=tf1.random_normal_initializer(stddev=0.3))
        y = tf.nn.conv2d(net, w, 1, "VALID")
        return tf.nn.bias_add(y, b) if bias == "bias_add" else y + b


def _build(training, bias, inside):
    """The issue's ten lines: conv + BN -> mean -> dropout -> 1x1 head -> squeeze."""
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        with tf1.variable_scope("Net"):
            with slim.arg_scope([slim.batch_norm], is_training=training):
                net = slim.conv2d(x, 8, [3, 3], normalizer_fn=slim.batch_norm,
                                  scope="conv1")
            net = tf.reduce_mean(net, [1, 2], keepdims=True)
            net = slim.dropout(net, 0.8, is_training=training)
            logits = _head(net, bias)
            if inside:
                logits = tf.squeeze(logits, [1, 2], name="SpatialSqueeze")
        if not inside:
            logits = tf.squeeze(logits, [1, 2], name="SpatialSqueeze")
        output = tf.identity(logits, name="output")
    return g, x, logits, output


class LogitsHeadTest(parameterized.TestCase):

    def _head_layer(self, g):
        return [op for op in g.get_operations() if op.type == "Conv2D"
                and op.name.startswith("Net/logits")][0]

    def _assert_one_range_after_bias(self, g, inside, label):
        conv = self._head_layer(g)
        bias_add = conv.outputs[0].consumers()
        self.assertLen(bias_add, 1, label)  # The bias add alone reads the conv.
        bias_add = bias_add[0]
        self.assertIn(bias_add.type, ("BiasAdd", "Add", "AddV2"), label)
        readers = bias_add.outputs[0].consumers()
        fake_quants = [c for c in readers if c.type.startswith("FakeQuant")]
        self.assertLen(fake_quants, 1, f"{label}: one range on the logits")
        self.assertEqual(fake_quants[0].name, "Net/logits/act_quant/FakeQuantWithMinMaxVars")
        # Nothing else reads the raw logits: the Squeeze reads the range.
        raw = [c.name for c in readers if c not in fake_quants
               and not qat.engine.marks.made_by_qat(c)]
        self.assertEqual(raw, [], label)
        squeeze = g.get_operation_by_name(
            "Net/SpatialSqueeze" if inside else "SpatialSqueeze")
        self.assertEqual(squeeze.inputs[0].op.type, "FakeQuantWithMinMaxVars", label)
        adds = [op.name for op in g.get_operations() if "add_quant" in op.name]
        self.assertEqual(adds, [], f"{label}: no second range after the bias")

    @parameterized.named_parameters(*_CASES)
    def test_training_and_eval_graphs_agree(self, bias, inside):
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        g, x, logits, _ = _build(True, bias, inside)
        with g.as_default():
            labels = tf1.placeholder(tf.int64, [None])
            tf1.losses.sparse_softmax_cross_entropy(labels, logits)
            loss = tf1.losses.get_total_loss()
            qat.create_training_graph(g, quant_delay=0)
            self._assert_one_range_after_bias(g, inside, "training")
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train_op = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                rng = np.random.RandomState(0)
                for _ in range(2):
                    sess.run(train_op, {x: rng.uniform(0, 1, [4, 8, 8, 3]),
                                        labels: [0, 1, 2, 3]})
                checkpoint = tf1.train.Saver().save(sess, os.path.join(workdir, "model"))
        g, x, _, output = _build(False, bias, inside)
        with g.as_default():
            qat.create_eval_graph(g)
            self._assert_one_range_after_bias(g, inside, "eval")
            sess = tf1.Session()
            tf1.train.Saver().restore(sess, checkpoint)  # Strict: every variable.
        inputs = np.random.RandomState(1).uniform(0, 1, [8, 8, 8, 3]).astype(np.float32)
        with sess:
            models = export.export_tflite(
                [x.name], [output.name], workdir, sess=sess, flavours=("uint8",),
                input_ranges={x.op.name: (0.0, 1.0)}, parity_inputs=inputs,
                max_diff_steps=2.0)
        ops = export.describe_model(models["uint8"].model).op_counts()
        self.assertNotIn("ADD", ops)  # The bias is the integer conv's.
        self.assertLessEqual(models["uint8"].parity.max_diff_steps, 2.0)


class LossArithmeticTest(parameterized.TestCase):

    @parameterized.parameters(True, False)
    def test_loss_arithmetic_gets_no_range_and_no_warning(self, training):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 8], name="x")
            logits = tf1.layers.dense(x, 4, name="dense")
            tf.reduce_mean(tf.square(logits - 1.0), name="regression_loss")
            tf1.losses.sparse_softmax_cross_entropy(
                tf1.placeholder(tf.int64, [None]), logits)
            tf1.losses.sigmoid_cross_entropy(
                tf1.placeholder(tf.float32, [None, 4]), logits)
            with self.assertLogs(level="WARNING") as logs:
                logging.warning("sentinel")  # assertLogs needs one record.
                result = qat.insert_quant_ops(g, is_training=training)
        names = sorted(q.name for q in result.quantizers)
        self.assertEqual(names, ["dense/act_quant", "dense/input_quant", "dense/weights_quant"])
        self.assertEqual(result.left_float, [])
        self.assertEqual([r for r in logs.output if "left float" in r], [])

    @parameterized.parameters(True, False)
    def test_activation_only_the_loss_reads_keeps_its_range(self, training):
        """A model ending in an activation is a model output in both graphs."""
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 8], name="x")
            y = tf.nn.leaky_relu(tf1.layers.dense(x, 4, name="dense"), name="out")
            if training:
                tf.reduce_mean(tf.square(y))
            result = qat.insert_quant_ops(g, is_training=training)
        self.assertIn("leaky_relu_quant", [q.kind for q in result.quantizers])


class ScaledOutputTest(parameterized.TestCase):
    """docs/known_limits.md: arithmetic after the last layer that only the loss reads."""

    def _build(self, training, named_output):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 8], name="x")
            pred = tf1.layers.dense(x, 4, name="dense") * 10.0
            if named_output:
                pred = tf.identity(pred, name="pred")
            if training:
                y = tf1.placeholder(tf.float32, [None, 4], name="y")
                tf.reduce_mean(tf.square(pred - y))
            result = qat.insert_quant_ops(g, is_training=training)
            return {v.op.name for v in tf1.global_variables()}, result

    def test_identity_ending_the_model_keeps_train_and_eval_symmetric(self):
        (training, _), (evaluation, _) = self._build(True, True), self._build(False, True)
        self.assertEqual(evaluation - training, set())
        self.assertIn("mul/mul_quant/min", evaluation)

    def test_without_it_the_multiply_stays_float_in_both_graphs(self):
        (training, _), (evaluation, result) = self._build(True, False), self._build(False, False)
        self.assertEqual(evaluation - training, set())
        self.assertNotIn("mul/mul_quant/min", training | evaluation)
        self.assertIn("dense/act_quant/min", evaluation)
        # The eval graph names the multiply it leaves float after the model.
        self.assertEqual([f.name for f in result.left_float], ["mul"])
        self.assertIn("after the model", result.left_float[0].reason)


if __name__ == "__main__":
    absltest.main()
