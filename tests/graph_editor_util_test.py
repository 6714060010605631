"""Tests of qat.graph_editor.util."""
import collections

from absl.testing import absltest
import tensorflow as tf

from qat import graph_editor as ge
from qat.graph_editor import util


def _names(items):
    return [x.name for x in items]


class ListsTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.graph = tf.Graph()
        with cls.graph.as_default():
            cls.a = tf.constant(1.0, name="a")
            cls.b = tf.constant(2.0, name="b")
            cls.c = tf.add(cls.a, cls.b, name="c")
            cls.d = tf.multiply(cls.c, cls.a, name="d")
            cls.parts = tf.split(tf.zeros([4, 2], name="z"), 2, name="split")
            cls.e = tf.identity(cls.parts[1], name="e")
        cls.other = tf.Graph()
        with cls.other.as_default():
            cls.x = tf.constant(0.0, name="x")

    def test_make_list_of_op_from_graph(self):
        self.assertEqual(_names(util.make_list_of_op(self.graph)),
                         _names(self.graph.get_operations()))
        with self.assertRaises(TypeError):
            util.make_list_of_op(self.graph, allow_graph=False)

    def test_make_list_of_op_single_set_and_dict_values(self):
        self.assertEqual(util.make_list_of_op(self.c.op), [self.c.op])
        self.assertCountEqual(util.make_list_of_op({self.c.op, self.d.op}),
                              [self.c.op, self.d.op])
        self.assertEqual(util.make_list_of_op({"k": self.a.op}.values()), [self.a.op])
        self.assertEqual(util.make_list_of_op([]), [])

    def test_make_list_of_op_tensors(self):
        with self.assertRaises(TypeError):
            util.make_list_of_op([self.c.op, self.c])
        self.assertEqual(util.make_list_of_op([self.c.op, self.c], ignore_ts=True),
                         [self.c.op])

    def test_make_list_of_op_mixed_graphs(self):
        with self.assertRaisesRegex(ValueError, "x"):
            util.make_list_of_op([self.c.op, self.x.op])

    def test_make_list_of_t(self):
        self.assertEqual(util.make_list_of_t(self.c), [self.c])
        self.assertEqual(util.make_list_of_t([self.c, self.d.op], ignore_ops=True), [self.c])
        with self.assertRaises(TypeError):
            util.make_list_of_t([self.c, self.d.op])
        with self.assertRaises(ValueError):
            util.make_list_of_t([self.c, self.x])
        with self.assertRaises(TypeError):
            util.make_list_of_t(self.graph, allow_graph=False)
        all_ts = util.make_list_of_t(self.graph)
        expected = [t for op in self.graph.get_operations() for t in op.outputs]
        self.assertEqual(all_ts, expected)
        self.assertEqual(util.get_tensors(self.graph), expected)

    def test_generating_and_consuming_ops(self):
        self.assertEqual(util.get_generating_ops([self.a, self.c, self.a]),
                         [self.a.op, self.c.op, self.a.op])
        self.assertEqual(util.get_generating_ops(self.c), [self.c.op])
        # a is consumed by c and d; c by d: each consumer once, in order.
        self.assertEqual(util.get_consuming_ops([self.a, self.c]), [self.c.op, self.d.op])
        self.assertEqual(util.get_consuming_ops(self.parts[1]), [self.e.op])
        self.assertEqual(util.get_consuming_ops(self.parts[0]), [])

    def test_get_unique_graph_and_check_graphs(self):
        self.assertIs(util.get_unique_graph([self.a, self.c.op]), self.graph)
        self.assertIsNone(util.get_unique_graph([], none_if_empty=True))
        with self.assertRaises(ValueError):
            util.get_unique_graph([])
        with self.assertRaises(ValueError):
            util.get_unique_graph([self.a, self.x])
        with self.assertRaises(TypeError):
            util.get_unique_graph([self.a], check_types=tf.Operation)
        util.check_graphs(self.a, self.c.op, ge.SubGraphView())
        with self.assertRaisesRegex(ValueError, r"Argument\[1\]"):
            util.check_graphs(self.a, self.x)


