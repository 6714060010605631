"""The quantizers' FakeQuant gradient equals TensorFlow's, bit for bit.

qat.quantize.emit.fake_quant_gradient replaces the input gradient of FakeQuant ops in
training graphs by a one-pass kernel over a recomputed nudged range; these
tests compare it with FakeQuantWithMinMaxVars(PerChannel)Gradient on random
ranges and on inputs placed exactly at the nudged bounds and one float step
either side, through the batched (precomputed) and the per-op path.
"""
import numpy as np
import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

from qat.quantize.emit import fake_quant_gradient
from qat import graph_editor as ge
from qat.quantize.emit import quant_ops
from qat.quantize.emit import quantizer_batch
from qat.engine import step_counter

tf.compat.v1.disable_eager_execution()

_CHANNELS = 6
_ROWS = 40


def _random_range(rng, shape):
    """A min <= 0 <= max pair, sometimes [0, 0], -0.0 or a one-sided range."""
    lo = -rng.exponential(1.0, shape) * (rng.rand(*shape) < 0.8)
    hi = rng.exponential(3.0, shape) * (rng.rand(*shape) < 0.9)
    if rng.rand() < 0.1:
        lo, hi = np.zeros(shape), np.zeros(shape)
    if rng.rand() < 0.1:
        lo = -np.zeros(shape)
    return lo.astype(np.float32), hi.astype(np.float32)


def _inputs_at_bounds(rng, lo, hi):
    """Random inputs plus each bound and its neighbouring floats."""
    x = rng.uniform(-8, 8, [_ROWS, _CHANNELS]).astype(np.float32)
    lo = np.broadcast_to(lo, [_CHANNELS])
    hi = np.broadcast_to(hi, [_CHANNELS])
    for c in range(_CHANNELS):
        for k, bound in enumerate((lo[c], hi[c])):
            if np.isfinite(bound):
                x[3 * k:3 * k + 3, c] = [np.nextafter(bound, -np.inf), bound,
                                         np.nextafter(bound, np.inf)]
    return x


def _reference_grad(op, grad):
    """TensorFlow's own FakeQuant gradient of the input."""
    kwargs = dict(gradients=grad, inputs=op.inputs[0], min=op.inputs[1],
                  max=op.inputs[2], num_bits=op.get_attr("num_bits"),
                  narrow_range=op.get_attr("narrow_range"))
    if op.type == "FakeQuantWithMinMaxVarsPerChannel":
        return tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
            **kwargs).backprops_wrt_input
    return tf.raw_ops.FakeQuantWithMinMaxVarsGradient(
        **kwargs).backprops_wrt_input


