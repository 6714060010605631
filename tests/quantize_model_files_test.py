"""qat.quantize_model's models in Keras's own files: `.keras` and `.weights.h5`.

A quantized model saved by Keras and loaded back keeps its options, its
signature and its quantization state, with Keras 3 and tf_keras alike, with
the class registered whichever Keras is imported first; a model Keras cannot
rebuild is named. Training and export are tests/quantize_model_test.py's.
"""
import importlib
import os
import sys
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import digits_util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat.tf2 import keras_models  # pylint: disable=g-import-not-at-top
from qat.tf2 import keras_registration  # pylint: disable=g-import-not-at-top
import tf2_util  # pylint: disable=g-import-not-at-top

_SIGNATURE = [tf.TensorSpec([None, 8, 8, 1], tf.float32)]


def _tmpdir() -> str:
    return tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())


class KerasFilesTest(absltest.TestCase):
    """Keras's own files (`.keras`, `.weights.h5`) of quantized models."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.x, cls.y), _ = digits_util.digits_split()

    def test_sequential_keeps_its_options_and_signature(self):
        k = tf2_util.keras()

        def build():
            return k.Sequential([
                k.layers.Conv2D(8, 3, use_bias=False, name="features"),
                k.layers.BatchNormalization(name="features_bn"),
                k.layers.ReLU(),
                k.layers.Flatten(),
                k.layers.Dense(10, name="head")], name="digits_sequential")

        signature = [tf.TensorSpec([None, 8, 8, 1], tf.float32, name="pixels")]
        model = build()  # Unbuilt: the signature is given, and must survive.
        # A scope is a prefix of op names: the conv's, as this Keras names it.
        trace = tf.function(build()).get_concrete_function(signature[0]).graph
        conv_scope = next(op.name for op in trace.get_operations()
                          if op.type == "Conv2D").rsplit("/", 1)[0]
        qm = qat.quantize_model(
            model, signature, weight_bits=7, activation_bits=6, symmetric=True,
            quant_delay=2, freeze_bn_delay=3, scope=conv_scope, per_channel_weights=True)
        self.assertTrue(any("head" in reason for reason in qm.left_float))  # Out of scope.
        x = self.x[:16]
        for _ in range(2):
            qm(x, training=True)
        path = os.path.join(_tmpdir(), "sequential.keras")
        qm.save(path)
        loaded = tf2_util.keras().models.load_model(path)
        self.assertIsInstance(loaded.model, k.Sequential)
        self.assertEqual(loaded.quantize_options, qm.quantize_options)
        self.assertEqual(loaded.rewriter.call.signature, signature)
        self.assertEqual(loaded.left_float, qm.left_float)
        tf2_util.assert_same_state(qm, loaded, x)
        for _ in range(2):  # Past the quant delay and the batch norm freeze.
            np.testing.assert_array_equal(qm(x, training=True).numpy(),
                                          loaded(x, training=True).numpy())
        tf2_util.assert_same_state(qm, loaded, x)
        self.assertEqual(tf2_util.quantization_step(loaded), 4)

    def test_tf_keras(self):
        import tf_keras  # pylint: disable=g-import-not-at-top

        def build():
            inputs = tf_keras.Input((8, 8, 1))
            h = tf_keras.layers.Conv2D(8, 3, use_bias=False)(inputs)
            h = tf_keras.layers.BatchNormalization()(h)
            h = tf_keras.layers.ReLU(6.0)(h)
            return tf_keras.Model(inputs, tf_keras.layers.Dense(10)(tf_keras.layers.Flatten()(h)))

        qm = qat.quantize_model(build(), quant_delay=3)
        self.assertIsInstance(qm, tf_keras.Model)
        loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        qm.compile(tf_keras.optimizers.Adam(1e-3), loss)
        fit_args = dict(batch_size=32, shuffle=False, verbose=0)
        qm.fit(self.x[:64], self.y[:64], **fit_args)
        out = _tmpdir()
        qm.save(os.path.join(out, "qm.keras"))
        qm.save_weights(os.path.join(out, "qm.h5"))
        loaded = tf_keras.models.load_model(os.path.join(out, "qm.keras"))
        self.assertEqual(loaded.quantize_options.quant_delay, 3)
        rebuilt = qat.quantize_model(build(), quant_delay=3)
        rebuilt.load_weights(os.path.join(out, "qm.h5"))
        np.testing.assert_array_equal(rebuilt(self.x, training=False).numpy(),
                                      qm(self.x, training=False).numpy())
        tf2_util.assert_same_state(qm, loaded, self.x)
        for m in (qm, loaded):
            m.fit(self.x[64:128], self.y[64:128], **fit_args)
        tf2_util.assert_same_state(qm, loaded, self.x)

    def test_the_class_is_registered_with_a_keras_imported_later(self):
        k = tf2_util.keras()
        self.assertIs(k.saving.get_registered_object("qat>QuantizedKerasModel"),
                      keras_models.model_class("keras"))
        # `import qat` may come first: its finder calls back once the package has run.
        root = _tmpdir()
        os.makedirs(os.path.join(root, "late_keras"))
        with open(os.path.join(root, "late_keras", "__init__.py"), "w") as f:
            f.write("READY = True\n")
        calls = []
        finder = keras_registration.AfterImport(
            {"late_keras": lambda: calls.append(sys.modules["late_keras"].READY)})
        sys.path.insert(0, root)
        sys.meta_path.insert(0, finder)
        try:
            module = importlib.import_module("late_keras")
        finally:
            sys.path.remove(root)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            sys.modules.pop("late_keras", None)
        self.assertEqual(calls, [True])
        self.assertNotIn(finder, sys.meta_path)  # Done: it left.
        self.assertNotIn("exec_module", vars(module.__loader__))  # The loader as it was.

    def test_models_keras_cannot_rebuild(self):
        k = tf2_util.keras()

        class TakesALayer(k.Model):  # No get_config: Keras cannot write its config.

            def __init__(self, head):
                super().__init__()
                self.conv = k.layers.Conv2D(4, 3)
                self.head = head

            def call(self, x):
                return self.head(k.ops.mean(self.conv(x), axis=[1, 2]))

        qm = qat.quantize_model(TakesALayer(k.layers.Dense(3)), _SIGNATURE)
        with self.assertRaisesRegex(NotImplementedError, "TakesALayer.*get_config.*save_weights"):
            qm.save(os.path.join(_tmpdir(), "qm.keras"))

        class Unregistered(k.Model):  # Its config is written; the class cannot be found.

            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.conv = k.layers.Conv2D(4, 3)

            def call(self, x):
                return self.conv(x)

        path = os.path.join(_tmpdir(), "unregistered.keras")
        qat.quantize_model(Unregistered(), _SIGNATURE).save(path)
        with self.assertRaisesRegex(TypeError, "Unregistered.*register_keras_serializable"):
            k.models.load_model(path)

        module = qat.quantize_model(tf2_util.ModuleCNN(), _SIGNATURE)
        with self.assertRaisesRegex(TypeError, "not a Keras model.*tf.train.Checkpoint"):
            module.save(os.path.join(_tmpdir(), "module.keras"))


if __name__ == "__main__":
    absltest.main()
