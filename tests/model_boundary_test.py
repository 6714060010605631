"""Issue #33 (part A.1): no planner rule crosses the model/loss boundary.

A model (`model/`: maybe a hidden dense layer with a ReLU, then a dense
`logits` layer; or a conv with a ReLU and a global average pool) is followed
by a loss that computes with constants or with tensors the model does not
compute (targets, labels, a teacher's outputs). The training graph
(rewritten, then an optimizer) and an eval graph with the same loss must
quantize exactly what the export graph (the model alone, its output named
with `tf.identity`) quantizes: the same model tensors under the same names
(`model/logits/act_quant` reads `model/logits/BiasAdd:0`, never `sub:0`),
no quantizer on loss arithmetic, and the same range variables, so a training
checkpoint restores strictly into the export graph
(`qat/quantize/plan/model/boundary.py`, docs/what_gets_a_range.md).
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
import boundary_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
tf1.disable_eager_execution()

CLASSES = 4


def _model(x, hidden):
    with tf1.variable_scope("model"):
        if hidden == "pool":  # An embedding: conv + ReLU, then a global average pool.
            net = tf1.layers.conv2d(x, CLASSES, 1, activation=tf.nn.relu, name="features")
            return tf.reduce_mean(net, [1, 2], name="embedding")
        net = x
        if hidden:
            net = tf1.layers.dense(net, 8, activation=tf.nn.relu, name="hidden")
        return tf1.layers.dense(net, CLASSES, name="logits")


def _labels():
    return tf1.placeholder(tf.int32, [None], name="labels")


# Loss tails: model output -> scalar loss, built outside the model's scope.
def _mse_const(y):
    return tf.reduce_mean(tf.square(y - 1.0))


def _mse_plus_const(y):  # The add joins no tail: it is the loss's.
    return tf.reduce_mean(tf.square(y + 1.0))


def _losses_mse_const(y):
    return tf1.losses.mean_squared_error(tf.ones_like(y), y)


def _mse_target(y):
    target = tf1.placeholder(tf.float32, [None, CLASSES], name="target")
    return tf.reduce_mean(tf.square(y - target))


def _hinge(y):  # {0, 1} labels from class ids: not computed by the model.
    return tf1.losses.hinge_loss(tf.one_hot(_labels(), CLASSES), y)


def _hinge_constant_labels(y):  # Fixed class ids: a constant, but one per example.
    return tf1.losses.hinge_loss(tf.one_hot(tf.constant([0, 1, 2, 3, 0, 1]), CLASSES), y)


def _hinge_float_labels(y):
    return tf1.losses.hinge_loss(
        tf1.placeholder(tf.float32, [None, CLASSES], name="hinge_labels"), y)


def _distill(y):  # Temperature 2 on the teacher's and the student's logits.
    teacher = tf1.placeholder(tf.float32, [None, CLASSES], name="teacher")
    return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=tf.nn.softmax(teacher / 2.0), logits=y / 2.0))


def _logit_scale(y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=_labels(), logits=y * 3.0 + 0.5))


def _label_smoothing(y):
    return tf1.losses.softmax_cross_entropy(
        tf.one_hot(_labels(), CLASSES), y, label_smoothing=0.1)


def _label_smoothing_soft(y):
    soft = tf1.placeholder(tf.float32, [None, CLASSES], name="soft_labels")
    return tf1.losses.softmax_cross_entropy(soft, y, label_smoothing=0.1)


def _plain_ce(y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=_labels(), logits=y))


def _clamp(y):  # A same-scale clamp in the loss.
    return tf.reduce_mean(tf.square(tf.minimum(y, 5.0) - _target()))


def _maximum0(y):  # Maximum(x, 0) is fused like a RELU inside a model.
    return tf.reduce_mean(tf.square(tf.maximum(y, 0.0) - _target()))


def _relu_margin(y):  # A margin without labels: relu(1 - y) (docs/known_limits.md).
    return tf.reduce_mean(tf.nn.relu(1.0 - y))


def _target():
    return tf1.placeholder(tf.float32, [None, CLASSES], name="target")


_TAILS = {
    "mse_const": _mse_const, "mse_plus_const": _mse_plus_const,
    "losses_mse_const": _losses_mse_const, "mse_target": _mse_target,
    "hinge": _hinge, "hinge_float_labels": _hinge_float_labels,
    "hinge_constant_labels": _hinge_constant_labels, "distill": _distill,
    "logit_scale": _logit_scale, "label_smoothing": _label_smoothing,
    "label_smoothing_soft": _label_smoothing_soft, "plain_ce": _plain_ce,
    "clamp": _clamp, "maximum0": _maximum0,
}
_CASES = ([(f"{tail}_{model}", tail, hidden) for tail in _TAILS
           for model, hidden in (("logits", False), ("hidden", True))
           if model == "logits" or tail in ("mse_const", "hinge", "distill", "logit_scale")]
          + [("mse_const_pool", "mse_const", "pool"), ("mse_target_pool", "mse_target", "pool")])


def _build(tail, hidden, mode, output=None, name_output=True):
    """`mode`: train (rewritten, then an optimizer), eval (with the loss) or export
    (the model alone, its output named with tf.identity if `name_output`)."""
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(0)
        shape = [None, 4, 4, 3] if hidden == "pool" else [None, 6]
        x = tf1.placeholder(tf.float32, shape, name="input")
        y = _model(x, hidden)
        if output is not None:
            y = output(y)
        if mode == "export":
            if name_output:
                tf.identity(y, name="output")
            qat.experimental_create_eval_graph(g)
            return g, x, None
        loss = _TAILS[tail](y)
        train_op = None
        if mode == "train":
            qat.experimental_create_training_graph(g)
            train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        else:
            qat.experimental_create_eval_graph(g)
    return g, x, train_op


class LossTailTest(parameterized.TestCase):

    @parameterized.named_parameters(*_CASES)
    def test_training_and_eval_graphs_quantize_what_the_export_graph_does(self, tail, hidden):
        export_graph, _, _ = _build(tail, hidden, "export")
        export = boundary_util.activation_quantizers(export_graph)
        expected = {name: t for name, (t, _) in export.items()}
        self.assertIn("model/features/act_quant" if hidden == "pool"
                      else "model/logits/act_quant", expected)
        for mode in ("train", "eval"):
            g, _, _ = _build(tail, hidden, mode)
            found = {name: t for name, (t, _) in
                     boundary_util.activation_quantizers(g).items()}
            # The same model tensors, named the same: the logits keep their range.
            self.assertEqual(found, expected, mode)
            self.assertEqual(boundary_util.range_variables(g),
                             boundary_util.range_variables(export_graph), mode)


class ActivationAfterConstantsTest(absltest.TestCase):
    """docs/known_limits.md: an activation of constant arithmetic is the model's."""

    def test_relu_margin_is_taken_for_the_model_and_restores_strictly(self):
        export_graph, _, _ = _build("mse_const", False, "export")
        export = boundary_util.range_variables(export_graph)
        for mode in ("train", "eval"):
            g = tf.Graph()
            with g.as_default():
                x = tf1.placeholder(tf.float32, [None, 6], name="input")
                loss = _relu_margin(_model(x, False))
                if mode == "train":
                    qat.experimental_create_training_graph(g)
                    tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
                else:
                    qat.experimental_create_eval_graph(g)
            found = boundary_util.activation_quantizers(g)
            self.assertEqual(found["model/logits/act_quant"][0], "model/logits/BiasAdd:0")
            self.assertIn("sub/act_quant", found)  # relu(1 - logits): a model's ReLU.
            self.assertContainsSubset(export, boundary_util.range_variables(g))


