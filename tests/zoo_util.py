"""The zoo: real architectures and hand-built blocks, trained, restored, exported.

`CASES` names each model; `build_graph` builds one in a new graph,
`train_two_steps` trains it for two steps with
`experimental_create_training_graph(symmetric_weights=True)` and saves a
checkpoint (batch norms recalibrated), `eval_session` restores that
checkpoint into a separately built eval graph with a plain strict
`Saver().restore`, `convert_with_tf` converts with TensorFlow's own converter
and the flags of docs/int8_export.md, and `layer_agreement` compares a TFLite model with the
eval graph layer by layer. `make_pattern_inputs` and `recalibrate_batch_norms`
work on any model (`calibration_util.calibrate_to_convergence` too). Used by
tests/zoo_test.py and tests/slim_nets_test.py.
"""
import dataclasses
import math
import os
from typing import Callable, Dict, List, Optional, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
from qat.engine import marks  # pylint: disable=g-import-not-at-top
from qat.quantize.plan.ops import patterns as quantize_patterns  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
_APPS = keras.applications
layers = keras.layers


@dataclasses.dataclass(frozen=True)
class Case:
    build: Callable[[tf.Tensor], tf.Tensor]  # input -> logits (pre-softmax ok)
    size: Tuple[int, ...]                    # input shape without batch
    input_range: Tuple[float, float] = (0.0, 1.0)
    # Whether the eval graph's output (and TFLite's) differs between
    # examples after the two training steps; see _NEARLY_CONSTANT.
    outputs_vary: bool = True
    # TFLite flavours the model converts to (uint8 has no RSQRT kernel).
    flavours: Tuple[str, ...] = ("uint8", "int8")
    # Largest TFLite - eval graph output difference allowed, in output steps
    # (tests/zoo_test.py; None: its default).
    max_output_steps: Optional[float] = None


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


def _concat_branches(x):
    """Branches with different ranges into a concatenation (issue #21).

    A small-weight ReLU branch, a large-weight signed branch, an
    average-pooled, bilinearly upsampled branch (its resize output a
    concatenation input) and a max pool -> average pool -> conv branch (the
    average pool reads its range through the max pool, so it is not rounded:
    rounded, the converter left the max pool's other readers in float); an
    average pool after the concatenation.
    """
    small = keras.initializers.RandomUniform(-0.1, 0.1, seed=1)
    large = keras.initializers.RandomUniform(-1.0, 1.0, seed=2)
    a = layers.Conv2D(4, 3, padding="same", kernel_initializer=small, name="branch_a")(x)
    a = layers.ReLU(name="branch_a_relu")(a)
    b = layers.Conv2D(4, 3, padding="same", kernel_initializer=large, name="branch_b")(x)
    c = layers.AveragePooling2D(2, name="branch_c_pool")(x)
    c = layers.Conv2D(4, 1, name="branch_c")(c)
    c = layers.UpSampling2D(2, interpolation="bilinear", name="branch_c_up")(c)
    d = layers.MaxPooling2D(3, strides=1, padding="same", name="branch_d_max")(x)
    d = layers.AveragePooling2D(3, strides=1, padding="same", name="branch_d_pool")(d)
    d = layers.Conv2D(4, 1, name="branch_d")(d)
    e = layers.Conv2D(4, 1, name="branch_e")(
        layers.MaxPooling2D(3, strides=1, padding="same", name="branch_e_max")(x))
    net = layers.Concatenate(name="cat")([a, b, c, d, e])
    net = layers.AveragePooling2D(2, name="pool")(net)
    net = layers.Conv2D(8, 1, name="head")(net)
    net = layers.Flatten(name="flat")(net)
    return layers.Dense(10, name="logits")(net)


def _dense_chain(x):
    """DenseNet's pattern: each concatenation reads the last; transitions pool."""
    net = layers.Conv2D(8, 3, padding="same", use_bias=False, name="stem")(x)
    net = layers.BatchNormalization(name="stem_bn")(net)
    net = layers.ReLU(name="stem_relu")(net)
    for block in range(2):
        for i in range(3):
            y = layers.BatchNormalization(name=f"b{block}_{i}_bn")(net)
            y = layers.ReLU(name=f"b{block}_{i}_relu")(y)
            y = layers.Conv2D(4, 3, padding="same", use_bias=False,
                              name=f"b{block}_{i}_conv")(y)
            net = layers.Concatenate(name=f"b{block}_{i}_cat")([net, y])
        net = layers.BatchNormalization(name=f"t{block}_bn")(net)
        net = layers.ReLU(name=f"t{block}_relu")(net)
        net = layers.Conv2D(8, 1, use_bias=False, name=f"t{block}_conv")(net)
        net = layers.AveragePooling2D(2, name=f"t{block}_pool")(net)
    net = layers.GlobalAveragePooling2D(name="gap")(net)
    return layers.Dense(10, name="logits")(net)


