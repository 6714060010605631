"""Training under XLA: qat's gradients, Keras's jit_compile (True and "auto"), the graph path.

QuantizeAndDequantizeV4Grad, the one-pass gradient of qat's quantizers, has
no XLA kernel; where XLA compiles the gradient the quantizers take
TensorFlow's own FakeQuant gradient (`qat.quantize.emit.xla_gradients`).
These tests check each gradient form under `tf.function(jit_compile=True)`
against TensorFlow's own gradient compiled by XLA in the same function (bit
for bit, inputs on the nudged bounds included), a training step under XLA
against one without it, Keras 3 and tf_keras models compiled with
`jit_compile=True`, Keras 3's `jit_compile="auto"` as it resolves on a GPU
machine, and a graph-path training op built in `jit_scope`. The end-to-end
exports of models trained under XLA are in quantize_model_test.py and
quantize_model_zoo_test.py.
"""
import os
from unittest import mock

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import digits_util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.quantize.emit import fake_quant_gradient  # pylint: disable=g-import-not-at-top
import tf2_util  # pylint: disable=g-import-not-at-top

_ROWS, _CHANNELS = 16, 6
_SIGNATURE = [tf.TensorSpec([None, 8, 8, 1], tf.float32)]


def _op_types(concrete):
    """The op types of a concrete function's graph and every function it calls."""
    graph = concrete.graph
    types = {op.type for op in graph.get_operations()}
    for function in graph.as_graph_def().library.function:
        types.update(node.op for node in function.node_def)
    return types


def _with_gradient(gradient_types):
    """Ops made inside get qat's registered gradients: {op type: gradient}."""
    return tf.compat.v1.get_default_graph().gradient_override_map(gradient_types)


def _quantizer(kind, x, lo, hi, active, ours):
    """One quantizer of `kind` on x, with qat's gradients (`ours`) or TensorFlow's."""
    fake_quant = (tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel if kind == "per_channel"
                  else tf.raw_ops.FakeQuantWithMinMaxVars)
    own = {"FakeQuantWithMinMaxVars": fake_quant_gradient.GRADIENT_OP_TYPE,
           "FakeQuantWithMinMaxVarsPerChannel": fake_quant_gradient.GRADIENT_OP_TYPE,
           "Relu6": fake_quant_gradient.RELU_GRADIENT_OP_TYPE,
           "Select": fake_quant_gradient.DELAYED_GRADIENT_OP_TYPE}
    with _with_gradient(own if ours else {}):
        inputs = tf.nn.relu6(x) if kind == "relu6" else x
        y = fake_quant(inputs=inputs, min=lo, max=hi, num_bits=8, narrow_range=False)
        if kind == "delayed":
            y = tf.compat.v1.where(active, y, inputs)
    return y