class StrictRestoreTest(tf.test.TestCase):

    def test_mse_const_checkpoint_restores_strictly_into_the_export_graph(self):
        """The issue's case: the logits' range is learnt on the logits, then restored."""
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        g, x, train_op = _build("mse_const", True, "train")
        batch = np.random.RandomState(0).uniform(-1, 1, [8, 6]).astype(np.float32)
        with g.as_default():
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                for _ in range(3):
                    sess.run(train_op, {x: batch})
                path = tf1.train.Saver().save(sess, os.path.join(workdir, "model"))
        g, x, _ = _build("mse_const", True, "export")
        with g.as_default(), tf1.Session() as sess:
            tf1.train.Saver().restore(sess, path)  # Strict: every variable.
            ranges = {v.op.name: v for v in tf1.global_variables()}
            low, high = sess.run([ranges["model/logits/act_quant/min"],
                                  ranges["model/logits/act_quant/max"]])
            logits = sess.run("model/logits/BiasAdd:0", {x: batch})
        # Learnt on the logits (not on `logits - 1`, a step lower): the range
        # of the batch it saw, up to three small weight updates.
        self.assertAllClose([low, high], [min(logits.min(), 0.0), max(logits.max(), 0.0)],
                            atol=0.3)


class TrailingArithmeticTest(parameterized.TestCase):
    """Constant arithmetic after the last layer: the model's only when an Identity names it."""

    def _quantizers(self, mode, named):
        def output(y):
            y = y * 3.0 + 0.5
            return tf.identity(y, name="predictions") if named else y
        # An export graph whose output nothing reads or names.
        g, _, _ = _build("mse_target", False, mode, output=output, name_output=False)
        return g, boundary_util.activation_quantizers(g)

    @parameterized.parameters("train", "eval", "export")
    def test_unnamed_stays_float_in_every_graph(self, mode):
        g, found = self._quantizers(mode, named=False)
        self.assertEqual(sorted(found), ["model/logits/act_quant", "model/logits/input_quant"])
        self.assertEqual(found["model/logits/act_quant"][0], "model/logits/BiasAdd:0")
        if mode == "export":  # Read by the output, not by a loss: named as left float.
            result = qat.insert_quant_ops(g, is_training=False)
            self.assertEqual([f.name for f in result.left_float], ["mul"])

    @parameterized.parameters("train", "eval", "export")
    def test_named_with_identity_is_the_models_in_every_graph(self, mode):
        _, found = self._quantizers(mode, named=True)
        self.assertEqual(sorted(found), ["add/add_quant", "model/logits/act_quant",
                                         "model/logits/input_quant", "mul/mul_quant"])


if __name__ == "__main__":
    absltest.main()
