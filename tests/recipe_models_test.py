"""Recipes on a Keras 3 model (issue #42): quantize_model, `.keras` files, a mixed export.

A digits CNN (conv, depthwise, pointwise, 3x3 conv, a 1x1 "squeeze" conv,
pool, dense, logits) with 4-bit per-channel weights everywhere but the
depthwise and the first and last layers (8 bits), and the squeeze layer
float. Exported, the file is smaller than the all-int8 one, its only float
ops are the squeeze layer and the pool reading its float output, and every
layer agrees with the eval function (`qat.report.layer_numerics_of_model`).
"""
import os
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

import digits_util
import qat
from qat import export
from qat import report
import tf2_util

RECIPE = [{"layers": ".*", "weight_bits": 4, "per_channel": True},
          {"kind": "depthwise", "weight_bits": 8},
          {"position": "first", "weight_bits": 8},
          {"position": "last", "weight_bits": 8},
          {"layers": "squeeze", "float": True}]


def _cnn():
    k = tf2_util.keras()
    k.utils.set_random_seed(0)
    inputs = k.Input((8, 8, 1))
    x = k.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(inputs)
    x = k.layers.DepthwiseConv2D(3, padding="same", activation="relu", name="dw")(x)
    x = k.layers.Conv2D(32, 1, activation="relu", name="pw")(x)
    x = k.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv3")(x)
    x = k.layers.Conv2D(16, 1, activation="relu", name="squeeze")(x)
    x = k.layers.GlobalAveragePooling2D(name="pool")(x)
    x = k.layers.Dense(32, activation="relu", name="fc")(x)
    return k.Model(inputs, k.layers.Dense(10, name="logits")(x))


def _fit(model, x, y, epochs):
    k = tf2_util.keras()
    model.compile(k.optimizers.Adam(3e-3),
                  k.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=epochs, batch_size=32, shuffle=False, verbose=0)


def _fake_quants(function):
    """{quantizer scope: (num_bits, per channel)} of a concrete function's FakeQuant ops."""
    return {op.name.rsplit("/", 1)[0]: (op.get_attr("num_bits"), op.type.endswith("PerChannel"))
            for op in function.graph.get_operations()
            if op.type.startswith("FakeQuantWithMinMaxVars")}


class RecipeModelTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.x, cls.y), (cls.x_test, cls.y_test) = digits_util.digits_split()
        cls.model = _cnn()
        _fit(cls.model, cls.x, cls.y, epochs=6)

    def test_recipe_layers_bits_and_keras_file(self):
        qm = qat.quantize_model(self.model, per_channel_weights=True, recipe=RECIPE)
        described = {layer.info.name.split("/")[-1]: layer.precision.describe()
                     for layer in qm.layer_precisions}
        self.assertEqual(described, {
            "conv1_1": "w8 per-channel a8", "dw_1": "w8 per-channel a8",
            "pw_1": "w4 per-channel a8", "conv3_1": "w4 per-channel a8",
            "squeeze_1": "float", "fc_1": "w4 per-tensor a8",  # matmuls: as the options say
            "logits_1": "w8 per-tensor a8"})
        quants = _fake_quants(qm.inference_function())
        bits = {name.split("/")[1]: value for name, value in quants.items()
                if name.endswith("weights_quant")}
        self.assertEqual(bits, {"conv1_1": (8, True), "dw_1": (8, True), "pw_1": (4, True),
                                "conv3_1": (4, True), "fc_1": (4, False),  # matmul: per tensor
                                "logits_1": (8, False)})
        self.assertEmpty([n for n in quants if "/squeeze_1/" in n + "/"])

        # .keras: save -> load_model -> fit keeps the recipe and its ranges.
        _fit(qm, self.x[:64], self.y[:64], epochs=1)
        path = os.path.join(tempfile.mkdtemp(), "qm.keras")
        qm.save(path)
        loaded = tf2_util.keras().models.load_model(path)
        self.assertEqual(loaded.quantize_options.recipe, qat.Recipe(RECIPE))
        self.assertEqual(_fake_quants(loaded.inference_function()), quants)
        np.testing.assert_array_equal(loaded(self.x_test, training=False).numpy(),
                                      qm(self.x_test, training=False).numpy())
        _fit(loaded, self.x[:64], self.y[:64], epochs=1)
        self.assertEqual(_fake_quants(loaded.inference_function()), quants)

    def test_export_mixed_model(self):
        out = tempfile.mkdtemp()
        exported = {}
        for name, recipe in (("int8", None), ("recipe", RECIPE)):
            qm = qat.quantize_model(self.model, per_channel_weights=True, recipe=recipe)
            _fit(qm, self.x, self.y, epochs=1)
            exported[name] = (qm, export.export_model(qm, out, name=name,
                                                      parity_inputs=self.x_test))
        qm, mixed = exported["recipe"]
        int8 = exported["int8"][1]
        floats = export.find_float_ops(mixed.report)
        numerics = report.layer_numerics_of_model(qm, self.x_test[:64], tflite=mixed.model)
        print(f"recipe model: {mixed.size_bytes} bytes vs {int8.size_bytes} all-int8; "
              f"float ops {[f.tflite_op for f in floats]}; {mixed.parity.format()}; "
              f"int8: {int8.parity.format()}\n{numerics.format()}")
        self.assertLess(mixed.size_bytes, int8.size_bytes)
        self.assertEqual(export.find_float_ops(int8.report), [])
        # The float layer and the pool reading its float output, between a
        # DEQUANTIZE (not compute) and the QUANTIZE of the next range.
        self.assertEqual([f.tflite_op for f in floats], ["CONV_2D", "MEAN", "QUANTIZE"])
        float_scopes = {part.split("/")[1] for f in floats[:2] for name in f.float_tensors
                        for part in name.split(";")}
        self.assertEqual(float_scopes, {"squeeze_1", "pool_1"})
        ops = mixed.report.ops
        self.assertEqual(ops[floats[0].tflite_index - 1].name, "DEQUANTIZE")
        self.assertGreaterEqual(mixed.parity.top1_agreement, 0.97)
        self.assertEqual(mixed.survival.differing, [])
        # Every integer layer within one step given TFLite's inputs, 4-bit ones included.
        self.assertEmpty(numerics.unmatched, numerics.format())
        self.assertLessEqual(numerics.worst_own.max_own_steps, 1.0 + 1e-3, numerics.format())

    def test_float_layer_between_integer_layers_is_refused_at_export(self):
        # pw reads dw's range and conv3 reads pw's output: TF's converter
        # quantizes pw itself, and the export says so.
        qm = qat.quantize_model(self.model, per_channel_weights=True,
                                recipe=[{"layers": "pw", "float": True}])
        qm(self.x[:32], training=True)
        with self.assertRaisesRegex(export.FloatOpError,
                                    r"keeps .*pw_1 float, but TF's converter made it integer"):
            export.export_model(qm, tempfile.mkdtemp())

    def test_bad_recipes_change_nothing(self):
        variables = len(self.model.variables)
        for recipe, message in (
                ([{"layers": "conv1", "weight_bits": 4}, {"layers": "conv9", "float": True}],
                 r"rule 1 .* selects no layer"),
                ([{"kind": "embedding"}], r"rule 0 .* selects no layer"),
                ([{"layers": "conv1", "float": True, "per_channel": True}],
                 "conflicting settings")):
            with self.subTest(recipe=recipe):
                with self.assertRaisesRegex(qat.RecipeError, message):
                    qat.quantize_model(self.model, recipe=recipe)
                self.assertLen(self.model.variables, variables)

    def test_recurrent_layer_ranges_take_its_activation_bits(self):
        k = tf2_util.keras()
        inputs = k.Input((8, 8))
        model = k.Model(inputs, k.layers.Dense(10, name="out")(
            k.layers.LSTM(16, name="lstm")(inputs)))
        qm = qat.quantize_model(model, recipe=[{"kind": "recurrent", "activation_bits": 16}])
        kinds = {layer.info.name.split("/", 1)[1]: layer.info.kind
                 for layer in qm.layer_precisions}
        self.assertEqual(kinds["lstm_1/while"], "recurrent")
        quants = _fake_quants(qm.inference_function())
        cell = {name: bits for name, (bits, _) in quants.items() if "/while/step_" in name}
        self.assertNotEmpty(cell)
        for name, bits in cell.items():  # Gates, cell state, steps' outputs; fixed grids 8-bit.
            expected = 8 if name.rsplit("/", 1)[-1].startswith(("fixed_quant", "weights_quant",
                                                               "param_quant")) else 16
            self.assertEqual(bits, expected, name)
        self.assertEqual([v for n, v in quants.items() if n.endswith("/out_1/act_quant")],
                         [(8, False)])

    def test_four_bit_embedding_is_refused(self):
        k = tf2_util.keras()
        inputs = k.Input((6,), dtype="int32")
        x = k.layers.Embedding(50, 16, name="emb")(inputs)
        x = k.layers.GlobalAveragePooling1D()(x)
        model = k.Model(inputs, k.layers.Dense(4, name="out")(x))
        with self.assertRaisesRegex(
                qat.RecipeError, r"rule 0 \{\"weight_bits\": 4\} gives 4-bit weights to "
                r".*emb.* \(embedding\): LiteRT has no 4-bit kernel"):
            qat.quantize_model(model, recipe=[{"weight_bits": 4}])


if __name__ == "__main__":
    absltest.main()
