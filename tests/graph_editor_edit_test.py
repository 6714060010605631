"""Tests of qat.graph_editor.edit (detach, connect, bypass)."""
from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from qat import graph_editor as ge


def _names(items):
    return [x.name for x in items]


class EditTest(parameterized.TestCase):
    """in/x, in/y placeholders; a control op `gate`;
    blk/m = x * y (control input: gate); blk/s = blk/m + 1;
    out = identity(blk/s) with a control input from blk/m; out2 = blk/s * 2."""

    def setUp(self):
        super().setUp()
        self.graph = tf.Graph()
        with self.graph.as_default():
            with tf.name_scope("in"):
                self.x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
                self.y = tf.compat.v1.placeholder(tf.float32, [2], name="y")
            self.gate = tf.no_op(name="gate")
            with tf.name_scope("blk"):
                with tf.control_dependencies([self.gate]):
                    self.m = tf.multiply(self.x, self.y, name="m")
                self.s = tf.add(self.m, 1.0, name="s")
            with tf.control_dependencies([self.m.op]):
                self.out = tf.identity(self.s, name="out")
            self.out2 = tf.multiply(self.s, 2.0, name="out2")
        self.feed = {self.x: [1.0, 2.0], self.y: [3.0, 4.0]}

    def run_graph(self, fetches, feed):
        with tf.compat.v1.Session(graph=self.graph) as sess:
            return sess.run(fetches, feed)

    def test_detach_inputs(self):
        sgv = ge.sgv_scope("blk", self.graph)
        sgv_, placeholders = ge.detach_inputs(sgv)
        self.assertIs(sgv_, sgv)
        self.assertEqual(_names(placeholders), ["in/geph__x_0:0", "in/geph__y_0:0"])
        self.assertEqual([p.op.type for p in placeholders], ["Placeholder"] * 2)
        self.assertEqual(placeholders[0].shape.as_list(), [2])
        self.assertEqual(list(sgv.inputs), placeholders)
        self.assertEqual(_names(self.m.op.inputs), ["in/geph__x_0:0", "in/geph__y_0:0"])
        self.assertEqual(self.x.consumers(), [])
        # Control inputs stay unless asked.
        self.assertEqual(self.m.op.control_inputs, [self.gate])
        res = self.run_graph(self.out, {placeholders[0]: [2.0, 2.0],
                                        placeholders[1]: [5.0, 6.0]})
        np.testing.assert_allclose(res, [11.0, 13.0])

    def test_detach_inputs_with_control_inputs(self):
        sgv, _ = ge.detach_inputs(ge.sgv_scope("blk", self.graph), control_inputs=True)
        self.assertEqual(self.m.op.control_inputs, [])
        self.assertEqual(_names(sgv.ops), ["blk/m", "blk/s/y", "blk/s"])

    def test_detach_outputs(self):
        sgv_, placeholders = ge.detach_outputs(ge.sgv_scope("blk", self.graph))
        self.assertEqual(_names(sgv_.outputs), ["blk/s:0"])
        self.assertEqual(_names(placeholders), ["blk/geph__s_0:0"])
        self.assertEqual(_names(self.out.op.inputs), ["blk/geph__s_0:0"])
        self.assertEqual(_names(self.out2.op.inputs)[0], "blk/geph__s_0:0")
        self.assertEqual(self.s.consumers(), [])
        # blk/m:0 is only read inside: untouched; control output kept.
        self.assertEqual(self.out.op.control_inputs, [self.m.op])
        # out still waits on blk/m (control input), hence the feed of x, y.
        feed = dict(self.feed)
        feed[placeholders[0]] = [7.0, 8.0]
        res = self.run_graph([self.out, self.out2], feed)
        np.testing.assert_allclose(res, [[7.0, 8.0], [14.0, 16.0]])

    def test_detach_outputs_with_control_outputs(self):
        control_outputs = ge.ControlOutputs(self.graph)
        ge.detach_outputs(ge.sgv_scope("blk", self.graph), control_outputs)
        self.assertEqual(self.out.op.control_inputs, [])

    def test_detach_control_inputs_and_outputs(self):
        sgv = ge.sgv_scope("blk", self.graph)
        ge.detach_control_inputs(sgv)
        self.assertEqual(self.m.op.control_inputs, [])
        with self.assertRaises(TypeError):
            ge.detach_control_outputs(sgv, None)
        ge.detach_control_outputs(sgv, ge.ControlOutputs(self.graph))
        self.assertEqual(self.out.op.control_inputs, [])
        # Data edges are untouched.
        np.testing.assert_allclose(self.run_graph(self.out, self.feed), [4.0, 9.0])

    def test_detach_both(self):
        sgv, inputs, outputs = ge.detach(ge.sgv_scope("blk", self.graph),
                                         control_ios=ge.ControlOutputs(self.graph))
        self.assertEqual(_names(inputs), ["in/geph__x_0:0", "in/geph__y_0:0"])
        self.assertEqual(_names(outputs), ["blk/geph__s_0:0"])
        self.assertEqual(self.m.op.control_inputs, [])
        self.assertEqual(self.out.op.control_inputs, [])
        self.assertEqual(list(sgv.inputs), inputs)

    def test_connect(self):
        with self.graph.as_default():
            k1 = tf.constant([3.0, 3.0], name="k1")
            k2 = tf.constant([4.0, 4.0], name="k2")
            user = tf.identity(k1, name="user")
        producer = ge.sgv([k1.op, k2.op])
        self.assertEqual(_names(producer.outputs), ["k1:0", "k2:0"])
        consumer = ge.connect(producer, ge.sgv_scope("blk", self.graph))
        self.assertEqual(_names(consumer.inputs), ["k1:0", "k2:0"])
        self.assertEqual(_names(self.m.op.inputs), ["k1:0", "k2:0"])
        np.testing.assert_allclose(self.run_graph(self.out, {}), [13.0, 13.0])
        # k1's other consumer is untouched without disconnect_first.
        self.assertEqual(_names(user.op.inputs), ["k1:0"])

    def test_connect_disconnect_first(self):
        with self.graph.as_default():
            k1 = tf.constant([3.0, 3.0], name="k1")
            k2 = tf.constant([4.0, 4.0], name="k2")
            user = tf.identity(k1, name="user")
        producer = ge.sgv([k1.op, k2.op])
        ge.connect(producer, ge.sgv_scope("blk", self.graph), disconnect_first=True)
        self.assertEqual(_names(user.op.inputs), ["geph__k1_0:0"])
        self.assertEqual(_names(self.m.op.inputs), ["k1:0", "k2:0"])

    def test_connect_mismatch(self):
        with self.graph.as_default():
            k1 = tf.constant([3.0, 3.0], name="k1")
        with self.assertRaisesRegex(ValueError, "different sizes"):
            ge.connect(ge.sgv(k1.op), ge.sgv_scope("blk", self.graph))
        self.assertEqual(_names(self.m.op.inputs), ["in/x:0", "in/y:0"])

    def test_bypass(self):
        # View {blk/s, its constant}: input blk/m:0, output blk/s:0.
        sgv = ge.sgv_scope("blk/s", self.graph)
        self.assertEqual(_names(sgv.inputs), ["blk/m:0"])
        self.assertEqual(_names(sgv.outputs), ["blk/s:0"])
        sgv, placeholders = ge.bypass(sgv)
        self.assertEqual(_names(placeholders), ["blk/geph__m_0:0"])
        self.assertEqual(_names(self.out.op.inputs), ["blk/m:0"])
        self.assertEqual(_names(self.s.op.inputs)[0], "blk/geph__m_0:0")
        np.testing.assert_allclose(self.run_graph([self.out, self.out2], self.feed),
                                   [[3.0, 8.0], [6.0, 16.0]])

    def test_bypass_mismatch_leaves_graph_unchanged(self):
        n_ops = len(self.graph.get_operations())
        with self.assertRaisesRegex(ValueError, "different sizes"):
            ge.bypass(ge.sgv_scope("blk", self.graph))
        self.assertLen(self.graph.get_operations(), n_ops)
        self.assertEqual(_names(self.m.op.inputs), ["in/x:0", "in/y:0"])

    def test_finalized_graph_refused(self):
        n_ops = len(self.graph.get_operations())
        self.graph.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            ge.detach_inputs(ge.sgv_scope("blk", self.graph))
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            ge.bypass(ge.sgv_scope("blk/s", self.graph))
        self.assertLen(self.graph.get_operations(), n_ops)
        self.assertEqual(_names(self.m.op.inputs), ["in/x:0", "in/y:0"])

    def test_func_graph_refused(self):
        found = {}

        @tf.function
        def fn(x):
            y = tf.multiply(x, 3.0, name="y")
            found["y"] = y
            return y + 1.0

        fn.get_concrete_function(tf.TensorSpec([2], tf.float32))
        with self.assertRaisesRegex(ValueError, "FuncGraph"):
            ge.detach_inputs(ge.sgv(found["y"].op))

    @parameterized.parameters(True, False)
    def test_bypass_variable_scale(self, use_resource):
        graph = tf.Graph()
        with graph.as_default():
            v = tf.compat.v1.get_variable("v", initializer=[2.0, 3.0],
                                          use_resource=use_resource)
            read = v.value()
            with tf.name_scope("scale"):
                scaled = tf.multiply(read, 10.0, name="mul")
            out = tf.add(scaled, 1.0, name="out")
            init = tf.compat.v1.global_variables_initializer()
        sgv = ge.sgv_scope("scale", graph)
        self.assertEqual(_names(sgv.inputs), [read.name])
        ge.bypass(sgv)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            np.testing.assert_allclose(sess.run(out), [3.0, 4.0])


if __name__ == "__main__":
    absltest.main()
