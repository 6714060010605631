"""Range survival of the converter's rewrites (qat/quantize/plan/ops/converter_rewrites.py).

Each network holds one rewrite TensorFlow's TFLite converter makes to
quantized graphs (an op it removes, a requantize it merges into the op
before it). Every range of the eval graph is given a distinct value, the
graph is converted with TF's plain converter in both flavours, and every
activation range must be a TFLite tensor with exactly its scale and zero
point (`qat.export.range_survival`): distinct ranges make a range that only
coincides with a neighbour's fail. Training and eval graphs must plan the
same variables (a plain Saver restores the training checkpoint).
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.export import range_survival  # pylint: disable=g-import-not-at-top
from qat.quantize.plan.ops import converter_rewrites  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def _conv(x, channels, kernel=1, name=None, activation=tf.nn.relu, training=False):
    y = tf1.layers.conv2d(x, channels, kernel, padding="same", use_bias=False, name=name)
    y = tf1.layers.batch_normalization(y, training=training, name=name + "_bn")
    return activation(y) if activation else y


def _image_pooling(x, training):
    """DeepLab's image pooling: GAP -> 1x1 conv + ReLU -> bilinear resize -> concat."""
    a = _conv(x, 8, 3, "a", training=training)
    pooled = tf.reduce_mean(a, [1, 2], keepdims=True)
    pooled = _conv(pooled, 8, 1, "pool_conv", training=training)
    pooled = tf1.image.resize_bilinear(pooled, [8, 8])
    branch = _conv(a, 8, 1, "branch", training=training)
    return _conv(tf.concat([branch, pooled], 3), 4, 1, "proj", None, training)


def _resize_two_readers(x, training):
    """The resized tensor has another reader: it keeps its own range."""
    a = _conv(x, 8, 3, "a", training=training)
    small = tf.nn.avg_pool2d(a, 4, 4, "VALID")
    p = _conv(small, 8, 1, "pool_conv", training=training)
    other = tf1.image.resize_bilinear(_conv(p, 8, 1, "other", training=training), [8, 8])
    up = tf1.image.resize_bilinear(p, [8, 8])
    out = _conv(tf.concat([_conv(a, 8, 1, "branch", training=training), up], 3), 8, 1,
                "proj", None, training)
    return out + other


def _squeeze_excite_1x1(x, training):
    """A squeeze-excite mean over a 1x1 map (its input also read by the Mul)."""
    a = _conv(x, 8, 3, "a", training=training)
    a = tf.nn.max_pool2d(a, 8, 8, "VALID")
    s = tf.reduce_mean(a, [1, 2], keepdims=True)
    s = _conv(s, 8, 1, "se", tf.nn.sigmoid, training)
    return _conv(a * s, 4, 1, "head", None, training)


def _rescaling_without_offset(x, training):
    """tf_keras Rescaling(1/255): x * (1/255) + 0, the add folded away."""
    y = keras.layers.Rescaling(1.0 / 255.0)(x)
    return _conv(y, 4, 3, "a", None, training)


def _rescaling_then_pool(x, training):
    """A same-scale op after the removed add reads the multiply's range."""
    y = keras.layers.Rescaling(1.0 / 255.0)(x)
    y = tf.nn.max_pool2d(y, 2, 2, "VALID")
    return _conv(y, 4, 1, "a", None, training)


def _normalisation(x, training):
    """(x - mean) / std by constant vectors: the converter makes the division a MUL."""
    y = (x - tf.constant([0.4, 0.5, 0.6])) / tf.constant([0.2, 0.25, 0.3])
    return _conv(y, 4, 3, "a", None, training)


def _hard_sigmoid_excite(x, training):
    """MobileNetV3's excite: relu6(conv + 3) / 6, the +3 folded into the bias."""
    a = _conv(x, 8, 3, "a", training=training)
    s = tf.reduce_mean(a, [1, 2], keepdims=True)
    s = tf1.layers.conv2d(s, 8, 1, name="excite")
    s = tf.nn.relu6(s + 3.0) * (1.0 / 6.0)
    return _conv(a * s, 4, 1, "head", None, training)


def _global_max_pool(x, training):
    """tf.reduce_max over H, W: REDUCE_MAX keeps its input's scale."""
    a = _conv(x, 8, 3, "a", None, training) - 0.5
    m = tf.reduce_max(a, [1, 2], keepdims=True)
    return _conv(m, 4, 1, "head", None, training)


def _identity_arithmetic(x, training):
    a = _conv(x, 8, 3, "a", training=training)
    return _conv((a * 1.0) - 0.0, 4, 1, "b", None, training)


