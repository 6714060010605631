"""A recipe's 16-bit recurrent layer exported as one int8 / int16 LiteRT model.

A Keras 3 LSTM on the digit rows (`recurrent_util`) with the recipe
`[{"kind": "recurrent", "activation_bits": 16}]` is trained by
`qat.quantize_model` and exported by qat's own call (`qat.export.export_model`),
which hands it to ai-edge-quantizer (TF's converter refuses 16-bit
activations inside an 8-bit model). Checked: no float compute op, the
LSTM's tensors int16 and the head's int8, top-1 agreement with the eval
function (its 16-bit FakeQuants on LiteRT's int16 grid) at least 99 %; and
the recipe with a float layer beside is refused naming it. Skipped
only where ai-edge-quantizer is not installed.
"""
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

import qat
from qat import export
import recurrent_util
import tf2_util

try:
    import ai_edge_quantizer  # pylint: disable=unused-import
    _MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    _MISSING = f"ai-edge-quantizer is not installed ({e}): pip install ai-edge-quantizer"

RECIPE = [{"kind": "recurrent", "activation_bits": 16}]


def _lstm():
    k = tf2_util.keras()
    k.utils.set_random_seed(0)
    inputs = k.Input((recurrent_util.STEPS, recurrent_util.FEATURES))
    h = k.layers.LSTM(16, name="lstm")(inputs)
    return k.Model(inputs, k.layers.Dense(recurrent_util.CLASSES, name="out")(h))


def _fit(model, x, y, epochs):
    k = tf2_util.keras()
    model.compile(k.optimizers.Adam(3e-3),
                  k.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=epochs, batch_size=32, shuffle=False, verbose=0)


@absltest.skipIf(_MISSING is not None, _MISSING)
class RecipeInt16ExportTest(tf.test.TestCase):

    def test_sixteen_bit_lstm_exports_integer_and_agrees(self):
        (x, y), (xt, _) = recurrent_util.digit_rows()
        model = _lstm()
        _fit(model, x, y, epochs=4)
        qm = qat.quantize_model(model, recipe=RECIPE)
        _fit(qm, x, y, epochs=1)
        exported = export.export_model(qm, tempfile.mkdtemp(), name="lstm16",
                                       parity_inputs=xt, min_top1_agreement=0.99)
        print(f"16-bit LSTM recipe: {exported.size_bytes} bytes, {exported.parity.format()}")
        self.assertEqual(export.find_float_ops(exported.report), [])
        self.assertGreaterEqual(exported.parity.top1_agreement, 0.99)
        report = exported.report
        types = {report.tensors[i].name: np.dtype(report.tensors[i].dtype)
                 for op in report.ops for i in op.outputs}
        # The cell state (c = f * c + i * g) of each of the 8 steps: int16.
        cell_state = [t for n, t in types.items() if n.endswith("lstm_cell_1/add_1")]
        self.assertLen(cell_state, recurrent_util.STEPS)
        self.assertEqual(set(cell_state), {np.dtype(np.int16)})
        # The dense head (the last FULLY_CONNECTED) stays int8, as the model's output.
        head = [op for op in report.ops if op.name == "FULLY_CONNECTED"][-1]
        self.assertEqual([np.dtype(t) for t in head.output_types], [np.dtype(np.int8)])
        self.assertEqual(types[report.tensors[report.ops[-1].outputs[0]].name],
                         np.dtype(np.int8))

    def test_float_layers_with_sixteen_bit_layers_are_refused(self):
        (x, _), _ = recurrent_util.digit_rows()
        qm = qat.quantize_model(_lstm(), recipe=RECIPE + [{"layers": "out", "float": True}])
        qm(x[:32], training=True)
        with self.assertRaisesRegex(qat.RecipeError,
                                    r"16-bit activations .*float layers \(.*out_1"):
            export.export_model(qm, tempfile.mkdtemp(), parity_inputs=x[:32])

if __name__ == "__main__":
    absltest.main()
