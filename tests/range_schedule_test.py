"""The activation range rule of training graphs: the bias-corrected moving average.

With the quantization step t, a moving-average range is updated at rate
(1 - decay) / (1 - decay^t): after t steps it is the average of the batch
ranges weighted by decay^(t - i), whatever the initial [-6, 6]. These tests
compute that average independently (as the weighted mean, not the
recursion), check that no variable is added, that `quant_delay` still
switches, and that QAT from scratch (quant_delay=0) of a small BERT-style
encoder reaches its float accuracy.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.engine import marks  # pylint: disable=g-import-not-at-top
from qat.engine import step_counter  # pylint: disable=g-import-not-at-top
from qat.quantize.emit import quantizer_batch  # pylint: disable=g-import-not-at-top
from tools import _text_models  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
tf1.disable_eager_execution()


def _weighted_mean(values, decay):
    """The bias-corrected moving average of `values`, as a weighted mean."""
    t = len(values)
    weights = np.array([decay ** (t - 1 - i) for i in range(t)], np.float64)
    return float(np.dot(weights, values) / weights.sum())


def _growing_batches(steps, seed=0):
    """Batches whose range grows tenfold, as logits do early in training."""
    rng = np.random.RandomState(seed)
    return [rng.uniform(-0.1, 0.1, [16]) * (1.0 + 9.0 * i / steps) + 0.02 * i / steps
            for i in range(steps)]


def _quantizer_graph(decay, quant_delay=0):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [16], name="x")
        batch = quantizer_batch.QuantizerBatch(graph)
        step = step_counter.get_or_create_quantization_step(graph)
        batch.add(quantizer_batch.QuantizerSpec(
            x, "net/act_quant", moving_average=True, ema_decay=decay,
            init_from_first_batch=True, quant_delay=quant_delay), step)
        y = batch.build()[0]
    return graph, x, y


def _variable(graph, name):
    found = [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
             if v.op.name == name]
    assert len(found) == 1, name
    return found[0]


class RangeScheduleTest(parameterized.TestCase):

    @parameterized.parameters(0.9, 0.99, 0.999, 1.0)
    def test_range_is_the_weighted_mean_of_the_batch_ranges(self, decay):
        steps = 40
        graph, x, _ = _quantizer_graph(decay)
        batches = _growing_batches(steps)
        lo_var = _variable(graph, "net/act_quant/min")
        hi_var = _variable(graph, "net/act_quant/max")
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got = []
            for data in batches:
                sess.run("net/act_quant/FakeQuantWithMinMaxVars:0", {x: data})
                got.append(sess.run([lo_var, hi_var]))
        # The batch range, widened to include 0 (TFLite's requirement).
        lows = [min(b.min(), 0.0) for b in batches]
        highs = [max(b.max(), 0.0) for b in batches]
        for t in (1, 2, 10, steps):
            np.testing.assert_allclose(
                got[t - 1], [_weighted_mean(lows[:t], decay), _weighted_mean(highs[:t], decay)],
                rtol=2e-5, err_msg=f"step {t}")
        # The plain moving average from the first batch (the rule this one
        # replaces) stays near the first batches' range when decay is 0.999.
        if decay == 0.999:
            plain = highs[0]
            for value in highs[1:]:
                plain -= (1.0 - decay) * (plain - value)
            self.assertLess(plain, 0.6 * got[-1][1])

    def test_no_variable_is_added(self):
        graph, _, _ = _quantizer_graph(0.999)
        names = sorted(v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))
        # The rate needs no variable: the range's own, and its count of
        # skipped (non-finite) batches.
        self.assertEqual(names, ["fake_quantization_step", "net/act_quant/max",
                                 "net/act_quant/min", "net/act_quant/skipped_batches"])

    def test_quant_delay_switches_and_the_range_learns_meanwhile(self):
        graph, x, y = _quantizer_graph(0.999, quant_delay=3)
        batches = _growing_batches(5, seed=1)
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            outs = [sess.run(y, {x: data}) for data in batches]
            hi = sess.run(_variable(graph, "net/act_quant/max"))
        np.testing.assert_array_equal(outs[0], batches[0].astype(np.float32))
        np.testing.assert_array_equal(outs[1], batches[1].astype(np.float32))
        self.assertFalse(np.array_equal(outs[2], batches[2].astype(np.float32)))
        np.testing.assert_allclose(hi, _weighted_mean([b.max() for b in batches], 0.999),
                                   rtol=2e-5)


def _range_variables(graph):
    """{quantizer scope: (min variable, max variable)} of qat's ranges."""
    found = {}
    for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES):
        scope, _, end = v.op.name.rpartition("/")
        if end in ("min", "max") and marks.made_by_qat(v.op, marks.QUANTIZER):
            found.setdefault(scope, {})[end] = v
    return {scope: (ends["min"], ends["max"]) for scope, ends in found.items()}


