"""`qat.export.edge_quantizer`: int8 and int16 activations in one LiteRT model.

A Keras 3 digits model (conv -> tanh -> dense) is quantized with
`qat.quantize_model` and trained a few steps; its frozen eval function goes
through ai-edge-quantizer with qat's own ranges. Checked: all int8, the
model computes what TF's converter's int8 model computes (the same ranges,
the same grid); with the conv and tanh outputs at 16 bits, those tensors are
int16, the rest int8, nothing float but the model's float interface, and the
output within one step of the reference (the eval function with those
FakeQuants on the int16 grid); 4-bit weights stay 4-bit; bad requests raise
and name the FakeQuant. Skipped only where ai-edge-quantizer is not installed.
"""
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from ai_edge_litert import schema_py_generated as schema
import keras
import numpy as np
import tensorflow as tf

import digits_util
import qat
from qat.export import edge_quantizer
from qat.export import edge_quantizer_graphs
from qat.export import functions
from qat.export import inspect
from qat.export import parity

try:
    import ai_edge_quantizer  # pylint: disable=unused-import
    _MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    _MISSING = f"ai-edge-quantizer is not installed ({e}): pip install ai-edge-quantizer"

_FAKE_QUANTS = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs")
_ONE_STEP = 1.0 + 1e-4  # One output step, and float32's error in dividing by it.
_CONV_AND_DENSE = (schema.BuiltinOperator.CONV_2D, schema.BuiltinOperator.FULLY_CONNECTED)


