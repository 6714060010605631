"""Tests of qat.gradient_checkpointing: same gradients as tf.gradients."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from qat.clients import gradient_checkpointing as gc

tf1 = tf.compat.v1


def _mlp(depth=16, width=24, use_resource=True):
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        x = tf1.placeholder(tf.float32, [4, width], name="x")
        h = x
        for i in range(depth):
            with tf1.variable_scope("layer%d" % i, use_resource=use_resource):
                w = tf1.get_variable(
                    "w", [width, width],
                    initializer=tf1.random_normal_initializer(stddev=1.0 / np.sqrt(width)))
                b = tf1.get_variable("b", [width], initializer=tf1.constant_initializer(0.1))
                h = tf.nn.tanh(tf.matmul(h, w) + b)
        loss = tf.reduce_mean(tf.square(h))
    feed = {x: np.random.RandomState(0).randn(4, width).astype(np.float32)}
    return graph, loss, feed


def _conv_net():
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(2)
        x = tf1.placeholder(tf.float32, [2, 12, 12, 3], name="x")
        h = x
        for i, filters in enumerate([8, 8, 16, 16]):
            h = tf1.layers.conv2d(h, filters, 3, padding="same", activation=tf.nn.relu,
                                  name="conv%d" % i)
            if i == 1:
                h = tf1.layers.max_pooling2d(h, 2, 2)
        h = tf1.layers.flatten(h)
        logits = tf1.layers.dense(h, 5, name="logits")
        labels = tf.constant([1, 3])
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    feed = {x: np.random.RandomState(1).rand(2, 12, 12, 3).astype(np.float32)}
    return graph, loss, feed


def _evaluate(graph, fetches, feed):
    with tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        return sess.run(fetches, feed)


class GradientCheckpointingTest(parameterized.TestCase):

    def _assert_same_gradients(self, graph, loss, feed, checkpoints, xs=None):
        with graph.as_default():
            xs = tf1.trainable_variables() if xs is None else xs
            self.assertNotEmpty(xs)
            reference = tf.gradients(loss, xs)
            n_ops = len(graph.get_operations())
            region_before = set(graph.get_operations())
            got = gc.gradients(loss, xs, checkpoints=checkpoints)
        self.assertLen(got, len(xs))
        ref_values, got_values = _evaluate(graph, [reference, got], feed)
        for x, r, g in zip(xs, ref_values, got_values):
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6, err_msg=x.name)
            self.assertGreater(np.abs(r).max(), 0.0)
        self.assertGreater(len(graph.get_operations()), n_ops)
        return region_before

    @parameterized.parameters(True, False)
    def test_mlp_memory_strategy(self, use_resource):
        graph, loss, feed = _mlp(use_resource=use_resource)
        with graph.as_default():
            xs = tf1.trainable_variables()
            bottlenecks = gc.find_bottleneck_tensors([loss], xs)
        # Each layer's MatMul, add and Tanh outputs are articulation points.
        self.assertGreaterEqual(len(bottlenecks), 3 * 15)
        self.assertEqual(len(set(bottlenecks)), len(bottlenecks))
        original_ops = self._assert_same_gradients(graph, loss, feed, "memory")
        # The backward pass reads the forward pass only at the checkpoints:
        # every other activation comes from a recomputed copy.
        n = len(bottlenecks)
        k = int(round(np.sqrt(n)))
        kept = set()
        forward = set(op for op in original_ops if op.name.startswith("layer"))
        for op in graph.get_operations():
            if op in original_ops:
                continue
            for t in op.inputs:
                if t.op in forward and t.op.type not in ("VarHandleOp", "VariableV2", "Identity"):
                    kept.add(t)
        self.assertLessEqual(len(kept), k)
        self.assertGreaterEqual(len(kept), k - 1)

    def test_conv_net_memory_strategy(self):
        graph, loss, feed = _conv_net()
        self._assert_same_gradients(graph, loss, feed, "memory")

    def test_conv_net_speed_strategy(self):
        graph, loss, feed = _conv_net()
        self._assert_same_gradients(graph, loss, feed, "speed")

    def test_keras_residual_net_with_batch_norm(self):
        import tf_keras as keras  # pylint: disable=g-import-not-at-top
        graph = tf.Graph()
        with graph.as_default():
            inputs = keras.Input([12, 12, 3], batch_size=2)
            h = keras.layers.Conv2D(8, 3, padding="same")(inputs)
            for _ in range(3):
                r = keras.layers.Conv2D(8, 3, padding="same")(h)
                r = keras.layers.BatchNormalization()(r, training=True)
                h = keras.layers.Add()([h, keras.layers.ReLU()(r)])
            outputs = keras.layers.Dense(3)(keras.layers.Flatten()(h))
            model = keras.Model(inputs, outputs)
            x = tf1.placeholder(tf.float32, [2, 12, 12, 3])
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
            # The residual adds are the articulation points.
            self.assertGreaterEqual(len(gc.find_bottleneck_tensors([loss], model.trainable_weights)), 3)
        feed = {x: np.random.RandomState(5).rand(2, 12, 12, 3).astype(np.float32)}
        self._assert_same_gradients(graph, loss, feed, "memory", xs=model.trainable_weights)

    def test_explicit_and_collection_checkpoints(self):
        graph, loss, feed = _mlp(depth=6)
        tanhs = [op.outputs[0] for op in graph.get_operations() if op.type == "Tanh"]
        self._assert_same_gradients(graph, loss, feed, [tanhs[1], tanhs[3]])
        graph, loss, feed = _mlp(depth=6)
        for op in graph.get_operations():
            if op.type == "Tanh":
                graph.add_to_collection(gc.CHECKPOINTS_COLLECTION, op.outputs[0])
        self._assert_same_gradients(graph, loss, feed, "collection")

    def test_non_articulation_checkpoint_with_skip_connection(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [3, 4])
            w1 = tf1.get_variable("w1", initializer=tf.ones([4, 4]) * 0.3)
            w2 = tf1.get_variable("w2", initializer=tf.ones([4, 4]) * -0.2)
            a = tf.nn.sigmoid(tf.matmul(x, w1))
            b = tf.nn.sigmoid(tf.matmul(a, w2))
            loss = tf.reduce_sum(tf.square(a + b))  # a skips over b
        feed = {x: np.arange(12, dtype=np.float32).reshape(3, 4) / 10.0}
        self._assert_same_gradients(graph, loss, feed, [b])

    def test_grad_ys_and_tensor_xs(self):
        graph, loss, feed = _mlp(depth=4)
        with graph.as_default():
            hidden = [op.outputs[0] for op in graph.get_operations() if op.type == "Tanh"]
            out = hidden[-1]
            seed = tf.fill(tf.shape(out), 0.5)
            xs = [hidden[0]] + tf1.trainable_variables()
            reference = tf.gradients(out, xs, grad_ys=seed)
            got = gc.gradients(out, xs, grad_ys=seed, checkpoints=[hidden[1]])
        ref_values, got_values = _evaluate(graph, [reference, got], feed)
        for r, g in zip(ref_values, got_values):
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6)

    def test_dropout_mask_outside_the_path_is_shared(self):
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(3)
            x = tf1.placeholder(tf.float32, [4, 8])
            h = x
            for i in range(4):
                h = tf1.layers.dense(h, 8, activation=tf.nn.relu, name="d%d" % i)
                h = tf.nn.dropout(h, rate=0.5)  # static shape: mask from constants
            loss = tf.reduce_sum(tf.square(h))
        feed = {x: np.random.RandomState(4).rand(4, 8).astype(np.float32)}
        self._assert_same_gradients(graph, loss, feed, "memory")

    def test_control_flow(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [3])
            w = tf1.get_variable("w", initializer=[0.5, -1.0, 2.0])
            h = tf.nn.tanh(x * w)
            # v2 functional cond: one op, copied and differentiated as such.
            h = tf.cond(tf.reduce_sum(x) > 0.0, lambda: h * w, lambda: h - w)
            loss = tf.reduce_sum(tf.square(tf.nn.tanh(h * 2.0)))
        self.assertIn("If", {op.type for op in graph.get_operations()})  # reads w: stateful
        self._assert_same_gradients(graph, loss, {x: [1.0, 2.0, 3.0]}, "memory")
        saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
        try:
            graph = tf.Graph()
            with graph.as_default():
                w = tf1.get_variable("w", initializer=2.0)
                _, y = tf1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * w),
                                      [0, tf.constant(1.0)])
                with self.assertRaisesRegex(ValueError, "control-flow-v1"):
                    gc.gradients(y, [w])
        finally:
            control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved

    def test_unreached_x_gives_none(self):
        graph, loss, _ = _mlp(depth=3)
        with graph.as_default():
            other = tf1.get_variable("other", [2])
            got = gc.gradients(loss, [other])
        self.assertEqual(got, [None])

    def test_errors(self):
        graph, loss, _ = _mlp(depth=3)
        with graph.as_default():
            xs = tf1.trainable_variables()
            with self.assertRaisesRegex(ValueError, "Unknown checkpoints strategy"):
                gc.gradients(loss, xs, checkpoints="fast")
            with self.assertRaises(TypeError):
                gc.gradients(loss, xs, checkpoints=["not a tensor"])
            dynamic = tf1.placeholder(tf.float32, [None, 24])
            m = tf.matmul(dynamic, xs[0])
            # The noise shape depends on xs: the random op would be recomputed.
            h = tf.reduce_sum(m * tf.random.uniform(tf.shape(m)))
            n_ops = len(graph.get_operations())
            with self.assertRaisesRegex(ValueError, "random"):
                gc.gradients(h, xs[:1])
            self.assertLen(graph.get_operations(), n_ops)


if __name__ == "__main__":
    absltest.main()