class NudgedRangeTest(parameterized.TestCase):

    def _assert_gradients_match(self, cases, per_channel, rng):
        """Builds one FakeQuant per (lo, hi, num_bits, narrow) case and
        compares its gradient with TensorFlow's at the nudged bounds.

        Many ops in one graph: the per-tensor ones go through the batched
        nudge, the per-channel ones through the per-op nudge; Grappler is on,
        as in training.
        """
        g = tf.Graph()
        built = []
        with g.as_default():
            for i, (lo, hi, num_bits, narrow) in enumerate(cases):
                lo_t = tf.compat.v1.placeholder_with_default(lo, lo.shape)
                hi_t = tf.compat.v1.placeholder_with_default(hi, hi.shape)
                x = tf.compat.v1.placeholder(tf.float32, [_ROWS, _CHANNELS])
                dy = tf.compat.v1.placeholder(tf.float32, [_ROWS, _CHANNELS])
                make = (tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel
                        if per_channel else tf.raw_ops.FakeQuantWithMinMaxVars)
                y = make(inputs=x, min=lo_t, max=hi_t, num_bits=num_bits,
                         narrow_range=narrow, name="fq_%d" % i)
                y.op._set_attr("_gradient_op_type", tf.compat.v1.AttrValue(
                    s=fake_quant_gradient.GRADIENT_OP_TYPE.encode()))
                built.append((y, x, dy))
            fake_quant_gradient.precompute_nudged_ranges(
                [y.op for y, _, _ in built])
            nudged = [fake_quant_gradient.nudged_range(
                tf.constant(lo), tf.constant(hi),
                *fake_quant_gradient.quant_bounds(bits, narrow))
                for lo, hi, bits, narrow in cases]
            ours = [tf.gradients(y, x, grad_ys=dy)[0] for y, x, dy in built]
            theirs = [_reference_grad(y.op, dy) for y, _, dy in built]
            with tf.compat.v1.Session() as sess:
                bounds = sess.run(nudged)
                feed = {}
                for (_, x, dy), (nlo, nhi) in zip(built, bounds):
                    feed[x] = _inputs_at_bounds(rng, nlo, nhi)
                    feed[dy] = rng.normal(size=[_ROWS, _CHANNELS]).astype(
                        np.float32)
                got, want = sess.run([ours, theirs], feed)
        for i, (a, b) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(a, b, err_msg="case %d: %r" % (
                i, cases[i]))

    @parameterized.parameters((False,), (True,))
    def test_gradient_matches_tensorflow_at_the_bounds(self, per_channel):
        rng = np.random.RandomState(3)
        cases = []
        for _ in range(120):
            num_bits = int(rng.choice([2, 4, 7, 8, 16]))
            narrow = bool(rng.rand() < 0.5)
            lo, hi = _random_range(rng, [_CHANNELS] if per_channel else [])
            cases.append((lo, hi, num_bits, narrow))
        self._assert_gradients_match(cases, per_channel, rng)

    @parameterized.parameters((False,), (True,))
    def test_zero_point_halves_round_away_from_zero(self, per_channel):
        # min = -(k + 1/2) steps of 1/64: the zero point is exactly k + 1/2,
        # which the kernels round up (tf.round would round 0.5 and 2.5 down).
        shape = [_CHANNELS] if per_channel else []
        cases = []
        for k in range(4):
            lo = np.full(shape, -(k + 0.5) / 64, np.float32)
            hi = np.full(shape, (255 - k - 0.5) / 64, np.float32)
            cases.append((lo, hi, 8, False))
        self._assert_gradients_match(cases, per_channel,
                                     np.random.RandomState(5))

    def test_both_zero_passes_every_gradient(self):
        g = tf.Graph()
        with g.as_default():
            lo, hi = fake_quant_gradient.nudged_range(
                tf.constant([0.0, -0.0, -1.0]), tf.constant([0.0, 0.0, 0.0]),
                0.0, 255.0)
            with tf.compat.v1.Session() as sess:
                lo, hi = sess.run([lo, hi])
        np.testing.assert_array_equal(lo[:2], [-np.inf, -np.inf])
        np.testing.assert_array_equal(hi[:2], [np.inf, np.inf])
        self.assertEqual((lo[2], hi[2]), (-1.0, 0.0))


