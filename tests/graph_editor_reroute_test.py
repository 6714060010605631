"""Tests of qat.graph_editor.reroute."""
from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from qat import graph_editor as ge


def _input_names(op):
    return [t.name for t in op.inputs]


class RerouteTsTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.a = tf.constant([1.0, 2.0], name="a")
            self.b = tf.constant([10.0, 20.0], name="b")
            self.c = tf.add(self.a, self.b, name="c")
            self.d = tf.multiply(self.c, self.a, name="d")
            self.e = tf.subtract(self.a, self.a, name="e")

    def _run(self, t):
        with tf.compat.v1.Session(graph=self.graph) as sess:
            return sess.run(t)

    def test_reroute_counts_slots_and_evaluates(self):
        # a feeds c (1 slot), d (1 slot) and e (2 slots).
        self.assertEqual(ge.reroute_ts(self.b, self.a), 4)
        self.assertEqual(_input_names(self.c.op), ["b:0", "b:0"])
        self.assertEqual(_input_names(self.d.op), ["c:0", "b:0"])
        self.assertEqual(_input_names(self.e.op), ["b:0", "b:0"])
        self.assertEqual(self.a.consumers(), [])
        np.testing.assert_allclose(self._run(self.d), [200.0, 800.0])

    def test_does_not_scan_the_graph(self):
        def fail():
            raise AssertionError("reroute_ts scanned the whole graph")

        self.graph.get_operations = fail
        try:
            self.assertEqual(ge.reroute_ts(self.b, self.a), 4)
            self.assertEqual(ge.swap_ts(self.a, self.b), 5)
        finally:
            del self.graph.get_operations

    def test_can_modify_and_cannot_modify(self):
        self.assertEqual(ge.reroute_ts(self.b, self.a, can_modify=[self.d.op]), 1)
        self.assertEqual(_input_names(self.d.op), ["c:0", "b:0"])
        self.assertEqual(_input_names(self.c.op), ["a:0", "b:0"])
        self.assertEqual(ge.reroute_ts(self.b, self.a, cannot_modify=self.e.op), 1)
        self.assertEqual(_input_names(self.c.op), ["b:0", "b:0"])
        self.assertEqual(_input_names(self.e.op), ["a:0", "a:0"])

    def test_identical_pairs_skipped(self):
        self.assertEqual(ge.reroute_ts([self.a, self.b], [self.a, self.b]), 0)
        self.assertEqual(_input_names(self.c.op), ["a:0", "b:0"])

    def test_swap(self):
        self.assertEqual(ge.swap_ts(self.a, self.b), 5)
        self.assertEqual(_input_names(self.c.op), ["b:0", "a:0"])
        self.assertEqual(_input_names(self.d.op), ["c:0", "b:0"])
        self.assertEqual(_input_names(self.e.op), ["b:0", "b:0"])
        np.testing.assert_allclose(self._run(self.d), [110.0, 440.0])

    def test_swap_with_repeated_pairs_changes_each_slot_once(self):
        self.assertEqual(ge.swap_ts([self.a, self.b], [self.b, self.a]), 5)
        self.assertEqual(_input_names(self.c.op), ["b:0", "a:0"])

    def test_dtype_mismatch_names_tensors_and_leaves_graph(self):
        with self.graph.as_default():
            i = tf.constant([1, 2], name="ints")
        with self.assertRaisesRegex(ValueError, "ints:0.*a:0|a:0.*ints:0"):
            ge.reroute_ts(i, self.a)
        self.assertEqual(_input_names(self.c.op), ["a:0", "b:0"])

    def test_shape_mismatch_names_tensors(self):
        with self.graph.as_default():
            s = tf.constant([1.0, 2.0, 3.0], name="three")
        with self.assertRaisesRegex(ValueError, r"three:0.*a:0"):
            ge.reroute_ts(s, self.a)
        with self.assertRaisesRegex(ValueError, "different sizes"):
            ge.reroute_ts([self.a, self.b], [self.b])
        self.assertEqual(_input_names(self.c.op), ["a:0", "b:0"])

    def test_partial_shapes_are_compatible(self):
        with self.graph.as_default():
            p = tf.compat.v1.placeholder(tf.float32, [None], name="p")
        self.assertEqual(ge.reroute_ts(p, self.b), 1)
        with tf.compat.v1.Session(graph=self.graph) as sess:
            np.testing.assert_allclose(sess.run(self.c, {p: [5.0, 6.0]}), [6.0, 8.0])

    def test_other_graph_refused(self):
        other = tf.Graph()
        with other.as_default():
            x = tf.constant([1.0, 2.0], name="x")
        with self.assertRaises(ValueError):
            ge.reroute_ts(x, self.a)

    def test_finalized_graph_refused(self):
        self.graph.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            ge.reroute_ts(self.b, self.a)
        self.assertEqual(_input_names(self.c.op), ["a:0", "b:0"])

    def test_func_graph_refused(self):
        found = {}

        @tf.function
        def fn(x):
            y = x + 1.0
            z = x * 2.0
            found["ts"] = (y, z)
            return y * z

        fn.get_concrete_function(tf.TensorSpec([], tf.float32))
        y, z = found["ts"]
        with self.assertRaisesRegex(ValueError, "FuncGraph"):
            ge.reroute_ts(z, y)


