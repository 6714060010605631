"""The zoo: real architectures and hand-built blocks, trained, restored, exported.

`run_case(name, workdir)` builds the training graph of one zoo model with
`experimental_create_training_graph(symmetric_weights=True)`, runs two
training steps, saves a checkpoint, builds the eval graph separately, restores
it with a plain strict `Saver().restore`, and exports uint8 and int8 TFLite
models twice: through `qat.export.export_tflite` and through TensorFlow's own
converter with the flags the README gives. Every model must be fully integer
and agree with the eval graph. Used by tests/zoo_test.py and
tools/bench_rewrite.py (`build_graph`).
"""
import dataclasses
import os
from typing import Callable, Dict, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
_APPS = keras.applications
layers = keras.layers


@dataclasses.dataclass(frozen=True)
class Case:
    build: Callable[[tf.Tensor], tf.Tensor]  # input -> logits (pre-softmax ok)
    size: Tuple[int, ...]                    # input shape without batch
    input_range: Tuple[float, float] = (0.0, 1.0)
    # Whether the eval graph's output (and TFLite's) differs between
    # examples after the two training steps; see _COLLAPSED.
    outputs_vary: bool = True


def _app(app, **kwargs):
    def build(x):
        # keras.Input(tensor=x) makes the placeholder a Keras tensor, so the
        # model is built on it once (MobileNetV3 refuses a plain tensor).
        model = app(input_tensor=keras.Input(tensor=x), weights=None,
                    classes=10, **kwargs)
        return model.output
    return build


def _hard_swish(x):
    return x * tf.nn.relu6(x + 3.0) * (1.0 / 6.0)


def _decoder(x):
    net = layers.Conv2D(8, 3, strides=2, padding="same", name="enc")(x)
    net = layers.ReLU(name="enc_relu")(net)
    for i, channels in enumerate((8, 4)):
        net = layers.Conv2DTranspose(channels, 3, strides=2, padding="same",
                                     name=f"dec{i}")(net)
        net = layers.BatchNormalization(name=f"dec{i}_bn")(net)
        net = layers.ReLU(name=f"dec{i}_relu")(net)
    net = layers.Flatten(name="flat")(net)
    return layers.Dense(10, name="logits")(net)


def _conv1d(x):
    net = layers.Reshape((x.shape[1] * x.shape[2], x.shape[3]), name="seq")(x)
    for i in range(2):
        net = layers.Conv1D(8, 3, padding="same", name=f"conv{i}")(net)
        net = layers.BatchNormalization(name=f"conv{i}_bn")(net)
        net = layers.ReLU(name=f"conv{i}_relu")(net)
    net = layers.GlobalAveragePooling1D(name="pool")(net)
    return layers.Dense(10, name="logits")(net)


def _leaky(x):
    net = layers.Conv2D(8, 3, padding="same", name="conv0")(x)
    net = layers.LeakyReLU(0.2, name="leaky0")(net)
    net = layers.Conv2D(8, 3, padding="same", name="conv1")(net)
    net = layers.BatchNormalization(name="conv1_bn")(net)
    net = layers.LeakyReLU(0.1, name="leaky1")(net)
    net = layers.Flatten(name="flat")(net)
    return layers.Dense(10, name="logits")(net)


def _dense_tanh_sigmoid(x):
    net = layers.Flatten(name="flat")(x)
    net = layers.Dense(16, activation="tanh", name="fc_tanh")(net)
    net = layers.Dense(16, activation="sigmoid", name="fc_sigmoid")(net)
    return layers.Dense(10, name="logits")(net)


def _hard_swish_se(x):
    net = layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv")(x)
    net = layers.BatchNormalization(name="conv_bn")(net)
    net = layers.Activation(_hard_swish, name="conv_hswish")(net)
    net = layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2,
                                 use_bias=False, name="dw")(net)
    net = layers.BatchNormalization(name="dw_bn")(net)
    net = layers.Activation(_hard_swish, name="dw_hswish")(net)
    se = layers.GlobalAveragePooling2D(keepdims=True, name="se_pool")(net)
    se = layers.Conv2D(8, 1, name="se_reduce")(se)
    se = layers.ReLU(name="se_relu")(se)
    se = layers.Conv2D(32, 1, name="se_expand")(se)
    se = layers.Activation("hard_sigmoid", name="se_gate")(se)
    net = layers.Multiply(name="se_mul")([net, se])
    net = layers.Conv2D(16, 1, use_bias=False, name="project")(net)
    net = layers.BatchNormalization(name="project_bn")(net)
    net = layers.Activation("swish", name="project_swish")(net)
    net = layers.GlobalAveragePooling2D(name="pool")(net)
    return layers.Dense(10, name="logits")(net)


# Models whose eval graph gives every example the same output after two
# training steps. Their eval batch norms use moving statistics that two steps
# (momentum 0.99 or 0.999) leave near their initial mean 0, variance 1, while
# the activation ranges were taken from the batch-normalised training
# activations: in eval mode the activations shrink from layer to layer until
# they are under half a quantization step and round to zero, and the rest of
# the network computes a constant (MobileNet: from its fifth conv on;
# EfficientNetB0: eval activations 10-30 times smaller than their ranges;
# InceptionV3: only its logits, every one of them rounding to zero).
_COLLAPSED = {"outputs_vary": False}

