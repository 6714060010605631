"""Tests of qat.graph_editor.subgraph (SubGraphView, make_view)."""
from absl.testing import absltest
import tensorflow as tf

from qat import graph_editor as ge


def _names(items):
    return [x.name for x in items]


class SubGraphViewTest(absltest.TestCase):
    """x, y placeholders; blk/m = x * y; blk/s = blk/m + y; out1 = blk/s;
    out2 = blk/m * 2; p an outside tensor used as a passthrough."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.graph = tf.Graph()
        with cls.graph.as_default():
            cls.x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
            cls.y = tf.compat.v1.placeholder(tf.float32, [2], name="y")
            with tf.name_scope("blk"):
                cls.m = tf.multiply(cls.x, cls.y, name="m")
                cls.s = tf.add(cls.m, cls.y, name="s")
            cls.out1 = tf.identity(cls.s, name="out1")
            cls.out2 = tf.multiply(cls.m, 2.0, name="out2")
            cls.p = tf.constant([0.0, 0.0], name="p")
            cls.q = tf.identity(cls.p, name="q")
            cls.dead = tf.constant(5.0, name="blk/dead")

    def view(self):
        return ge.SubGraphView([self.m.op, self.s.op], passthrough_ts=[self.p])

    def test_boundaries(self):
        sgv = self.view()
        self.assertIs(sgv.graph, self.graph)
        self.assertEqual(_names(sgv.ops), ["blk/m", "blk/s"])
        self.assertEqual(_names(sgv.inputs), ["x:0", "y:0", "p:0"])
        self.assertEqual(_names(sgv.outputs), ["blk/m:0", "blk/s:0", "p:0"])
        self.assertEqual(_names(sgv.passthroughs), ["p:0"])
        self.assertEqual(_names(sgv.connected_inputs), ["x:0", "y:0"])
        self.assertEqual(_names(sgv.connected_outputs), ["blk/m:0", "blk/s:0"])
        self.assertTrue(sgv.is_passthrough(self.p))
        self.assertFalse(sgv.is_passthrough(self.x))
        self.assertIs(sgv.op(1), self.s.op)
        self.assertEqual(sgv.input_index(self.y), 1)
        self.assertEqual(sgv.output_index(self.s), 1)
        with self.assertRaisesRegex(ValueError, "out1"):
            sgv.output_index(self.out1)
        with self.assertRaises(TypeError):
            sgv.inputs[0] = self.y  # pylint: disable=unsupported-assignment-operation

    def test_passthrough_already_at_boundary_ignored(self):
        sgv = ge.SubGraphView([self.m.op], passthrough_ts=[self.x, self.p])
        self.assertEqual(_names(sgv.passthroughs), ["p:0"])
        self.assertEqual(_names(sgv.inputs), ["x:0", "y:0", "p:0"])

    def test_empty_is_falsy(self):
        empty = ge.SubGraphView()
        self.assertFalse(empty)
        self.assertIsNone(empty.graph)
        self.assertEqual(list(empty.inputs), [])
        self.assertTrue(self.view())
        self.assertEqual(str(empty), "SubGraphView: empty")

    def test_passthrough_only_view(self):
        sgv = ge.make_view([self.p, self.x])
        self.assertEqual(list(sgv.ops), [])
        self.assertEqual(_names(sgv.inputs), ["p:0", "x:0"])
        self.assertEqual(_names(sgv.outputs), ["p:0", "x:0"])
        self.assertTrue(sgv)

    def test_remap_inputs(self):
        sgv = self.view()
        remapped = sgv.remap_inputs([2, 0])
        self.assertEqual(_names(remapped.inputs), ["p:0", "x:0"])
        # The original view is unchanged.
        self.assertEqual(_names(sgv.inputs), ["x:0", "y:0", "p:0"])
        self.assertEqual(_names(sgv.remap_inputs([self.y]).inputs), ["y:0"])
        with self.assertRaisesRegex(ValueError, "repetition"):
            sgv.remap_inputs([0, 0])
        with self.assertRaisesRegex(ValueError, "range"):
            sgv.remap_inputs([3])
        with self.assertRaises(ValueError):
            sgv.remap_inputs([self.out1])

    def test_remap_outputs(self):
        sgv = self.view()
        remapped = sgv.remap_outputs([1, 1, 0])
        self.assertEqual(_names(remapped.outputs), ["blk/s:0", "blk/s:0", "blk/m:0"])
        self.assertEqual(_names(remapped.remap_outputs_make_unique().outputs),
                         ["blk/s:0", "blk/m:0"])
        with self.assertRaisesRegex(ValueError, "range"):
            sgv.remap_outputs([-1])
        both = sgv.remap([0], [1])
        self.assertEqual(_names(both.inputs), ["x:0"])
        self.assertEqual(_names(both.outputs), ["blk/s:0"])
        self.assertEqual(_names(both.remap_default().inputs), ["x:0", "y:0", "p:0"])
        self.assertEqual(_names(both.remap_default(remove_output_map=False).outputs),
                         ["blk/s:0"])
        self.assertEqual(_names(sgv.remap(new_output_indices=[2]).inputs),
                         ["x:0", "y:0", "p:0"])

    def test_remap_outputs_to_consumers(self):
        sgv = self.view()
        # blk/m:0 has 2 consumers (blk/s inside, out2), blk/s:0 one (out1),
        # p:0 one (q).
        self.assertEqual(_names(sgv.remap_outputs_to_consumers().outputs),
                         ["blk/m:0", "blk/m:0", "blk/s:0", "p:0"])

    def test_consumers(self):
        self.assertEqual(_names(self.view().consumers()), ["out2", "out1", "q"])

    def test_remove_unused_ops(self):
        sgv = ge.SubGraphView([self.m.op, self.s.op, self.dead.op])
        self.assertEqual(_names(sgv.ops), ["blk/m", "blk/s", "blk/dead"])
        self.assertEqual(_names(sgv.outputs), ["blk/m:0", "blk/s:0", "blk/dead:0"])
        # blk/dead:0 is an output, so blk/dead is used until remapped away.
        self.assertEqual(_names(sgv.remove_unused_ops().ops), ["blk/m", "blk/s", "blk/dead"])
        self.assertEqual(_names(sgv.remap_outputs([0, 1]).remove_unused_ops().ops),
                         ["blk/m", "blk/s"])
        # Kept: the forward walk from the inputs and the backward walk from
        # the outputs (x reaches blk/s through blk/m).
        from_x = sgv.remap(new_input_indices=[0], new_output_indices=[0])
        self.assertEqual(_names(from_x.remove_unused_ops().ops), ["blk/m", "blk/s"])
        only_m = sgv.remap(new_input_indices=[], new_output_indices=[0])
        self.assertEqual(_names(only_m.remove_unused_ops().ops), ["blk/m"])

    def test_copy_and_context_manager(self):
        sgv = self.view()
        copied = sgv.copy()
        self.assertIsNot(copied, sgv)
        self.assertEqual(list(copied.ops), list(sgv.ops))
        copied._remap_inputs([0])  # pylint: disable=protected-access
        self.assertLen(sgv.inputs, 3)
        with sgv as entered:
            self.assertIs(entered, sgv)

    def test_find_op_by_name(self):
        sgv = self.view()
        self.assertIs(sgv.find_op_by_name("blk/s"), self.s.op)
        with self.assertRaisesRegex(ValueError, "out1"):
            sgv.find_op_by_name("out1")

    def test_str(self):
        text = str(self.view())
        self.assertIn("blk/m", text)
        self.assertIn("p:0 *", text)

    def test_mixed_graphs_refused(self):
        other = tf.Graph()
        with other.as_default():
            z = tf.constant(1.0)
        with self.assertRaises(ValueError):
            ge.SubGraphView([self.m.op, z.op])
        with self.assertRaises(TypeError):
            ge.SubGraphView([self.m])


class MakeViewTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.graph = tf.Graph()
        with cls.graph.as_default():
            cls.a = tf.constant([1.0, 2.0], name="a")
            with tf.name_scope("foo"):
                cls.b = tf.add(cls.a, 1.0, name="b")
                with tf.name_scope("bar"):
                    cls.c = tf.multiply(cls.b, 2.0, name="c")
            cls.values, cls.idx = tf.unique(tf.constant([1, 1, 2], name="u_in"), name="uniq")
            cls.w = tf.identity(cls.idx, name="w")

    def test_make_view_passes_views_through(self):
        sgv = ge.sgv(self.b.op)
        self.assertIs(ge.make_view(sgv), sgv)
        self.assertIs(ge.make_view(sgv, graph=self.graph), sgv)
        with self.assertRaises(ValueError):
            ge.make_view(sgv, graph=tf.Graph())

    def test_make_view_from_regex_and_tensors(self):
        sgv = ge.make_view("^foo/", self.a, graph=self.graph)
        self.assertEqual(_names(sgv.ops), ["foo/b/y", "foo/b", "foo/bar/c/y", "foo/bar/c"])
        self.assertEqual(_names(sgv.inputs), ["a:0"])
        self.assertEqual(_names(sgv.outputs), ["foo/bar/c:0"])
        sgv = ge.make_view("(?#ts)^a:0$", graph=self.graph)
        self.assertEqual(list(sgv.ops), [])
        self.assertEqual(_names(sgv.inputs), ["a:0"])

    def test_make_view_from_scope(self):
        sgv = ge.sgv_scope("foo", self.graph)
        self.assertEqual(_names(sgv.ops), ["foo/b/y", "foo/b", "foo/bar/c/y", "foo/bar/c"])
        sgv = ge.make_view_from_scope("foo/bar/", self.graph)
        self.assertEqual(_names(sgv.ops), ["foo/bar/c/y", "foo/bar/c"])
        self.assertEqual(_names(sgv.inputs), ["foo/b:0"])
        self.assertFalse(ge.sgv_scope("nothing", self.graph))

    def test_multi_output_op(self):
        sgv = ge.sgv(self.values.op)
        self.assertEqual(_names(sgv.inputs), ["u_in:0"])
        self.assertEqual(_names(sgv.outputs), ["uniq:0", "uniq:1"])
        self.assertEqual(_names(sgv.consumers()), ["w"])
        self.assertEqual(_names(sgv.remap_outputs_to_consumers().outputs), ["uniq:1"])


if __name__ == "__main__":
    absltest.main()
