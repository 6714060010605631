"""Checkpoints across the rewrite.

* A checkpoint saved from a rewritten training graph restores into a
  separately built eval graph (same variable names, no hidden EMA variables).
* A float checkpoint saved before the rewrite restores into the rewritten
  training graph: the new quantization variables are initialised, not looked
  up in the checkpoint. The pattern (docs/checkpoints.md): make the Saver over the float
  variables before calling `create_training_graph`, or filter the variables by
  the checkpoint's contents.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()


def _model(training):
    """Conv + batch norm + ReLU6 -> residual conv -> dense; returns (x, y, loss)."""
    x = tf.compat.v1.placeholder(tf.float32, [4, 8, 8, 3], name="x")
    labels = tf.compat.v1.placeholder(tf.int32, [4], name="labels")
    h = tf.compat.v1.layers.conv2d(x, 8, 3, padding="same", use_bias=False,
                                   name="conv1")
    h = tf.compat.v1.layers.batch_normalization(h, training=training,
                                                name="bn1")
    h = tf.nn.relu6(h)
    r = tf.compat.v1.layers.conv2d(h, 8, 3, padding="same", name="conv2")
    h = tf.nn.relu(h + r)
    h = tf.reduce_mean(h, [1, 2])
    y = tf.compat.v1.layers.dense(h, 3, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, y)
    return x, labels, y, loss


def _data(seed):
    rng = np.random.RandomState(seed)
    return (rng.rand(4, 8, 8, 3).astype(np.float32),
            rng.randint(0, 3, size=4).astype(np.int32))


def _var_values(sess, variables):
    return {v.op.name: sess.run(v) for v in variables}


class CheckpointTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())

    def test_training_checkpoint_restores_into_eval_graph(self):
        train_graph = tf.Graph()
        with train_graph.as_default():
            x, labels, _, loss = _model(training=True)
            qat.create_training_graph(train_graph, quant_delay=0)
            update_ops = tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.UPDATE_OPS)
            with tf.control_dependencies(update_ops):
                train_op = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(loss)
            saver = tf.compat.v1.train.Saver()
            quant_vars = [v for v in tf.compat.v1.global_variables()
                          if "_quant/" in v.op.name]
            hidden = [v.op.name for v in tf.compat.v1.global_variables()
                      if v.op.name.endswith(("/biased", "/local_step"))]
            self.assertEmpty(hidden)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for step in range(5):
                    xs, ls = _data(step)
                    sess.run(train_op, {x: xs, labels: ls})
                trained = _var_values(sess, tf.compat.v1.global_variables())
                path = saver.save(sess, os.path.join(self.dir, "qat"))
        self.assertNotEmpty(quant_vars)
        # The ranges moved away from their initial values while training.
        self.assertNotEqual(float(trained["conv1/act_quant/max"]), 6.0)

        eval_graph = tf.Graph()
        with eval_graph.as_default():
            x, _, y, _ = _model(training=False)
            qat.create_eval_graph(eval_graph)
            eval_vars = tf.compat.v1.global_variables()
            with tf.compat.v1.Session() as sess:
                tf.compat.v1.train.Saver().restore(sess, path)
                restored = _var_values(sess, eval_vars)
                out = sess.run(y, {x: _data(0)[0]})
        self.assertTrue(np.all(np.isfinite(out)))
        # The eval graph has every range; the counts of skipped batches are the
        # training graph's alone.
        quant_names = {v.op.name for v in quant_vars
                       if not v.op.name.endswith("/skipped_batches")}
        self.assertLen(quant_names, len(quant_vars) * 2 // 3)
        eval_quant = {n for n in restored if "_quant/" in n}
        self.assertEqual(eval_quant, quant_names)
        for name, value in restored.items():
            np.testing.assert_array_equal(value, trained[name], err_msg=name)

    def _save_float(self):
        g = tf.Graph()
        with g.as_default():
            _model(training=True)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                values = _var_values(sess, tf.compat.v1.global_variables())
                path = tf.compat.v1.train.Saver().save(
                    sess, os.path.join(self.dir, "float"))
        return path, values

    def test_float_checkpoint_into_training_graph_saver_before_rewrite(self):
        path, float_values = self._save_float()
        g = tf.Graph()
        with g.as_default():
            x, labels, y, loss = _model(training=True)
            float_saver = tf.compat.v1.train.Saver()  # Float variables only.
            qat.create_training_graph(g)
            train_op = tf.compat.v1.train.GradientDescentOptimizer(
                1e-2).minimize(loss)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                float_saver.restore(sess, path)
                restored = _var_values(sess, tf.compat.v1.global_variables())
                xs, ls = _data(1)
                sess.run(train_op, {x: xs, labels: ls})
                self.assertTrue(np.all(np.isfinite(sess.run(y, {x: xs}))))
        for name, value in float_values.items():
            np.testing.assert_array_equal(restored[name], value, err_msg=name)
        # The quantization variables start from their initial values.
        self.assertEqual(float(restored["conv1/act_quant/min"]), 0.0)
        self.assertEqual(float(restored["conv1/act_quant/max"]), 6.0)
        # Only the rewrite's range variables, their counts of skipped batches
        # and the step counter (whose first run starts the ranges from the
        # batch's) are new: no hidden EMA variables.
        self.assertEqual(
            sorted(set(restored) - set(float_values)),
            sorted([n for n in restored if n.endswith(
                ("_quant/min", "_quant/max", "_quant/skipped_batches"))]
                   + ["fake_quantization_step"]))

    def test_float_checkpoint_filtered_by_contents(self):
        path, float_values = self._save_float()
        g = tf.Graph()
        with g.as_default():
            _model(training=True)
            qat.create_training_graph(g)
            # A plain Saver() now also looks for the new variables: it fails.
            with tf.compat.v1.Session() as sess:
                with self.assertRaises(tf.errors.NotFoundError):
                    tf.compat.v1.train.Saver().restore(sess, path)
            in_checkpoint = {name for name, _ in tf.train.list_variables(path)}
            saver = tf.compat.v1.train.Saver(var_list=[
                v for v in tf.compat.v1.global_variables()
                if v.op.name in in_checkpoint])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                saver.restore(sess, path)
                restored = _var_values(sess, tf.compat.v1.global_variables())
        for name, value in float_values.items():
            np.testing.assert_array_equal(restored[name], value, err_msg=name)


if __name__ == "__main__":
    absltest.main()
