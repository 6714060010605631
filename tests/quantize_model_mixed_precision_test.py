"""qat.quantize_model under Keras mixed precision (issue #36 item 2).

Models built under `mixed_float16` / `mixed_bfloat16` (Keras 3, and tf_keras)
are quantized, trained with Keras's loss scaling (`fit`) and with a custom
loop (`LossScaleOptimizer`), checkpointed, and exported to the fully integer
int8 model of their float32 twin: every function is traced computing in
float32 and the training function's quantized layers compute in the policy's
dtype (`qat.tf2.precision`). The suite's Keras 3 subclassed CNN and Keras 3
MobileNetV2 pass the checks of `quantize_model_test` / `quantize_model_zoo_test`
under both policies. Every test restores the global policy (process-wide).
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import digits_util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
from qat.export import range_survival  # pylint: disable=g-import-not-at-top
import tf2_util  # pylint: disable=g-import-not-at-top

_POLICIES = ("mixed_float16", "mixed_bfloat16")
_SIGNATURE = [tf.TensorSpec([None, 8, 8, 1], tf.float32)]
_FLOAT_STEPS = 1500
_QAT_STEPS = 150
_ZOO_STEPS = 4
_STEP_TOLERANCE = 1e-3  # Float rounding of diff / scale.
_LOW_PRECISION = (tf.float16, tf.bfloat16)


def _tmpdir() -> str:
    return tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())


def _keras():
    return tf2_util.keras()


def _lso_step(model, learning_rate, loss_scale=True, initial_scale=2.0 ** 15):
    """A custom loop's step: Keras 3's LossScaleOptimizer (mixed_float16) or Adam."""
    k = _keras()
    optimizer = k.optimizers.Adam(learning_rate)
    if loss_scale:
        optimizer = k.optimizers.LossScaleOptimizer(optimizer, initial_scale=initial_scale)
    loss_fn = k.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
            scaled = optimizer.scale_loss(loss) if loss_scale else loss
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        return loss

    return step, optimizer


def _train(model, steps, learning_rate, seed, **kwargs):
    (x, y), _ = digits_util.digits_split()
    step, optimizer = _lso_step(model, learning_rate, **kwargs)
    rng = np.random.RandomState(seed)
    for _ in range(steps):
        b = rng.randint(0, len(x), 32)
        step(x[b], y[b])
    return optimizer


def _structure(model: bytes):
    """The ops of a .tflite model, each with its outputs' dtype, shape and quantization."""
    described = export.describe_model(model)
    return [(op.name, [(described.tensors[i].dtype, described.tensors[i].shape,
                        described.tensors[i].scale, described.tensors[i].zero_point)
                       for i in op.outputs]) for op in described.ops]


def _low_precision_ops(function):
    """Casts and ops computing in float16 / bfloat16 in a concrete function."""
    return [op.name for op in function.graph.get_operations()
            if op.type == "Cast" or any(t.dtype in _LOW_PRECISION for t in op.outputs)]


class _PolicyTest(parameterized.TestCase):

    def _use_policy(self, name, keras_module=None):
        """Sets the global policy of `keras_module` (Keras 3) until the test ends."""
        mixed_precision = (keras_module or _keras()).mixed_precision
        previous = mixed_precision.global_policy().name
        mixed_precision.set_global_policy(name)
        self.addCleanup(mixed_precision.set_global_policy, previous)


class LayerDtypeTest(_PolicyTest):

    def test_each_layer_trains_in_its_own_dtype(self):
        """A float32 layer in a mixed model (Keras's advice for outputs) stays
        float32; the layers' policies are theirs again after every trace."""
        self._use_policy("mixed_bfloat16")
        k = _keras()
        inputs = k.Input((8, 8, 1))
        h = k.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
        h = k.layers.ReLU()(k.layers.BatchNormalization()(h))
        h = k.layers.Conv2D(8, 3, padding="same", dtype="float32")(h)
        outputs = k.layers.Dense(10, dtype="float32")(k.layers.Flatten()(h))
        model = k.Model(inputs, outputs)
        policies = [layer.dtype_policy.name for layer in model.layers]
        qm = qat.quantize_model(model)
        self.assertLen(qm.rewriter.low_precision_layers, 1)
        training = qm.rewriter.functions[True].get_concrete_function().graph
        layers = [op for op in training.get_operations()
                      if op.type in ("Conv2D", "MatMul") and op.outputs[0].consumers()]
        self.assertCountEqual([op.get_attr("T") for op in layers],
                              [tf.bfloat16, tf.float32, tf.float32])
        self.assertEqual(_low_precision_ops(qm.inference_function()), [])
        self.assertEqual([layer.dtype_policy.name for layer in model.layers], policies)
        # Float inputs of any dtype are cast to the signature's (float32), as
        # Keras casts a float32 model's inputs; the output is float32.
        x = np.random.RandomState(0).rand(4, 8, 8, 1)
        expected = qm(x.astype(np.float32)).numpy()
        self.assertEqual(expected.dtype, np.float32)
        np.testing.assert_array_equal(qm(x).numpy(), expected)
        np.testing.assert_array_equal(qm(tf.constant(x, tf.bfloat16)).numpy(),
                                      qm(tf.cast(tf.constant(x, tf.bfloat16), tf.float32)).numpy())


