"""tf_keras MobileNetV2 (96x96) and ResNet50 (64x64), weights=None, graph mode.

The training rewrite gives every conv / depthwise / dense weight and every
activation TFLite needs a range for a FakeQuant; the eval rewrite converts to
a fully integer TFLite model (the converter fails or leaves float ops on any
tensor lacking min/max data).
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.matching import layer_patterns  # pylint: disable=g-import-not-at-top
from qat.quantize import plan as quantize  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

_MODELS = (
    ("mobilenet_v2", keras.applications.MobileNetV2, 96),
    ("resnet50", keras.applications.ResNet50, 64),
)
_LAYERS = ("Conv2D", "DepthwiseConv2dNative", "MatMul")


def _build(app, size, training, batch=None):
    g = tf.Graph()
    with g.as_default():
        # A fixed learning phase keeps batch norms out of functional If ops.
        keras.backend.set_learning_phase(1 if training else 0)
        x = tf.compat.v1.placeholder(tf.float32, [batch, size, size, 3],
                                     name="input")
        model = app(input_tensor=x, weights=None, classes=10)
    return g, x, model.output


def _quantized(t):
    return quantize.existing_quantizer(t)[0] is not None


class KerasModelsTest(parameterized.TestCase):

    @parameterized.named_parameters(*_MODELS)
    def test_training_graph_has_every_range(self, app, size):
        g, x, y = _build(app, size, training=True)
        qat.create_training_graph(g)
        ops = g.get_operations()
        layers = [op for op in ops if op.type in _LAYERS]
        self.assertGreater(len(layers), 50)
        unscaled = 0
        for op in layers:
            w = layer_patterns.weight_input(op)
            self.assertTrue(quantize.is_quantized_output(w), op.name)
            if op.inputs[1] is not w:
                # Folded (training): the layer reads fq(w*s) * 1/s.
                unscale = op.inputs[1].op
                self.assertEqual(unscale.type, "Mul", op.name)
                self.assertIs(unscale.inputs[0], w, op.name)
                unscaled += 1
        # Every conv is followed by a batch norm; the final Dense is not.
        self.assertEqual(unscaled, len(layers) - 1)
        weight_fqs = [op for op in ops if op.type == "FakeQuantWithMinMaxVars"
                      and op.name.endswith("/weights_quant/FakeQuantWithMinMaxVars")]
        self.assertLen(weight_fqs, len(layers))
        for op in ops:
            if op.type in ("Relu", "Relu6"):
                self.assertTrue(_quantized(op.outputs[0]), op.name)
            elif op.type == "AddV2" and op.name.endswith("_add/add"):
                out = op.outputs[0]
                activations = [c for c in out.consumers()
                               if c.type in ("Relu", "Relu6")]
                self.assertTrue(_quantized(out) or activations, op.name)
                for operand in op.inputs:  # Both sides of the residual.
                    self.assertTrue(quantize.is_quantized_output(operand),
                                    (op.name, operand.name))
            elif op.type == "Mean" and "pool" in op.name:
                self.assertTrue(_quantized(op.outputs[0]), op.name)
        self.assertTrue(_quantized(x))
        logits = y.op.inputs[0]  # Softmax input: the final dense layer.
        self.assertTrue(quantize.is_quantized_output(logits), logits.name)
        # Idempotent on a big graph too.
        before = g.as_graph_def()
        qat.create_training_graph(g)
        self.assertEqual(g.as_graph_def(), before)

    def test_gradients_built_before_the_rewrite_stay_float(self):
        g, x, y = _build(keras.applications.MobileNetV2, 96, training=True)
        with g.as_default():
            labels = tf.one_hot([1], 10)
            loss = tf.reduce_mean(keras.losses.categorical_crossentropy(labels, y))
            weights = [v for v in tf.compat.v1.trainable_variables()]
            tf.compat.v1.gradients(loss, weights)
            gradient_ops = {op for op in g.get_operations()
                            if op._original_op is not None}  # pylint: disable=protected-access
            self.assertGreater(len(gradient_ops), 100)
            inputs = {op: list(op.inputs) for op in gradient_ops}
            qat.create_training_graph(g)
        fqs = [op for op in g.get_operations()
               if op.type == "FakeQuantWithMinMaxVars"]
        self.assertLen(fqs, 118)  # As without gradients.
        for fq in fqs:
            self.assertNotIn(fq.inputs[0].op, gradient_ops, fq.name)
        for op, before in inputs.items():
            self.assertEqual(list(op.inputs), before, op.name)
        del x

    @parameterized.named_parameters(*_MODELS)
    def test_eval_graph_converts_fully_integer(self, app, size):
        g, x, y = _build(app, size, training=False, batch=1)
        qat.create_eval_graph(g)
        with g.as_default(), tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            frozen = export.freeze_session(sess, [y.op.name])
        model = export.convert_frozen_graph(frozen, [x.name], [y.name], "int8")
        report = export.check_fully_integer(model, frozen)
        self.assertIsNotNone(report)


if __name__ == "__main__":
    absltest.main()