class VariablesTest(parameterized.TestCase):

    @parameterized.parameters(True, False)
    def test_reroute_variable_reads(self, use_resource):
        graph = tf.Graph()
        with graph.as_default():
            v = tf.compat.v1.get_variable(
                "v", initializer=3.0, use_resource=use_resource)
            w = tf.compat.v1.get_variable(
                "w", initializer=5.0, use_resource=use_resource)
            read_v = tf.identity(v.value(), name="read_v")
            read_w = tf.identity(w.value(), name="read_w")
            out = tf.multiply(read_v, 2.0, name="out")
            init = tf.compat.v1.global_variables_initializer()
        self.assertEqual(ge.reroute_ts(read_w, read_v), 1)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            self.assertEqual(sess.run(out), 10.0)

    def test_ref_input_needs_ref_tensor(self):
        graph = tf.Graph()
        with graph.as_default():
            v = tf.compat.v1.get_variable("v", initializer=3.0, use_resource=False)
            w = tf.compat.v1.get_variable("w", initializer=5.0, use_resource=False)
            assign = tf.compat.v1.assign(v, 7.0, name="assign")
        ref_v = assign.op.inputs[0]
        self.assertEqual(ref_v.dtype, tf.float32._as_ref)  # pylint: disable=protected-access
        with self.assertRaisesRegex(ValueError, "reference"):
            ge.reroute_ts(w.value(), ref_v)
        self.assertIs(assign.op.inputs[0], ref_v)
        # A ref tensor can replace another: the assign now writes w.
        ref_w = w.value().op.inputs[0]
        self.assertEqual(ge.reroute_ts(ref_w, ref_v, can_modify=[assign.op]), 1)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.variables_initializer([v, w]))
            sess.run(assign)
            self.assertEqual(sess.run(w.value()), 7.0)
            self.assertEqual(sess.run(v.value()), 3.0)


