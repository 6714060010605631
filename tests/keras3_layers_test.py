"""Keras 3 layers through `qat.quantize_model`: fully integer int8, every range a tensor.

Keras 3 (tf.keras on TF 2.21 without TF_USE_LEGACY_KERAS) writes its layers
with other ops than tf_keras: a conv bias read as Squeeze(Reshape(b)),
EinsumDense and MultiHeadAttention's projections as a batch matmul with the
reshaped kernel, LayerNormalization as `x * inv + (-mean * inv + beta)`,
BatchNormalization as arithmetic, a grouped Conv2D as a call of an
XLA-compiled function reading the kernel's handle, a masked softmax as
`where(mask, scores, large negative)`. Each case builds a tiny Keras 3
model, quantizes it, trains two steps, converts the eval function with TF 2's
converter (`from_concrete_functions`, int8) and checks, with the export
checks the graph path uses on its eval graphs:

* no TFLite op computes in float (only the QUANTIZE / DEQUANTIZE of the
  model's float interface), `qat.export.inspect.find_float_ops`;
* every activation range of the frozen eval function is a TFLite tensor
  with its scale and zero point, `qat.export.range_survival.check_ranges`;
* TFLite's output is within `zoo_util.MAX_DIFF_STEPS` output steps of the
  eval function's, `qat.export.check_parity`;
* the eval trace leaves nothing float and asks for no range the training
  trace did not plan.

The test imports `keras` (the Keras 3 package) itself: Bazel's
`--test_env=TF_USE_LEGACY_KERAS=1` (.bazelrc) takes precedence over a
target's `env`, and it only decides what `tf.keras` is.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN on, as TensorFlow sets it on CPUs with AVX-512: without it TensorFlow has no CPU kernel
# for a grouped Conv2D (UnimplementedError), and this AMD EPYC has no AVX-512.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized
import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import convert_to_constants

import qat
from qat import export
from qat.engine import marks
from qat.export import inspect as export_inspect
from qat.export import range_survival
import zoo_util  # pylint: disable=g-import-not-at-top

L = keras.layers
_BATCH = 4
_IMAGE = (8, 8, 3)
_SEQUENCE = (6, 8)
_VOCAB, _TOKENS, _HIDDEN = 50, 6, 8


def _conv_bias(x):
    x = L.Conv2D(4, 3, activation="relu")(x)
    return L.Dense(3)(L.Flatten()(x))


def _conv_bn(x):
    x = L.Conv2D(8, 3, use_bias=False, padding="same")(x)
    # An explicit axis: Keras 3 reshapes the statistics to [1, 1, 1, c].
    x = L.ReLU()(L.BatchNormalization(axis=3, epsilon=1.001e-5)(x))
    x = L.Conv2D(8, 3, dilation_rate=2, padding="same")(x)  # With a bias.
    x = L.BatchNormalization(center=False, scale=False, momentum=0.5)(x)
    return L.GlobalAveragePooling2D()(x)


def _preactivation(x):
    """Batch norms after no layer (ResNetV2, DenseNet): on the input, an add, a concat."""
    x = L.BatchNormalization()(x)
    a = L.Conv2D(8, 1)(x)
    b = L.Conv2D(8, 3, padding="same", use_bias=False)(x)
    b = L.Conv2D(8, 1)(L.ReLU()(L.BatchNormalization(axis=3, epsilon=1.001e-5)(b)))
    y = L.ReLU()(L.BatchNormalization(momentum=0.5)(L.Add()([a, b])))
    y = L.Concatenate()([y, L.Conv2D(4, 1)(y)])
    y = L.BatchNormalization(center=False, scale=False)(y)
    return L.GlobalAveragePooling2D()(L.Conv2D(8, 1)(y))


def _grouped_conv(x):
    x = L.Conv2D(8, 1)(x)
    x = L.Conv2D(8, 3, groups=2, padding="same", activation="relu")(x)
    x = L.Conv2D(8, 3, groups=4, strides=2, use_bias=False)(x)
    x = L.Activation("relu6")(L.BatchNormalization()(x))
    return L.GlobalMaxPooling2D()(x)


def _depthwise_separable(x):
    x = L.DepthwiseConv2D(3, padding="same")(x)
    x = L.ReLU(6.0)(L.BatchNormalization()(x))
    x = L.SeparableConv2D(8, 3, padding="same", activation="relu")(x)
    x = L.SeparableConv2D(8, 3, use_bias=False)(x)
    x = L.BatchNormalization(epsilon=1e-5, momentum=0.999)(x)
    return L.GlobalAveragePooling2D()(x)


def _conv1d(x):
    x = L.Conv1D(8, 3, padding="same")(x)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.Conv1D(8, 3, activation="relu")(x)
    x = L.BatchNormalization()(x)  # After the activation: no layer to fold into.
    return L.GlobalAveragePooling1D()(x)


def _conv_transpose(x):
    x = L.Conv2DTranspose(4, 3, strides=2, padding="same")(x)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.Conv2DTranspose(4, 3, use_bias=False)(x)
    return L.BatchNormalization(scale=False)(x)


def _dense(x):
    x = L.Dense(16)(L.Flatten()(x))
    x = L.Activation("relu")(L.BatchNormalization()(x))
    return L.Dense(3, activation="softmax")(x)


def _dense_rank3(x):
    x = L.Dense(16, activation="relu")(x)
    return L.Dense(4)(x)


def _einsum_dense(x):
    x = L.EinsumDense("abc,cd->abd", output_shape=(None, 12), bias_axes="d",
                      activation="relu")(x)
    x = L.EinsumDense("abc,cde->abde", output_shape=(None, 2, 4), bias_axes="de")(x)
    return L.Flatten()(x)


def _layer_norm(x):
    x = L.Dense(8)(x)
    x = L.LayerNormalization()(x)
    x = L.LayerNormalization(center=False)(L.Dense(8)(x))
    x = L.LayerNormalization(scale=False)(L.Dense(8)(x))
    x = L.LayerNormalization(center=False, scale=False, epsilon=1e-6)(x)
    return L.Dense(4)(x)


def _activation(name):
    def build(x):
        x = L.Dense(8)(x)
        x = name(x) if callable(name) else L.Activation(name)(x)
        return L.Dense(4)(x)
    return build


def _merges_and_pools(x):
    a = L.Conv2D(4, 1)(x)
    b = L.Conv2D(4, 1, activation="relu")(x)
    merged = L.Concatenate()([L.Add()([a, b]), L.Multiply()([a, b])])
    pooled = L.MaxPooling2D(2)(L.AveragePooling2D(2, strides=1, padding="same")(merged))
    return L.Concatenate()([L.Flatten()(pooled), L.GlobalAveragePooling2D()(merged)])


def _dropout(x):
    x = L.Conv2D(4, 3, activation="relu")(x)
    x = L.Flatten()(L.Dropout(0.3)(x))
    return L.Dense(3)(L.Dropout(0.2)(x))


def _preprocessing(x):
    a = L.Conv2D(4, 3)(L.Rescaling(1 / 127.5, offset=-1)(x))
    b = L.Conv2D(4, 3)(L.Normalization(mean=[0.5, 0.4, 0.3], variance=[0.1, 0.2, 0.3])(x))
    return L.Flatten()(L.Add()([a, b]))


def _reshapes(x):
    x = L.Conv2D(4, 3)(L.ZeroPadding2D(1)(x))
    x = L.Dense(4)(L.Reshape((8, 32))(x))
    return L.Flatten()(x)


def _resizes(x):
    x = L.Conv2D(4, 3, padding="same")(x)
    nearest = L.Conv2D(2, 1)(L.UpSampling2D()(x))
    bilinear = L.Conv2D(2, 1)(L.UpSampling2D(interpolation="bilinear")(x))
    resized = L.Conv2D(2, 1)(L.Resizing(16, 16)(L.Resizing(12, 12)(x)))
    return L.Concatenate()([nearest, bilinear, resized])


def _embeddings(ids, mask_zero=False):
    x = L.Embedding(_VOCAB, _HIDDEN, mask_zero=mask_zero)(ids)
    return x + L.Embedding(_TOKENS, _HIDDEN)(keras.ops.arange(_TOKENS)[None])


def _attention(mask):
    def build(ids):
        x = _embeddings(ids, mask_zero=mask == "embedding")
        kwargs = {}
        if mask == "causal":
            kwargs["use_causal_mask"] = True
        elif mask == "padding":
            keep = keras.ops.cast(keras.ops.not_equal(ids, 0), "int32")
            kwargs["attention_mask"] = keep[:, None, :] * keras.ops.ones_like(keep)[:, :, None]
        a = L.MultiHeadAttention(2, 4, dropout=0.1)(x, x, **kwargs)
        x = L.LayerNormalization()(x + a)
        return L.Dense(2)(L.GlobalAveragePooling1D()(x))
    return build


def _encoder(ids):
    """/work/proto/t8.py's text encoder, smaller."""
    x = L.LayerNormalization()(_embeddings(ids))
    x = L.LayerNormalization()(x + L.MultiHeadAttention(2, _HIDDEN // 2)(x, x))
    f = L.Dense(4 * _HIDDEN)(L.Dense(4 * _HIDDEN, activation="gelu")(x))
    x = L.LayerNormalization()(x + L.Dense(_HIDDEN)(L.Dropout(0.1)(f)))
    return L.Dense(2)(L.GlobalAveragePooling1D()(x))


_CNN_CASES = [
    ("conv_bias", _conv_bias, _IMAGE),
    ("conv_batch_norm", _conv_bn, _IMAGE),
    ("preactivation", _preactivation, _IMAGE),
    ("grouped_conv", _grouped_conv, _IMAGE),
    ("depthwise_separable", _depthwise_separable, _IMAGE),
    ("conv1d", _conv1d, _SEQUENCE),
    ("conv_transpose", _conv_transpose, _IMAGE),
    ("dense", _dense, _IMAGE),
    ("dense_rank3", _dense_rank3, _SEQUENCE),
    ("einsum_dense", _einsum_dense, _SEQUENCE),
    ("layer_norm", _layer_norm, _SEQUENCE),
    ("merges_and_pools", _merges_and_pools, _IMAGE),
    ("dropout", _dropout, _IMAGE),
    ("preprocessing", _preprocessing, _IMAGE),
    ("reshapes", _reshapes, _IMAGE),
    ("resizes", _resizes, _IMAGE),
]
_ACTIVATIONS = [
    ("relu", "relu"), ("relu6", "relu6"), ("leaky_relu", "leaky_relu"),
    ("leaky_relu_layer", L.LeakyReLU(0.1)), ("gelu", "gelu"),
    ("gelu_approximate", lambda x: keras.activations.gelu(x, approximate=True)),
    ("swish", "swish"), ("silu", "silu"), ("hard_swish", "hard_swish"),
    ("hard_silu", "hard_silu"), ("hard_sigmoid", "hard_sigmoid"), ("sigmoid", "sigmoid"),
    ("tanh", "tanh"), ("softmax", "softmax"),
]
_TEXT_CASES = [
    ("attention", _attention(None)), ("attention_causal_mask", _attention("causal")),
    ("attention_padding_mask", _attention("padding")),
    ("attention_embedding_mask", _attention("embedding")), ("encoder", _encoder),
]


def _model(build, shape, dtype="float32"):
    inputs = keras.Input(shape, dtype=dtype)
    return keras.Model(inputs, build(inputs))


def _inputs(model, seed=0):
    rng = np.random.default_rng(seed)
    spec = model.inputs[0]
    shape = (_BATCH,) + tuple(spec.shape[1:])
    if "int" in str(spec.dtype):
        return rng.integers(0, _VOCAB, shape).astype(np.int32)
    return rng.random(shape).astype(np.float32)


def _train(qm, x, steps=2):
    optimizer = keras.optimizers.SGD(0.05)
    target = tf.random.stateless_normal(qm(x).shape, seed=[1, 2])
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(qm(x, training=True) - target))
        grads = tape.gradient(loss, qm.trainable_variables)
        optimizer.apply_gradients(
            [(g, v) for g, v in zip(grads, qm.trainable_variables) if g is not None])


def _convert(qm):
    function = qm.inference_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if any(t.dtype == tf.float32 for t in function.inputs if t.dtype != tf.resource):
        converter.inference_input_type = tf.int8
    frozen = convert_to_constants.convert_variables_to_constants_v2(function)
    return converter.convert(), frozen


class Keras3LayersTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        # Graph-mode test modules disable eager execution process-wide when
        # pytest imports them into the same process: run eagerly regardless.
        self.enter_context(context.eager_mode())
        keras.utils.set_random_seed(0)

    def assert_fully_integer(self, model, x=None):
        """quantize_model, two training steps, int8 TFLite: the checks above."""
        x = _inputs(model) if x is None else x
        qm = qat.quantize_model(model)
        _train(qm, x)
        qm(x, training=False)
        rewriter = qm.rewriter
        # A batch norm after an activation folds into no layer: quantized on its own.
        self.assertEqual([r for r in rewriter.left_float[False]
                          if ": batch norm not folded: no Conv2D" not in r], [])
        self.assertEmpty(set(rewriter.quantizer_names[False]) - set(rewriter.quantizer_names[True]))
        tflite, frozen = _convert(qm)
        graph_def = frozen.graph.as_graph_def()
        float_ops = export_inspect.find_float_ops(export_inspect.describe_model(tflite), graph_def)
        self.assertEqual([f.describe() for f in float_ops], [])
        survival = range_survival.check_ranges(graph_def, tflite, flavour="int8")
        self.assertGreater(survival.checked, 0)
        self.assertEqual([r.describe() for r in survival.lost], [])
        export.check_parity(tflite, graph_def, frozen.inputs[0].name, frozen.outputs[0].name, x,
                            max_diff_steps=zoo_util.MAX_DIFF_STEPS)
        return qm

    @parameterized.named_parameters(*_CNN_CASES)
    def test_layers(self, build, shape):
        self.assert_fully_integer(_model(build, shape))

    @parameterized.named_parameters(*_ACTIVATIONS)
    def test_activation(self, activation):
        self.assert_fully_integer(_model(_activation(activation), _SEQUENCE))

    @parameterized.named_parameters(*_TEXT_CASES)
    def test_text(self, build):
        self.assert_fully_integer(_model(build, (_TOKENS,), "int32"))

    def test_mobilenet_v3_small(self):
        model = keras.applications.MobileNetV3Small(
            input_shape=(32, 32, 3), alpha=0.75, weights=None, classes=10,
            include_preprocessing=True)
        x = np.random.default_rng(0).random((2, 32, 32, 3)).astype(np.float32) * 255
        self.assert_fully_integer(model, x)

    def test_mobilenet_v2(self):
        model = keras.applications.MobileNetV2(
            input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
        x = np.random.default_rng(0).random((2, 32, 32, 3)).astype(np.float32)
        self.assert_fully_integer(model, x)

    def test_batch_norm_statistics_update_in_training_only(self):
        model = _model(_conv_bn, _IMAGE)
        statistics = [w for w in model.non_trainable_weights if "moving" in w.path]
        self.assertLen(statistics, 4)
        before = [np.array(w.numpy()) for w in statistics]
        qm = qat.quantize_model(model)
        x = _inputs(model)
        qm(x, training=False)
        for old, w in zip(before, statistics):
            np.testing.assert_array_equal(old, w.numpy())
        _train(qm, x, steps=1)
        for old, w in zip(before, statistics):
            self.assertFalse(np.allclose(old, w.numpy()), w.path)
        self.assertEqual(qm.rewriter.left_float[True], [])

    def test_batch_norm_after_no_layer_is_depthwise_in_eval(self):
        """As a fused one: its output's range only, a 1x1 depthwise conv in eval."""
        qm = self.assert_fully_integer(_model(_preactivation, _IMAGE))
        names = qm.rewriter.quantizer_names
        # The one a ReLU alone reads has its range after the ReLU (act_quant).
        self.assertLen([n for n in names[True] if n.endswith("/batchnorm/bn_quant")], 2)
        graph = qm.inference_function().graph
        self.assertLen([op for op in graph.get_operations()
                        if op.type == "DepthwiseConv2dNative"], 3)

    def test_layer_norm_centred(self):
        """x * inv + (-mean * inv + beta) becomes (x - mean) * inv * gamma + beta."""
        model = _model(_layer_norm, _SEQUENCE)
        x = _inputs(model)
        qm = qat.quantize_model(model)
        graph = qm.inference_function().graph
        negations = [op for op in graph.get_operations() if op.type == "Neg"]
        self.assertLen(negations, 4)  # Keras 3's -mean, read by replaced ops only.
        for op in negations:
            self.assertTrue(all(marks.is_replaced(c) for c in op.outputs[0].consumers()), op.name)
        names = qm.rewriter.quantizer_names[True]
        self.assertLen([n for n in names if n.endswith("/centred/sub_quant")], 4)
        # The same function as the float model, up to quantization: one
        # training call sets the ranges to this batch's (no weight changes).
        qm(x, training=True)
        np.testing.assert_allclose(qm(x), model(x), atol=0.15)


if __name__ == "__main__":
    absltest.main()
