"""qat.quantize_model: QAT for Keras 3 models, tf.Module and tf.function loops.

Each model is trained in float, quantized with `quantize_model`, fine-tuned
with QAT, then exported with TF 2's own converter
(`qat.export.export_model`: from_concrete_functions, fully integer int8,
every range a tensor, top-1 agreement with `qm(x, training=False)`). The float
reference is the same float model fine-tuned the same steps on the same
batches without quantization (two trainings differ by about a point on this
split from noise alone).
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
from qat.tf2 import ranges  # pylint: disable=g-import-not-at-top
import tf2_util  # pylint: disable=g-import-not-at-top

_FLOAT_STEPS = 1500
_QAT_STEPS = 150
# Past the first of test_keras3_compile_fit's two epochs (44 steps each).
_FIT_QUANT_DELAY = 50
_SIGNATURE = [tf.TensorSpec([None, 8, 8, 1], tf.float32)]


def _tmpdir() -> str:
    return tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())


def _copy_weights(source, target):
    for s, t in zip(source.variables, target.variables):
        t.assign(s)


class EndToEndTest(parameterized.TestCase):
    """The issue's acceptance runs: train, quantize, fine-tune, export, restore."""

    @parameterized.named_parameters(
        ("keras3_subclassed", tf2_util.subclassed_cnn),
        ("tf_module", tf2_util.ModuleCNN))
    def test_gradient_tape_loop(self, build):
        tf2_util.keras().utils.set_random_seed(0)
        _, (x_test, y_test) = digits_util.digits_split()
        model = build()
        model(tf.zeros([1, 8, 8, 1]))  # Builds a Keras model's weights.
        tf2_util.train(model, _FLOAT_STEPS, 3e-3, seed=0)
        reference = build()
        reference(tf.zeros([1, 8, 8, 1]))
        _copy_weights(model, reference)

        qm = qat.quantize_model(model, _SIGNATURE)
        tf2_util.train(qm, _QAT_STEPS, 1e-3, seed=1)
        tf2_util.train(reference, _QAT_STEPS, 1e-3, seed=1)
        if isinstance(model, tf2_util.keras().Model):
            qm = self._resumed_from_keras_file(qm, reference, x_test)
        float_accuracy = tf2_util.accuracy(reference(x_test, training=False), y_test)
        qat_logits = qm(x_test, training=False).numpy()
        qat_accuracy = tf2_util.accuracy(qat_logits, y_test)

        out = _tmpdir()
        exported = export.export_model(qm, out, parity_inputs=x_test,
                                       min_top1_agreement=0.99)
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertEqual(exported.survival.differing, [])
        tflite_accuracy = tf2_util.accuracy(export.run_tflite(exported.model, x_test), y_test)
        print(f"{self._testMethodName}: float {float_accuracy:.4f}, QAT eval "
              f"{qat_accuracy:.4f}, TFLite int8 {tflite_accuracy:.4f}, "
              f"{exported.parity.format()}")
        self.assertGreaterEqual(qat_accuracy, float_accuracy - 0.01)
        self.assertGreaterEqual(exported.parity.top1_agreement, 0.99)

        # A checkpoint restores into a freshly built quantized model.
        path = tf.train.Checkpoint(model=qm).save(os.path.join(out, "ckpt"))
        fresh_model = build()
        fresh_model(tf.zeros([1, 8, 8, 1]))
        fresh = qat.quantize_model(fresh_model, _SIGNATURE)
        # Every variable of `fresh` restored (the Keras model's checkpoint also
        # holds the optimizer it was fitted with, which `fresh` has not).
        tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
        np.testing.assert_array_equal(fresh(x_test, training=False).numpy(), qat_logits)

    def _resumed_from_keras_file(self, qm, reference, x_test):
        """Issue #36: `fit`, `save("x.keras")`, `load_model`, further `fit`.

        The quantized model and the float reference are fitted two steps, the
        quantized model saved and loaded (its subclassed model rebuilt from its
        config), then the model, its loaded copy and the reference are fitted
        four more steps on the same batches: the copy stays identical to the
        model (weights, ranges, step counter, optimizer state, outputs).
        Returns the copy, which the caller's checks then hold to.
        """
        k = tf2_util.keras()
        (x, y), _ = digits_util.digits_split()
        for m in (qm, reference):
            m.compile(k.optimizers.Adam(1e-3),
                      k.losses.SparseCategoricalCrossentropy(from_logits=True))
            m.fit(x[:64], y[:64], batch_size=32, shuffle=False, verbose=0)
        path = os.path.join(_tmpdir(), "qm.keras")
        qm.save(path)
        loaded = k.models.load_model(path)
        self.assertIsNot(loaded.model, qm.model)
        tf2_util.assert_same_state(qm, loaded, x_test)
        for m in (qm, loaded, reference):
            m.fit(x[64:192], y[64:192], batch_size=32, shuffle=False, verbose=0)
        tf2_util.assert_same_state(qm, loaded, x_test)
        self.assertEqual(tf2_util.quantization_step(loaded), _QAT_STEPS + 6)
        return loaded

    def test_keras3_subclassed_under_xla(self):
        """jit_compile=True (Keras 3's default on GPU machines): `fit`, then a custom loop."""
        k = tf2_util.keras()
        k.utils.set_random_seed(0)
        (x, y), (x_test, y_test) = digits_util.digits_split()
        model = tf2_util.subclassed_cnn()
        model(tf.zeros([1, 8, 8, 1]))
        tf2_util.train(model, _FLOAT_STEPS * 2 // 3, 3e-3, seed=0)
        float_accuracy = tf2_util.accuracy(model(x_test, training=False), y_test)

        qm = qat.quantize_model(model, _SIGNATURE)
        qm.compile(k.optimizers.Adam(1e-3),
                   k.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
        self.assertIs(qm.jit_compile, True)
        qm.fit(x, y, epochs=1, batch_size=50, verbose=0)  # One batch shape: one compile.
        tf2_util.train(qm, _QAT_STEPS // 2, 1e-3, seed=1, jit_compile=True)
        self.assertIsNotNone(qm.rewriter.xla_function)
        qat_accuracy = tf2_util.accuracy(qm(x_test, training=False), y_test)

        exported = export.export_model(qm, _tmpdir(), parity_inputs=x_test,
                                       min_top1_agreement=0.99)
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertEqual(exported.survival.differing, [])
        numerics = report.layer_numerics_of_model(qm, x_test[:64], tflite=exported.model)
        self.assertEqual([r.name for r in numerics.unmatched], [])
        self.assertLessEqual(numerics.worst_own.max_own_steps, 1.0 + 1e-3, numerics.worst_own.name)
        print(f"{self._testMethodName}: float {float_accuracy:.4f}, QAT under XLA "
              f"{qat_accuracy:.4f}, {exported.parity.format()}")
        self.assertGreaterEqual(qat_accuracy, float_accuracy - 0.02)
        self.assertGreaterEqual(exported.parity.top1_agreement, 0.99)

    def test_keras3_compile_fit(self):
        k = tf2_util.keras()
        k.utils.set_random_seed(0)
        (x, y), (x_test, y_test) = digits_util.digits_split()
        model = tf2_util.functional_cnn(softmax=True)
        model.compile(k.optimizers.Adam(3e-3), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        model.fit(x, y, epochs=8, batch_size=32, verbose=0)
        qm = qat.quantize_model(model, quant_delay=_FIT_QUANT_DELAY)
        self.assertIsInstance(qm, k.Model)
        qm.compile(k.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                   metrics=["accuracy"])
        out = _tmpdir()
        checkpoints = [  # Each epoch's end, both kinds of file.
            k.callbacks.ModelCheckpoint(os.path.join(out, "qm_{epoch}.keras")),
            k.callbacks.ModelCheckpoint(os.path.join(out, "qm_{epoch}.weights.h5"),
                                        save_weights_only=True)]
        fit_args = dict(batch_size=32, shuffle=False, verbose=0)
        history = qm.fit(x, y, epochs=2, callbacks=checkpoints, **fit_args)
        self.assertLen(history.history["loss"], 2)
        _, qat_accuracy = qm.evaluate(x_test, y_test, verbose=0)
        self.assertGreater(qat_accuracy, 0.85)
        predictions = qm.predict(x_test, verbose=0)
        np.testing.assert_allclose(predictions, qm(x_test, training=False).numpy(),
                                   rtol=1e-5, atol=1e-6)

        # Resumed from epoch 1's files (the quant delay not reached yet), the
        # second epoch trains as it did: quantization starts at the same step.
        resumed = k.models.load_model(os.path.join(out, "qm_1.keras"))
        self.assertEqual(resumed.quantize_options.quant_delay, _FIT_QUANT_DELAY)
        steps_per_epoch = -(-len(x) // 32)
        self.assertEqual(tf2_util.quantization_step(resumed), steps_per_epoch)
        self.assertLess(steps_per_epoch, _FIT_QUANT_DELAY)
        resumed.fit(x, y, initial_epoch=1, epochs=2, **fit_args)
        tf2_util.assert_same_state(qm, resumed, x_test)
        rebuilt = qat.quantize_model(tf2_util.functional_cnn(softmax=True),
                                     quant_delay=_FIT_QUANT_DELAY)
        rebuilt.compile(k.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                        metrics=["accuracy"])
        rebuilt.optimizer.build(rebuilt.trainable_variables)  # Its state is in the file.
        rebuilt.load_weights(os.path.join(out, "qm_1.weights.h5"))
        rebuilt.fit(x, y, initial_epoch=1, epochs=2, **fit_args)
        tf2_util.assert_same_state(qm, rebuilt, x_test)
        exported = export.export_model(resumed, out, parity_inputs=x_test,
                                       min_top1_agreement=0.99)
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertEqual(exported.survival.differing, [])

    @parameterized.named_parameters(
        ("keras3", lambda: tf2_util.functional_cnn()),
        ("tf_module", tf2_util.ModuleCNN))
    def test_saved_model_converts_fully_integer(self, build):
        model = build()
        qm = qat.quantize_model(model, None if hasattr(model, "inputs") else _SIGNATURE)
        _, (x_test, _) = digits_util.digits_split()
        for _ in range(3):
            qm(x_test[:32], training=True)
        path = os.path.join(_tmpdir(), "saved_model")
        tf.saved_model.save(qm, path)
        loaded = tf.saved_model.load(path)
        self.assertIn("serving_default", loaded.signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(path)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        export.check_fully_integer(converter.convert(), label=path)


class CallTest(absltest.TestCase):
    """How a quantized model behaves as a model."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x = digits_util.digits_split()[1][0][:16]

    def test_trains_the_models_own_variables(self):
        model = tf2_util.functional_cnn()
        qm = qat.quantize_model(model)
        self.assertEqual([id(v) for v in qm.trainable_variables],
                         [id(v) for v in model.trainable_variables])
        qat_variables = qm.rewriter.store.ordered
        self.assertNotEmpty(qat_variables)
        self.assertTrue(all(not v.trainable for v in qat_variables))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(qm(self.x, training=True))
        grads = tape.gradient(loss, qm.trainable_variables)
        self.assertTrue(all(g is not None for g in grads))
        self.assertTrue(all(np.all(np.isfinite(g)) for g in grads))

    def test_batch_norm_statistics_update_in_training_only(self):
        model = tf2_util.functional_cnn()
        qm = qat.quantize_model(model)
        bn = next(layer for layer in model.layers if "batch_norm" in layer.name)
        before = bn.moving_mean.numpy().copy()
        qm(self.x, training=False)
        np.testing.assert_array_equal(bn.moving_mean.numpy(), before)
        qm(self.x, training=True)
        self.assertFalse(np.allclose(bn.moving_mean.numpy(), before))

    def test_eager_and_tf_function_calls_agree(self):
        qm = qat.quantize_model(tf2_util.functional_cnn())
        qm(self.x, training=True)
        eager = qm(self.x, training=False)
        in_function = tf.function(lambda x: qm(x, training=False))(self.x)
        np.testing.assert_array_equal(eager.numpy(), in_function.numpy())

    def test_quant_delay_counts_training_calls(self):
        module = tf2_util.ModuleCNN()
        qm = qat.quantize_model(module, _SIGNATURE, quant_delay=3)
        step = next(v for v in qm.rewriter.store.ordered if v.dtype == tf.int64)
        # The step counts training calls; quantization starts at the call
        # whose count reaches the delay (as in graph mode). Calls 1 and 2 run
        # the float model (its batch norm with batch statistics: the output
        # does not depend on the moving averages).
        for expected in (1, 2):
            np.testing.assert_allclose(qm(self.x, training=True).numpy(),
                                       module(self.x, training=True).numpy(),
                                       rtol=1e-4, atol=1e-5)
            self.assertEqual(int(step.numpy()), expected)
        qm(self.x, training=False)  # Eval calls do not count.
        self.assertEqual(int(step.numpy()), 2)
        quantized = qm(self.x, training=True).numpy()
        self.assertEqual(int(step.numpy()), 3)
        self.assertGreater(np.max(np.abs(quantized - module(self.x, training=True).numpy())),
                           1e-3)

    def test_python_control_flow_that_changes_is_named(self):

        class Changing(tf.Module):

            def __init__(self):
                super().__init__(name="changing")
                self.w = tf.Variable(tf.random.normal([3, 3, 1, 4]))
                self.w2 = tf.Variable(tf.random.normal([3, 3, 4, 4]))
                self.traces = 0

            def __call__(self, x, training=False):
                self.traces += 1
                h = tf.nn.relu(tf.nn.conv2d(x, self.w, 1, "SAME"))
                if self.traces > 1:  # Python state: another graph on later traces.
                    h = tf.nn.relu(tf.nn.conv2d(h, self.w2, 1, "SAME", name="late_conv"))
                return tf.reduce_mean(h, [1, 2])

        qm = qat.quantize_model(Changing(), _SIGNATURE)
        with self.assertRaisesRegex(ranges.UnplannedRangeError, "late_conv"):
            qm(self.x, training=False)


class ErrorTest(parameterized.TestCase):
    """Refusals: a clear error, never a silently float model."""

    def test_subclassed_model_without_signature(self):
        with self.assertRaisesRegex(ValueError, "pass input_signature"):
            qat.quantize_model(tf2_util.subclassed_cnn())

    def test_signature_the_model_refuses(self):
        with self.assertRaisesRegex(ValueError, "calling the model on input_signature"):
            qat.quantize_model(tf2_util.functional_cnn(),
                               [tf.TensorSpec([None, 8, 8, 3], tf.float32)])

    def test_signature_entries_must_be_tensor_specs(self):
        with self.assertRaisesRegex(TypeError, r"input_signature\[0\] is ndarray"):
            qat.quantize_model(tf2_util.ModuleCNN(), [np.zeros([1, 8, 8, 1])])

    def test_not_callable(self):
        with self.assertRaisesRegex(TypeError, "not callable"):
            qat.quantize_model(tf.Module())

    def test_callable_without_variables(self):
        with self.assertRaisesRegex(ValueError, "reads no tf.Variable"):
            qat.quantize_model(lambda x: tf.nn.relu(x * 2.0), [tf.TensorSpec([None, 4])])

    def test_nothing_to_quantize(self):
        scale = tf.Variable(2.0)
        with self.assertRaisesRegex(ValueError, "nothing to quantize"):
            qat.quantize_model(lambda x: x * scale, [tf.TensorSpec([None, 4])])

    def test_bad_option(self):
        with self.assertRaisesRegex(ValueError, "bits"):
            qat.quantize_model(tf2_util.functional_cnn(), weight_bits=9)


if __name__ == "__main__":
    absltest.main()