def _identity_pool(x, training):
    a = _conv(x, 8, 3, "a", training=training)
    return _conv(tf.nn.avg_pool2d(a, 1, 1, "VALID"), 4, 1, "b", None, training)


def _clamp_relu6(x, training):
    """min(max(conv, 0), 6): RELU fused into the conv, MINIMUM in its scale."""
    a = _conv(x, 8, 3, "a", None, training)
    return _conv(tf.minimum(tf.maximum(a, 0.0), 6.0), 4, 1, "b", None, training)


def _clamp_n1_to_1(x, training):
    """min(max(conv, -1), 1): MAXIMUM and MINIMUM in the conv's scale."""
    a = _conv(x, 8, 3, "a", None, training)
    return _conv(tf.minimum(tf.maximum(a, -1.0), 1.0), 4, 1, "b", None, training)


def _clamp_after_add(x, training):
    """max(add, 0): fused into the ADD as its RELU; max(., 0) after a clamp: a RELU."""
    a = _conv(x, 8, 3, "a", None, training)
    b = tf.maximum(a + _conv(x, 8, 1, "s", None, training), 0.0)
    return _conv(tf.maximum(tf.minimum(b, 4.0), 0.0), 4, 1, "b", None, training)


def _removed_reduction_into_concat(x, training):
    """A reduction over a 1x1 map read by a concatenation: the converter removes it,
    so the concatenation reads the tensor before it (which joins the group)."""
    a = tf.nn.max_pool2d(_conv(x, 8, 3, "a", training=training), 8, 8, "VALID")
    m = tf.reduce_max(a, [1, 2], keepdims=True)
    p = _conv(tf.reduce_mean(m, [1, 2], keepdims=True), 4, 1, "pool_conv", training=training)
    return _conv(tf.concat([m, p], 3), 4, 1, "proj", None, training)


CASES = dict(image_pooling=_image_pooling, resize_two_readers=_resize_two_readers,
             squeeze_excite_1x1=_squeeze_excite_1x1,
             rescaling_without_offset=_rescaling_without_offset,
             rescaling_then_pool=_rescaling_then_pool, normalisation=_normalisation,
             hard_sigmoid_excite=_hard_sigmoid_excite, global_max_pool=_global_max_pool,
             identity_arithmetic=_identity_arithmetic,
             identity_pool=_identity_pool, clamp_relu6=_clamp_relu6,
             clamp_n1_to_1=_clamp_n1_to_1, clamp_after_add=_clamp_after_add,
             removed_reduction_into_concat=_removed_reduction_into_concat)


def _build(case, training):
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, (None, 8, 8, 3), name="input")
        y = tf.identity(CASES[case](x, training), name="output")
    return g, x, y


def _range_variables(graph):
    return sorted(v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                  if v.op.name.endswith(("/min", "/max")))


def _distinct_ranges(sess):
    """Gives every activation range variable pair its own (min, max)."""
    names = _range_variables(sess.graph)
    pairs = sorted({n.rsplit("/", 1)[0] for n in names})
    for k, prefix in enumerate(pairs):
        lo, hi = -0.3 - 0.0731 * k, 2.0 + 0.513 * k
        for suffix, value in (("min", lo), ("max", hi)):
            var = [v for v in sess.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                   if v.op.name == prefix + "/" + suffix][0]
            var.load(value, sess)


def _reads_input(t):
    stack, seen = [t.op], set()
    while stack:
        op = stack.pop()
        if op.type == "Placeholder":
            return True
        for i in op.inputs:
            if i.op not in seen:
                seen.add(i.op)
                stack.append(i.op)
    return False


def _lost_ranges(frozen, model, flavour):
    """Activation ranges with no TFLite tensor of their shape, scale and zero point.

    Every range is distinct (`_distinct_ranges`), so a tensor with its
    quantization is the tensor holding its value.
    """
    nodes = {n.name: n for n in frozen.node}

    def value(name):
        node = nodes[name.split(":")[0]]
        while node.op == "Identity":
            node = nodes[node.input[0].split(":")[0]]
        return float(tf.make_ndarray(node.attr["value"].tensor))

    g = tf.Graph()
    with g.as_default():
        tf.import_graph_def(frozen, name="")
    interpreter = tf.lite.Interpreter(model_content=model)
    tensors = []
    for d in interpreter.get_tensor_details():
        q = d["quantization_parameters"]
        if len(q["scales"]) == 1:
            tensors.append((tuple(d["shape"]), float(q["scales"][0]), int(q["zero_points"][0])))
    lost = []
    for node in frozen.node:
        if node.op != "FakeQuantWithMinMaxVars":
            continue
        data = g.get_operation_by_name(node.name).inputs[0]
        if not _reads_input(data):
            continue  # A weight or parameter range.
        scale, zero_point = range_survival.expected_quantization(
            value(node.input[1]), value(node.input[2]), flavour=flavour)
        want = data.shape.as_list()
        if not any(len(shape) == len(want)
                   and all(w is None or w == d for w, d in zip(want, shape))
                   and abs(s - scale) <= 1e-5 * scale and z == zero_point
                   for shape, s, z in tensors):
            lost.append(f"{node.name} (scale {scale:.6g}, zero point {zero_point})")
    return lost


