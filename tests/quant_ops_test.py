"""Quantizer numbers computed in a Session: last value, EMA, symmetric, narrow,
per-channel and the quantization delay."""
import numpy as np
import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

from qat.quantize.emit import quant_ops
from qat.quantize.emit import quantizer_batch
from qat.engine import step_counter

tf.compat.v1.disable_eager_execution()


def _fake_quant_np(x, lo, hi, num_bits=8, narrow=False):
    """Reference FakeQuant (nudged range, round half away from zero)."""
    qmin = 1 if narrow else 0
    qmax = (1 << num_bits) - 1
    scale = (hi - lo) / (qmax - qmin)
    zero = qmin - lo / scale
    nudged_zero = np.clip(np.floor(zero + 0.5), qmin, qmax)
    nlo = (qmin - nudged_zero) * scale
    nhi = (qmax - nudged_zero) * scale
    clamped = np.clip(x, nlo, nhi)
    return np.floor((clamped - nlo) / scale + 0.5) * scale + nlo


def _var_value(sess, graph, name):
    var = [v for v in graph.get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if v.op.name == name]
    assert len(var) == 1, name
    return sess.run(var[0])


class LastValueTest(parameterized.TestCase):

    def test_training_assigns_batch_range_including_zero(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4])
            y = quant_ops.last_value_quantize(x, "net/weights_quant")
            self.assertEqual(y.op.name, "net/weights_quant/FakeQuantWithMinMaxVars")
            self.assertTrue(y.op.get_attr("narrow_range"))
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                data = np.array([0.5, 1.0, 2.0, 3.0], np.float32)
                out = sess.run(y, {x: data})
                self.assertEqual(_var_value(sess, g, "net/weights_quant/min"), 0.0)
                self.assertEqual(_var_value(sess, g, "net/weights_quant/max"), 3.0)
                np.testing.assert_allclose(
                    out, _fake_quant_np(data, 0.0, 3.0, narrow=True), atol=1e-6)
                data = np.array([-1.0, -0.5, -0.25, -2.0], np.float32)
                sess.run(y, {x: data})
                self.assertEqual(_var_value(sess, g, "net/weights_quant/min"), -2.0)
                self.assertEqual(_var_value(sess, g, "net/weights_quant/max"), 0.0)

    def test_variables_are_non_trainable_global(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4])
            quant_ops.last_value_quantize(x, "a/weights_quant")
            names = sorted(v.op.name for v in tf.compat.v1.global_variables())
            # With the count of the batches the range skipped (not finite).
            self.assertEqual(names, ["a/weights_quant/max", "a/weights_quant/min",
                                     "a/weights_quant/skipped_batches"])
            self.assertEmpty(tf.compat.v1.trainable_variables())
            self.assertLen(g.get_collection(
                tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES), 2)

    def test_eval_reads_variables_without_updates(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [3])
            y = quant_ops.last_value_quantize(x, "w", is_training=False)
            update_ops = [op for op in g.get_operations()
                          if op.type == "AssignVariableOp"
                          and "Initializer" not in op.name
                          and not op.name.endswith("/Assign")]
            self.assertEmpty(update_ops)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                data = np.array([-10.0, 1.0, 10.0], np.float32)
                out = sess.run(y, {x: data})
                # Initial range [-6, 6]; values clamp to it.
                np.testing.assert_allclose(
                    out, _fake_quant_np(data, -6.0, 6.0, narrow=True), atol=1e-5)
                self.assertEqual(_var_value(sess, g, "w/min"), -6.0)

    @parameterized.parameters(2, 4, 8)
    def test_symmetric(self, bits):
        for narrow in (False, True):
            g = tf.Graph()
            with g.as_default():
                x = tf.compat.v1.placeholder(tf.float32, [3])
                y = quant_ops.last_value_quantize(
                    x, "w", num_bits=bits, narrow_range=narrow, symmetric=True)
                with tf.compat.v1.Session() as sess:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    sess.run(y, {x: np.array([-1.0, 0.2, 0.5], np.float32)})
                    lo = _var_value(sess, g, "w/min")
                    hi = _var_value(sess, g, "w/max")
                    self.assertAlmostEqual(lo, -1.0)
                    expected = 1.0 if narrow else ((1 << bits) - 2) / (1 << bits)
                    self.assertAlmostEqual(hi, expected, places=6)

    def test_per_channel(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 2, 1, 3])
            y = quant_ops.last_value_quantize(x, "c/weights_quant",
                                              per_channel=True)
            self.assertEqual(y.op.type, "FakeQuantWithMinMaxVarsPerChannel")
            data = np.random.RandomState(0).randn(2, 2, 1, 3).astype(np.float32)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                out = sess.run(y, {x: data})
                lo = _var_value(sess, g, "c/weights_quant/min")
                hi = _var_value(sess, g, "c/weights_quant/max")
            self.assertEqual(lo.shape, (3,))
            np.testing.assert_allclose(
                lo, np.minimum(data.min(axis=(0, 1, 2)), 0), atol=1e-6)
            np.testing.assert_allclose(
                hi, np.maximum(data.max(axis=(0, 1, 2)), 0), atol=1e-6)
            for c in range(3):
                np.testing.assert_allclose(
                    out[..., c],
                    _fake_quant_np(data[..., c], lo[c], hi[c], narrow=True),
                    atol=1e-5)

    @parameterized.parameters(0, 1, 17, 8.0, "8", True)
    def test_bad_num_bits(self, bits):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [3])
            with self.assertRaisesRegex(ValueError, "num_bits"):
                quant_ops.last_value_quantize(x, "w", num_bits=bits)
            self.assertEmpty(tf.compat.v1.global_variables())


