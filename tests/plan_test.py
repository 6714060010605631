"""The tensor-centric plan: one range per tensor, structures, names, left float."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.quantize.plan import planner as plan_lib  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1


def _conv(x, name, channels=4):
    w = tf1.get_variable(name + "/weights", [3, 3, x.shape[-1], channels])
    return tf.nn.conv2d(x, w, 1, "SAME", name=name + "/Conv2D")


def _fake_quants(g):
    return {op.name.rsplit("/", 1)[0]: op for op in g.get_operations()
            if op.type.startswith("FakeQuant")}


class PlanTest(absltest.TestCase):

    def test_tensor_read_by_two_activations_has_one_range(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = _conv(x, "c")
            a = tf.nn.relu(y, name="a/Relu")
            b = tf.nn.relu6(y, name="b/Relu6")
            tf.identity(tf.concat([a, b], 3, name="cat/concat"), name="out")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {"c/input_quant", "c/weights_quant",
                                    "c/act_quant", "a/act_quant",
                                    "b/act_quant", "cat/concat_quant"})
        quantized = fqs["c/act_quant"].outputs[0]
        for name in ("a/Relu", "b/Relu6"):
            self.assertIs(g.get_operation_by_name(name).inputs[0], quantized)

    def test_hard_swish_is_quantized_at_its_output_only(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = _conv(x, "c")
            with tf.name_scope("hswish"):
                h = y * tf.nn.relu6(y + 3.0) * (1.0 / 6.0)
            tf.identity(_conv(h, "next"), name="out")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {
            "c/input_quant", "c/weights_quant", "c/act_quant",
            "hswish/act_quant", "next/weights_quant", "next/act_quant"})
        self.assertIs(fqs["hswish/act_quant"].inputs[0], h)

    def test_dropout_is_looked_through(self):
        names = []
        for training in (True, False):
            g = tf.Graph()
            with g.as_default():
                x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
                y = _conv(x, "c")
                if training:
                    y = tf.nn.dropout(y, rate=0.5)
                y = tf.nn.relu(y)
                tf.identity(_conv(y, "next"), name="out")
                qat.insert_quant_ops(g, is_training=training)
            names.append(set(_fake_quants(g)))
        self.assertEqual(names[0], names[1])
        self.assertIn("c/act_quant", names[0])

    def test_left_float_names_what_stays_float(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = tf.math.exp(_conv(x, "c"), name="odd/Exp")
            tf.identity(_conv(y, "next"), name="out")
            planner = plan_lib.Planner(g, True, None, False)
            plans = planner.run()
        self.assertIn("odd/Exp", dict(planner.left_float))
        self.assertIn("no integer TFLite kernel",
                      dict(planner.left_float)["odd/Exp"])
        # The tensor the next layer reads still gets its range, named after it.
        prefixes = {p.prefix for p in plans}
        self.assertIn("next/input_quant", prefixes)


if __name__ == "__main__":
    absltest.main()
