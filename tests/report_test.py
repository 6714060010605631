"""qat.report: coverage, per-layer numerics, TensorBoard summaries, plots, CLI."""
import json
import math
import os
import subprocess
import sys
import tempfile
from unittest import mock

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
from qat.report import numerics  # pylint: disable=g-import-not-at-top
from qat.report import plots  # pylint: disable=g-import-not-at-top
import export_util  # pylint: disable=g-import-not-at-top
from export_util import lost_range_graph  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
_TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "tools", "qat_report.py")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _digits():
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    return x[:1400], digits.target[:1400].astype(np.int64), x[1400:1600]


def _digits_model(images, is_training):
    """conv -> BN -> ReLU (x2) -> max pool -> dense, as in the demo."""
    layers = tf1.layers
    init = tf1.glorot_uniform_initializer(seed=0)
    net = images
    with tf1.variable_scope("digits"):
        for i, channels in enumerate((8, 16), start=1):
            net = layers.conv2d(net, channels, 3, padding="same", use_bias=False,
                                kernel_initializer=init, name=f"conv{i}")
            net = layers.batch_normalization(net, training=is_training, name=f"conv{i}/bn")
            net = tf.nn.relu(net)
        net = layers.flatten(layers.max_pooling2d(net, 2, 2))
        return layers.dense(net, 10, kernel_initializer=init, name="logits")


def _png_series(path):
    """Checks the PNG signature and returns the series stored in its metadata."""
    from PIL import Image  # pylint: disable=g-import-not-at-top
    with open(path, "rb") as f:
        assert f.read(8) == _PNG_SIGNATURE, path
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        return image.size, json.loads(image.text[plots.SERIES_KEY])


class TfliteTensorsTest(absltest.TestCase):

    def test_scalar_tensor_in_model(self):
        """A scalar op output (no example axis) is kept, not concatenated.

        EfficientNetB0's TFLite model has such tensors; they made
        `run_tflite_tensors` fail with "zero-dimensional arrays cannot be
        concatenated" whenever the samples took more than one batch.
        """
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            total = tf.reduce_sum(x, name="total")
            y = tf.identity(x * total, name="y")
            with tf1.Session(graph=g) as sess:
                model = tf1.lite.TFLiteConverter.from_session(sess, [x], [y]).convert()
        samples = np.arange(12, dtype=np.float32).reshape(3, 4)
        tensors = numerics.run_tflite_tensors(model, samples, batch_size=2)
        scalars = [t["value"] for t in tensors.values() if np.ndim(t["value"]) == 0]
        self.assertLen(scalars, 1)
        self.assertEqual(float(scalars[0]), float(samples[:2].sum()))
        outputs = [t["value"] for t in tensors.values() if np.shape(t["value"]) == (3, 4)]
        self.assertTrue(any(np.allclose(v, samples * np.where(
            np.arange(3)[:, None] < 2, samples[:2].sum(), samples[2:].sum()))
                            for v in outputs))


class ScopeCoverageTest(absltest.TestCase):
    """A layer outside `scope` is listed with that reason."""

    def test_layer_outside_scope(self):
        graph = tf.Graph()
        with graph.as_default():
            images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
            with tf1.variable_scope("body"):
                net = tf1.layers.conv2d(images, 4, 3, activation=tf.nn.relu, name="conv")
                net = tf1.layers.flatten(net)
            logits = tf1.layers.dense(net, 10, name="head")  # Outside the scope.
            tf.nn.softmax(logits, name="probabilities")
            qat.experimental_create_eval_graph(graph, scope="body/")
            sess = tf1.Session(graph=graph)
            sess.run(tf1.global_variables_initializer())
        coverage = report.coverage_report(graph, outputs=["probabilities"], scope="body/",
                                          sess=sess)
        sess.close()
        layers = {l.name: l for l in coverage.layers}
        self.assertEqual(set(layers), {"body/conv/Conv2D", "head/MatMul"})
        self.assertEqual(layers["body/conv/Conv2D"].weight_quantizer, "body/conv/weights_quant")
        self.assertEqual(layers["body/conv/Conv2D"].activation_quantizer, "body/conv/act_quant")
        self.assertIsNone(layers["body/conv/Conv2D"].reason)
        head = layers["head/MatMul"]
        self.assertIsNone(head.weight_quantizer)
        self.assertIsNone(head.activation_quantizer)
        self.assertIn("outside scope 'body/'", head.reason)
        floats = {f.tensor: f for f in coverage.float_tensors}
        self.assertEqual(floats["head/BiasAdd:0"].code, "outside_scope")
        self.assertEqual(floats["head/MatMul/ReadVariableOp:0"].code, "outside_scope")
        self.assertEqual(floats["probabilities:0"].code, "outside_scope")
        self.assertIn("outside scope", coverage.format())
        self.assertEqual(json.loads(coverage.to_json())["layers"][1]["name"], "head/MatMul")
        for q in coverage.quantizers:  # Values read from the session.
            self.assertTrue(math.isfinite(q.min) and math.isfinite(q.max), q)