CASES: Dict[str, Case] = {
    "mobilenet": Case(_app(_APPS.MobileNet), (32, 32, 3), **_COLLAPSED),
    "mobilenet_v2": Case(_app(_APPS.MobileNetV2), (32, 32, 3), **_COLLAPSED),
    "mobilenet_v3_small": Case(_app(_APPS.MobileNetV3Small), (32, 32, 3),
                               (0.0, 255.0), **_COLLAPSED),
    "mobilenet_v3_large": Case(_app(_APPS.MobileNetV3Large), (32, 32, 3),
                               (0.0, 255.0), **_COLLAPSED),
    "resnet50": Case(_app(_APPS.ResNet50), (32, 32, 3)),
    "resnet50_v2": Case(_app(_APPS.ResNet50V2), (32, 32, 3)),
    "inception_v3": Case(_app(_APPS.InceptionV3), (75, 75, 3), **_COLLAPSED),
    "densenet121": Case(_app(_APPS.DenseNet121), (32, 32, 3)),
    "efficientnet_b0": Case(_app(_APPS.EfficientNetB0), (32, 32, 3),
                            (0.0, 255.0), **_COLLAPSED),
    # No global pooling and inputs in [0, 4] date from activation ranges that
    # started at [-6, 6]; kept, the case feeds an input range other than
    # [0, 1] and [0, 255] through the converter flags.
    "conv_transpose_decoder": Case(_decoder, (16, 16, 3), (0.0, 4.0)),
    "conv1d": Case(_conv1d, (4, 8, 3)),
    "conv_leaky_relu": Case(_leaky, (8, 8, 3)),
    "dense_tanh_sigmoid": Case(_dense_tanh_sigmoid, (8, 8, 3)),
    "hard_swish_squeeze_excite": Case(_hard_swish_se, (16, 16, 3)),
}


def build_graph(name: str, training: bool, batch=None):
    """Builds one zoo model in a new graph; returns (graph, input, output).

    The output is `tf.identity(<model output>, name="output")`.
    """
    case = CASES[name]
    g = tf.Graph()
    with g.as_default():
        # tf_keras draws each unseeded initializer's seed from Python's
        # `random`, which a graph seed alone leaves free: seed everything, so
        # every run builds the same weights.
        keras.utils.set_random_seed(0)
        # A fixed learning phase keeps batch norms out of functional If ops.
        keras.backend.set_learning_phase(1 if training else 0)
        x = tf1.placeholder(tf.float32, (batch,) + case.size, name="input")
        y = tf.identity(case.build(x), name="output")
    return g, x, y


def make_inputs(name: str, n: int, seed: int = 0) -> np.ndarray:
    case = CASES[name]
    lo, hi = case.input_range
    rng = np.random.RandomState(seed)
    # Each example gets its own contrast: i.i.d. noise alone gives every
    # example the same global statistics, so after global pooling (and the
    # barely trained ranges of two steps) every output would be the same.
    contrast = np.linspace(0.2, 1.0, n).reshape((n,) + (1,) * len(case.size))
    noise = rng.uniform(0.0, 1.0, (n,) + case.size)
    return (lo + (hi - lo) * contrast * noise).astype(np.float32)


def train_two_steps(name: str, checkpoint: str, batch: int = 2):
    """Training graph, two steps; returns the two losses."""
    g, x, y = build_graph(name, training=True)
    with g.as_default():
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        logits = y
        if y.op.inputs[0].op.type == "Softmax":  # keras apps end in softmax
            logits = y.op.inputs[0].op.inputs[0]
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        qat.experimental_create_training_graph(g, symmetric_weights=True)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.AdamOptimizer(1e-4).minimize(loss)
        saver = tf1.train.Saver()
        losses = []
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for step in range(2):
                feed = {x: make_inputs(name, batch, seed=step),
                        labels: np.arange(batch) % 10}
                losses.append(sess.run([train_op, loss], feed)[1])
            saver.save(sess, checkpoint)
    return losses


def eval_session(name: str, checkpoint: str):
    """Eval graph restored with a plain, strict Saver; returns (sess, x, y)."""
    g, x, y = build_graph(name, training=False)
    with g.as_default():
        qat.experimental_create_eval_graph(g, symmetric_weights=True)
        sess = tf1.Session(graph=g)
        tf1.train.Saver().restore(sess, checkpoint)
    return sess, x, y


def convert_with_tf(sess, x, y, flavour: str, input_range) -> bytes:
    """TensorFlow's own converter with the README's flags (no qat.export)."""
    frozen = tf1.graph_util.convert_variables_to_constants(
        sess, sess.graph.as_graph_def(), [y.op.name])
    g = tf.Graph()
    with g.as_default():
        tf.import_graph_def(frozen, name="")
        with tf1.Session(graph=g) as frozen_sess:
            converter = tf1.lite.TFLiteConverter.from_session(
                frozen_sess, [g.get_tensor_by_name(x.name)],
                [g.get_tensor_by_name(y.name)])
    lo, hi = input_range
    std = 255.0 / (hi - lo)
    mean = -lo * std
    if flavour == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.inference_type = tf.int8
        mean -= 128.0
    else:
        converter.inference_type = tf.uint8
    converter.quantized_input_stats = {x.op.name: (mean, std)}
    return converter.convert()
