"""Recurrent models exported fully integer, every step within one step of the eval graph.

Issue #38. Each case trains a small recurrent model of the digit rows (8 steps
of 8 features) a few steps with quantization-aware training, exports it with
TF's converter and holds the model to the export checks (`qat.export`: no
float op, every range a tensor of the model, the kernels' preconditions) and
to the layer numerics (`qat.report`): given TFLite's own inputs, the eval
graph computes every tensor TFLite has a range of, at every step, within one
quantization step, and there is a row for every step's state.

* the graph path: `dynamic_rnn` of a MultiRNNCell (LSTMCell over GRUCell) as
  a While loop, uint8 and int8; `static_rnn` of a GRUCell (the unstack of
  the input TFLite's UNPACK reads) and `dynamic_rnn` of an LSTMCell as a TF1
  loop (`disable_control_flow_v2`), int8;
* the TF 2 path (`qat.quantize_model`): a Keras 3 stacked bidirectional LSTM
  (loops) with `return_sequences` and a dense head at every step; a Keras 3
  GRU(unroll=True) under a SimpleRNN loop; a tf_keras LSTM (a function call
  of `standard_lstm` around its loop).
"""
import math
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import keras
import numpy as np
import tensorflow as tf

import qat
from qat import export
from qat.export import freeze
from qat.report import numerics
from qat.report import tf2_models
import recurrent_util
import tf2_util

tf1 = tf.compat.v1
_TRAIN_STEPS = 40
_EXAMPLES = 128  # Test rows compared.


class RecurrentExportMixin(object):

    def assert_steps_within_one_step(self, report, steps_in_names=None,
                                     steps=recurrent_util.STEPS):
        """Every matched row within one step given TFLite's inputs; rows of every step."""
        rows = [r for r in report.rows if not math.isnan(r.max_own_steps)]
        self.assertGreater(len(rows), 20)
        worst = max(rows, key=lambda r: r.max_own_steps)
        self.assertLessEqual(worst.max_own_steps, 1.001, f"{worst.name}: {report.format()}")
        self.assertEqual(report.lost_ranges, [])
        self.assertEqual({r.step for r in rows if r.step is not None}, set(range(steps)),
                         report.format())
        if steps_in_names:  # An unrolled loop names its steps too.
            for k in range(steps):
                self.assertTrue(any(f"{steps_in_names}/step_{k}/" in r.tensor for r in rows),
                                f"no row of step {k}")


class GraphPathTest(RecurrentExportMixin, absltest.TestCase):

    def _export(self, cell, loop, flavours, v1=False):
        if v1:
            tf1.disable_control_flow_v2()
        try:
            checkpoint = recurrent_util.train_tf1(cell, loop, _TRAIN_STEPS, units=8)
            sess = recurrent_util.eval_session(cell, loop, checkpoint, units=8)
        finally:
            if v1:
                tf1.enable_control_flow_v2()
        _, (x, _) = recurrent_util.digit_rows()
        x = x[:_EXAMPLES]
        results = export.export_tflite(["input"], ["output"], tempfile.mkdtemp(), sess=sess,
                                       flavours=flavours, parity_inputs=x,
                                       min_top1_agreement=0.9)
        frozen = freeze.freeze_session(sess, ["output"])
        return {flavour: numerics.layer_numerics(frozen, "input", ["output"], x,
                                                 flavour=flavour, model=result.model)
                for flavour, result in results.items()}

    def test_dynamic_rnn_multi_cell_loop_both_flavours(self):
        for report in self._export("multi", "dynamic", ("uint8", "int8")).values():
            self.assert_steps_within_one_step(report, steps_in_names="net/rnn/while")

    def test_static_rnn_gru_cell(self):
        self.assert_steps_within_one_step(self._export("gru", "static", ("int8",))["int8"])

    def test_tf1_control_flow_loop(self):
        report = self._export("lstm", "dynamic", ("int8",), v1=True)["int8"]
        self.assert_steps_within_one_step(report, steps_in_names="net/rnn/while")