def _trained(weight_bits: int = 8):
    """(frozen eval function, TF converter int8 model, held-out inputs, train inputs)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, activation="tanh")(inputs)
    logits = keras.layers.Dense(10)(keras.layers.Flatten()(h))
    qm = qat.quantize_model(keras.Model(inputs, logits), weight_bits=weight_bits)
    (x, y), (xt, _) = digits_util.digits_split()
    optimizer = keras.optimizers.Adam(3e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, qm(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, qm.trainable_variables),
                                      qm.trainable_variables))

    for k in range(30):
        step(x[32 * k:32 * k + 32], y[32 * k:32 * k + 32])
    function = qm.inference_function()
    return functions.freeze_function(function), functions.convert_function(function), xt, x


def _activation_fake_quants_of(graph_def, op_type: str):
    """The activation FakeQuants quantizing an op of `op_type` (through Identity)."""
    nodes = {n.name: n for n in graph_def.node}
    found = []
    for node in graph_def.node:
        if node.op not in _FAKE_QUANTS:
            continue
        source = nodes[node.input[0].split(":")[0]]
        while source.op == "Identity":
            source = nodes[source.input[0].split(":")[0]]
        if source.op == op_type:
            found.append(node.name)
    return found


@absltest.skipIf(_MISSING is not None, _MISSING)
class EdgeQuantizerTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.frozen, cls.int8, cls.xt, cls.x = _trained()

    def _export(self, bits=None, frozen=None):
        frozen = frozen or self.frozen
        return edge_quantizer.mixed_precision_model(
            frozen.graph_def, frozen.input_names, frozen.output_names, [self.x[:128]],
            activation_bits=bits)

    def _parity(self, result):
        frozen = self.frozen
        reference = parity.run_graph(result.reference_graph_def, frozen.input_names[0],
                                     frozen.output_names[0], self.xt)
        return parity.compare_outputs(reference, parity.run_tflite(result.model, self.xt),
                                      parity._output_scale(self.int8))  # pylint: disable=protected-access

    def _float_ops(self, model):
        return [f.tflite_op for f in inspect.find_float_ops(inspect.describe_model(model))]

    def test_int8_is_tf_converters_model(self):
        result = self._export()
        self.assertEqual(self._float_ops(result.model), [])
        self.assertEqual(set(result.tensor_bits.values()), {8})
        ours = parity.run_tflite(result.model, self.xt)
        theirs = parity.run_tflite(self.int8, self.xt)
        steps = np.abs(ours - theirs).max() / parity._output_scale(self.int8)  # pylint: disable=protected-access
        self.assertLessEqual(steps, _ONE_STEP)
        report = self._parity(result)
        self.assertGreaterEqual(report.top1_agreement, 0.99)
        self.assertLessEqual(report.max_diff_steps, _ONE_STEP)

    def test_int16_island(self):
        chosen = (_activation_fake_quants_of(self.frozen.graph_def, "Tanh")
                  + _activation_fake_quants_of(self.frozen.graph_def, "BiasAdd")[:1])
        self.assertNotEmpty(chosen)
        result = self._export({name: 16 for name in chosen})
        self.assertEqual(self._float_ops(result.model), [])
        self.assertEqual(set(result.tensor_bits.values()), {8, 16})
        report = inspect.describe_model(result.model)
        types = {report.tensors[i].name: report.tensors[i].dtype
                 for op in report.ops for i in op.outputs}
        for tensor, bits in result.tensor_bits.items():
            if tensor not in types:  # The model's float input.
                continue
            self.assertEqual(types[tensor], np.int16 if bits == 16 else np.int8, tensor)
        tanh = [n for n in report.ops if n.name == "TANH"]
        self.assertEqual([np.dtype(t) for op in tanh for t in op.output_types], [np.int16])
        reference = {n.name: n for n in result.reference_graph_def.node}
        for name in chosen:
            self.assertEqual(reference[name].attr["num_bits"].i, 16)
        parity_report = self._parity(result)
        self.assertGreaterEqual(parity_report.top1_agreement, 0.99)
        self.assertLessEqual(parity_report.max_diff_steps, _ONE_STEP)

    def test_four_bit_weights(self):
        frozen, _, _, _ = _trained(weight_bits=4)
        result = self._export(frozen=frozen)
        from ai_edge_quantizer.utils import tfl_flatbuffer_utils  # pylint: disable=import-outside-toplevel
        model = tfl_flatbuffer_utils.read_model(result.model)
        graph = model.subgraphs[0]
        layers = [op for op in graph.operators
                  if model.operatorCodes[op.opcodeIndex].builtinCode in _CONV_AND_DENSE]
        self.assertLen(layers, 2)
        for op in layers:  # LiteRT's TensorType INT4: packed two to a byte.
            self.assertEqual(graph.tensors[op.inputs[1]].type, schema.TensorType.INT4)
        int8 = self._export()
        self.assertLess(len(result.model), len(int8.model))
        reference = parity.run_graph(frozen.graph_def, frozen.input_names[0],
                                     frozen.output_names[0], self.xt)
        agreement = np.mean(reference.argmax(-1)
                            == parity.run_tflite(result.model, self.xt).argmax(-1))
        self.assertGreaterEqual(agreement, 0.99)

    def test_bad_requests_raise_naming_the_fake_quant(self):
        tanh = _activation_fake_quants_of(self.frozen.graph_def, "Tanh")[0]
        with self.assertRaisesRegex(qat.export.ExportError, "no/such/FakeQuant"):
            self._export({"no/such/FakeQuant": 16})
        with self.assertRaisesRegex(qat.export.ExportError, re.escape(tanh) + ".*12-bit"):
            self._export({tanh: 12})
        nodes = {n.name: n for n in self.frozen.graph_def.node}
        weight = [n.name for n in self.frozen.graph_def.node if n.op in _FAKE_QUANTS
                  and not edge_quantizer_graphs.reads_input(n.input[0], nodes)][0]
        with self.assertRaisesRegex(qat.export.ExportError, "weight FakeQuant"):
            self._export({weight: 16})
        off_grid = tf.compat.v1.GraphDef()
        off_grid.CopyFrom(self.frozen.graph_def)
        node = [n for n in off_grid.node if n.name == tanh][0]
        node.attr["num_bits"].i = 16  # Its learned 8-bit range is not the int16 grid.
        frozen = functions.FrozenFunction(off_grid, self.frozen.input_names,
                                          self.frozen.output_names)
        with self.assertRaisesRegex(qat.export.ExportError, re.escape(tanh) + ".*int16 grid"):
            self._export(frozen=frozen)


if __name__ == "__main__":
    absltest.main()
