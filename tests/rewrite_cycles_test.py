"""A rewrite whose new edges would make a cycle is refused before it edits the graph.

`qat.engine.rewrite.apply` checks the edges a rewrite adds (reroutes, control
inputs, its new ops' inputs) with `qat.engine.rewrite_cycles`: a new op that
reads a tensor computed from the op it feeds raises a RewriteError naming the
cycle, and the graph is unchanged. Rewrites that make no cycle (a quantizer
between an op and its readers, ops inside and after a TF1 while loop, whose
NextIteration -> Merge back edges TensorFlow allows) apply as before.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.engine import marks  # pylint: disable=g-import-not-at-top
from qat.engine import rewrite as rewrite_lib  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def _chain():
    """input -> relu -> neg -> output."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2], name="input")
        relu = tf.nn.relu(x, name="relu")
        neg = tf.negative(relu, name="neg")
        tf.identity(neg, name="output")
    return graph


def _snapshot(graph):
    return graph.as_graph_def().SerializeToString(deterministic=True)


class RewriteCycleTest(tf.test.TestCase):

    def test_reroute_onto_a_later_tensor_is_refused(self):
        graph = _chain()
        before = _snapshot(graph)
        relu, neg = graph.get_operation_by_name("relu"), graph.get_operation_by_name("neg")
        rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
        nodes = rewrite.nodes
        late = nodes.node(nodes.unique_name("late"), "Identity",
                          [nodes.external(neg.outputs[0])], T=tf.float32)
        rewrite.reroute(relu, 0, late)  # relu would read a value computed from relu.
        with self.assertRaisesRegex(rewrite_lib.RewriteError,
                                    r"cycle of 3 ops.*relu -> neg -> late -> relu"):
            rewrite_lib.apply(rewrite)
        self.assertEqual(_snapshot(graph), before)

    def test_reroute_onto_an_existing_later_tensor_is_refused(self):
        graph = _chain()
        relu, neg = graph.get_operation_by_name("relu"), graph.get_operation_by_name("neg")
        rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
        rewrite.reroute(relu, 0, neg.outputs[0])
        with self.assertRaisesRegex(rewrite_lib.RewriteError, r"relu -> neg -> relu"):
            rewrite_lib.apply(rewrite)

    def test_control_input_on_a_later_op_is_refused(self):
        graph = _chain()
        before = _snapshot(graph)
        relu, neg = graph.get_operation_by_name("relu"), graph.get_operation_by_name("neg")
        rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
        nodes = rewrite.nodes
        watch = nodes.node(nodes.unique_name("watch"), "Identity",
                           [nodes.external(neg.outputs[0])], T=tf.float32)
        rewrite.add_control_inputs(relu, [watch])
        with self.assertRaisesRegex(rewrite_lib.RewriteError, r"relu -> neg -> watch -> relu"):
            rewrite_lib.apply(rewrite)
        self.assertEqual(_snapshot(graph), before)

    def test_op_between_a_tensor_and_its_readers_applies(self):
        graph = _chain()
        relu, neg = graph.get_operation_by_name("relu"), graph.get_operation_by_name("neg")
        rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
        nodes = rewrite.nodes
        between = nodes.node(nodes.unique_name("between"), "Identity",
                             [nodes.external(relu.outputs[0])], T=tf.float32)
        rewrite.reroute_consumers(relu.outputs[0], between, [neg])
        rewrite.add_control_inputs(graph.get_operation_by_name("output"), [between])
        ops = rewrite_lib.apply(rewrite)
        self.assertIs(neg.inputs[0].op, ops[between])

    def test_rerouted_edge_is_not_counted(self):
        """neg reads relu no more: a new op reading neg may feed relu's old reader."""
        graph = _chain()
        relu, neg = graph.get_operation_by_name("relu"), graph.get_operation_by_name("neg")
        out = graph.get_operation_by_name("output")
        x = graph.get_operation_by_name("input").outputs[0]
        rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
        nodes = rewrite.nodes
        rewrite.reroute(neg, 0, x)  # neg reads the input; relu feeds nothing.
        after = nodes.node(nodes.unique_name("after"), "Identity",
                           [nodes.external(out.outputs[0])], T=tf.float32)
        rewrite.add_control_inputs(relu, [after])
        rewrite_lib.apply(rewrite)
        with tf1.Session(graph=graph) as sess:
            self.assertAllClose(sess.run("output:0", {"input:0": [1.0, -2.0]}), [-1.0, 2.0])

    def test_tf1_while_loop_is_no_cycle(self):
        tf1.disable_control_flow_v2()
        try:
            graph = tf.Graph()
            with graph.as_default():
                x = tf1.placeholder(tf.float32, [2], name="input")
                _, y = tf1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.nn.relu(v) * 2.0),
                                      [tf.constant(0), x])
                out = tf.identity(y, name="output")
        finally:
            tf1.enable_control_flow_v2()
        rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
        nodes = rewrite.nodes
        after = nodes.node(nodes.unique_name("after"), "Identity", [nodes.external(y)],
                           T=tf.float32)
        rewrite.reroute_consumers(y, after, [out.op])
        rewrite_lib.apply(rewrite)
        with tf1.Session(graph=graph) as sess:
            self.assertAllClose(sess.run(out, {x: [1.0, -1.0]}), [8.0, 0.0])

    def test_recurrent_training_graph_is_rewritten(self):
        """The quantize pass's rewrites of a static RNN pass the check (and run)."""
        graph = tf.Graph()
        with graph.as_default():
            rows = tf1.placeholder(tf.float32, [4, 3, 2], name="input")
            with tf1.variable_scope("net"):
                outputs, _ = tf1.nn.static_rnn(tf1.nn.rnn_cell.LSTMCell(2),
                                               tf.unstack(rows, axis=1), dtype=tf.float32)
                logits = tf1.layers.dense(outputs[-1], 3, name="head")
            loss = tf.reduce_mean(tf.square(tf.identity(logits, name="output")))
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
            train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                sess.run(train, {rows: np.ones([4, 3, 2], np.float32)})


if __name__ == "__main__":
    absltest.main()