class QuantizerGradientTest(absltest.TestCase):

    def _quantizers(self, is_training=True):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [_ROWS, _CHANNELS],
                                         name="x")
            batch = quantizer_batch.QuantizerBatch(g)
            specs = [
                quantizer_batch.QuantizerSpec(x, "w/weights_quant", False,
                                        is_training, narrow_range=True),
                quantizer_batch.QuantizerSpec(x, "a/act_quant", True, is_training),
                quantizer_batch.QuantizerSpec(x, "s/act_quant", True, is_training,
                                        symmetric=True, num_bits=4),
                quantizer_batch.QuantizerSpec(x, "c/weights_quant", False,
                                        is_training, per_channel=True),
            ]
            for spec in specs:
                batch.add(spec)
            outputs = batch.build()
        return g, x, outputs

    def test_training_gradient_equals_tensorflow_gradient(self):
        g, x, outputs = self._quantizers()
        rng = np.random.RandomState(0)
        with g.as_default():
            dys = [tf.constant(rng.normal(size=[_ROWS, _CHANNELS]).astype(
                np.float32)) for _ in outputs]
            ours = [tf.gradients(y, x, grad_ys=dy)[0]
                    for y, dy in zip(outputs, dys)]
            theirs = [_reference_grad(y.op, dy) for y, dy in zip(outputs, dys)]
            data = rng.uniform(-3, 5, [_ROWS, _CHANNELS]).astype(np.float32)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(3):  # The EMA ranges move between runs.
                    got, want = sess.run([ours, theirs], {x: data})
                    for a, b in zip(got, want):
                        np.testing.assert_array_equal(a, b)
                    data = data * 1.7 - 0.4

    def test_batched_nudge_serves_the_per_tensor_quantizers(self):
        g, x, outputs = self._quantizers()
        with g.as_default():
            grads = [tf.gradients(y, x)[0] for y in outputs]
        for y, grad in zip(outputs, grads):
            self.assertEqual(grad.op.type, "QuantizeAndDequantizeV4Grad")
            source = grad.op.inputs[2].op
            if y.op.type == "FakeQuantWithMinMaxVars":
                self.assertEqual(source.type, "Unpack")
                self.assertStartsWith(source.name, "quant_constants/")
            else:
                self.assertNotEqual(source.type, "Unpack")

    def test_ranges_get_no_gradient_and_no_three_output_kernel(self):
        g, x, outputs = self._quantizers()
        with g.as_default():
            ranges = [y.op.inputs[1] for y in outputs]
            self.assertEqual(tf.gradients(outputs, ranges), [None] * 4)
            tf.gradients(outputs, x)
        types = {op.type for op in g.get_operations()}
        self.assertNotIn("FakeQuantWithMinMaxVarsGradient", types)
        self.assertNotIn("FakeQuantWithMinMaxVarsPerChannelGradient", types)

    def test_copied_quantizer_computes_its_own_nudge(self):
        g, x, outputs = self._quantizers()
        with g.as_default():
            ops = ge.get_forward_walk_ops([x.op], inclusive=False)
            _, info = ge.copy_with_input_replacements(ops, {})
            copies = [info.transformed(y) for y in outputs]
            dys = [tf.ones_like(c) * 0.5 for c in copies]
            ours = [tf.gradients(c, x, grad_ys=dy)[0]
                    for c, dy in zip(copies, dys)]
            theirs = [_reference_grad(c.op, dy) for c, dy in zip(copies, dys)]
            for grad in ours:
                self.assertNotEqual(grad.op.inputs[2].op.type, "Unpack")
            data = np.linspace(-4, 6, _ROWS * _CHANNELS, dtype=np.float32)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                got, want = sess.run([ours, theirs],
                                     {x: data.reshape(_ROWS, _CHANNELS)})
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)

    def test_rerouted_range_is_nudged_again(self):
        g, x, outputs = self._quantizers()
        fake_quant = outputs[0].op  # Per-tensor: its nudge was batched.
        with g.as_default():
            wider = tf.constant(-2.5)
            ge.reroute_ts([wider], [fake_quant.inputs[1]],
                          can_modify=[fake_quant])
            self.assertIs(fake_quant.inputs[1], wider)
            ours = tf.gradients(outputs[0], x)[0]
            self.assertNotEqual(ours.op.inputs[2].op.type, "Unpack")
            theirs = _reference_grad(fake_quant, tf.ones_like(x))
            data = np.linspace(-4, 6, _ROWS * _CHANNELS, dtype=np.float32)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                got, want = sess.run([ours, theirs],
                                     {x: data.reshape(_ROWS, _CHANNELS)})
        np.testing.assert_array_equal(got, want)
        self.assertGreater(np.count_nonzero(got), np.count_nonzero(
            data.reshape(_ROWS, _CHANNELS) >= 0))  # The new min counts.

    def test_eval_quantizers_keep_tensorflows_gradient(self):
        _, _, outputs = self._quantizers(is_training=False)
        for y in outputs:
            with self.assertRaises(ValueError):
                y.op.get_attr("_gradient_op_type")