def _convert(sess, x, y, flavour):
    """(frozen eval graph, TF's plain conversion of it) for inputs in [-1, 1]."""
    frozen = tf1.graph_util.convert_variables_to_constants(
        sess, sess.graph.as_graph_def(), [y.op.name])
    return frozen, zoo_util.convert_with_tf(sess, x, y, flavour, (-1.0, 1.0))


class ConverterRewritesTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(*[(name, name) for name in CASES])
    def test_every_range_survives(self, case):
        train_graph, _, _ = _build(case, training=True)
        qat.create_training_graph(train_graph)
        g, x, y = _build(case, training=False)
        qat.create_eval_graph(g)
        # Training and eval graphs plan the same ranges (a plain restore).
        self.assertEqual(_range_variables(train_graph), _range_variables(g))
        with tf1.Session(graph=g) as sess:
            sess.run(tf1.global_variables_initializer())
            _distinct_ranges(sess)
            for flavour in ("uint8", "int8"):
                frozen, model = _convert(sess, x, y, flavour)
                self.assertEmpty(_lost_ranges(frozen, model, flavour), flavour)

    def test_image_pooling_conv_shares_the_concat_range(self):
        g, _, _ = _build("image_pooling", training=False)
        qat.create_eval_graph(g)
        names = _range_variables(g)
        self.assertNotIn("pool_conv/act_quant/min", names)
        self.assertIn("concat/concat_quant/min", names)
        g, _, _ = _build("resize_two_readers", training=False)
        qat.create_eval_graph(g)
        self.assertIn("pool_conv/act_quant/min", _range_variables(g))


class PredicateTest(tf.test.TestCase):
    """Static shapes and constants decide; unknown ones keep the op."""

    def test_reductions(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, (None, 1, 1, 8))
            dynamic = tf1.placeholder(tf.float32, (None, None, None, 8))
            wide = tf1.placeholder(tf.float32, (None, 2, 1, 8))
            self.assertTrue(converter_rewrites.is_size_one_reduction(
                tf.reduce_mean(x, [1, 2]).op))
            self.assertFalse(converter_rewrites.is_size_one_reduction(
                tf.reduce_mean(dynamic, [1, 2]).op))
            self.assertFalse(converter_rewrites.is_size_one_reduction(
                tf.reduce_mean(wide, [1, 2]).op))
            self.assertTrue(converter_rewrites.is_size_one_reduction(
                tf.reduce_sum(wide, [2], keepdims=True).op))

    def test_arithmetic(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, (1, 4, 4, 8))
            is_data = lambda t: t.op.type == "Placeholder"
            self.assertTrue(converter_rewrites.is_neutral_arithmetic((x + 0.0).op, is_data))
            self.assertTrue(converter_rewrites.is_neutral_arithmetic((1.0 * x).op, is_data))
            self.assertFalse(converter_rewrites.is_neutral_arithmetic((x * 2.0).op, is_data))
            self.assertFalse(converter_rewrites.is_neutral_arithmetic((0.0 - x).op, is_data))
            batch = tf1.placeholder(tf.float32, (None, 4, 4, 8))
            self.assertTrue(converter_rewrites.is_neutral_arithmetic(
                (batch + tf.zeros([8])).op, is_data))
            self.assertTrue(converter_rewrites.is_constant_division(
                (batch / tf.ones([8]) * 2.0).op.inputs[0].op, is_data))
            self.assertFalse(converter_rewrites.is_constant_division(
                (2.0 / batch).op, is_data))
            # A broadcast that grows the tensor is not removed.
            grow = x + tf.zeros([2, 4, 4, 8])
            self.assertFalse(converter_rewrites.is_neutral_arithmetic(grow.op, is_data))


if __name__ == "__main__":
    tf.test.main()