# Models whose outputs barely differ between examples. `train_two_steps`
# recalibrates the batch norms, so no activation collapses to zero any more
# (before, two steps left the moving statistics at their initial values and
# every layer from MobileNet's fifth conv on computed a constant), but the
# MobileNets' softmax, after two steps from random weights, gives nearly the
# same probabilities to every input: the eval graph's outputs differ between
# examples by under 0.3 output steps (1/256), so TFLite's differ by one step
# or not at all, which says little. Their layers are compared one by one
# (`layer_agreement`).
_NEARLY_CONSTANT = {"outputs_vary": False}

CASES: Dict[str, Case] = {
    # 32x32: MobileNet's last feature maps are 1x1, so its global average pool
    # is a mean over a 1x1 map, which TF's converter removes (issue #25).
    "mobilenet": Case(_app(_APPS.MobileNet), (32, 32, 3), **_NEARLY_CONSTANT),
    "mobilenet_v2": Case(_app(_APPS.MobileNetV2), (32, 32, 3), **_NEARLY_CONSTANT),
    "mobilenet_v3_small": Case(_app(_APPS.MobileNetV3Small), (32, 32, 3),
                               (0.0, 255.0), **_NEARLY_CONSTANT),
    "mobilenet_v3_large": Case(_app(_APPS.MobileNetV3Large), (32, 32, 3),
                               (0.0, 255.0), **_NEARLY_CONSTANT),
    # Logits as the output (no softmax), as many TFLite exports are: the
    # 1x1-conv classifier head, read by a Reshape, is the model output.
    "mobilenet_logits": Case(_app(_APPS.MobileNet, classifier_activation=None),
                             (32, 32, 3), **_NEARLY_CONSTANT),
    "mobilenet_v3_small_logits": Case(
        _app(_APPS.MobileNetV3Small, classifier_activation=None), (32, 32, 3),
        (0.0, 255.0)),
    "mobilenet_v3_large_logits": Case(
        _app(_APPS.MobileNetV3Large, classifier_activation=None), (32, 32, 3),
        (0.0, 255.0)),
    # Logits outputs (classifier_activation=None) of the models above
    # (issue #25's acceptance).
    "mobilenet_v2_logits": Case(_app(_APPS.MobileNetV2, classifier_activation=None),
                                (32, 32, 3)),
    "efficientnet_b0_logits": Case(_app(_APPS.EfficientNetB0, classifier_activation=None),
                                   (32, 32, 3), (0.0, 255.0)),
    "resnet50_logits": Case(_app(_APPS.ResNet50, classifier_activation=None), (32, 32, 3)),
    "resnet50": Case(_app(_APPS.ResNet50), (32, 32, 3)),
    "resnet50_v2": Case(_app(_APPS.ResNet50V2), (32, 32, 3)),
    # Measured with shared concatenation ranges (README "The zoo"): 0.72 /
    # 1.14 output steps (uint8 / int8).
    "inception_v3": Case(_app(_APPS.InceptionV3), (75, 75, 3), max_output_steps=4.0),
    # 18.50 / 32.29: each dense block's concatenations share one range (the
    # last one's, TFLite's one scale), whose steps the pre-activation batch
    # norms after each concatenation amplify.
    "densenet121": Case(_app(_APPS.DenseNet121), (32, 32, 3), max_output_steps=48.0),
    "efficientnet_b0": Case(_app(_APPS.EfficientNetB0), (32, 32, 3),
                            (0.0, 255.0)),
    # No global pooling and inputs in [0, 4] date from activation ranges that
    # started at [-6, 6]; kept, the case feeds an input range other than
    # [0, 1] and [0, 255] through the converter flags.
    "conv_transpose_decoder": Case(_decoder, (16, 16, 3), (0.0, 4.0)),
    "conv1d": Case(_conv1d, (4, 8, 3)),
    "conv_leaky_relu": Case(_leaky, (8, 8, 3)),
    "dense_tanh_sigmoid": Case(_dense_tanh_sigmoid, (8, 8, 3)),
    "hard_swish_squeeze_excite": Case(_hard_swish_se, (16, 16, 3)),
    "concat_branches": Case(_concat_branches, (8, 8, 3), max_output_steps=16.0),  # 4 / 10
    "dense_chain": Case(_dense_chain, (16, 16, 3), max_output_steps=8.0),  # 3 / 5
}


