"""What the property suites found (issue #43), each a small graph that failed.

* A static basic RNN cell read by a dense head: the cell's concatenations and
  states form one shared range, whose owner (the last concatenation) is the
  last member with a learned range. The last step's state, a TANH output on
  its fixed grid, joins the group through the step before it, and is computed
  from the owner's quantized value: its statistics in the owner's update made
  the training graph a cycle TensorFlow refuses to run ("Graph is invalid,
  contains a cycle").
* A drop path on the last block of a network without a head: the training
  graph quantizes the block's output (its export name) and the drop path,
  looked through as dropout, reads the quantized value. The converter suite's
  `same_ranges_as_export` walked back from the model output through
  same-scale ops only and reported the drop path's `Mul` without a range (49
  of the training family's 63 violations on eecbd59): it looks through
  dropout as the planner does.
* `tf.nn.zero_fraction` (slim's sparsity summary) of a layer's bias add under
  control flow v2 is a `StatelessIf` of an int64 count reading the bias add,
  which joined the layer's tail (an If may be a tf_keras batch norm's cond)
  and so was never found to be an observer: the ReLU6 after the bias add
  did not fuse, and the training graph's `conv/act_quant` quantized the bias
  add where the eval graph's quantizes the ReLU6. Likewise TF 1's guard of an
  assert (an unread Merge of a cond whose branch ends in the Identity the
  Assert orders: `tf.debugging.assert_*` and the asserts of
  `tf.compat.v1.metrics.auc` under control flow v1) was no observer, nor was
  anything that only it read.
* A model that transposes its input (channels first) before the first layer:
  the int8 converter merges the input's QUANTIZE into the TRANSPOSE, whose
  tensor `qat.export`'s range survival did not look for (the input's range
  reported lost); and where the transposed shape equals the input's (3
  channels, 3x3), `qat.report.layer_numerics` matched the TRANSPOSE's tensor
  ("transpose;input_quant/...") to the input's row (146 steps "off").
"""
import os
import types

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
from qat.export import convert  # pylint: disable=g-import-not-at-top
from tools.property import converter_networks  # pylint: disable=g-import-not-at-top
from tools.property import converter_training_runs  # pylint: disable=g-import-not-at-top
from tools.property import invariants  # pylint: disable=g-import-not-at-top
from tools.property import training_branches  # pylint: disable=g-import-not-at-top
from tools.property import training_loop  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1

_STEPS, _FEATURES, _UNITS, _CLASSES = 3, 4, 2, 3


def _static_rnn_with_head(training: bool):
    """A BasicRNNCell unrolled over 3 steps, its last output read by a dense head.

    Returns:
      (graph, input placeholder, loss or None).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [4, _STEPS, _FEATURES], name="input")
        with tf1.variable_scope("net", use_resource=True):
            cell = tf1.nn.rnn_cell.BasicRNNCell(_UNITS)
            outputs, _ = tf1.nn.static_rnn(cell, tf.unstack(x, axis=1), dtype=tf.float32)
            logits = tf1.layers.dense(outputs[-1], _CLASSES, name="head")
        out = tf.identity(logits, name="output")
        loss = tf.reduce_mean(tf.square(out), name="loss") if training else None
    return graph, x, loss


def _range_variables(graph):
    with graph.as_default():
        return sorted(v.op.name for v in tf1.global_variables()
                      if v.op.name.endswith(("/min", "/max")))


class RecurrentGroupCycleTest(absltest.TestCase):

    def test_training_graph_runs(self):
        graph, x, loss = _static_rnn_with_head(training=True)
        with graph.as_default():
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
            train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                rows = np.random.RandomState(0).uniform(0, 1, (4, _STEPS, _FEATURES))
                for _ in range(2):  # Failed with "Graph is invalid, contains a cycle".
                    _, value = sess.run([train, loss], {x: rows})
        self.assertTrue(np.isfinite(value))

    def test_eval_graph_has_the_training_ranges(self):
        train_graph, _, _ = _static_rnn_with_head(training=True)
        qat.experimental_create_training_graph(train_graph, symmetric_weights=True)
        eval_graph, _, _ = _static_rnn_with_head(training=False)
        qat.experimental_create_eval_graph(eval_graph, symmetric_weights=True)
        self.assertNotEmpty(_range_variables(eval_graph))
        self.assertEqual(_range_variables(train_graph), _range_variables(eval_graph))


def _dropped_output(quantized: bool):
    """relu(x) (through a FakeQuant or not), then NASNet-A's drop path, as the output."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 3], name="input")
        y = tf.nn.relu(x)
        if quantized:
            y = tf.quantization.fake_quant_with_min_max_args(y, 0.0, 6.0)
        keep = tf.constant(0.8)
        mask = tf.floor(keep + tf.random.uniform([4, 1]))
        out = tf.identity(y / keep * mask, name="output")
    return types.SimpleNamespace(graph=graph, input=x, output=out)