class TrainingGraphCoverageTest(absltest.TestCase):
    """Training graphs: delayed and per-channel quantizers, ranges read without updates."""

    def test_delayed_per_channel_training_graph(self):
        graph = tf.Graph()
        with graph.as_default():
            images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
            net = tf1.layers.conv2d(images, 4, 3, use_bias=False, name="conv")
            net = tf.nn.relu(tf1.layers.batch_normalization(net, training=True, name="bn"))
            net = tf.nn.relu6(tf1.layers.separable_conv2d(net, 8, 3, name="sep"))
            logits = tf1.layers.dense(tf1.layers.flatten(net), 10, name="logits")
            probabilities = tf.nn.softmax(logits, name="probabilities")
            loss = -tf.reduce_mean(tf.math.log(probabilities + 1e-6))
            qat.fold_batch_norms(graph, is_training=True)
            qat.insert_quant_ops(graph, is_training=True, per_channel=True,
                                 symmetric_weights=True, quant_delay=10)
            del loss
            sess = tf1.Session(graph=graph)
            sess.run(tf1.global_variables_initializer())
        # No feed: the ranges are read from the variables, not after their updates.
        coverage = report.coverage_report(graph, outputs=["probabilities"], sess=sess)
        sess.close()
        self.assertEqual([l.batch_norm_status for l in coverage.layers],
                         ["folded (training)", "-", "-", "-"])
        self.assertEqual(coverage.float_tensors, [])  # Delayed quantizers' Select outputs too.
        weights = {q.name: q for q in coverage.quantizers if q.role == "weights"}
        self.assertLen(weights, 4)
        self.assertEqual(weights["conv/weights_quant"].channels, 4)
        self.assertTrue(all(q.per_channel and q.symmetric for q in weights.values()))
        for layer in coverage.layers:
            self.assertIn(layer.weight_quantizer, weights)
            self.assertIsNotNone(layer.activation_quantizer, layer)


