"""Tests of qat.graph_editor.transform: copies evaluated in a Session.

Copies of control flow are tests/graph_editor_control_flow_test.py's.
"""
import collections
import functools
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from qat import graph_editor as ge

tf1 = tf.compat.v1


def _run(graph, fetches, feed_dict=None, init=False):
    with tf1.Session(graph=graph) as sess:
        if init:
            with graph.as_default():
                sess.run(tf1.global_variables_initializer())
        return sess.run(fetches, feed_dict)


class CopyTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.a = tf1.placeholder(tf.float32, [3], name="a")
            self.b = tf.constant([1.0, 2.0, 3.0], name="b")
            with tf.name_scope("f"):
                self.c = tf.add(self.a, self.b, name="c")
                self.d = tf.multiply(self.c, 2.0, name="d")
                self.e = tf.reduce_sum(self.d, name="e")

    def test_copy_to_other_graph_evaluates(self):
        dst = tf.Graph()
        sgv, info = ge.copy(self.graph, dst_graph=dst, dst_scope="imported")
        self.assertIs(info.graph_, dst)
        self.assertEqual(info.scope_, "imported/")
        e_ = info.transformed(self.e)
        a_ = info.transformed(self.a)
        self.assertEqual(e_.name, "imported/f/e:0")
        self.assertIs(e_.graph, dst)
        self.assertEqual(len(sgv.ops), len(self.graph.get_operations()))
        self.assertEqual(_run(dst, e_, {a_: [1.0, 1.0, 1.0]}), 18.0)
        # The source graph is unchanged.
        self.assertEqual(len(self.graph.get_operations()), 7)

    def test_copy_view_in_same_graph_makes_input_placeholders(self):
        view = ge.sgv(self.c.op, self.d.op)
        sgv, info = ge.copy(view, dst_scope="copy")
        self.assertIs(info.graph_, self.graph)
        d_ = info.transformed(self.d)
        self.assertEqual(d_.op.name, "copy/f/d")
        placeholders = [t for t in sgv.inputs]
        # a, b and the constant 2.0 of d are the view's inputs.
        for t in placeholders:
            self.assertEqual(t.op.type, "Placeholder")
        self.assertEqual([t.op.name for t in placeholders],
                         ["copy/geph__a_0", "copy/geph__b_0", "copy/geph__y_0"])
        # Each input has one placeholder, found through the info.
        self.assertIs(info.transformed(self.a), placeholders[0])
        got = _run(self.graph, d_, {placeholders[0]: [1, 1, 1], placeholders[1]: [0, 1, 2],
                                    placeholders[2]: 3.0})
        np.testing.assert_allclose(got, [3.0, 6.0, 9.0])

    def test_second_copy_gets_unique_scope_unless_reused(self):
        _, info1 = ge.copy(ge.sgv(self.d.op), dst_scope="s")
        _, info2 = ge.copy(ge.sgv(self.d.op), dst_scope="s")
        self.assertEqual(info1.scope_, "s/")
        self.assertEqual(info2.scope_, "s_1/")
        _, info3 = ge.copy(ge.sgv(self.e.op), dst_scope="s", reuse_dst_scope=True)
        self.assertEqual(info3.scope_, "s/")
        self.assertEqual(info3.transformed(self.e).op.name, "s/f/e")

    def test_src_scope_is_stripped(self):
        _, info = ge.copy(ge.sgv_scope("f", self.graph), dst_graph=tf.Graph(),
                          dst_scope="g", src_scope="f")
        self.assertEqual(info.transformed(self.d).op.name, "g/d")
        self.assertEqual(info.transformed("f/d").name, "g/d")
        self.assertEqual(info.transformed("f/d:0").name, "g/d:0")

    def test_transformed_and_original_keep_structure(self):
        _, info = ge.copy(self.graph, dst_graph=tf.Graph())
        Pair = collections.namedtuple("Pair", ["x", "y"])
        tree = {"p": Pair(self.c, self.d.op), "l": [self.e],
                "o": collections.OrderedDict([("z", self.a), ("y", self.b)])}
        tree_ = info.transformed(tree)
        self.assertIsInstance(tree_["p"], Pair)
        self.assertIsInstance(tree_["o"], collections.OrderedDict)
        self.assertEqual(list(tree_["o"].keys()), ["z", "y"])
        self.assertIs(tree_["p"].x, info._transformed_ts[self.c])
        self.assertIs(tree_["p"].y, info._transformed_ops[self.d.op])
        self.assertEqual(info.original(tree_), tree)
        other = tf.Graph()
        with other.as_default():
            stranger = tf.constant(0.0)
        self.assertIsNone(info.transformed(stranger))
        self.assertIs(info.transformed(stranger, missing_fn=lambda t: t), stranger)
        with self.assertRaises(TypeError):
            info.transformed(3)

    def test_copy_with_input_replacements(self):
        with self.graph.as_default():
            replacement = tf.constant([10.0, 20.0, 30.0], name="r")
        view = ge.sgv(self.c.op, self.d.op, self.e.op)
        _, info = ge.copy_with_input_replacements(view, {self.a: replacement}, dst_scope="rep")
        e_ = info.transformed(self.e)
        c_ = info.transformed(self.c)
        self.assertIs(c_.op.inputs[0], replacement)
        self.assertIs(c_.op.inputs[1], self.b)  # not replaced: kept (same graph)
        self.assertEqual(_run(self.graph, e_), 2 * (60.0 + 6.0))
        with self.assertRaises(TypeError):
            ge.copy_with_input_replacements(view, [(self.a, replacement)])

    def test_copy_with_input_replacements_to_other_graph(self):
        dst = tf.Graph()
        with dst.as_default():
            replacement = tf.constant([1.0, 1.0, 1.0], name="r")
        view = ge.sgv(self.c.op, self.d.op)
        sgv, info = ge.copy_with_input_replacements(view, {self.a: replacement}, dst_graph=dst)
        c_ = info.transformed(self.c)
        self.assertIs(c_.op.inputs[0], replacement)
        # b is not replaced and cannot be kept in another graph: a placeholder.
        self.assertEqual(c_.op.inputs[1].op.type, "Placeholder")
        self.assertEqual(info.transformed(self.b), c_.op.inputs[1])
        got = _run(dst, info.transformed(self.d),
                   {c_.op.inputs[1]: [1.0, 2.0, 3.0], sgv.inputs[-1]: 2.0})
        np.testing.assert_allclose(got, [4.0, 6.0, 8.0])
        with self.assertRaisesRegex(ValueError, "not in the destination graph"):
            ge.copy_with_input_replacements(view, {self.a: self.b}, dst_graph=dst)

    def test_custom_handlers(self):
        with self.graph.as_default():
            with tf.control_dependencies([self.c.op]):
                f = tf.identity(self.d, name="f")
            tf1.add_to_collection("mine", f)
        transformer = ge.Transformer()
        transformer.transform_control_input_handler = lambda info, op: None
        transformer.assign_collections_handler = lambda info, elem, elem_: None
        transformer.transform_external_input_handler = (
            lambda info, t: tf.ones_like(t))
        transformer.transform_external_hidden_input_handler = (
            lambda info, t: tf.zeros_like(t))
        # Only `a` stays a view input: b and d become hidden inputs.
        view = ge.sgv(self.c.op, f.op).remap_inputs([0])
        self.assertEqual(list(view.inputs), [self.a])
        with self.graph.as_default():
            _, info = transformer(view, self.graph, "h")
        f_ = info.transformed(f)
        self.assertEqual(f_.op.control_inputs, [])
        self.assertLen(self.graph.get_collection("h/mine"), 0)
        self.assertLen(self.graph.get_collection("mine"), 1)
        np.testing.assert_allclose(_run(self.graph, info.transformed(self.c)), [1.0, 1.0, 1.0])
        np.testing.assert_allclose(_run(self.graph, f_), [0.0, 0.0, 0.0])

    def test_control_inputs(self):
        with self.graph.as_default():
            with tf.control_dependencies([self.c.op]):
                f = tf.identity(self.d, name="f")
            with tf.control_dependencies([self.e.op]):
                g = tf.identity(self.d, name="g")
        view = ge.sgv(self.d.op, self.e.op, f.op, g.op)
        _, info = ge.copy(view, dst_scope="ci")
        # self.c is outside the view: kept, as the copy is in the same graph.
        self.assertEqual(info.transformed(f.op).control_inputs, [self.c.op])
        self.assertEqual(info.transformed(g.op).control_inputs, [info.transformed(self.e.op)])
        _, info2 = ge.copy(view, dst_graph=tf.Graph())
        self.assertEqual(info2.transformed(f.op).control_inputs, [])
        self.assertEqual(info2.transformed(g.op).control_inputs, [info2.transformed(self.e.op)])

    def test_nodedef_fn(self):
        def scale_by_three(node_def):
            if node_def.op == "Mul":
                node_def.op = "RealDiv"
            return node_def
        transformer = ge.Transformer()
        transformer.transform_op_handler = functools.partial(
            ge.copy_op_handler, nodedef_fn=scale_by_three)
        dst = tf.Graph()
        _, info = transformer(self.graph, dst, "div")
        d_ = info.transformed(self.d)
        self.assertEqual(d_.op.type, "RealDiv")
        got = _run(dst, d_, {info.transformed(self.a): [1.0, 2.0, 3.0]})
        np.testing.assert_allclose(got, [1.0, 2.0, 3.0])

    def test_copy_shape(self):
        transformer = ge.Transformer()
        transformer.transform_op_handler = functools.partial(ge.copy_op_handler, copy_shape=True)
        transformer.transform_external_input_handler = lambda info, t: tf1.placeholder(
            tf.float32, None)
        with self.graph.as_default():
            _, info = transformer(ge.sgv(self.c.op), self.graph, "shape")
        self.assertEqual(info.transformed(self.c).shape.as_list(), [3])

    def test_in_place_transformation_refused(self):
        transformer = ge.Transformer()
        transformer.transform_op_handler = lambda info, op, new_inputs: (op, op.outputs)
        with self.assertRaisesRegex(ValueError, "In-place"):
            transformer(ge.sgv(self.d.op), self.graph, "x")

    def test_bad_input_leaves_graph_unchanged(self):
        n = len(self.graph.get_operations())
        with self.assertRaisesRegex(ValueError, "source scope"):
            ge.copy(self.graph, dst_scope="x", src_scope="f")
        self.assertLen(self.graph.get_operations(), n)
        with self.assertRaises(TypeError):
            ge.copy(self.graph, dst_graph="not a graph")
        finalized = tf.Graph()
        finalized.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            ge.copy(self.graph, dst_graph=finalized)

    def test_func_graph_refused(self):
        captured = {}

        @tf.function
        def fn(x):
            y = x * 2.0
            captured["graph"] = y.graph
            captured["y"] = y
            return y

        fn.get_concrete_function(tf.TensorSpec([], tf.float32))
        with self.assertRaisesRegex(ValueError, "FuncGraph"):
            ge.copy(captured["y"].op, dst_graph=tf.Graph())
        with self.assertRaisesRegex(ValueError, "FuncGraph"):
            ge.copy(self.graph, dst_graph=captured["graph"])


class GraphReplaceTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.x = tf1.placeholder(tf.float32, [], name="x")
            self.y = tf.square(self.x, name="y")
            self.z = tf.add(self.y, 1.0, name="z")
            self.u = tf.constant(5.0, name="u")
            self.new_x = tf.constant(3.0, name="new_x")

    def test_structures_are_preserved(self):
        Targets = collections.namedtuple("Targets", ["y", "z"])
        targets = {
            "d": {"y": self.y, "z": self.z},
            "o": collections.OrderedDict([("z", self.z), ("y", self.y)]),
            "n": Targets(self.y, self.z),
            "l": [self.z, (self.y,)],
        }
        with self.graph.as_default():
            got = ge.graph_replace(targets, {self.x: self.new_x}, dst_scope="r")
        self.assertIsInstance(got["o"], collections.OrderedDict)
        self.assertEqual(list(got["o"].keys()), ["z", "y"])
        self.assertIsInstance(got["n"], Targets)
        self.assertIsInstance(got["l"][1], tuple)
        self.assertIs(got["d"]["z"], got["n"].z)
        self.assertIsNot(got["n"].z, self.z)
        values = _run(self.graph, got, {self.x: 2.0})
        self.assertEqual(values["d"], {"y": 9.0, "z": 10.0})
        self.assertEqual(values["n"], Targets(9.0, 10.0))
        # The original is unchanged.
        self.assertEqual(_run(self.graph, self.z, {self.x: 2.0}), 5.0)

    def test_unconnected_target_is_returned_unchanged(self):
        got = ge.graph_replace([self.z, self.u], {self.x: self.new_x})
        self.assertIs(got[1], self.u)
        self.assertEqual(_run(self.graph, got[0]), 10.0)

    def test_not_connected_raises(self):
        with self.assertRaisesRegex(ValueError, "not connected"):
            ge.graph_replace(self.u, {self.x: self.new_x})

    def test_gradient_graph_copied_under_new_scope(self):
        with self.graph.as_default():
            w = tf1.get_variable("w", initializer=2.0, use_resource=True)
            loss = tf.square(w * self.x - 1.0)
            (grad,) = tf.gradients(loss, [w])
            grad_ = ge.graph_replace(grad, {self.x: self.new_x}, dst_scope="grad_at_3")
        self.assertTrue(grad_.op.name.startswith("grad_at_3/gradients/"))
        got, ref = _run(self.graph, [grad_, grad], {self.x: 0.5}, init=True)
        self.assertAlmostEqual(got, 2 * (2.0 * 3.0 - 1.0) * 3.0, places=5)
        self.assertAlmostEqual(ref, 2 * (2.0 * 0.5 - 1.0) * 0.5, places=5)
        # The whole "gradients" scope copied as a view evaluates the same.
        _, info = ge.copy(ge.sgv_scope("gradients", self.graph), dst_scope="gcopy")
        copied = info.transformed(grad)
        self.assertTrue(copied.op.name.startswith("gcopy/gradients/"))
        # Inputs of the copied view are placeholders named after the originals.
        originals = {info.transformed(t): t for t in ge.sgv_scope("gradients", self.graph).inputs}
        with tf1.Session(graph=self.graph) as sess:
            sess.run(tf1.variables_initializer([w]))
            values = sess.run(list(originals.values()), {self.x: 0.5})
            feed = dict(zip(originals.keys(), values))
            self.assertAlmostEqual(sess.run(copied, feed), ref, places=5)


