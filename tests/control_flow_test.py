"""qat.quantize.plan.model.control_flow: layers inside functional control flow are found.

Issue #12 item 6: convs inside a `tf.cond` (If), a `tf.while_loop` body
(While) or a `tf.function` called from the graph (PartitionedCall) get no
FakeQuant, since the rewrite cannot edit function bodies; the detection
lists each one so the rewrite can warn, and the documented workaround
(`tf.compat.v1.disable_control_flow_v2()`) gives graph-level conds whose
layers are quantized.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.quantize.plan.model import control_flow  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()


def _cond_model(g):
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3], name="x")
        p = tf.compat.v1.placeholder(tf.bool, [], name="p")
        w = tf.compat.v1.get_variable("w", [3, 3, 3, 4])
        y = tf.compat.v1.cond(
            p, lambda: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME", name="conv_a")),
            lambda: tf.nn.relu6(tf.nn.conv2d(x, 2.0 * w, 1, "SAME", name="conv_b")),
            name="branch")
        return x, p, tf.identity(y, name="out")


class ControlFlowTest(absltest.TestCase):

    def test_layers_in_cond_while_and_function_are_found(self):
        g = tf.Graph()
        _, _, y = _cond_model(g)
        with g.as_default():
            def body(i, v):
                return i + 1, tf.matmul(v, tf.ones([4, 4]), name="loop_matmul")

            _, z = tf.compat.v1.while_loop(lambda i, v: i < 3, body,
                                           [0, tf.reshape(y, [50, 4])], name="loop")

            @tf.function
            def head(t):
                return tf.nn.depthwise_conv2d(t, tf.ones([1, 1, 4, 1]), [1, 1, 1, 1],
                                              "SAME", name="head_dw")

            tf.identity(head(y), name="head_out")
            tf.identity(z, name="loop_out")
        found = control_flow.find_function_layers(g)
        summary = sorted((f.call_type, f.layer, f.layer_type) for f in found)
        call_types = {f.call_op: f.call_type for f in found}
        self.assertEqual(call_types["branch"], "If")
        self.assertIn(call_types["loop"], ("While", "StatelessWhile"))
        self.assertEqual(
            [s for s in summary if s[0] == "If"],
            [("If", "conv_a", "Conv2D"), ("If", "conv_b", "Conv2D")])
        self.assertEqual([(f.layer_type, f.layer.startswith("loop_matmul"))
                          for f in found if f.call_op == "loop"], [("MatMul", True)])
        self.assertEqual([f.layer_type for f in found if "PartitionedCall" in f.call_type],
                         ["DepthwiseConv2dNative"])
        for f in found:
            self.assertIn(f.function, [d.signature.name
                                       for d in g.as_graph_def().library.function])
            message = f.describe()
            self.assertIn(f.layer, message)
            self.assertIn(f.call_op, message)
            self.assertIn("disable_control_flow_v2", message)

    def test_quantize_pass_names_the_layers_it_leaves_float(self):
        g = tf.Graph()
        _cond_model(g)
        with self.assertLogs(level="WARNING") as logs:
            result = qat.insert_quant_ops(g, is_training=False)
        left = {item.name.rpartition("/")[2]: item.reason for item in result.left_float}
        self.assertIn("conv_a", left)
        self.assertIn("conv_b", left)
        self.assertIn("disable_control_flow_v2", left["conv_a"])
        self.assertTrue(any("conv_a" in line for line in logs.output))

    def test_nested_function_calls_are_followed(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 4], name="x")
            p = tf.compat.v1.placeholder(tf.bool, [], name="p")

            @tf.function
            def inner(t):
                return tf.matmul(t, tf.ones([4, 4]), name="inner_matmul")

            @tf.function
            def outer(t):
                return tf.cond(p, lambda: inner(t), lambda: t)

            outer(x)
        found = control_flow.find_function_layers(g)
        self.assertEqual([(f.layer, f.layer_type) for f in found],
                         [("inner_matmul", "MatMul")])
        self.assertIn(found[0].call_type, ("PartitionedCall", "StatefulPartitionedCall"))

    def test_graph_without_functions_has_none(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 4])
            tf.matmul(x, tf.ones([4, 3]))
        self.assertEqual(control_flow.find_function_layers(g), [])

    def test_find_does_not_modify_the_graph(self):
        g = tf.Graph()
        _cond_model(g)
        before = g.as_graph_def().SerializeToString(deterministic=True)
        self.assertLen(control_flow.find_function_layers(g), 2)
        self.assertEqual(g.as_graph_def().SerializeToString(deterministic=True), before)

    def test_workaround_control_flow_v1_quantizes_the_branches(self):
        tf.compat.v1.disable_control_flow_v2()
        try:
            g = tf.Graph()
            x, p, y = _cond_model(g)
        finally:
            tf.compat.v1.enable_control_flow_v2()
        self.assertEqual(control_flow.find_function_layers(g), [])
        qat.create_eval_graph(g)
        conv_weights = {}
        for op in g.get_operations():
            if op.type == "Conv2D":
                conv_weights[op.name] = op.inputs[1]
        self.assertLen(conv_weights, 2)
        for name, weights in conv_weights.items():
            producers = set()
            t = weights
            while t.op.type in ("Identity", "Switch"):
                t = t.op.inputs[0]
            producers.add(t.op.type)
            self.assertEqual(producers, {"FakeQuantWithMinMaxVars"}, name)
        with g.as_default():
            init = tf.compat.v1.global_variables_initializer()
        feed = {x: np.random.RandomState(0).uniform(-1, 1, [2, 5, 5, 3])}
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            for branch in (True, False):
                feed[p] = branch
                self.assertTrue(np.all(np.isfinite(sess.run(y, feed))))


if __name__ == "__main__":
    absltest.main()