class ControlFlowCoverageTest(absltest.TestCase):
    """A tf_keras batch norm without a fixed learning phase sits in an If op."""

    def test_batch_norm_inside_if_is_reported(self):
        import tf_keras  # pylint: disable=g-import-not-at-top
        graph = tf.Graph()
        with graph.as_default():
            images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
            model = tf_keras.Sequential([
                tf_keras.layers.Conv2D(4, 3, use_bias=False, input_shape=(8, 8, 1)),
                tf_keras.layers.BatchNormalization(), tf_keras.layers.ReLU(),
                tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
            tf.identity(model(images), name="output")
            fold_result = qat.fold_batch_norms(graph, is_training=False)
            qat.insert_quant_ops(graph, is_training=False)
        self.assertNotEmpty(fold_result.skipped)
        for result in (fold_result, None):  # The fold's own reason, or the graph's.
            coverage = report.coverage_report(graph, outputs=["output"], fold_result=result)
            conv = coverage.layers[0]
            self.assertEqual(conv.name, "sequential/conv2d/Conv2D")
            self.assertEqual(conv.batch_norm_status, "not folded")
            self.assertRegex(conv.batch_norm_reason, "If op")
            self.assertEqual([(f.tensor, f.code) for f in coverage.float_tensors],
                             [("sequential/batch_normalization/cond:0", "control_flow")])
            self.assertIn("batch norms folded: 0 of 1", coverage.summary_lines()[0])
        with_fold = report.coverage_report(graph, outputs=["output"], fold_result=fold_result)
        self.assertIn("which the fold cannot edit", with_fold.layers[0].batch_norm_reason)


def _three_conv_eval_graph():
    """A frozen eval graph: input -> 3 x (conv -> ReLU), ranges set by hand."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        net = images
        rng = np.random.RandomState(0)
        for name in ("a", "b", "c"):
            with tf1.variable_scope(name):
                weights = tf1.get_variable("weights", initializer=rng.normal(
                    0.0, 0.3, [3, 3, int(net.shape[-1]), 4]).astype(np.float32))
                net = tf.nn.relu(tf.nn.conv2d(net, weights, 1, "SAME"))
        tf.identity(net, name="out")
        qat.experimental_create_eval_graph(graph, symmetric_weights=True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for variable in tf1.global_variables():
                if variable.op.name.endswith("act_quant/max"):
                    variable.load(2.0, sess)
                elif variable.op.name.endswith("input_quant/max"):
                    variable.load(1.0, sess)
            return qat.export.freeze_session(sess, ["out"])


class OwnDifferenceTest(absltest.TestCase):
    """Each layer computed from TFLite's own inputs finds the one wrong kernel."""

    def test_wrong_kernel_is_told_from_accumulated_drift(self):
        frozen = _three_conv_eval_graph()
        # A TFLite model whose middle conv has other weights: every tensor
        # from it on differs from the eval graph, but only "b" on its own.
        wrong = tf1.GraphDef()
        wrong.CopyFrom(frozen)
        weights = [n for n in wrong.node
                   if n.op == "Const" and n.name == "b/weights"]
        self.assertLen(weights, 1)
        value = tf.make_ndarray(weights[0].attr["value"].tensor)
        weights[0].attr["value"].tensor.CopyFrom(tf.make_tensor_proto(-value))
        model = qat.export.convert_frozen_graph(wrong, ["images"], ["out"], "int8")
        samples = np.random.RandomState(1).uniform(0, 1, [16, 8, 8, 3]).astype(np.float32)
        result = report.layer_numerics(frozen, "images", ["out"], samples, flavour="int8",
                                       model=model)
        rows = {r.name: r for r in result.rows}
        layers = [name for name in rows if name.startswith(("a/", "b/", "c/"))
                  and name.endswith("Conv2D")]
        self.assertLen(layers, 3)
        a, b, c = (rows[name] for name in layers)
        self.assertLessEqual(a.max_own_steps, 1.0 + 1e-3)
        self.assertGreater(b.max_own_steps, 10.0)
        self.assertGreater(c.max_diff_steps, 10.0)  # Drifted from "b" on ...
        self.assertLessEqual(c.max_own_steps, 1.0 + 1e-3)  # ... but right on its own.
        self.assertIs(result.worst_own, b)
        self.assertIn(f"given TFLite's own inputs: {b.max_own_steps:.2f} steps ({b.name})",
                      result.format())

    def test_forced_inputs_leave_producers_fetchable(self):
        graph_def = _three_conv_eval_graph()
        fake_quants = [n.name + ":0" for n in graph_def.node
                       if n.op == "FakeQuantWithMinMaxVars" and "act_quant" in n.name]
        self.assertLen(fake_quants, 3)
        forced, placeholders = numerics.read_forced_inputs(graph_def, fake_quants[:2])
        self.assertLen(graph_def.node, len(forced.node) - 2)  # The input is not changed.
        graph = tf.Graph()
        with graph.as_default():
            tf.import_graph_def(forced, name="")
        samples = np.random.RandomState(2).uniform(0, 1, [2, 8, 8, 3]).astype(np.float32)
        zeros = np.zeros([2, 8, 8, 4], np.float32)
        with tf1.Session(graph=graph) as sess:
            first, last = sess.run(
                [fake_quants[0], fake_quants[2]],
                {"images:0": samples, placeholders[fake_quants[0]]: zeros,
                 placeholders[fake_quants[1]]: zeros})
        self.assertGreater(np.abs(first).max(), 0.0)  # Still computed from the input.
        np.testing.assert_array_equal(last, np.zeros_like(last))  # relu(conv(0)) = 0.


class DigitsReportTest(absltest.TestCase):
    """QAT-trained digits model: TensorBoard, coverage from files, numerics, plots."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        cls.logdir = os.path.join(cls.tmp, "tensorboard")
        x_train, y_train, cls.samples = _digits()
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(0)
            images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
            labels = tf1.placeholder(tf.int64, [None])
            loss = tf1.losses.sparse_softmax_cross_entropy(
                labels, _digits_model(images, is_training=True))
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
            cls.summaries = report.add_range_summaries(graph)
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train_op = tf1.train.AdamOptimizer(3e-3).minimize(loss)
            cls.range_variables = sorted(
                v.op.name for v in tf1.global_variables()
                if v.op.name.endswith(("_quant/min", "_quant/max")))
            rng = np.random.RandomState(0)
            writer = tf1.summary.FileWriter(cls.logdir)
            range_reads = {name: graph.get_tensor_by_name(name + "/Read/ReadVariableOp:0")
                           for name in cls.range_variables}
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                # Running the summaries (no feed needed) leaves the ranges alone.
                cls.ranges_before = sess.run(range_reads)
                sess.run(cls.summaries)
                cls.ranges_after = sess.run(range_reads)
                for step in range(300):
                    batch = rng.randint(0, len(x_train), 32)
                    feed = {images: x_train[batch], labels: y_train[batch]}
                    if step % 50 == 0:
                        writer.add_summary(sess.run(cls.summaries), step)
                    sess.run(train_op, feed)
                writer.close()
                cls.checkpoint = tf1.train.Saver().save(sess, os.path.join(cls.tmp, "model"))
        eval_graph = tf.Graph()
        with eval_graph.as_default():
            images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
            tf.nn.softmax(_digits_model(images, is_training=False), name="probabilities")
            qat.experimental_create_eval_graph(eval_graph, symmetric_weights=True)
            cls.meta = os.path.join(cls.tmp, "eval_graph.meta")
            tf1.train.export_meta_graph(cls.meta)
        cls.numerics = report.layer_numerics_from_files(
            cls.meta, cls.checkpoint, "images", ["probabilities"], cls.samples, flavour="int8")

    def test_summaries_do_not_update_ranges(self):
        self.assertEqual(self.ranges_before.keys(), self.ranges_after.keys())
        for name, value in self.ranges_before.items():
            self.assertEqual(value, self.ranges_after[name], name)

    def test_tensorboard_scalar_per_range_variable(self):
        scalars = report.read_scalars(self.logdir)
        self.assertLen(self.range_variables, 14)  # input + 3 weights + 3 activations.
        # And each range's count of skipped batches (none: every batch finite).
        counters = [name.rsplit("/", 1)[0] + "/skipped_batches"
                    for name in self.range_variables if name.endswith("/min")]
        self.assertEqual(sorted(scalars), sorted(self.range_variables + counters))
        for tag, points in scalars.items():
            self.assertEqual([s for s, _ in points], [0, 50, 100, 150, 200, 250], tag)
        for tag in counters:
            self.assertEqual({v for _, v in scalars[tag]}, {0.0}, tag)
        # The activation ranges move from their initial [0, 6] while training.
        self.assertNotAlmostEqual(scalars["digits/conv1/act_quant/max"][-1][1], 6.0, places=3)
        histograms = set()
        for path in tf.io.gfile.glob(os.path.join(self.logdir, "events.out.tfevents.*")):
            for event in tf1.train.summary_iterator(path):
                histograms.update(v.tag for v in event.summary.value if v.HasField("histo"))
        self.assertEqual(histograms, {"weights/digits/conv1/kernel", "weights/digits/conv2/kernel",
                                      "weights/digits/logits/kernel"})

    def test_coverage_from_meta_and_checkpoint(self):
        coverage = report.coverage_report_from_files(self.meta, self.checkpoint,
                                                     outputs=["probabilities"])
        self.assertEqual([l.name for l in coverage.layers],
                         ["digits/conv1/Conv2D", "digits/conv2/Conv2D", "digits/logits/MatMul"])
        for layer in coverage.layers:
            self.assertIsNotNone(layer.weight_quantizer, layer)
            self.assertIsNotNone(layer.activation_quantizer, layer)
        self.assertEqual([l.batch_norm_status for l in coverage.layers],
                         ["folded (eval)", "folded (eval)", "-"])
        self.assertEqual(coverage.layers[0].batch_norm, "digits/conv1/bn/FusedBatchNormV3")
        self.assertEqual(coverage.float_tensors, [])
        reader = tf.train.load_checkpoint(self.checkpoint)
        for q in coverage.quantizers:
            self.assertEqual(q.bits, 8)
            self.assertAlmostEqual(q.max, float(reader.get_tensor(q.max_variable)), places=6)
            self.assertEqual(q.symmetric, q.role == "weights", q.name)
        self.assertEqual(sorted(q.role for q in coverage.quantizers),
                         ["activation"] * 4 + ["weights"] * 3)

    def test_numerics_every_layer_finite_and_within_parity(self):
        rows = {r.name: r for r in self.numerics.rows}
        self.assertEqual(list(rows), ["digits/conv1/input_quant", "digits/conv1/Conv2D",
                                      "digits/conv2/Conv2D", "digits/logits/MatMul",
                                      "probabilities"])
        for row in self.numerics.rows:
            self.assertTrue(math.isfinite(row.sqnr_qat_db), row)
            self.assertGreater(row.sqnr_qat_db, 10.0, row)
            self.assertIsNotNone(row.tflite_tensor, row)
            self.assertGreater(row.sqnr_tflite_db, row.sqnr_qat_db, row)
        logits = rows["digits/logits/MatMul"]
        for row in self.numerics.rows:
            # The export's parity bound (tests/export_test.py: 4 output steps),
            # here for every layer; off-by-one roundings are rare.
            bound = 4.0
            if row.name == "probabilities":
                # A softmax passes on its logits' largest difference d as at most
                # sum_j |dp_i/dz_j| * d = 2 p_i (1 - p_i) d <= d / 2, counted in its
                # own (finer) steps, plus its own rounding.
                bound = max(bound, 1.0 + 0.5 * logits.max_diff_steps * logits.scale / row.scale)
            self.assertLessEqual(row.max_diff_steps, bound, row)
            self.assertLess(row.mean_diff_steps, 0.5, row)
        qat_out = self.numerics.rows[-1]
        self.assertEqual(qat_out.tensor, "probabilities:0")
        drift = self.numerics.first_drift
        over = [r.name for r in self.numerics.rows if r.max_diff_steps > 1.001]
        self.assertEqual(drift.name if drift else None, over[0] if over else None)
        text = self.numerics.format()
        self.assertIn("first layer where TFLite drifts by more than 1 step: "
                      + (drift.name if drift else "none"), text)
        self.assertEqual(json.loads(self.numerics.to_json())["rows"][1]["name"],
                         "digits/conv1/Conv2D")

    def test_plots_are_pngs_with_the_series(self):
        out = tempfile.mkdtemp(dir=self.tmp)
        sqnr = report.plot_sqnr(self.numerics, os.path.join(out, "sqnr.png"))
        size, series = _png_series(sqnr.path)
        self.assertGreater(size[0], 300)
        self.assertEqual(sorted(series), ["QAT vs float", "TFLite int8 vs eval graph"])
        self.assertEqual([p[1] for p in series["QAT vs float"]],
                         [r.sqnr_qat_db for r in self.numerics.rows])
        history = report.range_history(report.read_scalars(self.logdir))
        self.assertLen(history, 7)
        ranges = report.plot_range_history(history, os.path.join(out, "ranges.png"))
        _, series = _png_series(ranges.path)
        self.assertEqual(sorted(series), self.range_variables)
        self.assertEqual([p[0] for p in series["digits/conv1/act_quant/max"]],
                         [0, 50, 100, 150, 200, 250])

    def test_plots_without_matplotlib_say_how_to_install(self):
        with mock.patch.dict(sys.modules, {"matplotlib": None, "matplotlib.pyplot": None}):
            with self.assertRaisesRegex(ImportError, "pip install matplotlib"):
                report.plot_sqnr(self.numerics, os.path.join(self.tmp, "none.png"))

    def test_cli_writes_text_json_and_plot(self):
        out = tempfile.mkdtemp(dir=self.tmp)
        samples = os.path.join(out, "samples.npy")
        np.save(samples, self.samples[:64])
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1")
        proc = subprocess.run(
            [sys.executable, _TOOL, f"--graph={self.meta}", f"--checkpoint={self.checkpoint}",
             "--outputs=probabilities", "--inputs=images", f"--samples={samples}",
             f"--output_dir={out}"], capture_output=True, text=True, env=env, timeout=300,
            check=False)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr[-3000:])
        self.assertIn("layers: 3, weights quantized: 3, batch norms folded: 2 of 2", proc.stdout)
        self.assertIn("numerics (uint8, 64 examples, 5 tensors)", proc.stdout)
        with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
            data = json.load(f)
        self.assertLen(data["coverage"]["layers"], 3)
        self.assertLen(data["numerics"]["rows"], 5)
        _png_series(os.path.join(out, "sqnr.png"))
        bad = subprocess.run([sys.executable, _TOOL, f"--graph={out}/missing.meta",
                              "--outputs=probabilities"], capture_output=True, text=True,
                             env=env, timeout=300, check=False)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("does not exist", bad.stderr)


class IntegerInputsNumericsTest(absltest.TestCase):
    """Token ids and a mask (int32) beside a float input, API and CLI."""

    def test_rows_on_the_id_path_within_one_step(self):
        _, sess, _ = export_util.build_int_input_model()
        samples = export_util.make_int_inputs(32)
        result = report.layer_numerics_from_session(sess, ["ids", "mask", "x"], ["output"],
                                                    samples, flavour="int8")
        sess.close()
        self.assertEqual(result.num_examples, 32)
        rows = {r.name: r for r in result.rows}
        for name in ("net/emb_quant", "net/mask_quant", "net/kept_quant", "net/pool_quant",
                     "net/input_quant", "net/act_quant"):
            self.assertIn(name, rows)
            self.assertLessEqual(rows[name].max_own_steps, 1.0 + 1e-3, name)
        self.assertGreater(rows["net/emb_quant"].sqnr_qat_db, 30.0)

    def test_cli_reads_an_npz_per_input(self):
        tmp = tempfile.mkdtemp()
        graph, sess, saver = export_util.build_int_input_model()
        with graph.as_default():
            prefix = saver.save(sess, os.path.join(tmp, "model.ckpt"))
        sess.close()
        samples = os.path.join(tmp, "samples.npz")
        np.savez(samples, **export_util.make_int_inputs(16))
        proc = subprocess.run(
            [sys.executable, _TOOL, f"--graph={prefix}.meta", f"--checkpoint={prefix}",
             "--outputs=output", "--inputs=ids,mask,x", f"--samples={samples}",
             f"--output_dir={tmp}/report", "--flavour=int8", "--noplots"],
            capture_output=True, text=True, timeout=300, check=False,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stdout, r"numerics \(int8, 16 examples")
        self.assertIn("net/emb_quant", proc.stdout)



class LostRangesTest(absltest.TestCase):
    """Rows and ranges without a TFLite tensor are named, not skipped silently."""

    def _numerics(self, kind):
        frozen = lost_range_graph(kind)
        samples = np.random.RandomState(3).uniform(0, 1, [8, 4, 4, 3]).astype(np.float32)
        return report.layer_numerics(frozen, "input", ["output"], samples, flavour="int8")

    def test_removed_add_is_named_as_unmatched_and_lost(self):
        result = self._numerics("add_zero_other")
        self.assertEqual([r.name for r in result.unmatched], ["add_quant"])
        self.assertEqual([r.quantizer for r in result.lost_ranges], ["add_quant"])
        text = result.format()
        self.assertIn("rows without a TFLite tensor (not compared): add_quant", text)
        self.assertIn("ranges lost in conversion (no TFLite tensor of their scale and zero "
                      "point): add_quant", text)
        data = json.loads(result.to_json())
        self.assertEqual(data["unmatched"], ["add_quant"])
        self.assertEqual(data["lost_ranges"][0]["nearest"], "mul")

    def test_requantized_conv_is_named_as_lost(self):
        result = self._numerics("resize_concat")
        self.assertEqual([r.quantizer for r in result.lost_ranges], ["pool_conv/act_quant"])
        self.assertIn("pool_conv/act_quant (pool_conv/Relu:0, range [0, 2]", result.format())

    def test_clean_graph_names_none(self):
        result = self._numerics("clean")
        self.assertEqual(result.unmatched, [])
        self.assertEqual(result.lost_ranges, [])
        self.assertIn("rows without a TFLite tensor (not compared): none", result.format())


if __name__ == "__main__":
    absltest.main()