class SubclassedCNNTest(_PolicyTest):
    """The suite's Keras 3 subclassed CNN under both policies, custom loops."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Float training in float32, once: the mixed models start from its weights.
        _keras().utils.set_random_seed(0)
        model = tf2_util.subclassed_cnn()
        model(tf.zeros([1, 8, 8, 1]))
        tf2_util.train(model, _FLOAT_STEPS, 3e-3, seed=0)
        cls.float_weights = [v.numpy() for v in model.variables]

    def _build(self):
        model = tf2_util.subclassed_cnn()
        model(tf.zeros([1, 8, 8, 1]))
        for variable, value in zip(model.variables, self.float_weights):
            variable.assign(value)
        return model

    @parameterized.parameters(*_POLICIES)
    def test_gradient_tape_loop(self, policy):
        self._use_policy(policy)
        _, (x_test, y_test) = digits_util.digits_split()
        loss_scale = policy == "mixed_float16"
        model, reference = self._build(), self._build()
        self.assertEqual(model.compute_dtype, policy.split("_")[1])

        qm = qat.quantize_model(model, _SIGNATURE)
        self.assertEqual(qm.left_float, [])
        # Every quantized layer computes in the policy's dtype in training.
        self.assertLen(qm.rewriter.low_precision_layers, 4)
        _train(qm, _QAT_STEPS, 1e-3, seed=1, loss_scale=loss_scale)
        _train(reference, _QAT_STEPS, 1e-3, seed=1, loss_scale=loss_scale)
        float_accuracy = tf2_util.accuracy(reference(x_test, training=False), y_test)
        qat_logits = qm(x_test, training=False).numpy()
        self.assertEqual(qat_logits.dtype, np.float32)
        qat_accuracy = tf2_util.accuracy(qat_logits, y_test)

        # The eval function, what TF's converter sees, is the float32 twin's.
        function = qm.inference_function()
        self.assertEqual(_low_precision_ops(function), [])
        self.assertEqual([t.dtype for t in function.outputs], [tf.float32])
        self.assertTrue(all(v.dtype in (tf.float32, tf.int64) for v in qm.qat_ranges.ordered))
        out = _tmpdir()
        exported = export.export_model(qm, out, parity_inputs=x_test, min_top1_agreement=0.99)
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertEqual(exported.survival.differing, [])
        print(f"{policy}: float {float_accuracy:.4f}, QAT eval {qat_accuracy:.4f}, "
              f"{exported.parity.format()}")
        self.assertGreaterEqual(qat_accuracy, float_accuracy - 0.01)
        self.assertGreaterEqual(exported.parity.top1_agreement, 0.99)

        # The checkpoint restores into a fresh mixed model and into the float32
        # twin, which computes the same eval outputs and exports the same model.
        path = tf.train.Checkpoint(model=qm).save(os.path.join(out, "ckpt"))
        fresh = qat.quantize_model(self._build(), _SIGNATURE)
        tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
        np.testing.assert_array_equal(fresh(x_test, training=False).numpy(), qat_logits)
        self._use_policy("float32")
        twin = qat.quantize_model(self._build(), _SIGNATURE)
        self.assertEqual(twin.rewriter.low_precision_layers, [])
        tf.train.Checkpoint(model=twin).restore(path).assert_consumed()
        np.testing.assert_array_equal(twin(x_test, training=False).numpy(), qat_logits)
        self.assertEqual(_structure(export.convert_function(twin.inference_function())),
                         _structure(exported.model))

    def test_loss_scale_optimizer_skips_overflowing_steps(self):
        """Skipped steps (non-finite float16 gradients) leave the weights and
        keep the ranges finite; training goes on once the loss scale drops."""
        self._use_policy("mixed_float16")
        (x, y), (x_test, _) = digits_util.digits_split()
        qm = qat.quantize_model(self._build(), _SIGNATURE)
        step, optimizer = _lso_step(qm, 1e-3, initial_scale=2.0 ** 30)
        optimizer.build(qm.trainable_variables)
        ranges = [v for v in qm.qat_ranges.ordered if v.dtype == tf.float32]
        counter = next(v for v in qm.qat_ranges.ordered if v.dtype == tf.int64)
        rng = np.random.RandomState(2)
        skipped = []
        for _ in range(30):
            weights = [v.numpy() for v in qm.trainable_variables]
            scale = float(optimizer.dynamic_scale.numpy())
            b = rng.randint(0, len(x), 32)
            step(x[b], y[b])
            skipped.append(float(optimizer.dynamic_scale.numpy()) < scale)
            unchanged = all(np.array_equal(w, v.numpy())
                            for w, v in zip(weights, qm.trainable_variables))
            self.assertEqual(unchanged, skipped[-1])
            self.assertTrue(all(np.all(np.isfinite(v.numpy())) for v in ranges))
        print("skipped steps:", [i for i, s in enumerate(skipped) if s],
              "loss scale", float(optimizer.dynamic_scale.numpy()))
        self.assertTrue(skipped[0])
        self.assertFalse(all(skipped[-10:]))
        self.assertEqual(int(counter.numpy()), 30)  # Every training call counts.
        exported = export.export_model(qm, _tmpdir(), parity_inputs=x_test,
                                       min_top1_agreement=0.99)
        self.assertEqual(export.find_float_ops(exported.report), [])


class FitTest(_PolicyTest):

    def test_fit_with_loss_scaling_checkpoints_and_saved_model(self):
        self._use_policy("mixed_float16")
        k = _keras()
        k.utils.set_random_seed(0)
        (x, y), (x_test, y_test) = digits_util.digits_split()
        loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)

        def compiled(model, learning_rate=1e-3):
            model.compile(k.optimizers.Adam(learning_rate), loss, metrics=["accuracy"])
            return model

        model = compiled(tf2_util.functional_cnn(), 3e-3)
        model.fit(x, y, epochs=8, batch_size=32, verbose=0)
        qm = compiled(qat.quantize_model(model))
        self.assertIsInstance(qm.optimizer, k.optimizers.LossScaleOptimizer)
        self.assertEqual(qm.left_float, [])
        qm.fit(x, y, epochs=2, batch_size=32, verbose=0)
        _, qat_accuracy = qm.evaluate(x_test, y_test, verbose=0)
        self.assertGreater(qat_accuracy, 0.85)
        logits = qm(x_test, training=False).numpy()
        np.testing.assert_allclose(qm.predict(x_test, verbose=0), logits, rtol=1e-5, atol=1e-6)

        # save_weights / load_weights, and tf.train.Checkpoint with the
        # optimizer and its loss scale (the float model compiled too, as it was).
        out = _tmpdir()
        weights = os.path.join(out, "qm.weights.h5")
        qm.save_weights(weights)
        fresh_model = compiled(tf2_util.functional_cnn(), 3e-3)
        fresh = compiled(qat.quantize_model(fresh_model))
        fresh.load_weights(weights)
        np.testing.assert_array_equal(fresh(x_test, training=False).numpy(), logits)
        path = tf.train.Checkpoint(model=qm).save(os.path.join(out, "ckpt"))
        for optimizer in (fresh_model.optimizer, fresh.optimizer):
            optimizer.build(fresh.trainable_variables)
        tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
        np.testing.assert_array_equal(fresh(x_test, training=False).numpy(), logits)
        self.assertEqual(float(fresh.optimizer.dynamic_scale.numpy()),
                         float(qm.optimizer.dynamic_scale.numpy()))

        # The SavedModel's serving_default: float32 in and out, no cast, no
        # float16 op; TF's converter makes it fully integer.
        saved = os.path.join(out, "saved_model")
        tf.saved_model.save(qm, saved)
        serving = tf.saved_model.load(saved).signatures["serving_default"]
        self.assertEqual([s.dtype for s in serving.structured_input_signature[1].values()],
                         [tf.float32])
        self.assertEqual(_low_precision_ops(qm.inference_function()), [])
        library = serving.graph.as_graph_def().library
        self.assertEqual([n.name for f in library.function for n in f.node_def
                          if n.op == "Cast"], [])
        converter = tf.lite.TFLiteConverter.from_saved_model(saved)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        export.check_fully_integer(converter.convert(), label=saved)


class MobileNetV2Test(_PolicyTest):
    """`quantize_model_zoo_test`'s MobileNetV2 checks, trained under each policy:
    mixed_float16 with `fit` (Keras's loss scaling), mixed_bfloat16 in a loop."""

    @parameterized.parameters(*_POLICIES)
    def test_mobilenet_v2(self, policy):
        self._use_policy(policy)
        k = _keras()
        k.utils.set_random_seed(0)
        qm = qat.quantize_model(k.applications.MobileNetV2(
            input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10))
        self.assertEqual(qm.left_float, [])  # Keras 3's float32 batch norms folded too.
        self.assertGreater(len(qm.rewriter.low_precision_layers), 50)
        rng = np.random.RandomState(0)
        images = rng.rand(16 * _ZOO_STEPS, 32, 32, 3).astype(np.float32)
        labels = rng.randint(0, 10, 16 * _ZOO_STEPS)
        if policy == "mixed_float16":
            qm.compile(k.optimizers.Adam(1e-3), k.losses.SparseCategoricalCrossentropy())
            self.assertIsInstance(qm.optimizer, k.optimizers.LossScaleOptimizer)
            history = qm.fit(images, labels, batch_size=16, epochs=1, verbose=0)
            self.assertTrue(np.isfinite(history.history["loss"][-1]))
        else:
            step = tf2_util.adam_step(qm, 1e-3)
            for i in range(_ZOO_STEPS):
                loss = step(images[16 * i:16 * (i + 1)], labels[16 * i:16 * (i + 1)])
            self.assertTrue(np.isfinite(float(loss)))
        samples = images[:16]
        exported = export.export_model(qm, _tmpdir(), parity_inputs=samples)
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertEqual([r.describe() for r in exported.survival.lost
                          if r.kind == range_survival.DIFFERS], [])
        numerics = report.layer_numerics_of_model(qm, samples, tflite=exported.model)
        print("\n".join(numerics.summary_lines()))
        self.assertEqual([r.name for r in numerics.unmatched], [])
        self.assertGreater(len(numerics.rows), 60)
        worst = numerics.worst_own
        self.assertLessEqual(worst.max_own_steps, 1.0 + _STEP_TOLERANCE,
                             f"{worst.name}: {worst.max_own_steps} steps on TFLite's inputs")


class TfKerasTest(_PolicyTest):
    """A tf_keras model (TF_USE_LEGACY_KERAS=1) under mixed_float16."""

    def test_fit_and_loss_scale_loop(self):
        import tf_keras  # pylint: disable=g-import-not-at-top
        self._use_policy("mixed_float16", tf_keras)
        tf_keras.utils.set_random_seed(0)
        (x, y), (x_test, _) = digits_util.digits_split()
        inputs = tf_keras.Input((8, 8, 1))
        h = tf_keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
        h = tf_keras.layers.ReLU(6.0)(tf_keras.layers.BatchNormalization()(h))
        h = tf_keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(h)
        logits = tf_keras.layers.Dense(10)(tf_keras.layers.Flatten()(h))
        outputs = tf_keras.layers.Activation("linear", dtype="float32")(logits)
        model = tf_keras.Model(inputs, outputs)
        loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(tf_keras.optimizers.Adam(3e-3), loss)
        model.fit(x, y, epochs=3, batch_size=32, verbose=0)

        qm = qat.quantize_model(model)
        self.assertIsInstance(qm, tf_keras.Model)
        self.assertEqual(qm.left_float, [])
        self.assertLen(qm.rewriter.low_precision_layers, 3)
        qm.compile(tf_keras.optimizers.Adam(1e-3), loss)
        self.assertIsInstance(qm.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
        qm.fit(x, y, epochs=1, batch_size=32, verbose=0)

        optimizer = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.Adam(1e-3))

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                scaled = optimizer.get_scaled_loss(loss(yb, qm(xb, training=True)))
            variables = qm.trainable_variables
            grads = optimizer.get_unscaled_gradients(tape.gradient(scaled, variables))
            optimizer.apply_gradients(zip(grads, variables))

        for i in range(10):
            step(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])
        self.assertEqual(_low_precision_ops(qm.inference_function()), [])
        exported = export.export_model(qm, _tmpdir(), parity_inputs=x_test,
                                       min_top1_agreement=0.99)
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertEqual(exported.survival.differing, [])


if __name__ == "__main__":
    absltest.main()