def _gradient_function(kind, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def gradients(x, lo, hi, dy, active):
        grads = []
        for ours in (True, False):
            y = _quantizer(kind, x, lo, hi, active, ours)
            grads.append(tf.gradients(y, x, grad_ys=dy)[0])
        return grads
    return gradients


def _inputs(rng, lo, hi):
    """Random inputs, each nudged bound with its neighbouring floats, NaN and infinities."""
    x = rng.uniform(-8, 8, [_ROWS, _CHANNELS]).astype(np.float32)
    nudged = fake_quant_gradient.nudged_range(tf.constant(lo), tf.constant(hi), 0.0, 255.0)
    for k, bound in enumerate(np.broadcast_to(b.numpy(), [_CHANNELS]) for b in nudged):
        x[3 * k:3 * k + 3] = [np.nextafter(bound, -np.inf), bound, np.nextafter(bound, np.inf)]
    x[6, :3] = [np.nan, np.inf, -np.inf]
    return x


class GradientFormsTest(parameterized.TestCase):
    """Each registered gradient, compiled by XLA, equals TensorFlow's own."""

    @parameterized.parameters("per_tensor", "per_channel", "delayed", "relu6")
    def test_xla_form_equals_tensorflows_gradient(self, kind):
        rng = np.random.RandomState(0)
        under_xla = _gradient_function(kind, jit_compile=True)
        one_pass = _gradient_function(kind, jit_compile=False)
        shape = [_CHANNELS] if kind == "per_channel" else []
        seen_active = set()
        for case in range(12):
            lo = (-rng.exponential(1.0, shape) * (rng.rand(*shape) < 0.8)).astype(np.float32)
            hi = rng.exponential(3.0, shape).astype(np.float32)
            x = _inputs(rng, lo, hi)
            dy = rng.normal(size=x.shape).astype(np.float32)
            active = bool(case % 2) if kind == "delayed" else True
            seen_active.add(active)
            ours, theirs = (t.numpy() for t in under_xla(x, lo, hi, dy, active))
            plain_ours, plain_theirs = (t.numpy() for t in one_pass(x, lo, hi, dy, active))
            if kind == "delayed" and not active:
                # TensorFlow's Select gradient passes a NaN input's gradient;
                # qat's delayed quantizer masks it before the delay, in both forms.
                nan = np.isnan(x)
                np.testing.assert_array_equal(ours[nan], 0.0)
                np.testing.assert_array_equal(plain_ours[nan], 0.0)
                ours, theirs = ours[~nan], theirs[~nan]
                plain_ours, plain_theirs = plain_ours[~nan], plain_theirs[~nan]
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{kind} case {case}, XLA")
            np.testing.assert_array_equal(plain_ours, plain_theirs,
                                          err_msg=f"{kind} case {case}, one pass")
        self.assertLen(seen_active, 2 if kind == "delayed" else 1)
        args = (tf.TensorSpec([_ROWS, _CHANNELS]), tf.TensorSpec(shape), tf.TensorSpec(shape),
                tf.TensorSpec([_ROWS, _CHANNELS]), tf.TensorSpec([], tf.bool))
        # The one-pass kernel where XLA does not compile; never under XLA.
        self.assertNotIn("QuantizeAndDequantizeV4Grad",
                         _op_types(under_xla.get_concrete_function(*args)))
        self.assertIn("QuantizeAndDequantizeV4Grad",
                      _op_types(one_pass.get_concrete_function(*args)))


def _copy(model):
    twin = tf2_util.subclassed_cnn()
    twin(tf.zeros([1, 8, 8, 1]))
    for source, target in zip(model.variables, twin.variables):
        target.assign(source)
    return twin


def _sgd_step(qm, jit_compile):
    return tf2_util.gradient_step(qm, tf2_util.keras().optimizers.SGD(1e-2), jit_compile)


class TrainingStepTest(absltest.TestCase):

    def test_xla_step_gives_the_same_ranges_and_weights(self):
        tf2_util.keras().utils.set_random_seed(0)
        (x, y), _ = digits_util.digits_split()
        model = tf2_util.subclassed_cnn()
        model(tf.zeros([1, 8, 8, 1]))
        twin = _copy(model)
        # Every registered gradient: delayed per-channel and per-tensor quantizers,
        # fused ReLUs, the batch-norm freeze's select.
        options = dict(quant_delay=2, freeze_bn_delay=2, per_channel_weights=True)
        plain = qat.quantize_model(model, _SIGNATURE, **options)
        compiled = qat.quantize_model(twin, _SIGNATURE, **options)
        steps = _sgd_step(plain, False), _sgd_step(compiled, True)
        for i in range(3):  # Before the delays and after them.
            batch = slice(32 * i, 32 * (i + 1))
            losses = [float(step(x[batch], y[batch])) for step in steps]
            self.assertAlmostEqual(losses[0], losses[1], delta=1e-4)
        self.assertIsNotNone(compiled.rewriter.xla_function)
        self.assertIsNone(plain.rewriter.xla_function)
        # XLA's float arithmetic is not TensorFlow's kernels' (reassociated
        # sums, a division turned into a multiplication): float tolerance.
        for a, b in zip(plain.rewriter.store.ordered, compiled.rewriter.store.ordered):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-5, err_msg=a.name)
        for a, b in zip(model.variables, twin.variables):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-5, err_msg=a.name)
        self.assertEqual(int(plain.rewriter.store.ordered[0].numpy()), 3)  # The step counter.

    def test_forward_returns_no_constants(self):
        """The backward function reads no constant from the forward call.

        XLA's constant analysis would make the whole forward call a compile-
        time constant: the images and the variables folded into the
        computation, compiled again at every step.
        """
        qm = qat.quantize_model(tf2_util.functional_cnn())
        step = _sgd_step(qm, True)
        (x, y), _ = digits_util.digits_split()
        for i in range(3):
            step(x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])
        self.assertEqual(step.experimental_get_tracing_count(), 1)
        library = step.get_concrete_function(x[:16], y[:16]).graph.as_graph_def().library
        forward = [f for f in library.function if f.signature.name.startswith("__forward")]
        self.assertLen(forward, 1)
        nodes = {node.name: node.op for node in forward[0].node_def}
        returned = [ret.split(":")[0] for ret in forward[0].ret.values()]
        self.assertGreater(len(returned), 10)  # The activations the gradient reads.
        self.assertEqual([name for name in returned if nodes.get(name) == "Const"], [])


