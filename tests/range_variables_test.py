"""qat's variables take the model's kind: ref variables for TF1-style models.

TF's `freeze_graph` tool (GraphDef + checkpoint, the TF1 recipe) handles only
ref variables; these tests run it on the eval graphs of ref- and
resource-variable models restored from a training checkpoint.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized
from tensorflow.python.tools import freeze_graph

import qat
from qat import export
from qat.engine import range_variables
from qat.engine import step_counter

tf1 = tf.compat.v1

_REF_OPS = {"VariableV2", "Assign", "AssignSub", "AssignAdd"}
_RESOURCE_OPS = {"VarHandleOp", "ReadVariableOp", "AssignVariableOp",
                 "AssignSubVariableOp", "AssignAddVariableOp"}


def _model(x, training, use_resource):
    with tf1.variable_scope("net", use_resource=use_resource):
        y = tf1.layers.conv2d(x, 4, 3, padding="same", use_bias=False, name="conv")
        y = tf1.layers.batch_normalization(y, training=training, name="bn")
        y = tf.nn.relu6(y)
        y = tf1.layers.dense(tf1.layers.flatten(y), 5, name="logits")
    return tf.identity(y, name="output")


def _build(training, use_resource, quant_delay=0):
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="input")
        out = _model(x, training, use_resource)
        if not training:
            qat.create_eval_graph(graph)
            return graph, out, None
        loss = tf.reduce_mean(tf.square(out - 1.0))
        qat.create_training_graph(graph, quant_delay=quant_delay)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
    return graph, out, train


def _inputs(n=4, seed=0):
    return np.random.RandomState(seed).uniform(0.0, 2.0, (n, 8, 8, 3)).astype(np.float32)


def _op_types(graph):
    return {op.type for op in graph.get_operations()}


class VariableKindTest(parameterized.TestCase):

    def test_rule(self):
        for kinds, expected in [((False,), range_variables.REF),
                                ((True,), range_variables.RESOURCE),
                                ((False, True), range_variables.RESOURCE)]:
            graph = tf.Graph()
            with graph.as_default():
                for k, use_resource in enumerate(kinds):
                    tf1.get_variable("v%d" % k, [1], use_resource=use_resource)
            self.assertEqual(range_variables.variable_kind(graph), expected, kinds)

    def test_no_variables_follow_the_process_setting(self):
        enabled = tf1.resource_variables_enabled()
        self.addCleanup(tf1.enable_resource_variables if enabled
                        else tf1.disable_resource_variables)
        graph = tf.Graph()
        with graph.as_default():
            tf1.placeholder(tf.float32, [1], name="x")
        tf1.enable_resource_variables()
        self.assertEqual(range_variables.variable_kind(graph), range_variables.RESOURCE)
        tf1.disable_resource_variables()
        self.assertEqual(range_variables.variable_kind(graph), range_variables.REF)
        # The step counter made outside a rewrite follows the same rule.
        with graph.as_default():
            step_counter.get_or_create_quantization_step(graph)
        self.assertEqual(step_counter.get_quantization_step_variable(graph).op.type,
                         "VariableV2")


class RefRangesTest(parameterized.TestCase):
    """Training, restore and freeze_graph with ref and resource variables."""

    @parameterized.named_parameters(("ref", False), ("resource", True))
    def test_train_restore_freeze(self, use_resource):
        tmp = tempfile.mkdtemp()
        graph, _, train = _build(True, use_resource)
        own, other = ((_RESOURCE_OPS, _REF_OPS) if use_resource else (_REF_OPS, _RESOURCE_OPS))
        types = _op_types(graph)
        self.assertFalse(other & types, "the model's kind only")
        self.assertTrue(own <= types, types)
        ranges = [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                  if v.op.name.endswith("act_quant/max")]
        self.assertTrue(ranges)
        with graph.as_default(), tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            before = sess.run(ranges)
            for i in range(3):
                sess.run(train, {"input:0": _inputs(seed=i)})
            after = sess.run(ranges)
            self.assertEqual(sess.run(step_counter.get_quantization_step_variable(graph)), 3)
            for b, a in zip(before, after):
                self.assertNotEqual(float(b), float(a))  # The ranges moved.
            checkpoint = tf1.train.Saver().save(sess, os.path.join(tmp, "model.ckpt"))

        eval_graph, out, _ = _build(False, use_resource)
        kinds = {op.type for op in eval_graph.get_operations()
                 if op.type in range_variables.REF_VARIABLE_TYPES
                 | range_variables.RESOURCE_VARIABLE_TYPES}
        self.assertEqual(kinds, {"VarHandleOp"} if use_resource else {"VariableV2"})
        x = _inputs(8, seed=9)
        with eval_graph.as_default(), tf1.Session() as sess:
            tf1.train.Saver().restore(sess, checkpoint)  # Strict: every variable.
            expected = sess.run(out, {"input:0": x})
            restored = [v for v in tf1.global_variables() if v.op.name.endswith("act_quant/max")]
            self.assertEqual([v.op.name for v in restored], [v.op.name for v in ranges])
            self.assertEqual(sess.run(restored), after)
            graph_path = os.path.join(tmp, "eval.pb")
            with open(graph_path, "wb") as f:
                f.write(eval_graph.as_graph_def().SerializeToString())
            meta_path = os.path.join(tmp, "eval.meta")
            tf1.train.export_meta_graph(meta_path)
        frozen_path = os.path.join(tmp, "frozen.pb")
        if use_resource:
            # TF's freeze_graph from a GraphDef + checkpoint fails on every
            # resource variable (float models too); its meta-graph path works.
            frozen = freeze_graph.freeze_graph(
                None, "", True, checkpoint, "output", None, None, frozen_path, True, "",
                input_meta_graph=meta_path)
        else:
            # The TF1 recipe, as a command: GraphDef + checkpoint.
            result = subprocess.run(
                [sys.executable, "-m", "tensorflow.python.tools.freeze_graph",
                 "--input_graph=" + graph_path, "--input_binary=true",
                 "--input_checkpoint=" + checkpoint, "--output_node_names=output",
                 "--output_graph=" + frozen_path],
                capture_output=True, text=True, timeout=300, check=False)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
            frozen = tf1.GraphDef()
            with open(frozen_path, "rb") as f:
                frozen.ParseFromString(f.read())
        self.assertFalse({"VariableV2", "VarHandleOp"} & {n.op for n in frozen.node})
        np.testing.assert_array_equal(export.run_graph(frozen, "input", "output", x), expected)
        model = export.convert_frozen_graph(frozen, ["input"], ["output"], "int8",
                                            input_ranges={"input": (0.0, 2.0)})
        export.check_fully_integer(model, frozen)


if __name__ == "__main__":
    absltest.main()
