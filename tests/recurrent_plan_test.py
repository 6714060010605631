"""Recurrent layers: every cell tensor gets a range, the steps share them, loops unroll.

Issue #38. The planner's recurrence rule (`qat.quantize.plan.model.recurrences`) and
the loop unroller (`qat.prepare.loops`) on TF1 cells, planned only (no
training, no conversion: `recurrent_export_test.py` converts):

* every tensor of the recurrence TFLite computes has a range, nothing is
  left float, for LSTMCell, BasicLSTMCell, GRUCell, BasicRNNCell and
  MultiRNNCell with `static_rnn`, `dynamic_rnn` (a While loop) and
  `dynamic_rnn` with TF1 control flow (Enter / Exit);
* the steps of a cell share one range per cell value: the range variables
  are the same for 3 steps and for 5, and for the unrolled and the loop
  forms of one model (so is the checkpoint);
* a zero initial state is quantized on its value (the converter keeps the
  FILL of the batch size);
* a loop of unknown length is refused, naming it and the fix, and the graph
  is unchanged;
* the training graph's checkpoint restores strictly into the eval graph.
"""
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from qat import api
from qat.engine import config as config_lib
from qat.prepare import loops
import recurrent_util

tf1 = tf.compat.v1
CELLS = ("lstm", "basic_lstm", "gru", "rnn", "multi")


def _rewritten(cell, loop, steps=3, is_training=False, control_flow_v1=False):
    """(graph, rewrite result, session with initialised variables)."""
    if control_flow_v1:
        tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            rows = tf1.placeholder(tf.float32, [None, steps, recurrent_util.FEATURES],
                                   name="input")
            logits = recurrent_util.tf1_model(rows, cell, loop, units=4)
            if is_training:
                labels = tf1.placeholder(tf.int32, [None])
                tf1.losses.sparse_softmax_cross_entropy(labels, logits)
            result = api.rewrite_graph(graph, config_lib.RewriteConfig(
                is_training=is_training, symmetric_weights=True))
            sess = tf1.Session(graph=graph)
            sess.run(tf1.global_variables_initializer())
    finally:
        if control_flow_v1:
            tf1.enable_control_flow_v2()
    return graph, result, sess


def _range_variables(graph):
    return sorted(v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                  if v.op.name.endswith(("/min", "/max")))


class CellPlanTest(parameterized.TestCase):

    @parameterized.product(cell=CELLS, loop=("static", "dynamic", "dynamic_v1"))
    def test_every_cell_tensor_has_a_range(self, cell, loop):
        graph, result, sess = _rewritten(cell, loop.split("_")[0],
                                         control_flow_v1=loop.endswith("v1"))
        self.assertEqual([f"{x.name}: {x.reason}" for x in result.quantize.left_float], [])
        # No op of the cell reads a float tensor of the model raw: every Mul,
        # Add, Sub, concatenation, matmul and gate reads a FakeQuant, a
        # fixed-range op, a same-scale op of one, or a constant.
        quantized = {q.output for q in result.quantize.quantizers}
        live = _live_ops(graph, "output")
        for op in live:
            if op.type not in ("Mul", "AddV2", "Sub", "ConcatV2", "MatMul", "Sigmoid",
                               "Tanh", "Pack"):
                continue
            for t in op.inputs:
                if t.dtype == tf.float32 and t.op in live:
                    self.assertTrue(_reads_range(t, quantized),
                                    f"{op.name} ({op.type}) reads {t.name} without a range")
        x = np.random.RandomState(0).uniform(0, 1, (3, 3, recurrent_util.FEATURES))
        self.assertTrue(np.all(np.isfinite(sess.run("output:0", {"input:0": x}))))

    def test_no_loop_is_left_in_the_computation(self):
        for v1 in (False, True):
            graph, _, _ = _rewritten("lstm", "dynamic", control_flow_v1=v1)
            live = _live_ops(graph, "output")
            self.assertEqual([op.name for op in live if op.type in (
                "While", "StatelessWhile", "Enter", "Exit", "TensorListStack",
                "TensorArrayGatherV3")], [])


def _live_ops(graph, output):
    """The ops `output` is computed from."""
    stack, seen = [graph.get_operation_by_name(output)], set()
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(i.op for i in op.inputs)
    return seen