class OnePassTest(absltest.TestCase):

    def test_relu_mask_fused_in_a_functions_gradient(self):
        """Without XLA, a ReLU before a quantizer is masked in the quantizer's one pass,
        also where the gradient is a function of its own (reading the ReLU's output
        through a placeholder)."""
        qm = qat.quantize_model(tf2_util.functional_cnn())
        step = _sgd_step(qm, False)
        (x, y), _ = digits_util.digits_split()
        types = _op_types(step.get_concrete_function(x[:16], y[:16]))
        self.assertIn("QuantizeAndDequantizeV4Grad", types)
        self.assertEqual(types & {"ReluGrad", "Relu6Grad"}, set())
        self.assertIsNone(qm.rewriter.xla_function)


class ModuleTest(absltest.TestCase):

    def test_tf_module_training_and_eval_steps(self):
        """A tf.Module's quantized model in custom XLA training and eval steps."""
        qm = qat.quantize_model(tf2_util.ModuleCNN(), _SIGNATURE, quant_delay=1)
        (x, y), (x_test, _) = digits_util.digits_split()
        step = tf2_util.adam_step(qm, 1e-3, jit_compile=True)
        losses = [float(step(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])) for i in range(3)]
        self.assertTrue(np.all(np.isfinite(losses)))
        self.assertIsNotNone(qm.rewriter.xla_function)
        evaluate = tf.function(lambda images: qm(images, training=False), jit_compile=True)
        np.testing.assert_allclose(evaluate(x_test).numpy(), qm(x_test, training=False).numpy(),
                                   rtol=1e-4, atol=1e-4)


def _small_keras_model(k):
    inputs = k.Input((8, 8, 1))
    h = k.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    h = k.layers.BatchNormalization()(h)
    h = k.layers.ReLU(6.0)(h)
    h = k.layers.GlobalAveragePooling2D()(h)
    return k.Model(inputs, k.layers.Dense(10)(h))


class KerasJitCompileTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.x, cls.y), (cls.x_test, _) = digits_util.digits_split()
        cls.x, cls.y = cls.x[:256], cls.y[:256]

    def _compile(self, k, qm, **compile_args):
        qm.compile(k.optimizers.Adam(1e-3),
                   k.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=["accuracy"], **compile_args)

    def _fit_evaluate_predict(self, qm):
        history = qm.fit(self.x, self.y, epochs=2, batch_size=64, verbose=0)
        self.assertTrue(np.all(np.isfinite(history.history["loss"])))
        self.assertIsNotNone(qm.rewriter.xla_function)  # fit's training calls ran under XLA.
        loss, _ = qm.evaluate(self.x, self.y, verbose=0)
        self.assertTrue(np.isfinite(loss))
        np.testing.assert_allclose(qm.predict(self.x_test, verbose=0),
                                   qm(self.x_test, training=False).numpy(), rtol=1e-4, atol=1e-5)

    def test_keras3_auto_resolves_to_xla_on_a_gpu_machine(self):
        """Keras 3's default, as on every GPU machine: XLA for fit, evaluate, predict."""
        k = tf2_util.keras()
        qm = qat.quantize_model(_small_keras_model(k))
        gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
        devices = tf.config.list_physical_devices()
        with mock.patch.object(tf.config, "list_physical_devices", return_value=devices + [gpu]):
            self._compile(k, qm)  # jit_compile="auto", Keras 3's default.
            self.assertIs(qm.jit_compile, True)
        self._fit_evaluate_predict(qm)
        self.assertIs(qm.jit_compile, True)

    def test_tf_keras_jit_compile(self):
        import tf_keras  # pylint: disable=g-import-not-at-top
        qm = qat.quantize_model(_small_keras_model(tf_keras), quant_delay=4)
        self._compile(tf_keras, qm, jit_compile=True)
        self._fit_evaluate_predict(qm)
        self.assertTrue(qm.jit_compile)
        export.check_fully_integer(export.convert_function(qm.inference_function()))

    def test_supports_jit_is_the_float_models(self):
        from keras.src.trainers import trainer  # pylint: disable=g-import-not-at-top
        k = tf2_util.keras()
        model = _small_keras_model(k)
        qm = qat.quantize_model(model)
        self.assertTrue(trainer.model_supports_jit(qm))
        model.layers[1].supports_jit = False  # A layer XLA cannot compile.
        self.assertFalse(trainer.model_supports_jit(qm))


class GraphPathTest(absltest.TestCase):
    """A tf.compat.v1 training op built in jit_scope: XLA's gradient form, the same training."""

    def _train(self, jit_scope):
        graph = tf.Graph()
        rng = np.random.RandomState(0)
        (x_data, y_data), _ = digits_util.digits_split()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1])
            labels = tf.compat.v1.placeholder(tf.int32, [None])
            w1 = tf.Variable(rng.normal(0, 0.3, [3, 3, 1, 8]).astype(np.float32))
            w2 = tf.Variable(rng.normal(0, 0.1, [8, 10]).astype(np.float32))
            h = tf.nn.relu6(tf.nn.conv2d(x, w1, 1, "SAME"))
            h = tf.pad(h, [[0, 0], [1, 1], [1, 1], [0, 0]])
            logits = tf.matmul(tf.reduce_mean(h, [1, 2]), w2)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))
            qat.experimental_create_training_graph(graph, quant_delay=2)
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
            if jit_scope:
                with tf.xla.experimental.jit_scope():
                    train = optimizer.minimize(loss)
            else:
                train = optimizer.minimize(loss)
            types = {op.type for op in graph.get_operations()}
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for i in range(4):
                    sess.run(train, {x: x_data[32 * i:32 * (i + 1)],
                                     labels: y_data[32 * i:32 * (i + 1)]})
                values = sess.run(tf.compat.v1.global_variables())
        return types, values

    def test_jit_scope_gradients(self):
        plain_types, plain = self._train(jit_scope=False)
        xla_types, compiled = self._train(jit_scope=True)
        self.assertIn("QuantizeAndDequantizeV4Grad", plain_types)
        self.assertNotIn("QuantizeAndDequantizeV4Grad", xla_types)
        self.assertIn("FakeQuantWithMinMaxVarsGradient", xla_types)
        for a, b in zip(plain, compiled):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    absltest.main()
