"""Tests of qat.graph_editor.select."""
import re
import time

from absl.testing import absltest
import tensorflow as tf

from qat import graph_editor as ge
from qat.graph_editor import util


def _names(items):
    return [x.name for x in items]


class SelectTest(absltest.TestCase):
    """One small graph:

      a, b consts; c = a + b; d = c * a; e = identity(d); f = c - b;
      g = identity(b) with a control input from e; blk/h = e + 1;
      x.y/k and xzy/k consts; split -> split:0, split:1 -> s1.
    """

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.graph = tf.Graph()
        with cls.graph.as_default():
            cls.a = tf.constant(1.0, name="a")
            cls.b = tf.constant(2.0, name="b")
            cls.c = tf.add(cls.a, cls.b, name="c")
            cls.d = tf.multiply(cls.c, cls.a, name="d")
            cls.e = tf.identity(cls.d, name="e")
            cls.f = tf.subtract(cls.c, cls.b, name="f")
            with tf.control_dependencies([cls.e.op]):
                cls.g = tf.identity(cls.b, name="g")
            with tf.name_scope("blk"):
                cls.h = tf.add(cls.e, 1.0, name="h")
            with tf.name_scope("x.y"):
                cls.k1 = tf.constant(0, name="k")
            with tf.name_scope("xzy"):
                cls.k2 = tf.constant(0, name="k")
            cls.split = tf.split(tf.zeros([4], name="z"), 2, name="split")
            cls.s1 = tf.identity(cls.split[1], name="s1")
        cls.ops = {op.name: op for op in cls.graph.get_operations()}

    def op_names(self, names):
        return [self.ops[n] for n in names.split()]

    # filters

    def test_filter_ops(self):
        self.assertEqual(_names(ge.filter_ops([self.c.op, self.a.op], True)), ["c", "a"])
        consts = ge.filter_ops(self.graph, lambda op: op.type == "Const")
        self.assertEqual(_names(consts), ["a", "b", "blk/h/y", "x.y/k", "xzy/k", "z",
                                          "split/split_dim"])

    def test_filter_ops_from_regex_not_anchored(self):
        self.assertEqual(_names(ge.filter_ops_from_regex(self.graph, "k$")),
                         ["x.y/k", "xzy/k"])
        self.assertEqual(_names(ge.filter_ops_from_regex(self.graph, re.compile("^[cd]$"))),
                         ["c", "d"])

    def test_filter_ts(self):
        self.assertEqual(_names(ge.filter_ts([self.c.op, self.d.op], True)),
                         ["a:0", "b:0", "c:0", "d:0"])
        # Inputs first (split:1 feeds s1), then outputs.
        self.assertEqual(_names(ge.filter_ts_from_regex(self.graph, "^split:")),
                         ["split:1", "split:0"])
        self.assertEqual(
            _names(ge.filter_ts(self.graph, lambda t: t.dtype == tf.int32)),
            ["split/split_dim:0", "x.y/k:0", "xzy/k:0"])

    def test_get_name_scope_ops(self):
        self.assertEqual(_names(ge.get_name_scope_ops(self.graph, "blk")),
                         ["blk/h/y", "blk/h"])
        self.assertEqual(_names(ge.get_name_scope_ops(self.graph, "blk/")),
                         ["blk/h/y", "blk/h"])
        # The scope is literal: "." is not a regex wildcard.
        self.assertEqual(_names(ge.get_name_scope_ops(self.graph, "x.y")), ["x.y/k"])
        self.assertEqual(_names(ge.get_name_scope_ops(self.graph, "split")),
                         ["split/split_dim", "split"])
        self.assertEqual(ge.get_name_scope_ops(self.graph, "bl"), [])

    # ios and boundaries

    def test_check_cios(self):
        control_outputs = util.ControlOutputs(self.graph)
        self.assertEqual(ge.check_cios(), (False, None))
        self.assertEqual(ge.check_cios(control_ios=control_outputs), (True, control_outputs))
        self.assertEqual(ge.check_cios(True, control_outputs), (True, control_outputs))
        with self.assertRaises(TypeError):
            ge.check_cios(control_outputs=True)
        with self.assertRaises(TypeError):
            ge.check_cios(control_ios=True)
        with self.assertRaises(ValueError):
            ge.check_cios(control_outputs=control_outputs, control_ios=control_outputs)

    def test_get_ops_ios(self):
        control_outputs = util.ControlOutputs(self.graph)
        self.assertEqual(_names(ge.get_ops_ios(self.c.op)), ["a", "b", "d", "f"])
        self.assertEqual(_names(ge.get_ops_ios(self.e.op)), ["d", "blk/h"])
        self.assertEqual(
            _names(ge.get_ops_ios(self.e.op, control_outputs=control_outputs)),
            ["d", "blk/h", "g"])
        self.assertEqual(_names(ge.get_ops_ios(self.g.op)), ["b"])
        self.assertEqual(_names(ge.get_ops_ios(self.g.op, control_inputs=True)), ["b", "e"])
        self.assertEqual(
            _names(ge.get_ops_ios([self.e.op, self.g.op], control_ios=control_outputs)),
            ["d", "blk/h", "g", "b", "e"])

    def test_compute_boundary_ts(self):
        inputs, outputs, inside = ge.compute_boundary_ts([self.c.op, self.d.op])
        self.assertEqual(_names(inputs), ["a:0", "b:0"])
        # c:0 is also read by f outside, so it stays an output.
        self.assertEqual(_names(outputs), ["c:0", "d:0"])
        self.assertEqual(_names(inside), ["c:0"])
        inputs, outputs, inside = ge.compute_boundary_ts([self.c.op, self.d.op, self.f.op])
        self.assertEqual(_names(inputs), ["a:0", "b:0"])
        self.assertEqual(_names(outputs), ["d:0", "f:0"])
        self.assertEqual(_names(inside), ["c:0"])
        inputs, outputs, inside = ge.compute_boundary_ts(self.ops["split"])
        self.assertEqual(_names(inputs), ["split/split_dim:0", "z:0"])
        self.assertEqual(_names(outputs), ["split:0", "split:1"])
        self.assertEqual(inside, [])

    def test_get_within_boundary_ops(self):
        res = ge.get_within_boundary_ops(self.graph, self.c.op, boundary_ops=[self.d.op])
        self.assertEqual(_names(res), ["a", "b", "c", "d", "f", "g"])
        res = ge.get_within_boundary_ops(self.graph, self.c.op, boundary_ops=[self.d.op],
                                         inclusive=False)
        self.assertEqual(_names(res), ["a", "b", "c", "f", "g"])
        # With control outputs the walk crosses from e... but e is only reached
        # through d (boundary) or g's control input.
        res = ge.get_within_boundary_ops(self.graph, self.c.op, boundary_ops=[self.d.op],
                                         control_inputs=True)
        self.assertEqual(_names(res), ["a", "b", "c", "d", "e", "f", "g", "blk/h/y",
                                       "blk/h"])
        with self.assertRaisesRegex(ValueError, "intersecting"):
            ge.get_within_boundary_ops(self.graph, [self.c.op], boundary_ops=[self.c.op])

    # walks

    def test_forward_walk(self):
        self.assertEqual(_names(ge.get_forward_walk_ops(self.a.op)),
                         ["a", "c", "d", "f", "e", "blk/h"])
        self.assertEqual(_names(ge.get_forward_walk_ops(self.a.op, inclusive=False)),
                         ["c", "d", "f", "e", "blk/h"])

    def test_forward_walk_tensor_seeds(self):
        # A tensor seeds its consumers (c and d).
        self.assertEqual(_names(ge.get_forward_walk_ops(self.a)),
                         ["c", "d", "f", "e", "blk/h"])
        self.assertEqual(_names(ge.get_forward_walk_ops(self.a, inclusive=False)),
                         ["f", "e", "blk/h"])
        self.assertEqual(_names(ge.get_forward_walk_ops(self.split[1])), ["s1"])

    def test_forward_walk_control_outputs(self):
        control_outputs = util.ControlOutputs(self.graph)
        self.assertEqual(
            _names(ge.get_forward_walk_ops(self.d.op, control_outputs=control_outputs)),
            ["d", "e", "blk/h", "g"])
        self.assertEqual(_names(ge.get_forward_walk_ops(self.d.op)), ["d", "e", "blk/h"])

    def test_forward_walk_within_and_stop(self):
        self.assertEqual(
            _names(ge.get_forward_walk_ops(self.a.op, within_ops=self.op_names("a c f"))),
            ["a", "c", "f"])
        self.assertEqual(
            _names(ge.get_forward_walk_ops(self.a.op,
                                           within_ops_fn=lambda op: op.type != "Mul")),
            ["a", "c", "f"])
        # Seeds outside within_ops are dropped.
        self.assertEqual(ge.get_forward_walk_ops(self.a.op, within_ops=[self.c.op]), [])
        # contrib r1.15: an empty within_ops keeps the seeds and visits nothing else.
        self.assertEqual(_names(ge.get_forward_walk_ops(self.a.op, within_ops=[])), ["a"])
        self.assertEqual(ge.get_forward_walk_ops(self.a.op, within_ops=[], inclusive=False), [])
        self.assertEqual(_names(ge.get_forward_walk_ops(self.c, within_ops=())),
                         _names(self.c.consumers()))
        self.assertEqual(_names(ge.get_forward_walk_ops(self.a.op, stop_at_ts=[self.c])),
                         ["a", "c", "d", "e", "blk/h"])
        self.assertEqual(
            _names(ge.get_forward_walk_ops(self.ops["split"], stop_at_ts=self.split[0])),
            ["split", "s1"])
        self.assertEqual(ge.get_forward_walk_ops([]), [])

    def test_backward_walk(self):
        self.assertEqual(_names(ge.get_backward_walk_ops(self.e.op)),
                         ["e", "d", "c", "a", "b"])
        self.assertEqual(_names(ge.get_backward_walk_ops(self.d, inclusive=False)),
                         ["c", "a", "b"])
        self.assertEqual(_names(ge.get_backward_walk_ops(self.g.op)), ["g", "b"])
        self.assertEqual(_names(ge.get_backward_walk_ops(self.g.op, control_inputs=True)),
                         ["g", "b", "e", "d", "c", "a"])
        self.assertEqual(_names(ge.get_backward_walk_ops(self.e.op, stop_at_ts=[self.c])),
                         ["e", "d", "a"])
        self.assertEqual(
            _names(ge.get_backward_walk_ops(self.e.op, within_ops=self.op_names("e d a"))),
            ["e", "d", "a"])
        self.assertEqual(_names(ge.get_backward_walk_ops(self.e.op, within_ops=[])), ["e"])
        self.assertEqual(_names(ge.get_backward_walk_ops([self.e.op, self.d], within_ops=[])),
                         ["e", "d"])
        self.assertEqual(
            _names(ge.get_backward_walk_ops(self.e.op,
                                            within_ops_fn=lambda op: op.name != "c")),
            ["e", "d", "a"])

    def test_walks_intersection_and_union(self):
        self.assertEqual(_names(ge.get_walks_intersection_ops(self.a.op, self.e.op)),
                         ["a", "c", "d", "e"])
        self.assertEqual(
            _names(ge.get_walks_intersection_ops(self.a.op, self.e.op,
                                                 forward_inclusive=False,
                                                 backward_inclusive=False)),
            ["c", "d"])
        self.assertEqual(_names(ge.get_walks_union_ops(self.a.op, self.e.op)),
                         ["a", "c", "d", "f", "e", "blk/h", "b"])
        control_ios = util.ControlOutputs(self.graph)
        self.assertEqual(
            _names(ge.get_walks_intersection_ops(self.b.op, self.g.op,
                                                 control_ios=control_ios)),
            ["b", "c", "g", "d", "e"])

    def test_walk_mixed_graphs(self):
        other = tf.Graph()
        with other.as_default():
            x = tf.constant(1.0)
        with self.assertRaises(ValueError):
            ge.get_forward_walk_ops([self.a.op, x.op])

    # select

    def test_select_ops(self):
        self.assertEqual(_names(ge.select_ops("^[cd]$", graph=self.graph)), ["c", "d"])
        self.assertEqual(
            _names(ge.select_ops(self.a.op, [self.c.op, self.a.op, self.b], "^d$",
                                 graph=self.graph)),
            ["a", "c", "d"])
        self.assertEqual(
            _names(ge.select_ops(self.graph, positive_filter=lambda op: op.type == "Identity")),
            ["e", "g", "s1"])
        self.assertEqual(ge.select_ops("(?#ts)^c:0$", graph=self.graph), [])
        self.assertEqual(
            _names(ge.select_ops("^d$", "(?#ops)^e$", graph=self.graph,
                                 restrict_ops_regex=True)),
            ["e"])
        with self.assertRaisesRegex(ValueError, "graph"):
            ge.select_ops("^c$")
        with self.assertRaises(TypeError):
            ge.select_ops("^c$", graph="g")
        with self.assertRaises(ValueError):
            ge.select_ops(self.a.op, bad_keyword=1)

    def test_select_ts(self):
        self.assertEqual(_names(ge.select_ts("^c:0$", graph=self.graph)), ["c:0"])
        self.assertEqual(_names(ge.select_ts(self.a, [self.c, self.d.op], graph=self.graph)),
                         ["a:0", "c:0"])
        self.assertEqual(ge.select_ts("(?#ops)^c", graph=self.graph), [])

    def test_select_ops_and_ts(self):
        ops, ts = ge.select_ops_and_ts("(?#ts)^c:0$", "^d$", self.e.op, self.a,
                                       graph=self.graph)
        self.assertEqual(_names(ops), ["d", "e"])
        self.assertEqual(_names(ts), ["c:0", "a:0"])
        ops, ts = ge.select_ops_and_ts("(?#ops)^d$", graph=self.graph)
        self.assertEqual(_names(ops), ["d"])
        self.assertEqual(ts, [])


class LinearWalkTest(absltest.TestCase):

    def test_long_chain_walks_are_linear_and_do_not_scan(self):
        n = 2000
        graph = tf.Graph()
        with graph.as_default():
            first = tf.constant(0.0, name="x")
            t = first
            for _ in range(n):
                t = tf.identity(t)
        last = t

        def fail():
            raise AssertionError("the walk scanned the whole graph")

        graph.get_operations = fail
        start = time.perf_counter()
        forward = ge.get_forward_walk_ops(first.op)
        backward = ge.get_backward_walk_ops(last.op)
        both = ge.get_walks_intersection_ops(first.op, last.op)
        elapsed = time.perf_counter() - start
        self.assertLen(forward, n + 1)
        self.assertLen(backward, n + 1)
        self.assertLen(both, n + 1)
        # Quadratic list-membership walks take tens of seconds here.
        self.assertLess(elapsed, 5.0)


if __name__ == "__main__":
    absltest.main()
