"""Fixed-range outputs read by the model (qat/quantize/plan/ranges/fixed_ranges.py).

A sigmoid gating a squeeze-excite multiply, a tanh gate, a softmax read by a
matmul: TFLite's integer kernels write these on a fixed grid (LOGISTIC and
SOFTMAX 1/256, TANH 1/128) and the reader computes with the rounded value.
The eval graph must round the same way: each such output gets a FakeQuant
with TFLite's grid as a constant range, the converter keeps that scale (no
requantize), and the reader's eval output equals TFLite's given TFLite's
inputs, within one step, in both flavours.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import fixed_grid_util as util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat.export import range_survival  # pylint: disable=g-import-not-at-top
from qat.quantize.plan.ranges import fixed_ranges  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def _sigmoid_excite(x, training):
    a = util.conv(x, 8, "a", training=training)
    s = tf.reduce_mean(a, [1, 2], keepdims=True)
    s = util.conv(s, 8, "excite", tf.nn.sigmoid, training)
    return util.conv(a * s, 4, "head", None, training)


def _tanh_gate(x, training):
    a = util.conv(x, 8, "a", training=training)
    g = util.conv(x, 8, "gate", tf.nn.tanh, training)
    return util.conv(a * g, 4, "head", None, training)


def _softmax_weights(x, training):
    a = util.conv(x, 8, "a", None, training)
    w = tf.nn.softmax(tf.reshape(a, [-1, 64, 8]), axis=1)
    v = tf.reshape(util.conv(x, 8, "values", training=training), [-1, 64, 8])
    return tf1.layers.dense(tf.reduce_sum(w * v, 1), 4, name="head")


def _log_softmax_scores(x, training):
    a = util.conv(x, 8, "a", None, training)
    scores = tf.nn.log_softmax(a, axis=-1)
    return util.conv(scores + util.conv(x, 8, "b", None, training), 4, "head", None, training)


CASES = dict(sigmoid_excite=_sigmoid_excite, tanh_gate=_tanh_gate,
             softmax_weights=_softmax_weights, log_softmax_scores=_log_softmax_scores)
FIXED = dict(sigmoid_excite="Sigmoid", tanh_gate="Tanh", softmax_weights="Softmax",
             log_softmax_scores="LogSoftmax")


def _build(case, training):
    return util.build(CASES[case], training)


class FixedRangesTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(*[(name, name) for name in CASES])
    def test_reader_computes_with_tflite_grid(self, case):
        path, train_vars = util.calibrate(CASES[case], self.get_temp_dir())
        g, x, y = _build(case, training=False)
        qat.experimental_create_eval_graph(g, symmetric_weights=True)
        self.assertContainsSubset(util.variables(g), train_vars)  # A strict plain restore.
        fixed, = [op for op in g.get_operations() if op.type == FIXED[case]]
        quantizers = [c for c in fixed.outputs[0].consumers()
                      if c.type == "FakeQuantWithMinMaxVars"]
        self.assertLen(quantizers, 1)
        self.assertAllEqual(fixed.outputs[0].consumers(), quantizers)
        with tf1.Session(graph=g) as sess:
            tf1.train.Saver().restore(sess, path)
            lo, hi = sess.run(quantizers[0].inputs[1:])
            self.assertEqual((lo, hi), fixed_ranges.FIXED_GRIDS[fixed.type])
            frozen = tf1.graph_util.convert_variables_to_constants(
                sess, g.as_graph_def(), [y.op.name])
        for flavour in ("uint8", "int8"):
            model = util.convert(frozen, x, y, flavour)
            report = range_survival.check_ranges(frozen, model, flavour=flavour)
            self.assertEmpty(report.differing, report.format())
            interpreter = tf.lite.Interpreter(model_content=model)
            ops = [d["op_name"] for d in interpreter._get_ops_details()]  # pylint: disable=protected-access
            # The fixed scale is kept: no requantize, no float op.
            self.assertNotIn("QUANTIZE", ops[1:], ops)
            self.assertNotIn("DEQUANTIZE", ops[:-1], ops)
            util.check_layers(self, frozen, model, flavour)


class PlanTest(tf.test.TestCase):

    def test_output_read_only_by_the_loss_gets_none(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, (None, 8), name="input")
            logits = tf1.layers.dense(x, 4, name="fc")
            probs = tf.nn.sigmoid(logits, name="probs")
            labels = tf1.placeholder(tf.float32, (None, 4))
            tf.reduce_mean(tf.square(probs - labels))
            qat.create_training_graph(g)
        self.assertEqual([], [c.type for c in probs.consumers()
                              if c.type.startswith("FakeQuant")])


if __name__ == "__main__":
    tf.test.main()