class DelayedQuantizerGradientTest(absltest.TestCase):
    """Select(step >= delay, FakeQuant(x), x): the gradient of x is the
    incoming one before the delay and the straight-through one after."""

    def _check(self, make_outputs):
        g = tf.Graph()
        rng = np.random.RandomState(1)
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4, 3, 2, _CHANNELS],
                                         name="x")
            outputs = make_outputs(g, x)
            dys = [tf.constant(rng.normal(size=[4, 3, 2, _CHANNELS]).astype(
                np.float32)) for _ in outputs]
            ours, theirs = [], []
            for y, dy in zip(outputs, dys):
                select = y.op
                self.assertEqual(select.type, "Select")
                ours.append(tf.gradients(y, x, grad_ys=dy)[0])
                fake_quant = select.inputs[1].op
                while not fake_quant.type.startswith("FakeQuant"):
                    fake_quant = fake_quant.inputs[0].op  # Reshape_1.
                reference = tf.reshape(_reference_grad(
                    fake_quant, tf.reshape(dy, fake_quant.inputs[0].shape)),
                    x.shape)
                theirs.append(tf.compat.v1.where(select.inputs[0], reference,
                                                 dy))
            # Beyond the initial [-6, 6] of the moving averages too.
            data = rng.uniform(-9, 9, [4, 3, 2, _CHANNELS]).astype(np.float32)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                seen = set()
                for _ in range(4):  # The delay (2) is reached on the way.
                    got, want, active = sess.run(
                        [ours, theirs, outputs[0].op.inputs[0]], {x: data})
                    seen.add(bool(active))
                    for a, b in zip(got, want):
                        np.testing.assert_array_equal(a, b)
            self.assertEqual(seen, {False, True})
        return g, outputs, ours

    def test_batch_quantizers(self):
        def make(g, x):
            step = step_counter.get_or_create_quantization_step(g)
            batch = quantizer_batch.QuantizerBatch(g)
            for spec in [
                    quantizer_batch.QuantizerSpec(x, "a/act_quant", True,
                                            quant_delay=2),
                    quantizer_batch.QuantizerSpec(x, "w/weights_quant", False,
                                            narrow_range=True, quant_delay=2),
                    quantizer_batch.QuantizerSpec(x, "c/weights_quant", False,
                                            per_channel=True, quant_delay=2),
                    # A depthwise filter: per-channel through a reshape.
                    quantizer_batch.QuantizerSpec(
                        x, "d/weights_quant", False, per_channel=True,
                        channel_reshape=[4, 3, 2 * _CHANNELS], quant_delay=2),
            ]:
                batch.add(spec, step)
            return batch.build()

        _, outputs, grads = self._check(make)
        for y, grad in zip(outputs[:3], grads[:3]):
            # One masked pass straight to x; the FakeQuant's own gradient
            # never runs.
            self.assertEqual(grad.op.type, "QuantizeAndDequantizeV4Grad")
            self.assertIs(grad.op.inputs[1], y.op.inputs[2])

    def test_delay_quantization_function(self):
        def make(g, x):
            del g
            q = quant_ops.moving_avg_quantize(x, "l/act_quant")
            return [quant_ops.delay_quantization(q, x, 2, "l/act_quant")]

        _, outputs, grads = self._check(make)
        self.assertEqual(outputs[0].op.get_attr("_gradient_op_type"),
                         fake_quant_gradient.DELAYED_GRADIENT_OP_TYPE.encode())
        self.assertEqual(grads[0].op.type, "QuantizeAndDequantizeV4Grad")