class OverlappingRunsTest(parameterized.TestCase):
    """Two session runs that read the ranges before either writes them.

    research/slim's Supervisor runs the summary op in a thread beside the
    training step, and both run the model, so both update its ranges. Here
    the second run is fed, at each range's reads that no update precedes,
    the values the first run read: the interleaving where both read before
    either writes, made deterministic, at steps 1 and 2 where the
    bias-corrected rates are 1 and 1 / (1 + decay). Each range must still
    hold 0 and the model stay finite (a ReLU mean's range was [3.0, 3.0],
    then the logits' NaN).
    """

    @parameterized.parameters(False, True)
    def test_ranges_hold_zero_and_the_model_stays_finite(self, use_resource):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
            with tf1.variable_scope("net", use_resource=use_resource):
                y = tf1.layers.conv2d(x, 4, 3, padding="same", activation=tf.nn.relu,
                                      name="conv")
                # A global pool of a ReLU: its range starts at [-6, 6] and
                # its batches are nonnegative, as ResNet's.
                y = tf.reduce_mean(y, [1, 2], keepdims=True, name="pool")
                logits = tf.squeeze(tf1.layers.conv2d(y, 5, 1, name="logits"), [1, 2])
            loss = tf.reduce_mean(tf.square(logits))
            qat.create_training_graph(graph, quant_delay=0)
        ranges = _range_variables(graph)
        self.assertIn("net/mean_quant", ranges)
        variables = {v.op: v for pair in ranges.values() for v in pair}
        reads = {op.outputs[0]: variables[op.inputs[0].op] for op in graph.get_operations()
                 if op.type in ("Snapshot", "Identity", "ReadVariableOp")
                 and op.inputs[0].op in variables and not op.control_inputs}
        rng = np.random.RandomState(0)
        batches = [rng.uniform(0.0, 0.1, [2, 8, 8, 3]).astype(np.float32) for _ in range(3)]
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            first_read = dict(zip(reads, sess.run(list(reads.values()))))
            sess.run(loss, {x: batches[0]})
            sess.run(loss, {x: batches[1], **first_read})
            for scope, (lo, hi) in sess.run(ranges).items():
                self.assertTrue(np.all(lo <= 0.0) and np.all(hi >= 0.0) and np.all(hi > lo),
                                f"{scope}: [{lo}, {hi}]")
            self.assertTrue(np.isfinite(sess.run(loss, {x: batches[2]})))


class FromScratchTest(absltest.TestCase):
    """QAT with quant_delay=0 learns what float training learns, in as many steps."""

    CFG = _text_models.TextConfig(vocab=100, seq=16, hidden=32, heads=2, ffn=64, blocks=1,
                                  dropout=0.0)
    # Float training is at 99 % or more from step 25; QAT from scratch of this small
    # encoder reached 100 % by step 125 (the 4-block encoder of issue #26: by step 50); with
    # the attention probabilities and the pooler's tanh on TFLite's fixed grids
    # (qat/quantize/plan/ranges/fixed_ranges.py) 96.7 % at step 150, 100 % at step 200.
    STEPS = 200

    def _accuracy(self, quantize):
        train_ids, train_labels = _text_models.token_task(self.STEPS * 32, self.CFG, seed=1)
        test_ids, test_labels = _text_models.token_task(512, self.CFG, seed=2)
        graph, ids, _, logits = _text_models.build_graph("bert_nn", True, self.CFG)
        with graph.as_default():
            labels = tf1.placeholder(tf.int64, [None])
            loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
            if quantize:
                qat.experimental_create_training_graph(graph, symmetric_weights=True)
            train_op = tf1.train.AdamOptimizer(3e-3).minimize(loss)
            saver = tf1.train.Saver()
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                for i in range(0, self.STEPS * 32, 32):
                    sess.run(train_op, {ids: train_ids[i:i + 32],
                                        labels: train_labels[i:i + 32]})
                path = saver.save(sess, os.path.join(tempfile.mkdtemp(), "m"))
        # Accuracy of the eval graph (the ranges frozen, as TFLite uses them).
        graph, ids, _, logits = _text_models.build_graph("bert_nn", False, self.CFG)
        with graph.as_default():
            if quantize:
                qat.experimental_create_eval_graph(graph, symmetric_weights=True)
            saver = tf1.train.Saver()
            with tf1.Session() as sess:
                saver.restore(sess, path)
                predicted = sess.run(logits, {ids: test_ids}).argmax(1)
        return float(np.mean(predicted == test_labels))

    def test_qat_from_scratch_reaches_float_accuracy(self):
        float_accuracy = self._accuracy(quantize=False)
        self.assertGreater(float_accuracy, 0.95)
        self.assertGreaterEqual(self._accuracy(quantize=True), float_accuracy - 0.01)


if __name__ == "__main__":
    absltest.main()
