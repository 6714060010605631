"""Numeric tests of qat.fold_batch_norms on small layers: eval, training, freeze.

The rewritten graph's structure, warnings and refusals are
tests/fold_batch_norms_structure_test.py's.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

# qat/__init__ exports the function under the module's name: import from the module.
from qat.api import fold_batch_norms
from qat.engine import step_counter
from qat.matching import layer_patterns
import fold_batch_norms_util as bn_util


class FoldBatchNormsTest(tf.test.TestCase, parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self._x = np.random.RandomState(7).normal(
            1.0, 1.0, [bn_util.BATCH, bn_util.SIZE, bn_util.SIZE, 3]).astype(np.float32)

    @parameterized.named_parameters(*bn_util.PARAMS)
    def test_eval_fold_keeps_output(self, layer, bn):
        g, x, out, _ = bn_util.build(layer, bn, training=False)
        values = bn_util.random_values(g, 3)
        with bn_util.loaded_session(g, values) as sess:
            expected = sess.run(out, {x: self._x})
        result = fold_batch_norms(g, is_training=False)
        self.assertEmpty(result.skipped)
        self.assertLen(result.folded, 1)
        self.assertFalse(result.folded[0].training)
        self.assertEqual(result.folded[0].bias_add.type, "BiasAdd")
        with bn_util.loaded_session(g, values) as sess:
            got = sess.run(out, {x: self._x})
        self.assertLess(bn_util.rel_err(got, expected), 1e-5)
        # The old batch norm no longer reaches the output.
        with g.as_default():
            ops = tf.compat.v1.graph_util.extract_sub_graph(
                g.as_graph_def(), [out.op.name]).node
        self.assertNotIn(result.folded[0].batch_norm, [n.name for n in ops])

    @parameterized.named_parameters(*bn_util.TRAIN_PARAMS)
    def test_training_fold_before_freeze(self, layer, bn, use_cond):
        self._check_training_fold(layer, bn, 100, use_cond)

    @parameterized.named_parameters(*bn_util.PARAMS)
    def test_training_fold_without_delay(self, layer, bn):
        # No freeze: the consumers read the original batch norm directly.
        self._check_training_fold(layer, bn, None, False)

    def _check_training_fold(self, layer, bn, delay, use_cond):
        ref_g, ref_x, ref_out, ref_w = bn_util.build(layer, bn, training=True)
        g, x, out, w = bn_util.build(layer, bn, training=True)
        values = bn_util.random_values(g, 5)
        result = fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=delay,
                                  use_cond=use_cond)
        self.assertEmpty(result.skipped)
        self.assertLen(result.folded, 1)
        self.assertTrue(result.folded[0].training)
        self.assertIs(layer_patterns.weight_input(result.folded[0].layer_op),
                      result.folded[0].weights)
        fetches = []
        for graph, xt, o, wt in ((ref_g, ref_x, ref_out, ref_w), (g, x, out, w)):
            with graph.as_default():
                r = tf.constant(np.random.RandomState(9).normal(size=o.shape.as_list()),
                                tf.float32)
                loss = tf.reduce_sum(o * r)
                grads = tf.gradients(loss, [xt, wt])
                updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
            with bn_util.loaded_session(graph, values) as sess:
                got = sess.run([o] + grads, {xt: self._x})
                sess.run(updates, {xt: self._x})
                got.append(sess.run(bn_util.moving_variables(graph)))
            fetches.append(got)
        (ref_o, ref_gx, ref_gw, ref_mv), (o, gx, gw, mv) = fetches
        self.assertLess(bn_util.rel_err(o, ref_o), 1e-4)
        self.assertLess(bn_util.rel_err(gx, ref_gx), 1e-4)
        self.assertLess(bn_util.rel_err(gw, ref_gw), 1e-4)
        for a, b in zip(mv, ref_mv):
            self.assertLess(bn_util.rel_err(a, b), 1e-4)

    @parameterized.named_parameters(*bn_util.TRAIN_PARAMS)
    def test_training_fold_after_freeze(self, layer, bn, use_cond):
        eval_g, eval_x, eval_out, eval_w = bn_util.build(layer, bn, training=False)
        g, x, out, w = bn_util.build(layer, bn, training=True)
        values = bn_util.random_values(g, 11)
        fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=1, use_cond=use_cond)
        fetches = []
        for graph, xt, o, wt in ((eval_g, eval_x, eval_out, eval_w), (g, x, out, w)):
            with graph.as_default():
                r = tf.constant(np.random.RandomState(9).normal(size=o.shape.as_list()),
                                tf.float32)
                fetches.append([o] + tf.gradients(tf.reduce_sum(o * r), [xt, wt]))
        with g.as_default():
            updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        with bn_util.loaded_session(g, values) as sess:
            sess.run(out, {x: self._x})  # Step 1: batch statistics.
            before = sess.run(bn_util.moving_variables(g))
            for _ in range(2):
                got, _ = sess.run([fetches[1], updates], {x: self._x})
            after = sess.run(bn_util.moving_variables(g))
            step = sess.run(step_counter.get_quantization_step_variable(g))
        self.assertEqual(step, 3)  # One increment per run that evaluates the fold.
        for a, b in zip(after, before):
            self.assertAllEqual(a, b)
        with bn_util.loaded_session(eval_g, values) as sess:
            expected = sess.run(fetches[0], {eval_x: self._x})
        # Output and gradients (input, weights) of the moving-statistics layer.
        for a, b in zip(got, expected):
            self.assertLess(bn_util.rel_err(a, b), 1e-4)

    @parameterized.named_parameters(
        ("conv_fused", "conv", "fused", False), ("conv_unfused", "conv", "unfused", False),
        ("depthwise_fused", "depthwise", "fused", False),
        ("matmul_unfused", "matmul", "unfused", False),
        ("conv_fused_cond", "conv", "fused", True))
    def test_zero_gamma_gives_no_nan(self, layer, bn, use_cond):
        g, x, out, w = bn_util.build(layer, bn, training=True)
        values = bn_util.random_values(g, 13, gamma_zero=True)
        fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=1, use_cond=use_cond)
        with g.as_default():
            grads = tf.gradients(tf.reduce_sum(out), [x, w])
        with bn_util.loaded_session(g, values) as sess:
            for _ in range(2):  # Before and after the freeze.
                results = sess.run([out] + grads, {x: self._x})
                for r in results:
                    self.assertTrue(np.all(np.isfinite(r)))


if __name__ == "__main__":
    absltest.main()
