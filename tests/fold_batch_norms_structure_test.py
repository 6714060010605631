"""The structure qat.fold_batch_norms leaves: rerouted readers, tails, scopes, devices, NCHW.

And what it reports and refuses: unfoldable batch norms (one warning for
those after no layer, one for a batch norm in a functional cond), finalized
graphs, negative delays. The numerics are tests/fold_batch_norms_test.py's.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tf_keras

# qat/__init__ exports the function under the module's name: import from the module.
from qat.api import fold_batch_norms
from qat.matching import layer_patterns
import fold_batch_norms_util as bn_util


class FoldStructureTest(tf.test.TestCase):

    def test_op_reading_the_batch_norm_twice_is_rerouted_once_per_input(self):
        # tf.compat.v1.Print(y, [y]) and y * y read y at two inputs each.
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(
                tf.float32, [bn_util.BATCH, bn_util.SIZE, bn_util.SIZE, 3], name="x")
            y = bn_util.add_batch_norm("unfused", bn_util.make_layer("conv_bias", x),
                                       training=False)
            square = tf.multiply(y, y, name="square")
            printed = tf.compat.v1.Print(y, [y], "watched")
        result = fold_batch_norms(g, is_training=False)
        self.assertLen(result.folded, 1)
        folded = result.folded[0].bias_add.outputs[0]
        self.assertEqual(list(square.op.inputs), [folded, folded])
        self.assertEqual(list(printed.op.inputs)[:2], [folded, folded])

    def test_second_call_changes_nothing(self):
        for training, bn, use_cond in ((False, "fused", False), (True, "fused", False),
                                       (False, "unfused", False), (True, "unfused", False),
                                       (True, "fused", True)):
            g, _, _, _ = bn_util.build("conv_bias", bn, training=training)
            first = fold_batch_norms(g, is_training=training, freeze_batch_norm_delay=5,
                                     use_cond=use_cond)
            self.assertLen(first.folded, 1)
            before = g.as_graph_def()
            second = fold_batch_norms(g, is_training=training, freeze_batch_norm_delay=5,
                                      use_cond=use_cond)
            self.assertEqual(second.folded, [])
            self.assertEqual(second.skipped, [])
            self.assertProtoEquals(before, g.as_graph_def())

    def test_training_tail_structure(self):
        g, _, out, _ = bn_util.build("conv_bias", "fused", training=True)
        folded = fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=5).folded[0]
        layer = folded.layer_op
        self.assertEqual(layer.name, "Conv2D")
        self.assertEqual(folded.weights.op.name, "mul_fold")
        self._assert_unscaled_weights(g, layer, folded.weights)
        # The layer feeds the original bias (-> batch norm) and y * s.
        self.assertEqual(sorted(c.name for c in layer.outputs[0].consumers()),
                         ["BiasAdd", "rescale_fold"])
        rescale = g.get_operation_by_name("rescale_fold")
        self.assertIs(rescale.inputs[0], layer.outputs[0])
        self.assertEqual(rescale.inputs[1].op.type, "StopGradient")
        self.assertEqual(folded.bias_add.name, "BiasAdd_Fold")
        self.assertIs(folded.bias_add.inputs[0], rescale.outputs[0])
        self.assertEqual([c.type for c in folded.bias_add.outputs[0].consumers()], ["Select"])
        self.assertEqual(folded.output.op.type, "Select")
        self.assertEqual(out.op.inputs[0].op, folded.output.op)

    def test_training_tail_structure_without_delay(self):
        for use_cond in (False, True):  # No freeze: nothing to choose.
            g, _, out, _ = bn_util.build("conv_bias", "fused", training=True)
            bn_op = out.op.inputs[0].op
            folded = fold_batch_norms(g, is_training=True, use_cond=use_cond).folded[0]
            layer = folded.layer_op
            self.assertEqual(folded.weights.op.name, "mul_fold")
            self.assertEqual(folded.weights.op.inputs[1].op.type, "StopGradient")
            self._assert_unscaled_weights(g, layer, folded.weights)
            # The layer output feeds the original bias and batch norm only.
            self.assertEqual([c.type for c in layer.outputs[0].consumers()], ["BiasAdd"])
            self.assertIs(bn_op.inputs[0].op.inputs[0], layer.outputs[0])
            self.assertNotIn("div_fold", [op.name for op in g.get_operations()])
            self.assertIsNone(folded.bias_add)
            self.assertIsNone(folded.frozen)
            self.assertIs(folded.output, bn_op.outputs[0])
            self.assertIs(out.op.inputs[0], folded.output)
            # No choice on the data path; the moving-average updates keep a
            # batch's non-finite statistics out (a select feeding the update).
            selects = [op for op in g.get_operations()
                       if op.type in ("Select", "SelectV2", "If", "StatelessIf")]
            self.assertLen(selects, 2)  # The moving mean's and variance's.
            for op in selects:
                self.assertEqual(op.inputs[0].op.type, "IsFinite")
                self.assertEqual([c.type for c in op.outputs[0].consumers()],
                                 ["AssignSubVariableOp"])
            self.assertEmpty([op.name for op in g.get_operations()
                              if "_Fold" in op.name or "select_fold" in op.name])

    def _assert_unscaled_weights(self, g, layer, weights):
        """The layer reads unscale_fold = Mul(w*s, DivNoNan(1, stop_gradient(s)))."""
        unscale = layer.inputs[1].op
        self.assertEqual(unscale.name, "unscale_fold")
        self.assertEqual(unscale.type, "Mul")
        self.assertIs(unscale.inputs[0], weights)
        inverse = unscale.inputs[1].op
        self.assertEqual(inverse.type, "DivNoNan")
        self.assertEqual(inverse.inputs[1].op.type, "StopGradient")
        self.assertEqual(weights.consumers(), [unscale])
        self.assertIs(layer_patterns.weight_input(layer), weights)

    def test_cond_tail_structure(self):
        g, _, out, _ = bn_util.build("conv_bias", "fused", training=True)
        folded = fold_batch_norms(g, is_training=True, use_cond=True,
                                  freeze_batch_norm_delay=5).folded[0]
        self.assertIsNone(folded.bias_add)
        self.assertEqual(folded.output.op.type, "Identity")
        cond = folded.output.op.inputs[0].op
        self.assertIn(cond.type, ("If", "StatelessIf"))
        self._assert_unscaled_weights(g, folded.layer_op, folded.weights)
        # The layer feeds the original bias (-> batch norm) and the cond,
        # whose true branch computes y * s + b_fold.
        self.assertEqual(sorted(c.type for c in folded.layer_op.outputs[0].consumers()),
                         sorted(["BiasAdd", cond.type]))
        self.assertIs(out.op.inputs[0], folded.output)

    def test_eval_tail_structure_and_scope(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            with tf.compat.v1.variable_scope("net"):
                y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False, name="conv1")
                y = tf.compat.v1.layers.batch_normalization(y, training=False)
                out = tf.nn.relu(y)
        folded = fold_batch_norms(g, is_training=False).folded[0]
        self.assertEqual(folded.layer_op.name, "net/conv1/Conv2D")
        self.assertEqual(folded.bias_add.name, "net/conv1/BiasAdd_Fold")
        self.assertEqual(sorted(c.type for c in folded.layer_op.outputs[0].consumers()),
                         ["BiasAdd", "Mul"])
        self.assertIs(out.op.inputs[0], folded.output)

    def test_nchw_and_fetched_old_output(self):
        for training in (False, True):
            g = tf.Graph()
            with g.as_default():
                x = tf.compat.v1.placeholder(tf.float32, [2, 3, 6, 6])
                y = tf.nn.conv2d(x, bn_util.variable("w", [3, 3, 3, 4]), 1, "SAME",
                                 data_format="NCHW")
                y = tf.nn.bias_add(y, bn_util.variable("b", [4]), data_format="NCHW")
                bn_out = tf.compat.v1.layers.batch_normalization(
                    y, axis=1, fused=True, training=training)
                out = tf.nn.relu(bn_out)
            values = bn_util.random_values(g, 17)
            xv = np.random.RandomState(1).normal(size=[2, 3, 6, 6]).astype(np.float32)

            def run(fetches):
                runnable = bn_util.cpu_runnable(g)
                with bn_util.loaded_session(runnable, values) as sess:
                    return sess.run([t.name for t in fetches], {x.name: xv})

            expected, = run([out])
            result = fold_batch_norms(g, is_training=training)
            self.assertLen(result.folded, 1)
            got, old = run([out, bn_out])
            self.assertLess(bn_util.rel_err(got, expected), 1e-5)
            # The old batch-norm output, fetched directly, still computes the
            # unfolded value.
            self.assertLess(bn_util.rel_err(np.maximum(old, 0), expected), 1e-5)

    def test_device_is_kept(self):
        g = tf.Graph()
        with g.as_default(), g.device("/cpu:0"):
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False)
            tf.nn.relu(tf.compat.v1.layers.batch_normalization(y, training=True))
        folded = fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=5).folded[0]
        for t in (folded.weights, folded.output, folded.bias_add.outputs[0]):
            self.assertEqual(t.op.device, folded.layer_op.device)

    def test_device_is_kept_without_delay(self):
        g = tf.Graph()
        with g.as_default(), g.device("/cpu:0"):
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False)
            tf.nn.relu(tf.compat.v1.layers.batch_normalization(y, training=True))
        folded = fold_batch_norms(g, is_training=True).folded[0]
        new_ops = [folded.weights.op] + folded.layer_op.outputs[0].consumers()
        self.assertLen(new_ops, 2)
        for op in new_ops:
            self.assertEqual(op.device, folded.layer_op.device)

    def _graph_with_unfoldable(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            # No layer before it.
            tf.compat.v1.layers.batch_normalization(x, training=False, name="bn_input")
            # A layer output with another consumer.
            y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False, name="shared")
            tf.compat.v1.layers.batch_normalization(y, training=False, name="bn_shared")
            tf.nn.relu(y, name="other_consumer")
            # A foldable one.
            z = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False, name="ok")
            tf.compat.v1.layers.batch_normalization(z, training=False, name="bn_ok")
        return g

    def test_unfoldable_batch_norms_are_reported_and_left_alone(self):
        g = self._graph_with_unfoldable()
        with self.assertLogs(level="WARNING") as logs:
            result = fold_batch_norms(g, is_training=False)
        self.assertEqual([f.batch_norm for f in result.folded], ["bn_ok/FusedBatchNormV3"])
        reasons = {s.name: s.reason for s in result.skipped}
        self.assertCountEqual(reasons, ["bn_input/FusedBatchNormV3", "bn_shared/FusedBatchNormV3"])
        self.assertIn("no Conv2D", reasons["bn_input/FusedBatchNormV3"])
        self.assertIn("other_consumer", reasons["bn_shared/FusedBatchNormV3"])
        self.assertTrue(any("bn_shared/FusedBatchNormV3" in line for line in logs.output))
        self.assertEqual(g.get_operation_by_name("bn_shared/FusedBatchNormV3").inputs[0].op.name,
                         "shared/Conv2D")
        self.assertEqual(g.get_operation_by_name("shared/Conv2D").inputs[1].op.type,
                         "ReadVariableOp")

    def test_batch_norms_after_no_layer_share_one_warning(self):
        """DenseNet-like: a batch norm after every concat; one line, not one each."""
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            for i in range(5):
                x = tf.concat([x, tf.compat.v1.layers.batch_normalization(
                    x, training=False, name="bn%d" % i)], axis=-1)
        with self.assertLogs(level="WARNING") as logs:
            result = fold_batch_norms(g, is_training=False)
        self.assertLen(result.skipped, 5)
        lines = [line for line in logs.output if "not folded" in line]
        self.assertLen(lines, 1)
        self.assertIn("5 batch norm(s) not folded", lines[0])
        self.assertIn("bn0/FusedBatchNormV3 (input Placeholder:0)", lines[0])
        self.assertIn("and 2 more", lines[0])

    def test_batch_norm_inside_functional_cond_is_reported(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            training = tf.compat.v1.placeholder_with_default(False, [])
            y = tf_keras.layers.Conv2D(4, 3, use_bias=False)(x)
            tf_keras.layers.BatchNormalization()(y, training=training)
        result = fold_batch_norms(g, is_training=True)
        self.assertEmpty(result.folded)
        self.assertNotEmpty(result.skipped)
        self.assertTrue(all("Python bool" in s.reason for s in result.skipped))

    def test_finalized_graph_is_refused(self):
        g, _, _, _ = bn_util.build("conv", "fused", training=False)
        g.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            fold_batch_norms(g, is_training=False)

    def test_negative_delay_is_refused(self):
        g, _, _, _ = bn_util.build("conv", "fused", training=True)
        before = g.as_graph_def()
        with self.assertRaisesRegex(ValueError, "freeze_batch_norm_delay"):
            fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=-1)
        self.assertProtoEquals(before, g.as_graph_def())


if __name__ == "__main__":
    absltest.main()