# Cases outside the zoo (tests/arch_cases.py) that the helpers below accept by
# name; tests/zoo_test.py runs `CASES` only.
EXTRA_CASES: Dict[str, Case] = {}


def case_of(name: str) -> Case:
    """The case called `name`, from `CASES` or `EXTRA_CASES`."""
    return CASES[name] if name in CASES else EXTRA_CASES[name]


def build_graph(name: str, training: bool, batch=None):
    """Builds one zoo model in a new graph; returns (graph, input, output).

    The output is `tf.identity(<model output>, name="output")`.
    """
    case = case_of(name)
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
    """n examples in the case's input range, each with its own layout.

    I.i.d. noise alone gives every example the same statistics: a randomly
    initialised network (two training steps) maps them all to nearly the
    same deep features, and quantization to one output. So each example
    is half noise, half a coarse random pattern (4 cells along each
    spatial axis), scaled by a contrast of its own.
    """
    case = case_of(name)
    return make_pattern_inputs(case.size, case.input_range, n, seed)


def make_pattern_inputs(shape: Tuple[int, ...], input_range: Tuple[float, float],
                        n: int, seed: int = 0) -> np.ndarray:
    """`make_inputs` for any input shape (without batch) and range."""
    lo, hi = input_range
    rng = np.random.RandomState(seed)
    contrast = np.linspace(0.2, 1.0, n).reshape((n,) + (1,) * len(shape))
    noise = rng.uniform(0.0, 1.0, (n,) + shape)
    coarse = rng.uniform(0.0, 1.0, (n,) + tuple(min(d, 4) for d in shape[:-1])
                         + shape[-1:])
    for axis, size in enumerate(shape[:-1], start=1):
        coarse = np.repeat(coarse, -(-size // coarse.shape[axis]), axis=axis)
        coarse = coarse.take(np.arange(size), axis=axis)
    pattern = 0.5 * coarse + 0.5 * noise
    return (lo + (hi - lo) * contrast * pattern).astype(np.float32)


def train_two_steps(name: str, checkpoint: str, batch: int = 2):
    """Training graph, two steps, batch norms recalibrated; returns the two losses."""
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
        recalibrate = recalibrate_batch_norms(g)
        saver = tf1.train.Saver()
        losses = []
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for step in range(2):
                feed = {x: make_inputs(name, batch, seed=step),
                        labels: np.arange(batch) % 10}
                losses.append(sess.run([train_op, loss], feed)[1])
            # Not calibration_util's converged one: see "One-shot calibration" below.
            sess.run(recalibrate, {x: make_inputs(name, _CALIBRATION_EXAMPLES, seed=2)})
            saver.save(sess, checkpoint)
    return losses


# One-shot calibration: zoo_test and slim_nets_test recalibrate the batch norms once
# (`recalibrate_batch_norms`) and keep the ranges of the two training steps:
# `calibration_util.calibrate_to_convergence` makes their end-to-end
# differences larger, not smaller. With ranges that fit the eval graph's activations, the
# quantization error of these two-step random networks (per-tensor folded
# weights) reaches the output: QAT-vs-float SQNR falls to 0 dB by the last
# stage, MobileNetV2's output (softmax) then differs by 116 output steps
# instead of 0.73, ResNet v2 50 (int8, TF-Slim) by 87 instead of 61. The
# per-layer checks (every layer within one step given TFLite's inputs) stay
# the precise ones.

# Examples of the batch the moving statistics are recalibrated on.
_CALIBRATION_EXAMPLES = 8


def recalibrate_batch_norms(graph: tf.Graph) -> tf.Operation:
    """Sets every training batch norm's moving mean and variance to its batch's.

    Two training steps leave the moving statistics near their initial mean 0,
    variance 1 (momentum 0.99 or 0.999), while the activation ranges were
    taken from the batch-normalised training activations. In eval mode the
    activations then shrink from layer to layer until they round to zero and
    the network computes a constant: parity would hold trivially. Assigning
    the batch statistics of one calibration batch (as after a long training)
    makes the eval graph compute what the training graph does. A training
    FusedBatchNorm of tf_keras reads its moving mean and variance (inputs 3
    and 4) from resource variables. Unfused batch norms are left alone.
    """
    updates = []
    for op in graph.get_operations():
        if (op.type in quantize_patterns.BATCH_NORM_TYPES and op.get_attr("is_training")
                and not marks.is_replaced(op)):  # tf_keras's fused layer norm.
            for moving, batch in ((op.inputs[3], op.outputs[1]),
                                  (op.inputs[4], op.outputs[2])):
                assert moving.op.type == "ReadVariableOp", moving.op.name
                updates.append(tf.raw_ops.AssignVariableOp(
                    resource=moving.op.inputs[0], value=batch))
    return tf.group(*updates, name="recalibrate_batch_norms")


def eval_session(name: str, checkpoint: str):
    """Eval graph restored with a plain, strict Saver; returns (sess, x, y)."""
    g, x, y = build_graph(name, training=False)
    with g.as_default():
        qat.experimental_create_eval_graph(g, symmetric_weights=True)
        sess = tf1.Session(graph=g)
        tf1.train.Saver().restore(sess, checkpoint)
    return sess, x, y


def convert_with_tf(sess, x, y, flavour: str, input_range, frozen=None) -> bytes:
    """TensorFlow's own converter with the flags of docs/int8_export.md (no qat.export).

    `frozen`: the graph `sess` freezes to at `y` (qat.export.freeze_session),
    where the caller has it already; frozen here otherwise.
    """
    if frozen is None:
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


@dataclasses.dataclass
class LayerAgreement:
    """Per-layer numerics of one TFLite model against the eval graph."""
    numerics: "report.NumericsReport"
    matched: List["report.TensorNumerics"]  # Rows with a TFLite tensor.
    checked: List["report.TensorNumerics"]  # Matched and integer.

    @property
    def worst(self) -> "report.TensorNumerics":
        """The checked row whose own difference (TFLite's inputs given) is largest."""
        return max(self.checked, key=lambda row: row.max_own_steps)


def layer_agreement(frozen, x, y, inputs, flavour: str, model: bytes) -> LayerAgreement:
    """Each layer of `model` against the eval graph, given TFLite's own inputs.

    Every matched integer row is checked, concatenations' neighbours
    included: a concatenation and its inputs share one range
    (`qat.quantize.plan.ranges.shared_ranges`), as TFLite shares one scale.
    """
    numerics = report.layer_numerics(frozen, x.name, [y.op.name], inputs,
                                     flavour=flavour, model=model)
    matched = [r for r in numerics.rows if r.tflite_tensor is not None]
    # A float TFLite tensor has no steps. The model input itself is no layer:
    # TFLite quantizes it with the converter's input stats, and requantizes
    # it to the input quantizer's range where the two differ (two roundings,
    # docs/known_limits.md); the layers after it are compared given that.
    checked = [r for r in matched
               if not math.isnan(r.max_own_steps) and r.tflite_tensor != x.op.name]
    return LayerAgreement(numerics, matched, checked)


# Given the same inputs, a TFLite kernel and the eval graph differ only where
# a value lies within float rounding (or the bias's int32 rounding) of a
# rounding boundary: one step.
MAX_OWN_STEPS = 1.0 + 1e-3
# Such one-step differences add up through the network, most where a layer's
# gain is high (ResNet50V2's pre-activation batch norms amplify a one-step
# input difference to six output steps). Worst measured end to end without a
# concatenation: 13.00 steps (ResNet50V2; docs/performance.md "The zoo"). The
# zoo is seeded: the margin (1.4x or more) is for other thread counts and
# TensorFlow versions. Cases measured apart (Case.max_output_steps) have their
# own bound.
MAX_DIFF_STEPS = 24.0
# Rows TFLite keeps no tensor of (a layer's own range before a ReLU that
# TFLite fuses into it) are not compared; the rest must be, at least half.
MIN_MATCHED_ROWS = 0.5


class ZooAssertions:
    """zoo_test's checks of a TFLite model against the eval graph (a TestCase mixin)."""

    def assert_each_layer_agrees(self, frozen, x, y, inputs, flavour, model) -> float:
        """Every checked layer within MAX_OWN_STEPS; returns the worst own steps."""
        agreement = layer_agreement(frozen, x, y, inputs, flavour, model)
        numerics = agreement.numerics
        self.assertGreaterEqual(len(agreement.matched),
                                MIN_MATCHED_ROWS * len(numerics.rows), numerics.format())
        self.assertIsNotNone(numerics.rows[-1].tflite_tensor, "the model output")
        self.assertTrue(agreement.checked)
        worst = agreement.worst
        self.assertLessEqual(worst.max_own_steps, MAX_OWN_STEPS,
                             f"{flavour}: {worst.name}\n{numerics.format()}")
        return worst.max_own_steps

    def assert_outputs_vary(self, outputs, label):
        """Parity means little if every example gets the same output."""
        flat = np.reshape(outputs, (len(outputs), -1))
        self.assertGreater(len(np.unique(flat, axis=0)), 1,
                           f"{label}: the same output for every example")
