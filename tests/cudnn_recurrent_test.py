"""cuDNN recurrences (issue #43): quantized as on CPU, or named with what to do.

Keras 3 runs a default LSTM or GRU as one `CudnnRNNV3` op wherever a GPU is
visible while it is traced. Reproduced on CPU as the issue did: Keras's GPU
check (`keras.src.backend.tensorflow.rnn._is_gpu_available`) made true while
the model is traced.

* `qat.quantize_model` traces such layers on their generic path
  (`qat.tf2.recurrent_kernels`): the quantized model holds no cuDNN op,
  exports fully integer, plans the ranges of the CPU trace, trains the
  model's own variables, and leaves the model's `use_cudnn` as it was. On
  eecbd59 its inference function held the `CudnnRNNV3`, with 3 FakeQuant ops
  and an empty `left_float`.
* A graph given to `create_training_graph` / `create_eval_graph` with a cuDNN
  op names it in `left_float`, with what to do (on eecbd59: nothing said).
"""
import os
import sys
import tempfile
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import api  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.engine import config as config_lib  # pylint: disable=g-import-not-at-top
import recurrent_util  # pylint: disable=g-import-not-at-top
import tf2_util  # pylint: disable=g-import-not-at-top

keras = tf2_util.keras()
tf1 = tf.compat.v1
_CUDNN_TYPES = ("CudnnRNN", "CudnnRNNV2", "CudnnRNNV3")
_UNITS = 8


def _gpu_visible_to_keras():
    """Keras 3 sees a GPU while this is active (its cuDNN choice), on any machine."""
    import keras.src.backend.tensorflow.rnn  # pylint: disable=g-import-not-at-top,unused-import
    return mock.patch.object(sys.modules["keras.src.backend.tensorflow.rnn"],
                             "_is_gpu_available", lambda: True)


def _model(kind: str):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((recurrent_util.STEPS, recurrent_util.FEATURES))
    if kind == "bidirectional_lstm":
        h = keras.layers.Bidirectional(keras.layers.LSTM(_UNITS))(inputs)
    else:
        h = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[kind](_UNITS)(inputs)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def _op_types(function) -> set:
    return {op.type for op in function.graph.get_operations()}


def _range_names(qm) -> list:
    return sorted(v.name for v in qm.qat_ranges.ordered)


class KerasCudnnLayerTest(parameterized.TestCase):

    @parameterized.parameters("lstm", "gru", "bidirectional_lstm")
    def test_quantized_as_on_cpu(self, kind):
        model = _model(kind)
        cpu_ranges = _range_names(qat.quantize_model(model))
        signature = [tf.TensorSpec([None, recurrent_util.STEPS, recurrent_util.FEATURES])]
        with _gpu_visible_to_keras():
            float_trace = tf.function(model).get_concrete_function(*signature)
            self.assertTrue(_op_types(float_trace) & set(_CUDNN_TYPES))  # The GPU's trace.
            qm = qat.quantize_model(model)
            (x, y), (xt, _) = recurrent_util.digit_rows()
            kernel = model.trainable_variables[0]
            before = kernel.numpy()
            step = tf2_util.adam_step(qm, 3e-3)
            rng = np.random.RandomState(0)
            for _ in range(20):
                batch = rng.randint(0, len(x), 32)
                step(x[batch], y[batch])
            types = _op_types(qm.inference_function())
            self.assertFalse(types & set(_CUDNN_TYPES))
            self.assertEqual(qm.left_float, [])
            self.assertEqual(_range_names(qm), cpu_ranges)
            # Training trains the model's own weights (on a GPU too).
            self.assertEqual({id(v) for v in qm.trainable_variables},
                             {id(v) for v in model.trainable_variables})
            self.assertFalse(np.array_equal(kernel.numpy(), before))
            # Fully integer (export_model raises otherwise), and matches the eval graph.
            export.export_model(qm, tempfile.mkdtemp(), parity_inputs=xt[:64],
                                min_top1_agreement=0.9)
        for layer in model._flatten_layers():  # pylint: disable=protected-access
            if hasattr(layer, "use_cudnn"):
                self.assertEqual(layer.use_cudnn, "auto")


def _cudnn_lstm_graph(training: bool) -> tf.Graph:
    """A cuDNN LSTM (as Keras 3 builds it on a GPU machine) read by a dense head."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, recurrent_util.STEPS, recurrent_util.FEATURES],
                            name="input")
        with tf1.variable_scope("net"):
            params = tf1.get_variable(
                "cudnn_params", [4 * _UNITS * (recurrent_util.FEATURES + _UNITS + 2)])
            zeros = tf.zeros([1, 4, _UNITS])
            outputs, _, _, _, _ = tf.raw_ops.CudnnRNNV3(
                input=tf.transpose(x, [1, 0, 2]), input_h=zeros, input_c=zeros, params=params,
                sequence_lengths=tf.fill([4], recurrent_util.STEPS), rnn_mode="lstm",
                is_training=training, time_major=True, name="lstm")
            logits = tf1.layers.dense(outputs[-1], 10, name="logits")
        out = tf.identity(logits, name="output")
        if training:
            tf.reduce_mean(tf.square(out), name="loss")
    return graph


class GraphCudnnOpTest(parameterized.TestCase):

    @parameterized.parameters(True, False)
    def test_named_in_left_float(self, training):
        graph = _cudnn_lstm_graph(training)
        result = api.rewrite_graph(graph, config_lib.RewriteConfig(
            is_training=training, symmetric_weights=True))
        left = {item.name: item.reason for item in result.quantize.left_float}
        self.assertIn("net/lstm", left)
        self.assertIn("cuDNN", left["net/lstm"])
        self.assertIn("use_cudnn=False", left["net/lstm"])


if __name__ == "__main__":
    absltest.main()
