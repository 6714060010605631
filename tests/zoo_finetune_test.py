"""Fine-tuning the zoo's blocks on the 8x8 digits: int8 TFLite matches float.

Three networks, one per block the tensor-centric plan exists for:
hard-swish + squeeze-excite, swish, and a transposed-conv decoder block.
Each is trained in float, then fine-tuned from that checkpoint twice with the
same batches: in float, and with quantization-aware training
(`experimental_create_training_graph(symmetric_weights=True)`). The QAT eval
graph exports to a fully integer int8 TFLite model whose accuracy on the
held-out digits is within 1 point of the float fine-tuned network.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import digits_util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1

_STEPS = 300
_FINE_TUNE_STEPS = 200
_BATCH = 64


def _digits():
    return digits_util.digits_split()


def _conv_bn(h, channels, name, training, stride=1, transposed=False):
    layer = tf1.layers.conv2d_transpose if transposed else tf1.layers.conv2d
    h = layer(h, channels, 3, strides=stride, padding="same", use_bias=False,
              name=name)
    return tf1.layers.batch_normalization(h, training=training, momentum=0.9,
                                          name=name + "_bn")


def _hard_swish(x):
    return x * tf.nn.relu6(x + 3.0) * (1.0 / 6.0)


def _hard_swish_se(x, training):
    h = _hard_swish(_conv_bn(x, 16, "conv0", training))
    se = tf.reduce_mean(h, [1, 2], keepdims=True)
    se = tf.nn.relu(tf1.layers.conv2d(se, 4, 1, name="se_reduce"))
    se = tf1.layers.conv2d(se, 16, 1, name="se_expand")
    h = h * (tf.nn.relu6(se + 3.0) * (1.0 / 6.0))
    return _hard_swish(_conv_bn(h, 32, "conv1", training, stride=2))


def _swish(x, training):
    h = tf.nn.silu(_conv_bn(x, 16, "conv0", training))
    return tf.nn.silu(_conv_bn(h, 32, "conv1", training, stride=2))


def _transposed(x, training):
    h = tf.nn.relu(_conv_bn(x, 16, "down", training, stride=2))
    h = tf.nn.relu(_conv_bn(h, 16, "up", training, stride=2, transposed=True))
    return tf.nn.relu(_conv_bn(h, 32, "conv", training, stride=2))


_BLOCKS = {"hard_swish_squeeze_excite": _hard_swish_se, "swish": _swish,
           "transposed_conv": _transposed}


def _network(block, training):
    x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="x")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    h = tf.reduce_mean(_BLOCKS[block](x, training), [1, 2])
    logits = tf.identity(tf1.layers.dense(h, 10, name="logits"), name="output")
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    return x, labels, logits, loss


def _train(block, train_data, path, quantize, init_path=None):
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(1)
        x, labels, _, loss = _network(block, training=True)
        float_saver = tf1.train.Saver()
        if quantize:
            qat.experimental_create_training_graph(g, symmetric_weights=True)
        rate = 1e-2 if init_path is None else 1e-3
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.AdamOptimizer(rate).minimize(loss)
        saver = tf1.train.Saver()
        images, targets = train_data
        rng = np.random.RandomState(2)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            if init_path is not None:
                float_saver.restore(sess, init_path)
            for _ in range(_STEPS if init_path is None else _FINE_TUNE_STEPS):
                idx = rng.randint(0, len(targets), _BATCH)
                sess.run(train_op, {x: images[idx], labels: targets[idx]})
            saver.save(sess, path)


def _eval_session(block, path, quantize):
    g = tf.Graph()
    with g.as_default():
        x, _, logits, _ = _network(block, training=False)
        if quantize:
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
        sess = tf1.Session(graph=g)
        tf1.train.Saver().restore(sess, path)
    return sess, x, logits


class ZooFineTuneTest(parameterized.TestCase):

    @parameterized.named_parameters(*[(b, b) for b in _BLOCKS])
    def test_int8_tflite_within_one_point_of_float(self, block):
        train_data, (images, targets) = _digits()
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        pretrained = os.path.join(tmp, "pretrained", "model")
        float_path = os.path.join(tmp, "float", "model")
        qat_path = os.path.join(tmp, "qat", "model")
        _train(block, train_data, pretrained, False)
        _train(block, train_data, float_path, False, init_path=pretrained)
        _train(block, train_data, qat_path, True, init_path=pretrained)
        sess, x, logits = _eval_session(block, float_path, False)
        with sess:
            float_acc = 100.0 * np.mean(
                sess.run(logits, {x: images}).argmax(1) == targets)
        sess, x, logits = _eval_session(block, qat_path, True)
        with sess:
            models = export.export_tflite(
                [x.name], [logits.name], tmp, sess=sess, flavours=("int8",),
                input_ranges={x.op.name: (0.0, 1.0)})
        lite = export.run_tflite(models["int8"].model, images)
        int8_acc = 100.0 * np.mean(lite.argmax(1) == targets)
        print("%s: float %.2f%%, TFLite int8 %.2f%%" % (block, float_acc,
                                                        int8_acc))
        self.assertGreater(float_acc, 90.0)
        self.assertGreaterEqual(int8_acc, float_acc - 1.0)


if __name__ == "__main__":
    absltest.main()