class MovingAverageTest(absltest.TestCase):

    def test_ema_update_without_hidden_variables(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [3])
            y = quant_ops.moving_avg_quantize(
                x, "net/act_quant", ema_decay=0.9, init_min=0.0, init_max=6.0)
            self.assertFalse(y.op.get_attr("narrow_range"))
            names = sorted(v.op.name for v in tf.compat.v1.global_variables())
            # No hidden moving-average variable; the range's count of batches
            # it skipped (not finite) is qat's own.
            self.assertEqual(names, ["net/act_quant/max", "net/act_quant/min",
                                     "net/act_quant/skipped_batches"])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                lo, hi = 0.0, 6.0
                for data in ([-1.0, 0.0, 2.0], [0.5, 1.0, 10.0], [-3.0, 0.0, 1.0]):
                    data = np.array(data, np.float32)
                    out = sess.run(y, {x: data})
                    lo = lo - 0.1 * (lo - min(data.min(), 0.0))
                    hi = hi - 0.1 * (hi - max(data.max(), 0.0))
                    self.assertAlmostEqual(
                        _var_value(sess, g, "net/act_quant/min"), lo, places=5)
                    self.assertAlmostEqual(
                        _var_value(sess, g, "net/act_quant/max"), hi, places=5)
                    np.testing.assert_allclose(
                        out, _fake_quant_np(data, lo, hi), atol=1e-5)

    def test_nonnegative_input_skips_the_min_reduction(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 3])
            relu = tf.nn.relu(x)
            batch = quantizer_batch.QuantizerBatch(g)
            batch.add(quantizer_batch.QuantizerSpec(
                relu, "r/act_quant", moving_average=True, ema_decay=0.5,
                init_min=0.0, init_max=6.0, nonnegative=True))
            y = batch.build()[0]
            self.assertEqual(
                [op.type for op in g.get_operations() if op.type == "Min"], [])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                data = np.array([[-1.0, 2.0, 0.5], [3.0, -4.0, 1.0]], np.float32)
                out = sess.run(y, {x: data})
                self.assertEqual(_var_value(sess, g, "r/act_quant/min"), 0.0)
                self.assertAlmostEqual(
                    _var_value(sess, g, "r/act_quant/max"), 4.5, places=5)
            np.testing.assert_allclose(
                out, _fake_quant_np(np.maximum(data, 0), 0.0, 4.5), atol=1e-5)

    def test_eval_has_no_updates(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [3])
            y = quant_ops.moving_avg_quantize(x, "a", is_training=False,
                                              init_min=0.0, init_max=6.0)
            self.assertFalse(any(op.type == "AssignSubVariableOp"
                                 for op in g.get_operations()))
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                data = np.array([-1.0, 3.0, 7.0], np.float32)
                np.testing.assert_allclose(
                    sess.run(y, {x: data}), _fake_quant_np(data, 0.0, 6.0),
                    atol=1e-5)
                self.assertEqual(_var_value(sess, g, "a/max"), 6.0)

    def test_bad_decay(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [3])
            with self.assertRaisesRegex(ValueError, "ema_decay"):
                quant_ops.moving_avg_quantize(x, "a", ema_decay=1.5)


class DelayTest(absltest.TestCase):

    def test_float_until_delay_then_quantized_ranges_learn_meanwhile(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2])
            q = quant_ops.moving_avg_quantize(x, "l/act_quant", ema_decay=0.5,
                                              init_min=0.0, init_max=6.0)
            y = quant_ops.delay_quantization(q, x, 3, "l/act_quant")
            self.assertEqual(y.op.name, "l/act_quant/delayed_quant")
            self.assertIs(quant_ops.delay_quantization(q, x, None, "l"), q)
            self.assertIs(quant_ops.delay_quantization(q, x, 0, "l"), q)
            data = np.array([0.123, 1.0], np.float32)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                outs = [sess.run(y, {x: data}) for _ in range(4)]
                step = sess.run(step_counter.get_quantization_step_variable(g))
                hi = _var_value(sess, g, "l/act_quant/max")
            self.assertEqual(step, 4)
            np.testing.assert_array_equal(outs[0], data)
            np.testing.assert_array_equal(outs[1], data)
            # Step 3 reaches the delay: quantized from then on.
            self.assertNotAlmostEqual(float(outs[2][0]), 0.123, places=4)
            # Four EMA updates towards 1.0 at rate 0.5.
            self.assertAlmostEqual(hi, 1.0 + 5.0 / 16.0, places=5)


if __name__ == "__main__":
    absltest.main()
