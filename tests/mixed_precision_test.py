"""Mixed precision (issue #12 item 5): float16 / bfloat16 layers.

tf_keras `mixed_float16` / `mixed_bfloat16` layers compute in float16 /
bfloat16 from float32 variables (read, then Cast) and their fused batch norms
keep float32 statistics. The fold recognises the cast weights and builds
dtype-correct ops (scale and bias in float32, cast to the layer's dtype where
they meet the weights or the layer output), so eval and training folds match
the unfolded network; `QuantizerBatch` quantizes a float16 / bfloat16 tensor
in float32 between two casts.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.quantize.emit import quantizer_batch  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

_POLICIES = {"float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}
# Relative precision of the layer dtype (the fold reorders roundings).
_TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2}
_X = np.random.RandomState(0).uniform(-1, 1, [4, 6, 6, 3]).astype(np.float32)


def _build(dtype_name, training, layer="conv"):
    g = tf.Graph()
    with g.as_default():
        tf_keras.mixed_precision.set_global_policy(_POLICIES[dtype_name])
        try:
            x = tf.compat.v1.placeholder(tf.float32, _X.shape, name="x")
            if layer == "conv":
                y = tf_keras.layers.Conv2D(4, 3, padding="same", use_bias=True)(x)
            else:
                y = tf_keras.layers.DepthwiseConv2D(3, padding="same")(x)
            y = tf_keras.layers.BatchNormalization(
                moving_mean_initializer=tf_keras.initializers.RandomNormal(0.0, 0.3, 1),
                moving_variance_initializer=tf_keras.initializers.RandomUniform(0.5, 2.0, 2),
                gamma_initializer=tf_keras.initializers.RandomUniform(0.5, 1.5, 3),
                beta_initializer=tf_keras.initializers.RandomNormal(0.0, 0.3, 4),
            )(y, training=training)
            y = tf_keras.layers.ReLU()(y)
            out = tf.identity(tf.cast(y, tf.float32), name="out")
        finally:
            tf_keras.mixed_precision.set_global_policy("float32")
    return g, x, out


class MixedPrecisionFoldTest(parameterized.TestCase):

    def _assert_close(self, actual, expected, dtype_name):
        tolerance = _TOLERANCE[dtype_name] * (1.0 + np.abs(expected))
        self.assertTrue(np.all(np.abs(actual - expected) <= tolerance),
                        np.max(np.abs(actual - expected)))

    @parameterized.product(dtype_name=["float16", "bfloat16"], layer=["conv", "depthwise"])
    def test_eval_fold_matches_unfolded(self, dtype_name, layer):
        g, x, out = _build(dtype_name, training=False, layer=layer)
        layer_op = [op for op in g.get_operations()
                    if op.type in ("Conv2D", "DepthwiseConv2dNative")][0]
        self.assertEqual(layer_op.inputs[1].op.type, "Cast")  # float32 variable, cast.
        with g.as_default():
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            unfolded = sess.run(out, {x: _X})
            result = qat.fold_batch_norms(g, is_training=False)
            self.assertEmpty(result.skipped)
            self.assertLen(result.folded, 1)
            folded_layer = result.folded[0]
            self.assertEqual(folded_layer.weights.dtype, tf.as_dtype(dtype_name))
            self.assertEqual(folded_layer.output.dtype, tf.as_dtype(dtype_name))
            folded = sess.run(out, {x: _X})
        self._assert_close(folded, unfolded, dtype_name)

    @parameterized.product(dtype_name=["float16", "bfloat16"], delay=[None, 0])
    def test_training_fold_matches_unfolded_and_has_gradients(self, dtype_name, delay):
        g, x, out = _build(dtype_name, training=True)
        with g.as_default():
            loss = tf.reduce_mean(tf.square(out))
            variables = tf.compat.v1.trainable_variables()
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            unfolded = sess.run(out, {x: _X})
            result = qat.fold_batch_norms(g, is_training=True,
                                          freeze_batch_norm_delay=delay)
            self.assertEmpty(result.skipped)
            self.assertLen(result.folded, 1)
            with g.as_default():
                grads = tf.gradients(loss, variables)
                if delay is not None:
                    sess.run(tf.compat.v1.variables_initializer(
                        [v for v in tf.compat.v1.global_variables()
                         if "fake_quantization_step" in v.op.name]))
            self.assertNotIn(None, grads)
            folded, grad_values = sess.run([out, grads], {x: _X})
        if delay is None:
            self._assert_close(folded, unfolded, dtype_name)
        for value in grad_values:
            self.assertTrue(np.all(np.isfinite(value)))

    def test_float32_fold_adds_no_cast(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, _X.shape)
            y = tf_keras.layers.Conv2D(4, 3, padding="same")(x)
            tf_keras.layers.BatchNormalization()(y, training=False)
        qat.fold_batch_norms(g, is_training=False)
        self.assertEmpty([op.name for op in g.get_operations() if op.type == "Cast"])


class MixedPrecisionQuantizerTest(parameterized.TestCase):

    @parameterized.product(dtype_name=["float16", "bfloat16"], training=[True, False],
                           delay=[None, 3])
    def test_quantized_in_float32_between_casts(self, dtype_name, training, delay):
        dtype = tf.as_dtype(dtype_name)
        g = tf.Graph()
        values = np.linspace(-3.0, 5.0, 24).reshape([2, 3, 4]).astype(np.float32)
        with g.as_default():
            x = tf.compat.v1.placeholder(dtype, [2, 3, 4], name="x")
            step = tf.compat.v1.train.get_or_create_global_step()
            batch = quantizer_batch.QuantizerBatch(g)
            batch.add(quantizer_batch.QuantizerSpec(
                inputs=x, prefix="q", moving_average=False, is_training=training,
                init_min=-2.0, init_max=4.0, quant_delay=delay), step.read_value())
            (quantized,) = batch.build()
            self.assertEqual(quantized.dtype, dtype)
            fq = g.get_operation_by_name("q/FakeQuantWithMinMaxVars")
            self.assertEqual(fq.inputs[0].op.type, "Cast")
            self.assertEqual(fq.inputs[0].dtype, tf.float32)
            reference = tf.quantization.fake_quant_with_min_max_vars(
                tf.cast(x, tf.float32), fq.inputs[1], fq.inputs[2])
            init = tf.compat.v1.global_variables_initializer()
            assign_step = step.assign(5)
            grad = tf.gradients(tf.reduce_sum(tf.cast(quantized, tf.float32)), x)[0]
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            sess.run(assign_step)
            out, ref, grad_value = sess.run(
                [quantized, tf.cast(reference, dtype), grad], {x: values})
        np.testing.assert_array_equal(out, ref)
        self.assertTrue(np.all(np.isfinite(grad_value.astype(np.float32))))

    def test_integer_tensor_is_refused(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.int32, [2])
            with self.assertRaisesRegex(ValueError, "float16 and bfloat16"):
                quantizer_batch.QuantizerBatch(g).add(quantizer_batch.QuantizerSpec(
                    inputs=x, prefix="q", moving_average=True))


if __name__ == "__main__":
    absltest.main()