class DropPathOutputTest(absltest.TestCase):

    def test_drop_path_after_the_output_range_is_looked_through(self):
        self.assertEqual(invariants.output_range_violations(_dropped_output(True)), [])

    def test_drop_path_of_an_unquantized_output_is_still_found(self):
        problems = invariants.output_range_violations(_dropped_output(False))
        self.assertLen(problems, 1)
        self.assertIn("has no range", problems[0])

    def test_converter_training_run_holds(self):
        """The suite's minimal example: one conv block, no head, a drop path on it."""
        block = converter_networks.ConvBlock("conv", 4, activation="relu")
        run = converter_training_runs.ConverterTrainingRun(
            converter_networks.ConvNet(4, "none", (block,)), training_loop.Regime("sgd_1", 2),
            training_branches.Branches(drop_path="div_mask", drop_block=0))
        self.assertEqual(converter_training_runs.violations(run), {})


def _zero_fraction(t):
    tf1.summary.scalar("sparsity", tf.nn.zero_fraction(t))


def _assert(t):
    tf.debugging.assert_greater_equal(t, tf.reduce_min(t))


def _auc(t):
    flat = tf.reshape(t, [4, -1])
    tf1.metrics.auc(tf.one_hot(tf.zeros([4], tf.int32), int(flat.shape[-1])), tf.sigmoid(flat))


def _observed_conv(observer=None, control_flow_v2: bool = True, tanh: bool = False) -> tf.Graph:
    """conv -> bias -> ReLU6 (or tanh), the bias add (the tanh) watched by `observer`."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 5, 5, 3], name="input")
        y = tf1.layers.conv2d(x, 4, 3, name="conv")
        act = tf.nn.tanh(y) if tanh else tf.nn.relu6(y)
        if observer is not None:
            if not control_flow_v2:
                tf1.disable_control_flow_v2()
            try:
                observer(act if tanh else y)
            finally:
                tf1.enable_control_flow_v2()
        out = tf.identity(act, name="output")
        tf.reduce_mean(tf.square(out), name="loss")
    return graph


def _quantized_tensors(graph):
    return {op.name.rsplit("/", 1)[0]: op.inputs[0].name for op in graph.get_operations()
            if op.type.startswith("FakeQuant") and "weights_quant" not in op.name}


class ObserverOfALayerTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("zero_fraction_v2", _zero_fraction, True, False),
        ("assert_v1", _assert, False, False),
        ("auc_v1", _auc, False, False),
        ("auc_of_tanh_v1", _auc, False, True))
    def test_quantizers_as_unwatched(self, observer, control_flow_v2, tanh):
        self.assertTrue(tf1.control_flow_v2_enabled())
        watched = _observed_conv(observer, control_flow_v2, tanh)
        plain = _observed_conv(tanh=tanh)
        for graph in (watched, plain):
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
        self.assertEqual(_quantized_tensors(watched), _quantized_tensors(plain))
        if not tanh:
            self.assertEqual(_quantized_tensors(watched)["conv/act_quant"], "Relu6:0")


def _transposed_input_eval_graph(size: int):
    """A channels-first input [n, 3, size, size] transposed, then a 1x1 conv and
    ReLU, rewritten for eval with set ranges and frozen."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3, size, size], name="input")
        y = tf1.layers.conv2d(tf.transpose(x, [0, 2, 3, 1]), 2, 1, activation=tf.nn.relu,
                              name="conv")
        tf.identity(y, name="output")
        qat.experimental_create_eval_graph(graph, symmetric_weights=True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for v in tf1.global_variables():
                name = v.op.name
                if name.endswith(("/min", "/max")) and "weights_quant" not in name:
                    low, high = (-1.0, 1.0) if "input_quant" in name else (0.0, 4.0)
                    sess.run(v.assign(low if name.endswith("/min") else high))
            return export.freeze_session(sess, ["output"])


class TransposedInputTest(absltest.TestCase):

    def test_input_range_survives(self):
        frozen = _transposed_input_eval_graph(5)
        for flavour in ("uint8", "int8"):
            model = convert.convert_frozen_graph(frozen, ["input"], ["output"], flavour)
            survival = export.check_ranges(frozen, model, flavour=flavour)
            self.assertEqual([r.describe() for r in survival.lost], [], flavour)

    def test_layer_numerics_match_the_input(self):
        """3 channels of 3x3: the transposed tensor has the input's shape."""
        frozen = _transposed_input_eval_graph(3)
        samples = np.random.RandomState(0).uniform(-1, 1, (8, 3, 3, 3)).astype(np.float32)
        for flavour in ("uint8", "int8"):
            numerics = report.layer_numerics(frozen, "input", ["output"], samples,
                                             flavour=flavour)
            for row in numerics.rows:
                self.assertFalse(row.max_own_steps > 1.0 + 1e-3, f"{flavour}: {row}")
            self.assertIsNotNone(numerics.rows[-1].tflite_tensor)


if __name__ == "__main__":
    absltest.main()