_SAME_SCALE = ("Identity", "StridedSlice", "Split", "Unpack", "Transpose", "Reshape", "Pack",
               "ConcatV2", "Fill")


def _reads_range(t, quantized):
    """Whether `t` is a FakeQuant's output, a gate's, a constant, or a
    same-scale op of those (a Fill of a quantized value)."""
    for _ in range(100):
        if t in quantized or t.op.type.startswith("FakeQuant"):
            return True
        if t.op.type in ("Sigmoid", "Tanh", "Const"):
            return True
        if t.op.type not in _SAME_SCALE:
            return False
        t = t.op.inputs[1 if t.op.type in ("Split", "Fill") else 0]
    return False


class SharedStepsTest(parameterized.TestCase):

    def test_range_variables_do_not_depend_on_the_number_of_steps(self):
        for cell in ("lstm", "gru"):
            three = _range_variables(_rewritten(cell, "static", steps=3)[0])
            five = _range_variables(_rewritten(cell, "static", steps=5)[0])
            self.assertEqual(three, five)
            looped = _range_variables(_rewritten(cell, "dynamic", steps=5)[0])
            self.assertEqual(looped, _range_variables(
                _rewritten(cell, "dynamic", steps=3, control_flow_v1=True)[0]))

    def test_a_state_written_and_read_is_one_range(self):
        graph, result, _ = _rewritten("lstm", "static", steps=4)
        by_op = {q.tensor.op.name: q for q in result.quantize.quantizers}
        # The cell state c = f * c + i * g of each step (AddV2 add_1, add_3,
        # ...), its products and the zero initial state: one range each.
        cell_state = {by_op[n].range_name for n in by_op if n.startswith("net/rnn/lstm_cell/add_")
                      and int(n.rsplit("_", 1)[1]) % 2 == 1}
        self.assertLen(cell_state, 1)
        zero = [q for q in result.quantize.quantizers if q.kind == "fill_quant"]
        self.assertLen(zero, 2)  # The cell and hidden states, quantized on their values.
        for q in zero:
            self.assertEqual(q.tensor.op.type, "Const")
            self.assertIn(q.range_name, {r.range_name for r in result.quantize.quantizers
                                         if r.kind != "fill_quant"})

    def test_training_checkpoint_restores_strictly_into_the_eval_graph(self):
        for loop in ("static", "dynamic"):
            train_graph, _, train_sess = _rewritten("gru", loop, is_training=True)
            with train_graph.as_default():
                path = tf1.train.Saver().save(train_sess, os.path.join(tempfile.mkdtemp(),
                                                                       "model"))
            eval_graph, _, eval_sess = _rewritten("gru", loop)
            with eval_graph.as_default():
                tf1.train.Saver().restore(eval_sess, path)  # Strict: every variable.
            self.assertEqual(_range_variables(train_graph), _range_variables(eval_graph))


class RefusalTest(absltest.TestCase):

    def test_a_loop_of_unknown_length_is_refused_and_the_graph_unchanged(self):
        graph = tf.Graph()
        with graph.as_default():
            rows = tf1.placeholder(tf.float32, [None, None, recurrent_util.FEATURES],
                                   name="input")
            recurrent_util.tf1_model(rows, "lstm", "dynamic", units=4)
            before = graph.as_graph_def()
            with self.assertRaisesRegex(loops.UnknownStepsError,
                                        r"net/rnn/while.*lstm_cell/MatMul.*static sequence length"):
                api.rewrite_graph(graph, config_lib.RewriteConfig(is_training=False))
        self.assertEqual(graph.as_graph_def(), before)

    def test_a_keras_loop_of_unknown_length_is_refused(self):
        import keras  # pylint: disable=g-import-not-at-top
        import qat  # pylint: disable=g-import-not-at-top
        inputs = keras.Input((None, recurrent_util.FEATURES))
        model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.LSTM(4)(inputs)))
        with self.assertRaisesRegex(loops.UnknownStepsError,
                                    r"lstm.*/while.*lstm_cell.*/MatMul.*static sequence length"):
            qat.quantize_model(model)


if __name__ == "__main__":
    absltest.main()