class MultiOutputTest(absltest.TestCase):

    def test_split_and_unique_outputs(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf.constant([[1.0, 2.0], [3.0, 4.0]], name="x")
            s0, s1 = tf.split(x, 2, name="split")
            out = tf.add(s0, s1, name="out")
            values, idx = tf.unique(tf.constant([3, 3, 5], name="u_in"), name="uniq")
            idx_plus = tf.add(idx, 1, name="idx_plus")
        self.assertEqual(ge.swap_ts(s0, s1), 2)
        self.assertEqual(_input_names(out.op), ["split:1", "split:0"])
        # Both int32; shapes [?] and [3] are compatible.
        self.assertEqual(ge.reroute_ts(values, idx), 1)
        self.assertEqual(_input_names(idx_plus.op)[0], "uniq:0")
        with tf.compat.v1.Session(graph=graph) as sess:
            np.testing.assert_allclose(sess.run(out), [[4.0, 6.0]])
            np.testing.assert_array_equal(sess.run(idx_plus), [4, 6])


class SubGraphRerouteTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.x = tf.constant(2.0, name="x")
            self.y = tf.constant(3.0, name="y")
            with tf.name_scope("f"):
                self.f = tf.multiply(self.x, 10.0, name="mul")
            with tf.name_scope("g"):
                self.g = tf.add(self.y, 1.0, name="add")
            self.out_f = tf.identity(self.f, name="out_f")
            self.out_g = tf.identity(self.g, name="out_g")

    def _run(self, ts):
        with tf.compat.v1.Session(graph=self.graph) as sess:
            return sess.run(ts)

    def test_swap_inputs(self):
        f_view = ge.sgv_scope("f", self.graph)
        g_view = ge.sgv_scope("g", self.graph)
        f_view, g_view = ge.swap_inputs(f_view, g_view)
        self.assertEqual([t.name for t in f_view.inputs], ["y:0"])
        self.assertEqual([t.name for t in g_view.inputs], ["x:0"])
        self.assertEqual(self._run([self.out_f, self.out_g]), [30.0, 3.0])

    def test_reroute_inputs(self):
        f_view = ge.sgv_scope("f", self.graph)
        g_view = ge.sgv_scope("g", self.graph)
        _, g_view = ge.reroute_inputs(f_view, g_view)
        self.assertEqual([t.name for t in g_view.inputs], ["x:0"])
        self.assertEqual(self._run([self.out_f, self.out_g]), [20.0, 3.0])

    def test_swap_and_reroute_outputs(self):
        f_view = ge.sgv_scope("f", self.graph)
        g_view = ge.sgv_scope("g", self.graph)
        ge.swap_outputs(f_view, g_view)
        self.assertEqual(self._run([self.out_f, self.out_g]), [4.0, 20.0])
        ge.reroute_outputs(f_view, g_view)
        # Both outside consumers now read f's output.
        self.assertEqual(self._run([self.out_f, self.out_g]), [20.0, 20.0])

    def test_swap_ios(self):
        f_view = ge.sgv_scope("f", self.graph)
        g_view = ge.sgv_scope("g", self.graph)
        ge.swap_ios(f_view, g_view)
        # out_f reads g (now fed x): 3; out_g reads f (now fed y): 30.
        self.assertEqual(self._run([self.out_f, self.out_g]), [3.0, 30.0])


class KerasGraphTest(absltest.TestCase):

    def test_bypass_keras_batch_norm(self):
        import tf_keras  # pylint: disable=import-outside-toplevel
        graph = tf.Graph()
        with graph.as_default():
            inputs = tf.compat.v1.placeholder(tf.float32, [1, 4, 4, 2], name="inputs")
            conv = tf_keras.layers.Conv2D(3, 3, padding="same", name="conv")(inputs)
            bn = tf_keras.layers.BatchNormalization(name="bn")(conv, training=False)
            out = tf.nn.relu(bn, name="out")
            init = tf.compat.v1.global_variables_initializer()
        self.assertEqual(out.op.inputs[0].op.type, "FusedBatchNormV3")
        self.assertEqual(ge.reroute_ts(conv, bn), 1)
        self.assertIs(out.op.inputs[0], conv)
        x = np.random.RandomState(0).randn(1, 4, 4, 2).astype(np.float32)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            got, conv_value = sess.run([out, conv], {inputs: x})
        np.testing.assert_allclose(got, np.maximum(conv_value, 0.0))


class ControlInputsTest(absltest.TestCase):

    def test_add_remove(self):
        graph = tf.Graph()
        with graph.as_default():
            a = tf.constant(1.0, name="a")
            b = tf.constant(2.0, name="b")
            c = tf.identity(a, name="c")
        ge.add_control_inputs(c.op, [b.op])
        self.assertEqual(c.op.control_inputs, [b.op])
        self.assertEqual(b.op._control_outputs, [c.op])  # pylint: disable=protected-access
        with self.assertRaisesRegex(ValueError, "already"):
            ge.add_control_inputs(c.op, b.op)
        with self.assertRaisesRegex(ValueError, "not a control input"):
            ge.remove_control_inputs(c.op, [b.op, a.op])
        self.assertEqual(c.op.control_inputs, [b.op])
        ge.remove_control_inputs(c.op, b.op)
        self.assertEqual(c.op.control_inputs, [])
        with self.assertRaises(TypeError):
            ge.add_control_inputs(c, [b.op])

    def test_finalized_graph(self):
        graph = tf.Graph()
        with graph.as_default():
            a = tf.constant(1.0, name="a")
            c = tf.identity(a, name="c")
        graph.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            ge.add_control_inputs(c.op, a.op)
        self.assertEqual(c.op.control_inputs, [])


if __name__ == "__main__":
    absltest.main()