class Tf2PathTest(RecurrentExportMixin, absltest.TestCase):

    def _export(self, model, steps=recurrent_util.STEPS):
        (x, y), (xt, _) = recurrent_util.digit_rows()
        x, xt = x[:, :steps], xt[:, :steps]  # The first rows of each digit.
        qm = qat.quantize_model(model)
        step = tf2_util.adam_step(qm, 3e-3)
        rng = np.random.RandomState(0)
        for _ in range(_TRAIN_STEPS):
            batch = rng.randint(0, len(x), 32)
            step(x[batch], y[batch])
        self.assertEqual(qm.left_float, [])
        xt = xt[:_EXAMPLES]
        result = export.export_model(qm, tempfile.mkdtemp(), parity_inputs=xt,
                                     min_top1_agreement=0.9)
        return tf2_models.layer_numerics_of_model(qm, xt, tflite=result.model)

    def test_keras3_stacked_bidirectional_lstm_loops_per_step_head(self):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4, recurrent_util.FEATURES))  # 4 steps: a smaller graph.
        h = keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True))(inputs)
        h = keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True))(h)
        logits = keras.layers.GlobalAveragePooling1D()(keras.layers.Dense(10)(h))
        report = self._export(keras.Model(inputs, logits), steps=4)
        self.assert_steps_within_one_step(report, steps_in_names="backward_lstm_1/while",
                                          steps=4)

    def test_keras3_unrolled_gru_under_a_simple_rnn_loop(self):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((recurrent_util.STEPS, recurrent_util.FEATURES))
        h = keras.layers.GRU(8, unroll=True, return_sequences=True)(inputs)
        h = keras.layers.SimpleRNN(8)(h)
        report = self._export(keras.Model(inputs, keras.layers.Dense(10)(h)))
        self.assert_steps_within_one_step(report, steps_in_names="simple_rnn_1/while")

    def test_tf_keras_lstm(self):
        import tf_keras  # pylint: disable=g-import-not-at-top
        tf_keras.utils.set_random_seed(0)
        inputs = tf_keras.Input((recurrent_util.STEPS, recurrent_util.FEATURES))
        h = tf_keras.layers.LSTM(8)(inputs)
        report = self._export(tf_keras.Model(inputs, tf_keras.layers.Dense(10)(h)))
        self.assert_steps_within_one_step(report, steps_in_names="while")


class SharedWeightTest(absltest.TestCase):
    """Dense layers reading one weight (a recurrent layer's steps) keep its FakeQuant's scale.

    TF's int8 converter quantizes such a weight per channel again and a bias
    of equal values (a GRU's gate bias as initialized) with one channel's
    scale, unless told to keep dense layers per tensor.
    """

    def _graph(self):
        rng = np.random.RandomState(0)
        weight = rng.uniform(-1, 1, (4, 4)).astype(np.float32)
        weight[:, 3] *= 0.5  # A channel of a smaller range.
        limit = float(np.abs(weight).max())
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="input")
            h = tf.quantization.fake_quant_with_min_max_args(x, 0.0, 1.0)
            w = tf.quantization.fake_quant_with_min_max_args(tf.constant(weight), -limit, limit,
                                                              narrow_range=True)
            for _ in range(2):  # Two steps of one weight and one bias of equal values.
                h = tf.quantization.fake_quant_with_min_max_args(
                    tf.nn.bias_add(tf.matmul(h, w), tf.constant(np.ones(4, np.float32))), -4, 4)
            tf.identity(h, name="output")
        return graph

    def test_both_converters_compute_the_eval_graph(self):
        graph = self._graph()
        x = np.random.RandomState(1).uniform(0, 1, (16, 4)).astype(np.float32)
        with tf1.Session(graph=graph) as sess:
            expected = sess.run("output:0", {"input:0": x})
        graph_def = graph.as_graph_def()
        session_model = export.convert_frozen_graph(graph_def, ["input"], ["output"], "int8")
        function = tf1.wrap_function(
            lambda t: tf.import_graph_def(graph_def, {"input:0": t}, ["output:0"])[0],
            [tf.TensorSpec([None, 4], tf.float32)])
        for model in (session_model, export.convert_function(function)):
            np.testing.assert_allclose(export.run_tflite(model, x), expected, atol=1e-6)


if __name__ == "__main__":
    absltest.main()
