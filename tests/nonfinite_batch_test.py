"""One bad batch does not end training (issue #37, item 4).

A batch whose min or max is NaN or infinite leaves every range as it was
(moving average, last value, kernel floors, a concatenation's group, per
channel), the FakeQuant of that step reads the unchanged range, the range's
`<prefix>/skipped_batches` counts the batch, and the first finite batch after
skipped ones still sets a new range with its full weight. End to end, on the
digits: a NaN and an infinite batch fed mid-training through the training
graph's loss alone and through a full train step (an optimizer that skips
non-finite gradients), then training goes on; the checkpoint restores strictly
into an eval graph built apart, and exports. The TF 2 path: `quantize_model`
with Keras's `LossScaleOptimizer`, its train step compiled by XLA.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
from qat.engine import step_counter  # pylint: disable=g-import-not-at-top
from qat.quantize.emit import quantizer_batch  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1

import digits_util  # pylint: disable=g-import-not-at-top
import tf2_util  # pylint: disable=g-import-not-at-top

_NAN, _INF = float("nan"), float("inf")
_DECAY = 0.999
_STEPS = 30  # Before the bad batches, and after them.
_INPUT_RANGE = "digits/conv1/input_quant"


def _variables(graph):
    return {v.op.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}


class QuantizerTest(parameterized.TestCase, tf.test.TestCase):
    """One quantizer fed batches, some not finite."""

    def _run(self, batches, shape=(4,), per_channel=False, moving_average=True,
             symmetric=False, nonnegative=False, group=None):
        """[(min, max, skipped, FakeQuant output)] after each batch."""
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, shape, name="x")
            t = tf.nn.relu(x) if nonnegative else x
            member = tf1.placeholder(tf.float32, shape, name="member")
            batch = quantizer_batch.QuantizerBatch(graph)
            step = step_counter.get_or_create_quantization_step(graph)
            batch.add(quantizer_batch.QuantizerSpec(
                t, "net/quant", moving_average=moving_average, per_channel=per_channel,
                symmetric=symmetric, nonnegative=nonnegative, init_from_first_batch=True,
                ema_decay=_DECAY, statistics_of=(member,) if group is not None else ()), step)
            y = batch.build()[0]
            variables = _variables(graph)
            fetches = [variables["net/quant/" + n] for n in ("min", "max", "skipped_batches")]
            out = []
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                for k, values in enumerate(batches):
                    feed = {x: values}
                    if group is not None:
                        feed[member] = group[k]
                    result = sess.run(y, feed)
                    out.append(tuple(sess.run(fetches)) + (result,))
        return out

    @parameterized.product(bad=(_NAN, _INF, -_INF), symmetric=(False, True),
                           nonnegative=(False, True))
    def test_moving_average_as_if_never_fed(self, bad, symmetric, nonnegative):
        first, second = [-1.0, 0.5, 2.0, 1.0], [-3.0, 0.0, 4.0, 1.0]
        settings = dict(symmetric=symmetric, nonnegative=nonnegative)
        runs = self._run([first, [1.0, bad, -1.0, 0.0], second], **settings)
        if bad == -_INF and nonnegative:  # relu(-inf) = 0: a finite batch.
            self.assertEqual([r[2] for r in runs], [0, 0, 0])
            return
        self.assertEqual([r[2] for r in runs], [0, 1, 1])
        self.assertEqual(runs[1][:2], runs[0][:2])  # Bit for bit.
        # The FakeQuant of the skipped step read the kept range.
        out = runs[1][3]
        lo, hi = runs[0][:2]
        self.assertTrue(np.all(out[np.isfinite(out)] >= lo - 1e-6))
        self.assertTrue(np.all(out[np.isfinite(out)] <= hi + 1e-6))
        # Then the range learns as if the bad batch had never been fed (the
        # bias correction counts the batches it learned from).
        self.assertEqual(runs[2][:2], self._run([first, second], **settings)[1][:2])

    def test_first_finite_batch_gets_full_weight(self):
        # Two skipped batches first: the range reads its initial value, then
        # the first finite batch sets it exactly (rate 1), the next averages.
        runs = self._run([[_NAN] * 4, [0.0, _INF, 1.0, 2.0],
                          [-1.0, 0.5, 2.0, 1.0], [-3.0, 0.0, 4.0, 1.0]])
        self.assertEqual([r[2] for r in runs], [1, 2, 2, 2])
        self.assertEqual(runs[0][:2], (-6.0, 6.0))
        self.assertEqual(runs[1][:2], (-6.0, 6.0))
        self.assertEqual(runs[2][:2], (-1.0, 2.0))
        rate = (1 - _DECAY) / (1 - _DECAY ** 2)
        self.assertAllClose(runs[3][:2], (-1.0 - rate * (-1.0 + 3.0), 2.0 - rate * (2.0 - 4.0)),
                            rtol=1e-5)  # The rate in float32.

    @parameterized.parameters(True, False)
    def test_a_range_too_wide_for_float32(self, moving_average):
        # Finite values whose range's width overflows: skipped as well.
        runs = self._run([[-1.0, 0.5, 2.0, 1.0], [-3e38, 0.0, 3e38, 1.0]],
                         moving_average=moving_average)
        self.assertEqual([r[2] for r in runs], [0, 1])
        self.assertEqual(runs[1][:2], runs[0][:2])

    @parameterized.parameters(_NAN, _INF)
    def test_last_value_per_channel(self, bad):
        # A weight of one channel not finite (training diverged): the whole
        # range keeps its value.
        good = np.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 1.0]], np.float32)
        worse = good.copy()
        worse[1, 0] = bad
        runs = self._run([good, worse * 2, good * 3], shape=(3, 2), per_channel=True,
                         moving_average=False, symmetric=True)
        self.assertEqual([r[2] for r in runs], [0, 1, 1])
        self.assertAllEqual(runs[1][0], runs[0][0])
        self.assertAllEqual(runs[1][1], runs[0][1])
        self.assertAllClose(runs[2][1], runs[0][1] * 3)
        self.assertTrue(np.all(np.isfinite(runs[1][3][:, 1])))  # Finite weights quantized.

    def test_concatenation_group(self):
        # A member of the group not finite: the group's one range is kept.
        a = [[-1.0, 0.5, 2.0, 1.0], [-1.0, 0.5, 2.0, 1.0]]
        b = [[0.0, 1.0, 3.0, 1.0], [0.0, _INF, 3.0, 1.0]]
        runs = self._run(a, group=b)
        self.assertEqual([r[2] for r in runs], [0, 1])
        self.assertEqual(runs[1][:2], runs[0][:2])
        self.assertEqual(runs[0][:2], (-1.0, 3.0))


class KernelFloorTest(tf.test.TestCase):
    """A kernel floor computed from a non-finite value does not widen a range."""

    def test_bias_floor_of_an_infinite_bias(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            w = tf1.get_variable("dense/kernel", initializer=tf.ones([4, 3]) * 0.5)
            b = tf1.get_variable("dense/bias", initializer=tf.zeros([3]))
            tf.identity(tf.nn.bias_add(tf.matmul(x, w), b), name="output")
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
            fake_quants = [op for op in graph.get_operations()
                           if op.type == "FakeQuantWithMinMaxVars"]
            variables = _variables(graph)
            ranges = {n: v for n, v in variables.items() if n.endswith(("/min", "/max"))}
            counters = {n: v for n, v in variables.items() if n.endswith("/skipped_batches")}
            data = np.random.RandomState(0).uniform(-1, 1, [8, 4]).astype(np.float32)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                sess.run(fake_quants, {x: data})
                before = sess.run(ranges)
                sess.run(b.assign([1.0, _INF, 0.0]))
                sess.run(fake_quants, {x: data})
                after, counts = sess.run(ranges), sess.run(counters)
                with self.assertLogs(level="WARNING") as logs:
                    read = report.read_skipped_batches(sess=sess)
        self.assertEqual(read, {n.rsplit("/", 1)[0]: c for n, c in counts.items()})
        self.assertIn("the range MatMul/input_quant (of x:0) skipped 1 training batch whose",
                      "\n".join(r.getMessage() for r in logs.records))
        self.assertTrue(all(np.all(np.isfinite(v)) for v in after.values()), after)
        # The input's range has the int32-bias floor, read from the bias: an
        # infinite floor, so the batch is skipped; so is the output's (inf).
        self.assertEqual(counts, {"MatMul/input_quant/skipped_batches": 1,
                                  "act_quant/skipped_batches": 1,
                                  "weights_quant/skipped_batches": 0})
        for name in ("MatMul/input_quant/max", "act_quant/max"):
            self.assertEqual(after[name], before[name])


def _bad(images, value):
    """`images` with one pixel of the first image set to `value`."""
    bad = images.copy()
    bad[0, 3, 3, 0] = value
    return bad


def _digits_model(training):
    """The README's net (conv, batch norm, ReLU, dense): (images, logits)."""
    images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
    net = tf1.layers.conv2d(images, 16, 3, padding="same", use_bias=False, name="digits/conv1")
    net = tf.nn.relu(tf1.layers.batch_normalization(net, training=training,
                                                   name="digits/conv1/bn"))
    logits = tf1.layers.dense(tf1.layers.flatten(net), 10, name="digits/logits")
    return images, tf.identity(logits, name="output")


