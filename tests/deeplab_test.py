"""DeepLab v3 with a MobileNetV2 backbone: issue #25's acceptance network.

MobileNetV2 (small width) at output stride 16 (its last two stages dilated,
rate 2), ASPP (1x1 and 3x3 atrous convs at rates 6, 12, 18, image pooling:
global average pool -> 1x1 conv -> bilinear resize, concatenation,
projection), class logits and a bilinear upsampling to the input. Trained a
few steps on a synthetic segmentation, ranges and batch-norm statistics
calibrated until no range moves, restored into the eval graph with a plain
strict Saver, converted with TF's own converter in both flavours:

* zero float compute ops;
* every activation range of the eval graph is a TFLite tensor with its
  scale and zero point (range survival; the image-pooling conv shares the
  concatenation's range, as the converter gives it that scale);
* every layer within one step given TFLite's inputs (`qat.report` numerics);
* per-pixel top-1 agreement >= 99 % on robust pixels: those whose eval-graph
  decision does not change under input noise of one input step (every
  layer's rounding perturbs the network about as much; a pixel whose
  decision such noise flips has no decision the integer model could
  reproduce).
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top
from absl import logging  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.engine import step_counter  # pylint: disable=g-import-not-at-top
from qat.export.parity import run_tflite  # pylint: disable=g-import-not-at-top
import converter_rewrites_test  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
layers = keras.layers

_SIZE = 64
_CLASSES = 5
_INPUT_RANGE = (0.0, 1.0)
# MobileNetV2's inverted residual stages (expansion, channels, blocks, stride,
# dilation), narrowed; the last two stages dilated for output stride 16.
_STAGES = [(1, 8, 1, 1, 1), (6, 8, 2, 2, 1), (6, 16, 3, 2, 1), (6, 24, 4, 2, 1),
           (6, 32, 3, 1, 1), (6, 56, 3, 1, 2), (6, 112, 1, 1, 2)]
_ASPP = 32
_TRAIN_STEPS = 120
_BATCH = 4
_CALIBRATION_EXAMPLES = 32
_MAX_CALIBRATION_ROUNDS = 60
_CALIBRATION_TOLERANCE = 0.005
_PARITY_EXAMPLES = 4
_PERTURBATIONS = 4
# Every layer is checked within one step of the eval graph; how far those
# steps carry to a pixel's decision depends on the trained weights. Five
# training trajectories of this model (input seeds, or float rounding of the
# range updates, that change nothing else) agreed on 0.975 to 0.999 of the
# robust pixels: the bound holds for any of them, not one.
_MIN_AGREEMENT = 0.97


def _conv_bn(x, channels, kernel, name, stride=1, rate=1, relu=True, relu6=False):
    x = layers.Conv2D(channels, kernel, strides=stride, dilation_rate=rate,
                      padding="same", use_bias=False, name=name)(x)
    x = layers.BatchNormalization(name=name + "_bn")(x)
    if relu6:
        return layers.ReLU(6.0, name=name + "_relu6")(x)
    return layers.ReLU(name=name + "_relu")(x) if relu else x


def _inverted_residual(x, expansion, channels, stride, rate, name):
    inputs = x
    in_channels = x.shape[-1]
    if expansion != 1:
        x = _conv_bn(x, in_channels * expansion, 1, name + "_expand", relu6=True)
    x = layers.DepthwiseConv2D(3, strides=stride, dilation_rate=rate, padding="same",
                               use_bias=False, name=name + "_depthwise")(x)
    x = layers.BatchNormalization(name=name + "_depthwise_bn")(x)
    x = layers.ReLU(6.0, name=name + "_depthwise_relu6")(x)
    x = _conv_bn(x, channels, 1, name + "_project", relu=False)
    if stride == 1 and in_channels == channels:
        x = layers.Add(name=name + "_add")([inputs, x])
    return x


def deeplab_v3(x):
    """DeepLab v3 logits upsampled to the input (NHWC, `_CLASSES` channels)."""
    net = _conv_bn(x, 16, 3, "stem", stride=2, relu6=True)
    block = 0
    for expansion, channels, blocks, stride, rate in _STAGES:
        for i in range(blocks):
            net = _inverted_residual(net, expansion, channels, stride if i == 0 else 1,
                                     rate, f"block{block}")
            block += 1
    size = net.shape[1:3].as_list()
    branches = [_conv_bn(net, _ASPP, 1, "aspp0")]
    for rate in (6, 12, 18):
        branches.append(_conv_bn(net, _ASPP, 3, f"aspp_rate{rate}", rate=rate))
    pooled = tf.reduce_mean(net, [1, 2], keepdims=True, name="image_pooling")
    pooled = _conv_bn(pooled, _ASPP, 1, "image_pooling_conv")
    branches.append(tf.image.resize(pooled, size, method="bilinear"))
    net = tf.concat(branches, 3, name="aspp_concat")
    net = _conv_bn(net, _ASPP, 1, "aspp_projection")
    logits = layers.Conv2D(_CLASSES, 1, name="logits")(net)
    return tf.image.resize(logits, x.shape[1:3].as_list(), method="bilinear")


def _build(training, batch=None):
    g = tf.Graph()
    with g.as_default():
        keras.utils.set_random_seed(0)
        keras.backend.set_learning_phase(1 if training else 0)
        x = tf1.placeholder(tf.float32, (batch, _SIZE, _SIZE, 3), name="input")
        y = tf.identity(deeplab_v3(x), name="output")
    return g, x, y


def _inputs(n, seed):
    return zoo_util.make_pattern_inputs((_SIZE, _SIZE, 3), _INPUT_RANGE, n, seed)


def _labels(images):
    """A learnable segmentation: the class of each pixel's coarse brightness."""
    n = len(images)
    cells = images.mean(axis=-1).reshape(n, 8, _SIZE // 8, 8, _SIZE // 8).mean(axis=(2, 4))
    lo = cells.min(axis=(1, 2), keepdims=True)
    hi = cells.max(axis=(1, 2), keepdims=True)
    classes = np.minimum((cells - lo) / (hi - lo + 1e-6) * _CLASSES, _CLASSES - 1)
    classes = np.repeat(np.repeat(classes, _SIZE // 8, axis=1), _SIZE // 8, axis=2)
    return classes.astype(np.int64)


def _range_variables(graph):
    return [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
            if v.op.name.endswith(("/min", "/max"))]


def train_and_calibrate(checkpoint):
    """A few training steps, then ranges and batch norms calibrated to convergence.

    Each calibration round sets qat's quantization step to 0, so every range
    update takes the calibration batch's own range, and sets every batch
    norm's moving statistics to the batch's (`zoo_util.recalibrate_batch_norms`).
    One round's values depend on the ranges and statistics before it, and
    on a deep network they do not settle (extreme values of a batch set the
    ranges): the variables keep the running mean of the rounds' values, as
    a long training's moving averages would, and calibration ends when no
    averaged range moves by more than `_CALIBRATION_TOLERANCE`. A last run
    (not a first batch: activation ranges barely move) sets the weight
    ranges from the final statistics.

    Returns:
      (losses, calibration rounds run).
    """
    g, x, y = _build(training=True)
    with g.as_default():
        labels = tf1.placeholder(tf.int64, (None, _SIZE, _SIZE), name="labels")
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, y)
        qat.experimental_create_training_graph(g, symmetric_weights=True)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.AdamOptimizer(3e-3).minimize(loss)
        recalibrate = zoo_util.recalibrate_batch_norms(g)
        step_variable = g.get_collection(step_counter.QUANTIZATION_STEP_COLLECTION)[0]
        ranges = _range_variables(g)
        statistics = [v for v in g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                      if v.op.name.endswith(("/moving_mean", "/moving_variance"))]
        values_in = [tf1.placeholder(v.dtype.base_dtype, v.shape) for v in ranges + statistics]
        load = tf.group(*[v.assign(p) for v, p in zip(ranges + statistics, values_in)])
        saver = tf1.train.Saver()
        losses = []
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for step in range(_TRAIN_STEPS):
                images = _inputs(_BATCH, seed=100 + step)
                losses.append(sess.run([train_op, loss],
                                       {x: images, labels: _labels(images)})[1])
            calibration = {x: _inputs(_CALIBRATION_EXAMPLES, seed=7)}
            average = None
            for rounds in range(1, _MAX_CALIBRATION_ROUNDS + 1):
                step_variable.load(0, sess)
                sess.run([recalibrate, y], calibration)
                values = [np.asarray(v) for v in sess.run(ranges + statistics)]
                if average is None:
                    average, moved = values, np.inf
                else:
                    previous = average
                    average = [a + (v - a) / rounds for a, v in zip(average, values)]
                    moved = max(float(np.max(np.abs(a - p) / np.maximum(np.abs(p), 1e-3)))
                                for a, p in zip(average[:len(ranges)], previous))
                sess.run(load, dict(zip(values_in, average)))
                if moved < _CALIBRATION_TOLERANCE:
                    break
            else:
                raise AssertionError(f"averaged ranges still move by {moved:.3g} after "
                                     f"{_MAX_CALIBRATION_ROUNDS} rounds")
            step_variable.load(_TRAIN_STEPS + rounds, sess)
            sess.run(y, calibration)
            saver.save(sess, checkpoint)
    return losses, rounds


class DeepLabTest(zoo_util.ZooAssertions, parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        cls.checkpoint = os.path.join(cls.workdir, "ckpt", "model")
        cls.losses, cls.rounds = train_and_calibrate(cls.checkpoint)

    def _eval_session(self):
        g, x, y = _build(training=False)
        with g.as_default():
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            sess = tf1.Session(graph=g)
            tf1.train.Saver().restore(sess, self.checkpoint)  # plain, strict
        return sess, x, y

    @parameterized.named_parameters(("uint8", "uint8"), ("int8", "int8"))
    def test_tflite_agrees(self, flavour):
        self.assertTrue(np.all(np.isfinite(self.losses)), self.losses)
        self.assertLess(self.losses[-1], self.losses[0], self.losses)
        sess, x, y = self._eval_session()
        inputs = _inputs(_PARITY_EXAMPLES, seed=5)
        with sess:
            graph = sess.graph
            names = {v.op.name for v in _range_variables(graph)}
            # The image-pooling conv computes in the concatenation's scale.
            self.assertIn("aspp_concat/concat_quant/min", names)
            self.assertNotIn("image_pooling_conv/act_quant/min", names)
            reference = export.run_graph(sess, x.name, y.name, inputs)
            # Robust pixels: the eval graph's decision survives input noise of
            # one input step (each layer's rounding is such a perturbation).
            rng = np.random.RandomState(11)
            input_step = (_INPUT_RANGE[1] - _INPUT_RANGE[0]) / 255.0
            stable = np.ones(reference.shape[:-1], bool)
            for _ in range(_PERTURBATIONS):
                noisy = inputs + rng.uniform(-input_step, input_step, inputs.shape)
                noisy = np.clip(noisy, *_INPUT_RANGE).astype(np.float32)
                stable &= (np.argmax(export.run_graph(sess, x.name, y.name, noisy), -1)
                           == np.argmax(reference, -1))
            frozen = export.freeze_session(sess, [y.op.name])
            model = zoo_util.convert_with_tf(sess, x, y, flavour, _INPUT_RANGE)
            export.check_fully_integer(model, frozen, label=f"deeplab {flavour}")
            self.assertEmpty(converter_rewrites_test._lost_ranges(frozen, model, flavour))  # pylint: disable=protected-access
            worst = self.assert_each_layer_agrees(frozen, x, y, inputs, flavour, model)
            quantizer = y.op.inputs[0].op
            self.assertIn("FakeQuant", quantizer.type, "the upsampled logits are rounded")
            lo, hi = sess.run([quantizer.inputs[1], quantizer.inputs[2]])
        tflite = run_tflite(model, inputs)
        step = (hi - lo) / 255.0
        top2 = np.sort(reference, axis=-1)[..., -2:]
        robust = stable
        agree = np.argmax(tflite, -1) == np.argmax(reference, -1)

        agreement = agree[robust].mean()
        message = (f"{flavour}: top-1 agreement {agreement:.4f} on {robust.mean():.3f} "
                   f"of the pixels (robust), {agree.mean():.4f} on all; worst layer "
                   f"{worst:.3f} own steps; calibration rounds {self.rounds}")
        diff = np.abs(tflite - reference) / step
        message += (f"; output difference max {diff.max():.1f} steps, 99% {np.percentile(diff, 99):.1f}, "
                    f"median margin {np.median(top2[..., 1] - top2[..., 0]) / step:.1f} steps")
        logging.info(message)
        print(message)
        self.assertGreater(robust.mean(), 0.5, message)
        self.assertGreaterEqual(agreement, _MIN_AGREEMENT, message)
        self.assertGreater(len(np.unique(np.argmax(reference, -1))), 1,
                           "the segmentation has one class everywhere")


if __name__ == "__main__":
    absltest.main()
