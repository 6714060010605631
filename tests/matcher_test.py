"""Tests for qat.matching.matcher and the layer / batch-norm patterns of qat.matching.layer_patterns."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from qat.matching import layer_patterns
from qat.matching.matcher import GraphMatcher, OneofPattern, OpTypePattern


def _placeholder(shape):
    return tf.compat.v1.placeholder(tf.float32, shape)


class MatcherTest(tf.test.TestCase, parameterized.TestCase):

    def test_ordered_match_binds_ops_and_tensors(self):
        g = tf.Graph()
        with g.as_default():
            x = _placeholder([1, 4, 4, 3])
            w = tf.constant(1.0, shape=[3, 3, 3, 2])
            conv = tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")
            out = tf.nn.bias_add(conv, tf.constant([1.0, 2.0]))
        pattern = OpTypePattern("BiasAdd", name="bias", inputs=[
            OpTypePattern("Conv2D", name="conv", inputs=["*", OpTypePattern("Const", name="w")]),
            "*"])
        matches = list(GraphMatcher(pattern).match_graph(g))
        self.assertLen(matches, 1)
        self.assertIs(matches[0].get_op("conv"), conv.op)
        self.assertIs(matches[0].get_tensor("conv"), conv)
        self.assertIs(matches[0].get_op("w"), w.op)
        self.assertIs(matches[0].get_op(pattern), out.op)
        self.assertIs(matches[0].get_tensor("bias"), out)

    def test_ordered_inputs_reject_swapped_order(self):
        g = tf.Graph()
        with g.as_default():
            a = _placeholder([2])
            b = tf.constant([1.0, 2.0])
            tf.add(b, a)
        ordered = OpTypePattern("AddV2", inputs=["*", OpTypePattern("Const")])
        unordered = OpTypePattern("AddV2", inputs=["*", OpTypePattern("Const")],
                                  ordered_inputs=False)
        self.assertEmpty(list(GraphMatcher(ordered).match_graph(g)))
        self.assertLen(list(GraphMatcher(unordered).match_graph(g)), 1)

    def test_alternative_types_and_oneof(self):
        g = tf.Graph()
        with g.as_default():
            a = _placeholder([2])
            r = tf.nn.relu(a)
            r6 = tf.nn.relu6(a)
            tf.identity(a)
        alt = OpTypePattern("Relu|Relu6", name="act")
        found = [m.get_op("act") for m in GraphMatcher(alt).match_graph(g)]
        self.assertEqual(found, [r.op, r6.op])
        oneof = OneofPattern([OpTypePattern("Relu6", name="six"),
                              OpTypePattern("Relu", name="plain")])
        matches = list(GraphMatcher(oneof).match_graph(g))
        self.assertLen(matches, 2)
        self.assertIs(matches[0].get_op("plain"), r.op)
        self.assertIsNone(matches[0].get_op("six"))
        self.assertIs(matches[1].get_op("six"), r6.op)
        self.assertIs(matches[1].get_op(oneof), r6.op)

    def test_multi_output_tensor_is_the_consumed_one(self):
        g = tf.Graph()
        with g.as_default():
            x = _placeholder([1, 2, 2, 3])
            y, mean, _ = tf.compat.v1.nn.fused_batch_norm(
                x, tf.ones([3]), tf.zeros([3]), is_training=True)
            consumer = tf.identity(mean)
            tf.identity(y)
        pattern = OpTypePattern("Identity", inputs=[
            OpTypePattern("FusedBatchNormV3", name="bn")])
        tensors = [m.get_tensor("bn") for m in GraphMatcher(pattern).match_graph(g)]
        self.assertEqual([t.name for t in tensors], [mean.name, y.name])
        self.assertIs(GraphMatcher(pattern).match_op(consumer.op).get_tensor("bn"), mean)

    def test_shared_pattern_must_bind_same_op(self):
        g = tf.Graph()
        with g.as_default():
            a = _placeholder([2])
            b = _placeholder([2])
            same = tf.multiply(a, a)
            different = tf.multiply(a, b)
        leaf = OpTypePattern("Placeholder")
        pattern = OpTypePattern("Mul", inputs=[leaf, leaf])
        matcher = GraphMatcher(pattern)
        self.assertIsNotNone(matcher.match_op(same.op))
        self.assertIsNone(matcher.match_op(different.op))

    def test_backtracks_over_unordered_inputs(self):
        g = tf.Graph()
        with g.as_default():
            a = _placeholder([2])
            n = tf.negative(a)
            out = tf.multiply(n, tf.abs(n))
        # "*" could take either input; only one assignment satisfies Abs(Neg).
        neg = OpTypePattern("Neg", name="neg")
        pattern = OpTypePattern("Mul", inputs=[neg, OpTypePattern("Abs", inputs=[neg])],
                                ordered_inputs=False)
        result = GraphMatcher(pattern).match_op(out.op)
        self.assertIsNotNone(result)
        self.assertIs(result.get_op("neg"), n.op)

    def test_input_count_mismatch_and_unknown_name(self):
        g = tf.Graph()
        with g.as_default():
            out = tf.nn.relu(_placeholder([2]))
        pattern = OpTypePattern("Relu", name="r", inputs=["*", "*"])
        self.assertIsNone(GraphMatcher(pattern).match_op(out.op))
        result = GraphMatcher(OpTypePattern("Relu", name="r")).match_op(out.op)
        with self.assertRaisesRegex(ValueError, "nope"):
            result.get_op("nope")

    def test_match_graph_only_tries_anchor_types(self):
        g = tf.Graph()
        with g.as_default():
            a = _placeholder([2])
            for _ in range(5):
                a = tf.nn.relu(a)
            tf.identity(a)

        tried = []

        class Spy(OpTypePattern):
            def matches_type(self, op):
                tried.append(op.type)
                return super().matches_type(op)

        list(GraphMatcher(Spy("Identity")).match_graph(g))
        self.assertEqual(tried, ["Identity"])

    def test_bad_patterns(self):
        with self.assertRaises(ValueError):
            OpTypePattern("")
        with self.assertRaises(ValueError):
            OneofPattern([])
        with self.assertRaises(TypeError):
            OpTypePattern("Relu", inputs=["Relu"])


class LayerPatternsTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(
        ("resource", "resource"), ("ref", "ref"), ("const", "const"))
    def test_layer_chain_weights(self, kind):
        g = tf.Graph()
        with g.as_default():
            x = _placeholder([1, 4, 4, 3])
            if kind == "const":
                w = tf.identity(tf.constant(1.0, shape=[3, 3, 3, 2]))
            else:
                w = tf.compat.v1.get_variable(
                    "w", [3, 3, 3, 2], use_resource=(kind == "resource"))
            conv = tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")
            b = tf.compat.v1.get_variable("b", [2], use_resource=(kind != "ref"))
            biased = conv + b
        result = GraphMatcher(layer_patterns.LAYER_CHAIN).match_op(biased.op)
        self.assertIsNotNone(result)
        self.assertIs(result.get_op("layer"), conv.op)
        self.assertIs(result.get_op("bias_add"), biased.op)
        self.assertIs(layer_patterns.weight_input(conv.op), result.get_tensor("weights"))
        self.assertTrue(layer_patterns.is_parameter(result.get_tensor("bias")))

    def test_layer_chain_atrous_identity_reshape(self):
        g = tf.Graph()
        with g.as_default():
            x = _placeholder([1, 8, 8, 3])
            w = tf.constant(1.0, shape=[3, 3, 3, 4])
            y = tf.compat.v1.nn.atrous_conv2d(x, w, rate=2, padding="SAME")
            out = tf.reshape(tf.identity(y), [1, 8, 8, 4])
        result = GraphMatcher(layer_patterns.LAYER_CHAIN).match_op(out.op)
        self.assertIsNotNone(result)
        self.assertEqual(result.get_op("layer").type, "Conv2D")
        self.assertEqual(result.get_op("batch_to_space").type, "BatchToSpaceND")
        self.assertIs(result.get_op("layer_identity"), y.op.outputs[0].consumers()[0])
        self.assertIs(result.get_op("reshape"), out.op)
        self.assertIsNone(result.get_op("bias_add"))

    def test_layer_chain_rejects_activation_input(self):
        g = tf.Graph()
        with g.as_default():
            a = _placeholder([2, 3])
            out = tf.matmul(a, tf.nn.relu(_placeholder([3, 4])))
        self.assertIsNone(GraphMatcher(layer_patterns.LAYER_CHAIN).match_op(out.op))

    @parameterized.named_parameters(
        ("scale_center", True, True), ("scale", True, False),
        ("center", False, True), ("neither", False, False))
    def test_unfused_batch_norm(self, scale, center):
        g = tf.Graph()
        with g.as_default():
            x = _placeholder([2, 4, 4, 3])
            y = tf.compat.v1.layers.batch_normalization(
                x, fused=False, scale=scale, center=center, training=True)
        matches = list(GraphMatcher(layer_patterns.UNFUSED_BATCH_NORM).match_graph(g))
        self.assertLen(matches, 1)
        m = matches[0]
        self.assertIs(m.get_op("batch_norm"), y.op)
        self.assertIs(m.get_tensor("bn_input"), x)
        self.assertEqual(m.get_op("gamma") is not None, scale)
        self.assertEqual(m.get_op("beta") is not None, center)
        self.assertEqual(m.get_op("mean").type, "Squeeze")
        self.assertEqual(m.get_op("epsilon").type, "Const")

    def test_fused_batch_norm_and_layer_ops(self):
        g = tf.Graph()
        with g.as_default():
            x = _placeholder([2, 4, 4, 3])
            conv = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False)
            tf.compat.v1.layers.batch_normalization(conv, fused=True, training=False)
            tf.compat.v1.layers.dense(tf.reshape(conv, [2, -1]), 5)
        matches = list(GraphMatcher(layer_patterns.FUSED_BATCH_NORM).match_graph(g))
        self.assertLen(matches, 1)
        self.assertIs(matches[0].get_tensor("bn_input"), conv)
        self.assertEqual([op.type for op in layer_patterns.layer_ops(g)],
                         ["Conv2D", "MatMul"])
        self.assertEqual(layer_patterns.output_channels(conv.op), 4)
        with self.assertRaisesRegex(ValueError, "not a layer op"):
            layer_patterns.weight_input(x.op)


if __name__ == "__main__":
    absltest.main()