class ControlOutputsTest(absltest.TestCase):

    def test_get_get_all_update(self):
        graph = tf.Graph()
        with graph.as_default():
            a = tf.constant(1.0, name="a")
            b = tf.constant(2.0, name="b")
            with tf.control_dependencies([a.op]):
                c = tf.identity(b, name="c")
        control_outputs = util.ControlOutputs(graph)
        self.assertIs(control_outputs.graph, graph)
        self.assertEqual(list(control_outputs.get(a.op)), [c.op])
        self.assertEqual(tuple(control_outputs.get(b.op)), ())
        self.assertEqual(control_outputs.get_all(), {a.op: [c.op]})
        with graph.as_default():
            with tf.control_dependencies([b.op]):
                d = tf.identity(a, name="d")
        # get() reads the live graph; get_all() after update() too.
        self.assertEqual(list(control_outputs.get(b.op)), [d.op])
        self.assertEqual(control_outputs.update().get_all(), {a.op: [c.op], b.op: [d.op]})
        with self.assertRaises(TypeError):
            util.ControlOutputs("not a graph")


class PlaceholderTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.graph = tf.Graph()
        with self.graph.as_default():
            with tf.name_scope("foo"):
                self.t = tf.constant([1.0, 2.0], name="bar")

    def test_placeholder_name(self):
        self.assertEqual(util.placeholder_name(self.t), "foo/geph__bar_0")
        self.assertEqual(util.placeholder_name(self.t, scope=""), "geph__bar_0")
        self.assertEqual(util.placeholder_name(self.t, scope="s"), "s/geph__bar_0")
        self.assertEqual(util.placeholder_name(self.t, scope="s/"), "s/geph__bar_0")
        self.assertEqual(util.placeholder_name(), "geph")
        self.assertEqual(util.placeholder_name(scope="s"), "s/geph")
        self.assertEqual(util.placeholder_name(self.t, prefix="p"), "foo/p__bar_0")
        with self.assertRaises(TypeError):
            util.placeholder_name(self.t.op)

    def test_placeholder_name_reused(self):
        with self.graph.as_default():
            ph = util.make_placeholder_from_tensor(self.t)
        self.assertEqual(ph.op.name, "foo/geph__bar_0")
        self.assertEqual(util.placeholder_name(ph), "foo/geph__bar_0")

    def test_make_placeholders_in_default_graph(self):
        with self.graph.as_default():
            with tf.name_scope("elsewhere"):
                ph = util.make_placeholder_from_tensor(self.t)
                ph_root = util.make_placeholder_from_tensor(self.t, scope="")
                ph2 = util.make_placeholder_from_dtype_and_shape(tf.int32, [3], scope="s")
                ph3 = ge.ph(tf.int64)
        self.assertEqual(ph.name, "foo/geph__bar_0:0")
        self.assertEqual(ph.op.type, "Placeholder")
        self.assertEqual(ph.dtype, tf.float32)
        self.assertEqual(ph.shape.as_list(), [2])
        self.assertEqual(ph_root.name, "geph__bar_0:0")
        self.assertEqual(ph2.name, "s/geph:0")
        self.assertEqual(ph2.shape.as_list(), [3])
        self.assertEqual(ph3.name, "geph:0")
        self.assertIs(ph.graph, self.graph)

    def test_placeholder_has_no_control_inputs(self):
        with self.graph.as_default():
            with tf.control_dependencies([self.t.op]):
                ph = util.make_placeholder_from_tensor(self.t)
        self.assertEqual(ph.op.control_inputs, [])

    def test_refuses_finalized_graph(self):
        self.graph.finalize()
        with self.graph.as_default():
            with self.assertRaisesRegex(RuntimeError, "finalized"):
                util.make_placeholder_from_tensor(self.t)


class ModifiableGraphTest(absltest.TestCase):

    def test_func_graph_refused(self):
        captured = {}

        @tf.function
        def fn(x):
            captured["graph"] = tf.compat.v1.get_default_graph()
            return x * 2.0

        fn.get_concrete_function(tf.TensorSpec([], tf.float32))
        with self.assertRaisesRegex(ValueError, "FuncGraph"):
            util.check_graph_modifiable(captured["graph"])

    def test_finalized_refused_plain_accepted(self):
        graph = tf.Graph()
        util.check_graph_modifiable(graph)
        graph.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            util.check_graph_modifiable(graph, "reroute")
        with self.assertRaises(TypeError):
            util.check_graph_modifiable(None)