class ReluFusionTest(parameterized.TestCase):
    """ReLU -> training FakeQuant: one masked pass for both, the same values."""

    def _graph(self, relu_fn, quant_delay=None, is_training=True):
        g = tf.Graph()
        with g.as_default():
            z = tf.compat.v1.placeholder(tf.float32, [_ROWS, _CHANNELS], name="z")
            relu = relu_fn(z)
            step = step_counter.get_or_create_quantization_step(g)
            batch = quantizer_batch.QuantizerBatch(g)
            batch.add(quantizer_batch.QuantizerSpec(
                relu, "r/act_quant", True, is_training, quant_delay=quant_delay), step)
            y, = batch.build()
        return g, z, relu, y

    def _data(self, rng):
        """Random values plus 0, subnormals, the smallest normal and 6's neighbours."""
        data = rng.uniform(-2, 8, [_ROWS, _CHANNELS]).astype(np.float32)
        tiny = np.finfo(np.float32).tiny
        special = [0.0, -0.0, 1e-40, -1e-40, tiny, np.nextafter(tiny, 1),
                   np.nextafter(np.float32(6), 0), 6.0, np.nextafter(np.float32(6), 7)]
        data[:len(special), 0] = special
        return data

    def _compare(self, g, z, ours, theirs, steps=4):
        rng = np.random.RandomState(2)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            data = self._data(rng)
            for _ in range(steps):  # The ranges (and the delay) move.
                got, want = sess.run([ours, theirs], {z: data})
                np.testing.assert_array_equal(got, want)
                self.assertTrue(np.any(got != 0))
                data = data * 0.8 + 0.3

    @parameterized.named_parameters(("relu6", tf.nn.relu6, "Relu6Grad"),
                                    ("relu", tf.nn.relu, "ReluGrad"))
    def test_one_pass_equals_both_masks(self, relu_fn, relu_grad_type):
        g, z, relu, y = self._graph(relu_fn)
        self.assertEqual(relu.op.get_attr("_gradient_op_type"),
                         fake_quant_gradient.RELU_GRADIENT_OP_TYPE.encode())
        with g.as_default():
            dy = tf.constant(np.random.RandomState(3).normal(
                size=[_ROWS, _CHANNELS]).astype(np.float32))
            ours = tf.gradients(y, z, grad_ys=dy)[0]
            relu_grad = getattr(tf.raw_ops, relu_grad_type)
            theirs = relu_grad(gradients=_reference_grad(y.op, dy), features=relu)
        self.assertEqual(ours.op.type, "QuantizeAndDequantizeV4Grad")
        # Straight from the incoming gradient, not from a first masked pass.
        self.assertNotEqual(ours.op.inputs[0].op.type, "QuantizeAndDequantizeV4Grad")
        types = [op.type for op in g.get_operations()]
        self.assertEqual(types.count(relu_grad_type), 1)  # The reference's only.
        self._compare(g, z, ours, theirs)

    def test_delayed_quantizer(self):
        g, z, relu, y = self._graph(tf.nn.relu6, quant_delay=2)
        with g.as_default():
            dy = tf.ones_like(y) * 0.5
            ours = tf.gradients(y, z, grad_ys=dy)[0]
            fake_quant = y.op.inputs[1].op
            theirs = tf.raw_ops.Relu6Grad(
                gradients=tf.compat.v1.where(y.op.inputs[0], _reference_grad(fake_quant, dy), dy),
                features=relu)
        self.assertEqual(ours.op.type, "QuantizeAndDequantizeV4Grad")
        self.assertNotEqual(ours.op.inputs[0].op.type, "QuantizeAndDequantizeV4Grad")
        self._compare(g, z, ours, theirs)

    def test_gradient_of_the_relu_output_is_unchanged(self):
        """Only the ReLU's input gradient gets the ReLU's mask."""
        g, _, relu, y = self._graph(tf.nn.relu6)
        with g.as_default():
            dy = tf.ones_like(y)
            ours = tf.gradients(y, relu, grad_ys=dy)[0]
            theirs = _reference_grad(y.op, dy)
        self._compare(g, g.get_tensor_by_name("z:0"), ours, theirs)

    def test_other_consumers_get_the_relus_own_gradient(self):
        g, z, relu, y = self._graph(tf.nn.relu6)
        with g.as_default():
            dy = tf.ones_like(y) * 0.25
            other = relu * 3.0  # A second path from the ReLU to the loss.
            ours = tf.gradients([y, other], z, grad_ys=[dy, tf.ones_like(other)])[0]
            theirs = tf.raw_ops.Relu6Grad(
                gradients=_reference_grad(y.op, dy) + 3.0, features=relu)
        self.assertEqual(ours.op.type, "Relu6Grad")
        self._compare(g, z, ours, theirs)

    def test_eval_and_overridden_relus_are_left_alone(self):
        _, _, relu, _ = self._graph(tf.nn.relu6, is_training=False)
        with self.assertRaises(ValueError):
            relu.op.get_attr("_gradient_op_type")

        def overridden(z):
            with tf.compat.v1.get_default_graph().gradient_override_map(
                    {"Relu6": "Identity"}):
                return tf.nn.relu6(z)

        _, _, relu, _ = self._graph(overridden)
        self.assertEqual(relu.op.get_attr("_gradient_op_type"), b"Identity")


if __name__ == "__main__":
    absltest.main()
