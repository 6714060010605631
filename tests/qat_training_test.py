"""Quantization-aware training end to end on scikit-learn's 8x8 digits.

A small conv + batch norm + ReLU network trained with create_training_graph
reduces its loss. Fine-tuned with create_training_graph from the float
network's checkpoint (the contrib recipe), its eval graph (create_eval_graph,
restored from the QAT checkpoint) is within 1 point of accuracy of the float
network fine-tuned the same way without quantization, on held-out digits.
Two networks trained independently differ by up to ~2 points on this test
split from initialisation noise alone, so both start from the same float
weights and see the same batches.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import digits_util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

_STEPS = 400
_FINE_TUNE_STEPS = 200
_BATCH = 64


def _digits():
    return digits_util.digits_split()


def _network(training):
    x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1], name="x")
    labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
    h = x
    for i, (channels, stride) in enumerate(((16, 1), (32, 2))):
        h = tf.compat.v1.layers.conv2d(h, channels, 3, strides=stride,
                                       padding="same", use_bias=False,
                                       name="conv%d" % i)
        h = tf.compat.v1.layers.batch_normalization(
            h, training=training, momentum=0.9, name="bn%d" % i)
        h = tf.nn.relu(h)
    h = tf.reduce_mean(h, [1, 2])
    logits = tf.compat.v1.layers.dense(h, 10, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return x, labels, logits, loss


def _train(train_data, path, quantize, init_path=None):
    """Trains; returns (first losses, last losses) averaged over 20 steps.

    With `init_path`, starts from that float checkpoint (the variables the
    rewrite adds keep their initial values) and fine-tunes at a lower rate.
    """
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(1)
        x, labels, _, loss = _network(training=True)
        float_saver = tf.compat.v1.train.Saver()
        if quantize:
            qat.create_training_graph(g)
        learning_rate = 1e-2 if init_path is None else 1e-3
        with tf.control_dependencies(
                tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(loss)
        saver = tf.compat.v1.train.Saver()
        images, targets = train_data
        rng = np.random.RandomState(2)
        losses = []
        steps = _STEPS if init_path is None else _FINE_TUNE_STEPS
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            if init_path is not None:
                float_saver.restore(sess, init_path)
            for _ in range(steps):
                idx = rng.randint(0, len(targets), _BATCH)
                _, value = sess.run([train_op, loss],
                                    {x: images[idx], labels: targets[idx]})
                losses.append(value)
            saver.save(sess, path)
    return np.mean(losses[:20]), np.mean(losses[-20:])


def _accuracy(test_data, path, quantize):
    g = tf.Graph()
    with g.as_default():
        x, _, logits, _ = _network(training=False)
        if quantize:
            qat.create_eval_graph(g)
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, path)
            predicted = sess.run(logits, {x: test_data[0]}).argmax(axis=1)
    return 100.0 * np.mean(predicted == test_data[1])


class QatTrainingTest(absltest.TestCase):

    def test_qat_training_reduces_loss(self):
        train_data, _ = _digits()
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        first, last = _train(train_data, os.path.join(tmp, "qat"), True)
        print("QAT from scratch: loss %.3f -> %.3f" % (first, last))
        self.assertLess(last, 0.5 * first)

    def test_qat_fine_tuning_matches_float_accuracy(self):
        train_data, test_data = _digits()
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        pretrained = os.path.join(tmp, "pretrained")
        float_path = os.path.join(tmp, "float")
        qat_path = os.path.join(tmp, "qat")
        _train(train_data, pretrained, False)
        float_first, float_last = _train(train_data, float_path, False,
                                         init_path=pretrained)
        qat_first, qat_last = _train(train_data, qat_path, True,
                                     init_path=pretrained)
        float_acc = _accuracy(test_data, float_path, False)
        qat_acc = _accuracy(test_data, qat_path, True)
        print("float fine-tuning loss %.3f -> %.3f, accuracy %.2f%%; QAT "
              "fine-tuning loss "
              "%.3f -> %.3f, eval accuracy %.2f%%" % (
                  float_first, float_last, float_acc, qat_first, qat_last,
                  qat_acc))
        self.assertGreater(float_acc, 90.0)
        self.assertLessEqual(abs(qat_acc - float_acc), 1.0)


if __name__ == "__main__":
    absltest.main()
