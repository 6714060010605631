"""quantize_model on a Keras 3 MobileNetV2 and a Keras 3 text encoder, layer by layer.

Issue #32's acceptance: `keras.applications.MobileNetV2` (alpha 0.35,
32x32) and a Keras 3 text encoder (Embedding + MultiHeadAttention +
LayerNormalization + GELU FFN from int32 ids), each quantized and trained a
few QAT steps, convert with TF 2's converter to fully integer int8 models in
which every activation range is a tensor, and `qat.report`'s numerics on the
quantized model find every layer within one step of the eval rewrite given
TFLite's own inputs (`max_own_steps`). Issue #36: MobileNetV2 does so after a
`.keras` save, `load_model` and further `fit` round trip.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
from qat.export import range_survival  # pylint: disable=g-import-not-at-top
import tf2_util  # pylint: disable=g-import-not-at-top

_STEPS = 4
_STEP_TOLERANCE = 1e-3  # Float rounding of diff / scale.
_VOCAB, _LENGTH, _HIDDEN = 1000, 32, 64


def _mobilenet_v2():
    k = tf2_util.keras()
    return k.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                      classes=10)


def _text_encoder():
    k = tf2_util.keras()
    ids = k.Input((_LENGTH,), dtype="int32", name="ids")
    x = k.layers.Embedding(_VOCAB, _HIDDEN)(ids)
    x = x + k.layers.Embedding(_LENGTH, _HIDDEN)(k.ops.arange(_LENGTH)[None])
    x = k.layers.LayerNormalization()(x)
    attended = k.layers.MultiHeadAttention(2, _HIDDEN // 2)(x, x)
    x = k.layers.LayerNormalization()(x + attended)
    hidden = k.layers.Dense(4 * _HIDDEN, activation="gelu")(x)
    x = k.layers.LayerNormalization()(x + k.layers.Dense(_HIDDEN)(hidden))
    logits = k.layers.Dense(2)(k.layers.GlobalAveragePooling1D()(x))
    return k.Model(ids, logits, name="text_encoder")


def _train(qm, inputs, labels, jit_compile=None):
    step = tf2_util.adam_step(qm, 1e-3, jit_compile)

    for i in range(len(inputs) // 16):
        batch = slice(16 * i, 16 * (i + 1))
        loss = step(inputs[batch], labels[batch])
    return float(loss)


def _train_under_xla(qm, inputs, labels):
    """Half the steps with Keras's `fit(jit_compile=True)`, half in a custom XLA loop."""
    k = tf2_util.keras()
    qm.compile(k.optimizers.Adam(1e-3),
               k.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    half = len(inputs) // 2
    history = qm.fit(inputs[:half], labels[:half], batch_size=16, epochs=1, verbose=0)
    assert qm.rewriter.xla_function is not None, "fit's training calls ran without XLA"
    return min(history.history["loss"][-1], _train(qm, inputs[half:], labels[half:], True))


class QuantizeModelZooTest(absltest.TestCase):

    def _check(self, build, inputs, labels, samples, keras_file=False, min_top1_agreement=None,
               train=_train):
        tf2_util.keras().utils.set_random_seed(0)
        qm = qat.quantize_model(build())
        self.assertEqual(qm.left_float, [])
        out = _tmpdir()
        if keras_file:
            qm = self._fitted_after_keras_file(qm, os.path.join(out, "qm.keras"), inputs,
                                               labels, samples)
        else:
            self.assertTrue(np.isfinite(train(qm, inputs, labels)))
        exported = export.export_model(qm, out, parity_inputs=samples,
                                       min_top1_agreement=min_top1_agreement)
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertEqual([r.describe() for r in exported.survival.lost
                          if r.kind == range_survival.DIFFERS], [])
        numerics = report.layer_numerics_of_model(qm, samples, tflite=exported.model)
        print("\n".join(numerics.summary_lines()))
        self.assertEqual([r.name for r in numerics.unmatched], [])
        worst = numerics.worst_own
        self.assertLessEqual(worst.max_own_steps, 1.0 + _STEP_TOLERANCE,
                             f"{worst.name}: {worst.max_own_steps} steps on TFLite's inputs")
        return qm, numerics

    def _fitted_after_keras_file(self, qm, path, inputs, labels, samples):
        """Issue #36: `save("x.keras")`, `load_model`, then `fit`; returns the loaded copy.

        Before saving, training calls without gradients move the ranges, the
        batch norm statistics and the step counter (one gradient trace, the
        loaded copy's `fit`, keeps the test short).
        """
        k = tf2_util.keras()
        for i in range(_STEPS):
            qm(inputs[16 * i:16 * (i + 1)], training=True)
        qm.save(path)
        loaded = k.models.load_model(path)
        tf2_util.assert_same_state(qm, loaded, samples)
        loaded.compile(k.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        history = loaded.fit(inputs, labels, batch_size=16, verbose=0)
        self.assertTrue(np.isfinite(history.history["loss"][-1]))
        self.assertEqual(tf2_util.quantization_step(loaded), 2 * _STEPS)
        return loaded

    def test_mobilenet_v2(self):
        """Saved as a .keras file, loaded and fitted, then checked."""
        rng = np.random.RandomState(0)
        images = rng.rand(16 * _STEPS, 32, 32, 3).astype(np.float32)
        labels = rng.randint(0, 10, 16 * _STEPS)
        _, numerics = self._check(_mobilenet_v2, images, labels, images[:16], keras_file=True,
                                  min_top1_agreement=0.95)
        self.assertGreater(len(numerics.rows), 60)

    def test_mobilenet_v2_under_xla(self):
        """jit_compile=True, Keras 3's default on GPU machines: `fit` and a custom loop."""
        rng = np.random.RandomState(0)
        images = rng.rand(16 * _STEPS, 32, 32, 3).astype(np.float32)
        labels = rng.randint(0, 10, 16 * _STEPS)
        _, numerics = self._check(_mobilenet_v2, images, labels, images[:16],
                                  min_top1_agreement=0.95, train=_train_under_xla)
        self.assertGreater(len(numerics.rows), 60)

    def test_text_encoder(self):
        rng = np.random.RandomState(1)
        ids = rng.randint(0, _VOCAB, (16 * _STEPS, _LENGTH)).astype(np.int32)
        labels = rng.randint(0, 2, 16 * _STEPS)
        qm, numerics = self._check(_text_encoder, ids, labels, ids[:16])
        self.assertGreater(len(numerics.rows), 30)
        model = export.describe_model(export.convert_function(qm.inference_function()))
        self.assertEqual(model.tensors[model.inputs[0]].dtype, np.int32)  # Ids stay ids.


def _tmpdir():
    import tempfile  # pylint: disable=g-import-not-at-top
    return tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())


if __name__ == "__main__":
    absltest.main()
