"""PartitionedVariable weights are folded and quantized (issue #12 item 7).

A partitioned variable (`get_variable(..., partitioner=...)`) is read as
ConcatV2 of its shards; the layer patterns recognise that as weights, so the
batch norm after the layer is folded and the concatenated weights get their
`weights_quant`, exactly as for the same weights in one variable.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from tools.property import invariants  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

_RNG = np.random.RandomState(0)
_CONV_W = _RNG.normal(0, 0.4, [3, 3, 3, 6]).astype(np.float32)
_DENSE_W = _RNG.normal(0, 0.4, [12, 6]).astype(np.float32)
_X = {"conv": _RNG.uniform(-1, 1, [4, 5, 5, 3]).astype(np.float32),
      "dense": _RNG.uniform(-1, 1, [4, 12]).astype(np.float32)}


def _build(layer, shards, training, resource, fused):
    """conv / dense -> batch norm -> relu, weights in `shards` partitions."""
    g = tf.Graph()
    with g.as_default(), tf.compat.v1.variable_scope("", use_resource=resource):
        x = tf.compat.v1.placeholder(tf.float32, _X[layer].shape, name="x")
        value = _CONV_W if layer == "conv" else _DENSE_W
        axis = 3 if layer == "conv" else 0
        partitioner = (tf.compat.v1.fixed_size_partitioner(shards, axis=axis)
                       if shards > 1 else None)
        w = tf.compat.v1.get_variable("w", value.shape, partitioner=partitioner)
        y = tf.nn.conv2d(x, w, 1, "SAME") if layer == "conv" else tf.matmul(x, w)
        y = tf.compat.v1.layers.batch_normalization(
            y, training=training, fused=fused,
            moving_mean_initializer=tf.compat.v1.constant_initializer(0.2),
            moving_variance_initializer=tf.compat.v1.constant_initializer(1.7),
            gamma_initializer=tf.compat.v1.constant_initializer(1.3))
        out = tf.identity(tf.nn.relu(y), name="out")
        shard_vars = list(w) if shards > 1 else [w]
        assigns = []
        offset = 0
        for v in shard_vars:
            n = int(v.shape[axis])
            part = value[..., offset:offset + n] if axis == 3 else value[offset:offset + n]
            assigns.append(v.assign(part))
            offset += n
        load = tf.group(assigns)
    return g, x, out, shard_vars, load


class PartitionedWeightsTest(parameterized.TestCase):

    def _run(self, g, x, fetches, load, layer):
        with g.as_default():
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            sess.run(load)
            return sess.run(fetches, {x: _X[layer]})

    @parameterized.product(layer=["conv", "dense"], training=[False, True],
                           resource=[True, False])
    def test_folded_and_quantized_like_one_variable(self, layer, training, resource):
        fused = layer == "conv"
        results = []
        for shards in (3, 1):
            g, x, out, shard_vars, load = _build(layer, shards, training, resource, fused)
            fold = qat.fold_batch_norms(g, is_training=training)
            self.assertEmpty(fold.skipped, shards)
            self.assertLen(fold.folded, 1)
            if training:
                qat.create_training_graph(g)
            else:
                qat.create_eval_graph(g)
            self.assertEmpty(invariants.weights_violations(g, [v.op for v in shard_vars]))
            quants = [op.name for op in g.get_operations()
                      if op.type == "FakeQuantWithMinMaxVars" and "weights_quant" in op.name]
            self.assertLen(quants, 1, quants)
            fetches = [out]
            if training:
                with g.as_default():
                    loss = tf.reduce_mean(tf.square(out))
                    grads = tf.gradients(loss, shard_vars)
                self.assertNotIn(None, grads)
                fetches.append(grads)
            results.append(self._run(g, x, fetches, load, layer))
        partitioned, single = results
        np.testing.assert_allclose(partitioned[0], single[0], rtol=1e-6, atol=1e-6)
        if training:
            joined = np.concatenate(partitioned[1], axis=3 if layer == "conv" else 0)
            self.assertTrue(np.all(np.isfinite(joined)))
            np.testing.assert_allclose(joined, single[1][0], rtol=1e-5, atol=1e-6)

    def test_without_batch_norm_weights_are_quantized(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4, 12], name="x")
            w = tf.compat.v1.get_variable(
                "w", [12, 6], partitioner=tf.compat.v1.fixed_size_partitioner(3))
            tf.identity(tf.nn.relu(tf.matmul(x, w)), name="out")
        qat.create_eval_graph(g)
        self.assertEmpty(invariants.weights_violations(g, [v.op for v in w]))

    def test_second_call_changes_nothing(self):
        g, _, _, _, _ = _build("conv", 3, False, True, True)
        qat.create_eval_graph(g)
        before = g.as_graph_def().SerializeToString(deterministic=True)
        qat.create_eval_graph(g)
        self.assertEqual(g.as_graph_def().SerializeToString(deterministic=True), before)


if __name__ == "__main__":
    absltest.main()