class CollectionsAndVariablesTest(absltest.TestCase):

    def test_collections(self):
        graph = tf.Graph()
        with graph.as_default():
            a = tf.constant(1.0, name="a")
            b = tf.multiply(a, 3.0, name="b")
            tf1.add_to_collection("mine", b)
            tf1.add_to_collection("mine", b.op)
            tf1.add_to_collection(tf1.GraphKeys.LOSSES, b)
        _, info = ge.copy(graph, dst_scope="c")
        b_ = info.transformed(b)
        def assert_items(collection, expected):
            # Copies are added op first, then its outputs.
            self.assertCountEqual([id(item) for item in collection],
                                  [id(item) for item in expected])
        assert_items(graph.get_collection("c/mine"), [b_, b_.op])
        assert_items(graph.get_collection(tf1.GraphKeys.LOSSES), [b, b_])
        assert_items(graph.get_collection("mine"), [b, b.op])
        dst = tf.Graph()
        _, info = ge.copy(graph, dst_graph=dst, src_scope="", dst_scope="")
        assert_items(dst.get_collection("mine"), [info.transformed(b), info.transformed(b.op)])

    def _variable_graph(self, use_resource):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [2], name="x")
            w = tf1.get_variable("w", initializer=[1.0, 2.0], use_resource=use_resource)
            y = tf.reduce_sum(x * w, name="y")
            update = tf1.assign_add(w, [1.0, 1.0]).op
        return graph, x, w, y, update

    def test_variables_copied_to_other_graph(self):
        for use_resource in (True, False):
            with self.subTest(use_resource=use_resource):
                graph, x, w, y, update = self._variable_graph(use_resource)
                self.assertEqual(w.op.type, "VarHandleOp" if use_resource else "VariableV2")
                dst = tf.Graph()
                _, info = ge.copy(graph, dst_graph=dst, dst_scope="net")
                variables = dst.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                self.assertEqual([v.name for v in variables], ["net/w:0"])
                self.assertEqual(len(dst.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)), 1)
                if not use_resource:
                    # Colocation with the variable follows the copy.
                    read_ = dst.get_operation_by_name("net/w/read")
                    self.assertEqual(read_.get_attr("_class"), [b"loc:@net/w"])
                with tf1.Session(graph=dst) as sess:
                    sess.run(variables[0].initializer)
                    x_ = info.transformed(x)
                    self.assertEqual(sess.run(info.transformed(y), {x_: [1.0, 1.0]}), 3.0)
                    sess.run(info.transformed(update))
                    self.assertEqual(sess.run(info.transformed(y), {x_: [1.0, 1.0]}), 5.0)

    def test_same_graph_copy_reads_the_same_variable(self):
        for use_resource in (True, False):
            with self.subTest(use_resource=use_resource):
                graph, x, w, y, update = self._variable_graph(use_resource)
                consumer_ops = ge.get_forward_walk_ops([x.op], inclusive=False)
                _, info = ge.copy_with_input_replacements(consumer_ops, {}, dst_scope="again")
                y_ = info.transformed(y)
                with tf1.Session(graph=graph) as sess:
                    sess.run(w.initializer)
                    self.assertEqual(sess.run(y_, {x: [1.0, 1.0]}), 3.0)
                    sess.run(update)
                    self.assertEqual(sess.run([y, y_], {x: [1.0, 1.0]}), [5.0, 5.0])

    def test_ref_input_cannot_become_a_placeholder(self):
        graph, x, w, y, update = self._variable_graph(False)
        n = len(graph.get_operations())
        with self.assertRaisesRegex(ValueError, "AssignAdd.*placeholder cannot replace"):
            ge.copy(update, dst_scope="c")
        self.assertLen(graph.get_operations(), n)
        _, info = ge.copy_with_input_replacements(update, {}, dst_scope="d")
        with tf1.Session(graph=graph) as sess:
            sess.run(w.initializer)
            sess.run(info.transformed(update))
            np.testing.assert_allclose(sess.run(w), [2.0, 3.0])

    def test_same_graph_copy_of_variable_is_a_new_variable(self):
        graph, x, w, y, update = self._variable_graph(True)
        _, info = ge.copy(graph, dst_scope="twin")
        w_ = [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
              if v.name == "twin/w:0"]
        self.assertLen(w_, 1)
        with tf1.Session(graph=graph) as sess:
            sess.run([w.initializer, w_[0].initializer])
            sess.run(update)
            x_ = info.transformed(x)
            self.assertEqual(sess.run([y, info.transformed(y)], {x: [1, 1], x_: [1, 1]}),
                             [5.0, 3.0])


if __name__ == "__main__":
    absltest.main()
