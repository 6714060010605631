"""Tests of qat.graph_editor.transform on control flow: TF 1's loops and conds, v2's functional ops.

Copies to another graph and within one (each loop its own frame),
graph_replace, and gradients through copied loops and conds, evaluated in a
Session. The other copies are tests/graph_editor_transform_test.py's.
"""
import contextlib
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from qat import graph_editor as ge

tf1 = tf.compat.v1


@contextlib.contextmanager
def _control_flow_v1():
    """Builds tf.cond / tf.while_loop as v1 Switch/Merge/Enter/Exit ops."""
    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved


def _run(graph, fetches, feed_dict=None, init=False):
    with tf1.Session(graph=graph) as sess:
        if init:
            with graph.as_default():
                sess.run(tf1.global_variables_initializer())
        return sess.run(fetches, feed_dict)


class ControlFlowTest(absltest.TestCase):

    def _while_graph(self):
        graph = tf.Graph()
        with graph.as_default(), _control_flow_v1():
            max_index = tf1.placeholder(tf.int32, [], name="max_index")
            start = tf1.placeholder(tf.int32, [], name="start")
            result = tf1.while_loop(lambda i: i < max_index, lambda i: i + 1, [start])
        self.assertIn("Enter", {op.type for op in graph.get_operations()})
        return graph, max_index, start, result

    def test_while_loop_v1_copied_to_other_graph(self):
        graph, max_index, start, result = self._while_graph()
        dst = tf.Graph()
        _, info = ge.copy(graph, dst_graph=dst, dst_scope="imported")
        got = _run(dst, info.transformed(result),
                   {info.transformed(max_index): 10, info.transformed(start): 0})
        self.assertEqual(got, 10)
        # The loop back edges were closed: no temporary placeholder is consumed.
        for op in dst.get_operations():
            if "geph_tmp" in op.name:
                self.assertEqual(op.outputs[0].consumers(), [])

    def test_while_loop_v1_copied_in_same_graph_gets_own_frame(self):
        graph, max_index, start, result = self._while_graph()
        _, info = ge.copy(graph, dst_scope="again")
        frames = {op.get_attr("frame_name") for op in graph.get_operations()
                  if op.type == "Enter"}
        self.assertLen(frames, 2)
        got = _run(graph, [result, info.transformed(result)],
                   {max_index: 4, start: 0, info.transformed(max_index): 7,
                    info.transformed(start): 1})
        self.assertEqual(got, [4, 7])

    def test_while_loop_v1_graph_replace(self):
        graph, max_index, start, result = self._while_graph()
        with graph.as_default():
            seven = tf.constant(7, name="seven")
        result_ = ge.graph_replace(result, {max_index: seven}, dst_scope="r")
        self.assertEqual(_run(graph, [result, result_], {max_index: 3, start: 0}), [3, 7])

    def test_gradients_through_copied_v1_loop_and_cond(self):
        graph = tf.Graph()
        with graph.as_default(), _control_flow_v1():
            x = tf1.placeholder(tf.float32, [], name="x")
            flag = tf1.placeholder(tf.bool, [], name="flag")

            def body(i, v):
                # A v1 cond nested in the v1 loop.
                return i + 1, tf.cond(flag, lambda: v * x, lambda: v + x)

            _, y = tf1.while_loop(lambda i, v: i < 3, body, [0, tf.constant(1.0)])
            two = tf.constant(2.0, name="two")
            y2 = ge.graph_replace(y, {x: two}, dst_scope="r")
            self.assertIsNotNone(y2.op._control_flow_context)
            (dy2,) = tf.gradients(y2, two)
            (dy,) = tf.gradients(y, x)
        got = _run(graph, [y2, dy2, y, dy], {x: 3.0, flag: True})
        self.assertEqual(got, [8.0, 12.0, 27.0, 27.0])  # x**3 and 3 x**2
        got = _run(graph, [y2, dy2], {x: 3.0, flag: False})
        self.assertEqual(got, [7.0, 3.0])  # 1 + 3 x
        # Copied to another graph, the contexts are rebuilt there.
        dst = tf.Graph()
        _, info = ge.copy(graph, dst_graph=dst, dst_scope="imported")
        y_, x_, flag_ = info.transformed([y, x, flag])
        with dst.as_default(), _control_flow_v1():
            (dy_,) = tf.gradients(y_, x_)
        self.assertEqual(_run(dst, [y_, dy_], {x_: 2.0, flag_: True}), [8.0, 12.0])

    def test_cond_v1(self):
        graph = tf.Graph()
        with graph.as_default(), _control_flow_v1():
            choice = tf1.placeholder(tf.bool, [], name="choice")
            value = tf1.placeholder(tf.float32, [], name="value")
            result = tf.cond(choice, lambda: value * 2.0, lambda: value - 1.0)
            self.assertEqual(result.op.type, "Merge")
            other = tf.constant(10.0)
        dst = tf.Graph()
        _, info = ge.copy(graph, dst_graph=dst, dst_scope="imported")
        r_, c_, v_ = info.transformed([result, choice, value])
        self.assertEqual(_run(dst, r_, {c_: True, v_: 3.0}), 6.0)
        self.assertEqual(_run(dst, r_, {c_: False, v_: 3.0}), 2.0)
        with graph.as_default(), _control_flow_v1():
            result2 = ge.graph_replace(result, {value: other})
            (grad2,) = tf.gradients(result2, other)
        self.assertEqual(_run(graph, [result2, grad2], {choice: True}), [20.0, 2.0])
        self.assertEqual(_run(graph, [result2, grad2], {choice: False}), [9.0, 1.0])

    def test_v2_functional_cond_and_while(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [], name="x")
            y = tf.cond(x > 0.0, lambda: x * 2.0, lambda: x - 1.0)
            (w,) = tf.while_loop(lambda i: i < 10.0, lambda i: i + x, [x])
        types = {op.type for op in graph.get_operations()}
        self.assertTrue({"StatelessIf", "StatelessWhile"} <= types, types)
        dst = tf.Graph()
        _, info = ge.copy(graph, dst_graph=dst)
        x_, y_, w_ = info.transformed([x, y, w])
        self.assertEqual(_run(dst, [y_, w_], {x_: 3.0}), [6.0, 12.0])
        with dst.as_default():
            (dy,) = tf.gradients(y_, x_)
        self.assertEqual(_run(dst, dy, {x_: 3.0}), 2.0)
        with graph.as_default():
            four = tf.constant(4.0)
            y2, w2 = ge.graph_replace([y, w], {x: four})
            dy2, dw2 = tf.gradients(y2, four)[0], tf.gradients(w2, four)[0]
        # y = 2 x; the loop adds x twice to x (4, 8, 12): w = 3 x.
        self.assertEqual(_run(graph, [y2, w2, dy2, dw2]), [8.0, 12.0, 2.0, 3.0])


if __name__ == "__main__":
    absltest.main()
