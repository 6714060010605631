"""TF 2's converter path: the eval graph as a TF 2 SavedModel, from_saved_model.

A trained qat model's eval graph (restored from its checkpoint) is written
with a serving signature, converted with `tf.lite.TFLiteConverter.from_saved_model`
and `optimizations=[DEFAULT]` (float and int8 I/O), checked for zero float
ops and compared with the eval graph; the SavedModel is loaded as TF Serving
does (v1 loader, `serve` tag, signature tensors) and with `tf.saved_model.load`.
The command-line tool runs the same path in a process with eager execution
disabled.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf
from absl.testing import absltest

import qat
from qat import export
from qat.export import saved_model

tf1 = tf.compat.v1

_TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "tools", "export_tflite.py")


def _build(training):
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        y = tf1.layers.conv2d(x, 8, 3, padding="same", use_bias=False, name="conv")
        y = tf1.layers.batch_normalization(y, training=training, name="bn")
        y = tf.nn.relu6(y)
        y = tf1.layers.conv2d(y, 8, 3, strides=2, padding="same", activation=tf.nn.relu,
                              name="conv2")
        logits = tf1.layers.dense(tf1.layers.flatten(y), 5, name="logits")
        out = tf.identity(logits, name="logits_out")
        if training:
            loss = tf.reduce_mean(tf.square(out - 1.0))
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train = tf1.train.AdamOptimizer(0.01).minimize(loss)
            return graph, train
        qat.experimental_create_eval_graph(graph, symmetric_weights=True)
        return graph, out


def _inputs(n, seed):
    return np.random.RandomState(seed).uniform(0.0, 2.0, (n, 8, 8, 3)).astype(np.float32)


class SavedModelExportTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()
        graph, train = _build(True)
        with graph.as_default(), tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for i in range(20):
                sess.run(train, {"images:0": _inputs(8, i)})
            checkpoint = tf1.train.Saver().save(sess, os.path.join(cls.tmp, "model.ckpt"))
        eval_graph, _ = _build(False)
        with eval_graph.as_default():
            cls.meta = os.path.join(cls.tmp, "eval.meta")
            tf1.train.export_meta_graph(cls.meta)
        cls.checkpoint = checkpoint
        cls.sess = tf1.Session(graph=eval_graph)
        with eval_graph.as_default():
            tf1.train.Saver().restore(cls.sess, checkpoint)
        cls.x = _inputs(64, 100)
        cls.results = {}
        for int8_io in (False, True):
            cls.results[int8_io] = export.export_tflite(
                ["images"], ["logits_out"], os.path.join(cls.tmp, "io%d" % int8_io),
                sess=cls.sess, flavours=["int8"], int8_io=int8_io, converter="saved_model",
                parity_inputs=cls.x)["int8"]

    @classmethod
    def tearDownClass(cls):
        cls.sess.close()
        super().tearDownClass()

    def test_fully_integer_float_and_int8_io(self):
        for int8_io, result in self.results.items():
            report = result.report
            self.assertEqual(export.find_float_ops(report), [], int8_io)
            names = [op.name for op in report.ops]
            self.assertIn("CONV_2D", names)
            self.assertIn("FULLY_CONNECTED", names)
            io_types = (export.inspect.tensor_types(report, report.inputs)
                        + export.inspect.tensor_types(report, report.outputs))
            self.assertEqual(io_types, ["int8", "int8"] if int8_io else ["float32", "float32"])
            self.assertEqual(result.saved_model_dir,
                             os.path.join(self.tmp, "io%d" % int8_io, "model_saved_model"))

    def test_parity_with_the_eval_graph(self):
        for int8_io, result in self.results.items():
            self.assertGreaterEqual(result.parity.top1_agreement, 0.9, int8_io)
            self.assertLessEqual(result.parity.max_diff_steps, 2.0, result.parity.format())

    def test_same_model_as_tf1_converter(self):
        """TF 2's converter and TF1's give models with the same outputs."""
        frozen = export.freeze_session(self.sess, ["logits_out"])
        tf1_model = export.convert_frozen_graph(frozen, ["images"], ["logits_out"], "int8")
        np.testing.assert_allclose(export.run_tflite(self.results[False].model, self.x),
                                   export.run_tflite(tf1_model, self.x), atol=1e-5)

    def test_serving_load(self):
        path = self.results[False].saved_model_dir
        expected = self.sess.run("logits_out:0", {"images:0": self.x})
        # TF Serving: the v1 loader with the serve tag, then the signature's tensors.
        graph = tf.Graph()
        with tf1.Session(graph=graph) as sess:
            meta = tf1.saved_model.loader.load(sess, ["serve"], path)
            signature = meta.signature_def[saved_model.SIGNATURE_KEY]
            self.assertEqual(sorted(signature.inputs), ["images"])
            self.assertEqual(sorted(signature.outputs), ["logits_out"])
            self.assertEqual(signature.method_name, "tensorflow/serving/predict")
            got = sess.run(signature.outputs["logits_out"].name,
                           {signature.inputs["images"].name: self.x})
        np.testing.assert_array_equal(got, expected)
        loaded = tf.saved_model.load(path)
        serve = loaded.signatures[saved_model.SIGNATURE_KEY]
        self.assertEqual(list(serve.structured_outputs), ["logits_out"])
        np.testing.assert_array_equal(serve(images=tf.constant(self.x))["logits_out"].numpy(),
                                      expected)

    def test_input_without_fake_quant_needs_a_range(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            w = tf.constant(np.eye(4, dtype=np.float32))
            wq = tf.quantization.fake_quant_with_min_max_args(w, -1.0, 1.0, narrow_range=True)
            y = tf.quantization.fake_quant_with_min_max_args(tf.matmul(x, wq), -4.0, 4.0)
            tf.identity(y, name="y")
        frozen = graph.as_graph_def()
        with self.assertRaisesRegex(export.ExportError, "input 'x' has no range"):
            saved_model.write_saved_model(frozen, ["x"], ["y"], os.path.join(self.tmp, "norange"))
        path = saved_model.write_saved_model(frozen, ["x"], ["y"],
                                             os.path.join(self.tmp, "range"),
                                             input_ranges={"x": (-2.0, 2.0)})
        model = saved_model.convert_saved_model(path)
        self.assertEqual(export.find_float_ops(export.describe_model(model)), [])
        with self.assertRaisesRegex(export.ExportError, "already holds a SavedModel"):
            saved_model.write_saved_model(frozen, ["x"], ["y"], path,
                                          input_ranges={"x": (-2.0, 2.0)})

    def test_uint8_refused(self):
        with self.assertRaisesRegex(export.ExportError, "int8 models only"):
            export.export_tflite(["images"], ["logits_out"], os.path.join(self.tmp, "u"),
                                 sess=self.sess, flavours=["uint8"], converter="saved_model")

    def test_graph_mode_gets_tf1_converter(self):
        """Why TF1 scripts' from_saved_model keeps float kernels (docs/int8_export.md)."""
        script = (
            "import sys, tensorflow as tf\n"
            "from qat import export\n"
            "tf.compat.v1.disable_eager_execution()\n"
            "c = tf.lite.TFLiteConverter.from_saved_model(sys.argv[1])\n"
            "print('tf1_class', isinstance(c, tf.compat.v1.lite.TFLiteConverter))\n"
            "c.optimizations = [tf.lite.Optimize.DEFAULT]\n"
            "print('plain_float_ops', len(export.find_float_ops(export.describe_model(c.convert()))))\n"
            "model = export.convert_saved_model(sys.argv[1])\n"
            "print('qat_float_ops', len(export.find_float_ops(export.describe_model(model))))\n")
        proc = subprocess.run([sys.executable, "-c", script, self.results[False].saved_model_dir],
                              capture_output=True, text=True, timeout=300, check=False,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        lines = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
        self.assertEqual(lines["tf1_class"], "True")
        self.assertGreater(int(lines["plain_float_ops"]), 0)  # Float kernels kept.
        self.assertEqual(lines["qat_float_ops"], "0")

    def test_command_line(self):
        out_dir = os.path.join(self.tmp, "cli")
        proc = subprocess.run(
            [sys.executable, _TOOL, "--graph=" + self.meta, "--checkpoint=" + self.checkpoint,
             "--inputs=images", "--outputs=logits_out", "--converter=saved_model",
             "--int8_io", "--parity=random", "--parity_examples=32", "--output_dir=" + out_dir],
            capture_output=True, text=True, timeout=300, check=False,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("int8: ", proc.stdout)
        self.assertIn("fully integer", proc.stdout)
        self.assertNotIn("uint8", proc.stdout)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "model_saved_model",
                                                    "saved_model.pb")))


if __name__ == "__main__":
    absltest.main()