Point = collections.namedtuple("Point", ["x", "y"])


class TreeTest(absltest.TestCase):

    def test_is_iterable(self):
        graph = tf.Graph()
        with graph.as_default():
            t = tf.constant([1, 2])
        self.assertFalse(util.is_iterable(t))
        self.assertFalse(util.is_iterable(t.op))
        self.assertFalse(util.is_iterable(3))
        self.assertTrue(util.is_iterable([t]))
        self.assertTrue(util.is_iterable({}))

    def test_flatten_tree(self):
        tree = {"a": [1, (2, 3)], "b": Point(4, {"c": 5}), "d": "str"}
        self.assertEqual(util.flatten_tree(tree), [1, 2, 3, 4, 5, "str"])
        self.assertEqual(util.flatten_tree(7), [7])

    def test_transform_tree_keeps_structure(self):
        tree = collections.OrderedDict(
            [("b", [1, (2, 3)]), ("a", Point(4, {"c": 5})), ("s", "x")])
        res = util.transform_tree(tree, lambda v: v * 10)
        self.assertIsInstance(res, collections.OrderedDict)
        self.assertEqual(list(res.keys()), ["b", "a", "s"])
        self.assertIsInstance(res["b"], list)
        self.assertIsInstance(res["b"][1], tuple)
        self.assertIsInstance(res["a"], Point)
        self.assertEqual(res["a"].y, {"c": 50})
        self.assertEqual(res["b"], [10, (20, 30)])
        self.assertEqual(res["s"], "x" * 10)
        self.assertEqual(util.transform_tree({1, 2}, lambda v: v + 1, iterable_type=list),
                         [2, 3])

    def test_concatenate_unique_and_list_view(self):
        la = [1, 2]
        self.assertIs(util.concatenate_unique(la, [2, 3, 3, 4]), la)
        self.assertEqual(la, [1, 2, 3, 4])
        view = util.ListView(la)
        self.assertLen(view, 4)
        self.assertEqual(view[2], 3)
        self.assertEqual(list(view), la)
        self.assertEqual(view + [5], [1, 2, 3, 4, 5])
        self.assertEqual([0] + view, [0, 1, 2, 3, 4])
        self.assertTrue(view == la)
        self.assertTrue(view == util.ListView(list(la)))
        self.assertTrue(view != [1, 2])
        self.assertEqual(view.index(3), 2)
        self.assertTrue(view)
        self.assertFalse(util.ListView([]))
        with self.assertRaises(TypeError):
            view[0] = 9  # pylint: disable=unsupported-assignment-operation
        with self.assertRaises(TypeError):
            util.ListView((1, 2))

    def test_scope_helpers(self):
        self.assertEqual(util.scope_finalize("a/b"), "a/b/")
        self.assertEqual(util.scope_finalize("a/b/"), "a/b/")
        self.assertEqual(util.scope_finalize(""), "")
        self.assertEqual(util.scope_dirname("a/b/op"), "a/b/")
        self.assertEqual(util.scope_dirname("op"), "")
        self.assertEqual(util.scope_basename("a/b/op"), "op")
        self.assertEqual(util.scope_basename("op"), "op")


class CorrespondingTest(absltest.TestCase):

    def test_find_corresponding(self):
        src = tf.Graph()
        with src.as_default(), tf.name_scope("s"):
            a = tf.constant(1.0, name="a")
        dst = tf.Graph()
        with dst.as_default(), tf.name_scope("d"):
            a_ = tf.constant(1.0, name="a")
        self.assertIs(util.find_corresponding_elem(a, dst, "d", "s"), a_)
        self.assertIs(util.find_corresponding_elem(a.op, dst, "d/", "s/"), a_.op)
        res = util.find_corresponding({"k": [a, a.op]}, dst, "d", "s")
        self.assertEqual(res, {"k": [a_, a_.op]})
        names = util.get_predefined_collection_names()
        self.assertIn(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, names)
        self.assertIn(tf.compat.v1.GraphKeys.UPDATE_OPS, names)


if __name__ == "__main__":
    absltest.main()