class GraphTrainingTest(tf.test.TestCase):
    """The graph path: a NaN and an infinite batch mid-training, then on."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (x, y), cls._test_data = digits_util.digits_split()
        cls._dir = tempfile.mkdtemp()
        rng = np.random.RandomState(0)
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(0)
            images, logits = _digits_model(training=True)
            labels = tf1.placeholder(tf.int64, [None])
            loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
            # An optimizer that skips a step whose gradients are not finite
            # (mixed precision's); batch norm's updates run with the step.
            optimizer = tf1.train.experimental.MixedPrecisionLossScaleOptimizer(
                tf1.train.AdamOptimizer(1e-2), "dynamic")
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train_op = optimizer.minimize(loss)
            summary = report.add_range_summaries(graph, weight_histograms=False)
            variables = _variables(graph)
            ranges = {n: v for n, v in variables.items() if n.endswith(("/min", "/max"))}
            counters = {n: v for n, v in variables.items() if n.endswith("/skipped_batches")}
            cls._counter_names = sorted(counters)
            cls._losses, cls._after_bad = [], []
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())

                def train(n):
                    for _ in range(n):
                        batch = rng.randint(0, len(y), 32)
                        cls._losses.append(sess.run([train_op, loss],
                                                    {images: x[batch], labels: y[batch]})[1])

                train(_STEPS)
                batch = rng.randint(0, len(y), 32)
                for how, fetch in (("loss", loss), ("step", train_op)):
                    for value in (_NAN, _INF):
                        before = sess.run(ranges)
                        sess.run(fetch, {images: _bad(x[batch], value), labels: y[batch]})
                        cls._after_bad.append((how, value, before, sess.run(ranges),
                                               sess.run(counters), sess.run(variables)))
                train(_STEPS)
                cls._summary = tf1.Summary.FromString(sess.run(summary))
                cls._counts = sess.run(counters)
                cls._checkpoint = tf1.train.Saver().save(sess, os.path.join(cls._dir, "qat"))
                # A checkpoint as qat wrote it before the counters existed.
                cls._old_checkpoint = tf1.train.Saver(
                    [v for n, v in variables.items() if n not in counters]).save(
                        sess, os.path.join(cls._dir, "old"))

    def test_bad_batches_leave_every_range_finite_and_are_counted(self):
        seen = 0
        for how, value, before, after, counts, values in self._after_bad:
            what = f"{value} batch through the {how}"
            for name, v in values.items():
                self.assertTrue(np.all(np.isfinite(v)), f"{name} after a {what}")
            # The input range saw the bad value: kept bit for bit, counted.
            for end in ("/min", "/max"):
                self.assertEqual(after[_INPUT_RANGE + end], before[_INPUT_RANGE + end], what)
            seen += 1
            self.assertEqual(counts[_INPUT_RANGE + "/skipped_batches"], seen, what)

    def test_training_goes_on(self):
        after = self._losses[_STEPS:]
        self.assertLen(after, _STEPS)
        self.assertTrue(np.all(np.isfinite(after)), after)
        self.assertLess(np.mean(after[-10:]), np.mean(self._losses[_STEPS - 10:_STEPS]))

    def test_summaries_show_the_counts(self):
        scalars = {v.tag: v.simple_value for v in self._summary.value}
        for name in self._counter_names:
            self.assertEqual(scalars[name], self._counts[name], name)
        self.assertEqual(scalars[_INPUT_RANGE + "/skipped_batches"], 4)

    def test_strict_restore_export_and_report(self):
        x, y = self._test_data
        graph = tf.Graph()
        with graph.as_default():
            images, logits = _digits_model(training=False)
            qat.experimental_create_eval_graph(graph, symmetric_weights=True)
            # The counters are the training graph's: an eval graph restores
            # checkpoints written with or without them.
            names = set(_variables(graph))
            self.assertEmpty([n for n in names if n.endswith("/skipped_batches")])
            sess = tf1.Session(graph=graph)
            tf1.train.Saver().restore(sess, self._old_checkpoint)
            tf1.train.Saver().restore(sess, self._checkpoint)
            for name, value in sess.run(_variables(graph)).items():
                self.assertTrue(np.all(np.isfinite(value)), name)
            accuracy = np.mean(np.argmax(sess.run(logits, {images: x}), 1) == y)
            self.assertGreater(accuracy, 0.85)
        with sess:
            exported = export.export_tflite(
                ["images"], ["output"], os.path.join(self._dir, "export"), sess=sess,
                flavours=("int8",), default_input_range=(0.0, 1.0), parity_inputs=x,
                min_top1_agreement=0.97)["int8"]
        self.assertTrue(os.path.exists(exported.path))
        # The coverage report reads the counts from the checkpoint and warns
        # once, naming the range and its tensor.
        with self.assertLogs(level="WARNING") as logs:
            coverage = report.coverage_report(graph, outputs=["output"],
                                              checkpoint=self._checkpoint)
        warnings = [r.getMessage() for r in logs.records if "skipped" in r.getMessage()]
        # The input range skips every bad batch. Whether its FakeQuant passes a
        # NaN on, so that later ranges skip it too, differs between machines
        # (TensorFlow's kernel passes it on some CPUs and clamps it on others):
        # the later ranges' warnings are counted from the counters.
        skipping = sorted(n.rsplit("/", 1)[0] for n, c in self._counts.items() if c)
        self.assertLen(warnings, len(skipping), warnings)
        self.assertIn(_INPUT_RANGE, skipping)
        self.assertTrue(any(f"{_INPUT_RANGE} (of images:0) skipped 4 training batches" in w
                            for w in warnings), warnings)
        counted = {q.name: q.skipped_batches for q in coverage.quantizers}
        self.assertEqual(counted[_INPUT_RANGE], 4)
        self.assertIn(f"{_INPUT_RANGE}: 4", "\n".join(coverage.summary_lines()))
        with self.assertNoLogs(level="WARNING"):
            report.coverage_report(graph, outputs=["output"], checkpoint=self._checkpoint)
            from_checkpoint = report.read_skipped_batches(checkpoint=self._checkpoint)
        self.assertEqual(from_checkpoint, {n.rsplit("/", 1)[0]: c for n, c in self._counts.items()})
        self.assertEqual(report.read_skipped_batches(checkpoint=self._old_checkpoint), {})


class QuantizeModelTest(tf.test.TestCase):
    """The TF 2 path: Keras's LossScaleOptimizer skips the NaN batch's step."""

    def test_bad_batches_then_training_goes_on(self):
        keras = tf2_util.keras()
        (x, y), _ = digits_util.digits_split()
        keras.utils.set_random_seed(0)
        model = tf2_util.functional_cnn(softmax=True)
        qm = qat.quantize_model(model)
        # The counters are statistics, not Keras weights: weight files keep
        # their layout.
        self.assertLen(qm.weights, len(model.weights) + len(qm.qat_ranges.ordered))
        self.assertNotEmpty(qm.qat_statistics.ordered)
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
        loss_fn = keras.losses.SparseCategoricalCrossentropy()

        @tf.function
        def step(images, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, qm(images, training=True))
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, qm.trainable_variables)
            optimizer.apply_gradients(zip(grads, qm.trainable_variables))
            return loss

        rng = np.random.RandomState(0)
        losses = []

        def train(n):
            for _ in range(n):
                batch = rng.randint(0, len(y), 32)
                losses.append(float(step(x[batch], y[batch])))

        def finite(variables):
            return all(np.all(np.isfinite(v.numpy())) for v in variables)

        train(_STEPS)
        batch = rng.randint(0, len(y), 32)
        applied = int(optimizer.iterations.numpy())
        step(_bad(x[batch], _NAN), y[batch])
        self.assertEqual(int(optimizer.iterations.numpy()), applied)  # Skipped.
        step(_bad(x[batch], _INF), y[batch])
        self.assertTrue(finite(qm.qat_ranges.ordered))
        self.assertTrue(finite(model.variables))  # Batch norm's moving statistics too.
        # The training function compiles under XLA (where a reduction may
        # ignore NaN values: the range then learns the finite ones).
        forward = tf.function(lambda images: qm(images, training=True), jit_compile=True)
        forward(_bad(x[:32], _NAN))
        self.assertTrue(finite(qm.qat_ranges.ordered))
        train(_STEPS)
        self.assertTrue(np.all(np.isfinite(losses)), losses)
        self.assertLess(np.mean(losses[-10:]), np.mean(losses[_STEPS - 10:_STEPS]))
        # Keras's fit reads the counters at its end and warns once per range.
        qm.compile(optimizer="adam", loss=loss_fn)
        with self.assertLogs(level="WARNING") as logs:
            qm.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
        input_range = "digits_functional_1/conv2d_1/input_quant"
        warnings = [r.getMessage() for r in logs.records if "skipped" in r.getMessage()]
        self.assertTrue(any(f"{input_range} (of images:0) skipped 2 training batches" in w
                            for w in warnings), warnings)
        with self.assertNoLogs(level="WARNING"):
            counts = qm.skipped_batches()
        self.assertEqual(counts[input_range], 2)
        coverage = report.coverage_report_of_model(qm)
        self.assertEqual({q.name: q.skipped_batches for q in coverage.quantizers}[input_range], 2)


if __name__ == "__main__":
    absltest.main()
