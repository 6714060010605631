"""Tests of qat.export on small graphs with hand-placed FakeQuant ops."""
import os
import tempfile

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from qat import export
from export_util import build_model, make_inputs

tf1 = tf.compat.v1


class ExportBothFlavoursTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()
        cls.graph, cls.sess, cls.saver = build_model()
        cls.nodes_before = len(cls.graph.as_graph_def().node)
        cls.results = export.export_tflite(
            ["input"], ["output"], cls.tmp, sess=cls.sess,
            input_ranges={"input": (0.0, 1.0)}, parity_inputs=make_inputs())

    @classmethod
    def tearDownClass(cls):
        cls.sess.close()
        super().tearDownClass()

    def test_files_written(self):
        for flavour in ("uint8", "int8"):
            path = os.path.join(self.tmp, f"model_{flavour}.tflite")
            self.assertEqual(self.results[flavour].path, path)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), self.results[flavour].model)
            self.assertGreater(os.path.getsize(path), 1000)

    def test_uint8_ops_and_types(self):
        report = self.results["uint8"].report
        self.assertEqual([op.name for op in report.ops],
                         ["CONV_2D", "CONV_2D", "RESHAPE", "FULLY_CONNECTED"])
        for op in report.ops:
            for t in op.input_types + op.output_types:
                self.assertIn(np.dtype(t).name, ("uint8", "int32"), op)
        self.assertEqual(export.inspect.tensor_types(report, report.inputs), ["uint8"])
        self.assertEqual(export.inspect.tensor_types(report, report.outputs), ["uint8"])
        self.assertEqual(export.find_float_ops(report), [])
        # The input range (0, 1) becomes scale 1/255, zero point 0.
        inp = report.tensors[report.inputs[0]]
        self.assertAlmostEqual(inp.scale, 1 / 255, places=6)
        self.assertEqual(inp.zero_point, 0)

    def test_int8_ops_and_types(self):
        report = self.results["int8"].report
        self.assertEqual([op.name for op in report.ops],
                         ["QUANTIZE", "CONV_2D", "CONV_2D", "RESHAPE", "FULLY_CONNECTED",
                          "DEQUANTIZE"])
        for op in report.ops[1:-1]:
            for t in op.input_types + op.output_types:
                self.assertIn(np.dtype(t).name, ("int8", "int32"), op)
        self.assertEqual(export.find_float_ops(report), [])
        quantize = report.ops[0]
        self.assertEqual(report.tensors[quantize.outputs[0]].zero_point, -128)

    def test_int8_io(self):
        results = export.export_tflite(
            ["input"], ["output"], self.tmp, sess=self.sess, flavours=["int8"], name="io",
            input_ranges={"input": (0.0, 1.0)}, int8_io=True)
        report = results["int8"].report
        self.assertEqual([op.name for op in report.ops],
                         ["CONV_2D", "CONV_2D", "RESHAPE", "FULLY_CONNECTED"])
        self.assertEqual(export.inspect.tensor_types(report, report.inputs), ["int8"])
        self.assertEqual(export.inspect.tensor_types(report, report.outputs), ["int8"])

    def test_parity_computed(self):
        for flavour in ("uint8", "int8"):
            p = self.results[flavour].parity
            self.assertEqual(p.num_examples, 64)
            self.assertAlmostEqual(p.output_scale, 24 / 255, places=5)
            # Integer kernels round differently from FakeQuant in float: a few
            # steps at most on this 3-layer net, and mostly the same argmax.
            self.assertLessEqual(p.max_diff_steps, 4.0, flavour)
            self.assertGreaterEqual(p.top1_agreement, 0.9, flavour)
            self.assertAlmostEqual(p.max_abs_diff, p.max_diff_steps * p.output_scale, places=5)

    def test_parity_threshold_raises(self):
        with self.assertRaisesRegex(export.ParityError, "max difference .* output steps > 0"):
            export.check_parity(self.results["uint8"].model, self.sess, "input", "output",
                                make_inputs(), max_diff_steps=0.0)
        with self.assertRaisesRegex(export.ParityError, "top-1 agreement"):
            export.check_parity(self.results["uint8"].model, self.sess, "input", "output",
                                make_inputs(), min_top1_agreement=1.01)

    def test_session_graph_unchanged(self):
        self.assertLen(self.graph.as_graph_def().node, self.nodes_before)

    def test_from_meta_and_graph_def_with_checkpoint(self):
        with self.graph.as_default():
            prefix = self.saver.save(self.sess, os.path.join(self.tmp, "ckpt", "model.ckpt"))
        pb = os.path.join(self.tmp, "graph.pb")
        tf.io.write_graph(self.graph.as_graph_def(), self.tmp, "graph.pb", as_text=False)
        tf.io.write_graph(self.graph.as_graph_def(), self.tmp, "graph.pbtxt", as_text=True)
        inputs = make_inputs()
        expected = export.run_tflite(self.results["uint8"].model, inputs)
        for path, ckpt in ((prefix + ".meta", prefix), (pb, prefix),
                           (os.path.join(self.tmp, "graph.pbtxt"),
                            os.path.join(self.tmp, "ckpt"))):
            results = export.export_tflite(
                ["input"], ["output"], os.path.join(self.tmp, "f"), graph_path=path,
                checkpoint=ckpt, flavours=["uint8"], input_ranges={"input": (0.0, 1.0)})
            np.testing.assert_array_equal(
                export.run_tflite(results["uint8"].model, inputs), expected, err_msg=path)


    def test_frozen_graph_file_needs_no_checkpoint(self):
        frozen = export.freeze_session(self.sess, ["output"])
        tf.io.write_graph(frozen, self.tmp, "frozen.pb", as_text=False)
        results = export.export_tflite(
            ["input"], ["output"], os.path.join(self.tmp, "frozen"), flavours=["uint8"],
            graph_path=os.path.join(self.tmp, "frozen.pb"), input_ranges={"input": (0, 1)})
        self.assertEqual(results["uint8"].model, self.results["uint8"].model)


class ResourceAndRefVariablesTest(absltest.TestCase):

    def test_ref_variables(self):
        graph, sess, _ = build_model(use_resource=False)
        self.assertIn("VariableV2", {op.type for op in graph.get_operations()})
        frozen = export.freeze_session(sess, ["output"])
        self.assertFalse({"VariableV2", "VarHandleOp"} & {n.op for n in frozen.node})
        model = export.convert_frozen_graph(frozen, ["input"], ["output"], "uint8",
                                            input_ranges={"input": (0.0, 1.0)})
        export.check_fully_integer(model, frozen)
        np.testing.assert_allclose(export.run_graph(frozen, "input", "output", make_inputs(8)),
                                   export.run_graph(sess, "input", "output", make_inputs(8)))
        sess.close()


class InputRangeTest(absltest.TestCase):

    def test_stats(self):
        self.assertEqual(export.quantized_input_stats((0.0, 1.0), "uint8"), (0.0, 255.0))
        self.assertEqual(export.quantized_input_stats((0.0, 1.0), "int8"), (-128.0, 255.0))
        self.assertEqual(export.quantized_input_stats((-1.0, 1.0), "uint8"), (127.5, 127.5))
        with self.assertRaisesRegex(export.ExportError, "empty"):
            export.quantized_input_stats((1.0, 1.0), "uint8")

    def test_range_from_input_fake_quant(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            tf.quantization.fake_quant_with_min_max_vars(
                tf.identity(x), tf1.constant(-2.0), tf1.constant(2.0), name="in_quant")
        self.assertEqual(export.input_range_from_fake_quant(graph.as_graph_def(), "x"),
                         (-2.0, 2.0))

    def test_default_range(self):
        graph, sess, _ = build_model()
        frozen = export.freeze_session(sess, ["output"])
        sess.close()
        model = export.convert_frozen_graph(frozen, ["input"], ["output"], "uint8",
                                            default_input_range=(-1.0, 1.0))
        report = export.describe_model(model)
        self.assertAlmostEqual(report.tensors[report.inputs[0]].scale, 2 / 255, places=6)

    def test_missing_range_is_an_error(self):
        graph, sess, _ = build_model()
        frozen = export.freeze_session(sess, ["output"])
        sess.close()
        self.assertIsNone(export.input_range_from_fake_quant(frozen, "input"))
        with self.assertRaisesRegex(export.ExportError,
                                    r"input 'input' has no range.*input_range"):
            export.convert_frozen_graph(frozen, ["input"], ["output"], "int8")


class RuntimeCheckTest(absltest.TestCase):

    def test_asymmetric_int8_weights_named(self):
        # Asymmetric weight ranges give int8 weights a nonzero zero point, which
        # the int8 CONV_2D kernel refuses; uint8 takes them.
        graph, sess, _ = build_model(weight_range=(-0.5, 1.0))
        frozen = export.freeze_session(sess, ["output"])
        sess.close()
        uint8 = export.convert_frozen_graph(frozen, ["input"], ["output"], "uint8",
                                            input_ranges={"input": (0.0, 1.0)})
        export.check_runnable(uint8, frozen)
        int8 = export.convert_frozen_graph(frozen, ["input"], ["output"], "int8",
                                           input_ranges={"input": (0.0, 1.0)})
        export.check_fully_integer(int8, frozen)  # Integer, yet not runnable.
        with self.assertRaises(export.ConversionError) as ctx:
            export.check_runnable(int8, frozen, label="m_int8.tflite")
        message = str(ctx.exception)
        self.assertIn("m_int8.tflite: the TFLite runtime refuses the model", message)
        self.assertIn("CONV_2D #1 weights", message)
        self.assertIn("net/conv1/weights_quant/FakeQuantWithMinMaxVars", message)
        self.assertIn("symmetric=True", message)


class FloatOpDetectorTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        graph, sess, _ = build_model(unquantized_add=True)
        cls.frozen = export.freeze_session(sess, ["output"])
        sess.close()

    def _convert(self, flavour):
        return export.convert_frozen_graph(self.frozen, ["input"], ["output"], flavour,
                                           input_ranges={"input": (0.0, 1.0)})

    def test_unquantized_add_named(self):
        for flavour in ("uint8", "int8"):
            model = self._convert(flavour)
            float_ops = export.find_float_ops(export.describe_model(model), self.frozen)
            by_op = {f.tflite_op: f.tf_ops for f in float_ops}
            # The add and the mul feeding it have no range; everything after them
            # (reshape, fully connected) is float too.
            self.assertEqual(by_op["ADD"], [("net/res/add", "AddV2")], flavour)
            self.assertEqual(by_op["MUL"], [("net/mul", "Mul")], flavour)
            self.assertEqual(float_ops[0].tflite_op, "MUL")
            with self.assertRaises(export.FloatOpError) as ctx:
                export.check_fully_integer(model, self.frozen, label="m.tflite")
            message = str(ctx.exception)
            self.assertIn("m.tflite is not fully integer", message)
            self.assertIn("'net/res/add' (AddV2)", message)
            self.assertIn("no min/max range", message)
            self.assertGreaterEqual(len(ctx.exception.float_ops), 2)

    def test_identity_followed_and_dangling_fake_quant_hinted(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            xq = tf.quantization.fake_quant_with_min_max_args(x, 0.0, 1.0)
            w = tf.quantization.fake_quant_with_min_max_args(
                tf1.constant(np.eye(4, dtype=np.float32)), -1.0, 1.0, narrow_range=True)
            logits = tf.matmul(xq, w, name="logits/MatMul")
            # A range for the logits that nothing reads (contrib's last-layer case).
            tf.quantization.fake_quant_with_min_max_args(logits, -2.0, 2.0,
                                                         name="logits/act_quant")
            tf.identity(logits, name="out")
        sess = tf1.Session(graph=graph)
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(export.FloatOpError) as ctx:
                export.export_tflite(["x"], ["out"], tmp, sess=sess, flavours=["uint8"])
        sess.close()
        self.assertEqual(ctx.exception.float_ops[0].tf_ops,
                         [("out", "Identity"), ("logits/MatMul", "MatMul")])
        self.assertIn("hint: 'logits/MatMul' is read by 'logits/act_quant', which feeds "
                      "nothing: export 'logits/act_quant' as the output", str(ctx.exception))

    def test_pipeline_raises_and_writes(self):
        graph, sess, _ = build_model(unquantized_add=True)
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(export.FloatOpError, "net/res/add"):
                export.export_tflite(["input"], ["output"], tmp, sess=sess,
                                     flavours=["uint8"], input_ranges={"input": (0, 1)})
            results = export.export_tflite(["input"], ["output"], tmp, sess=sess,
                                           flavours=["uint8"], input_ranges={"input": (0, 1)},
                                           require_integer=False)
            self.assertIn("ADD", results["uint8"].report.op_counts())
        sess.close()


class ErrorTest(absltest.TestCase):

    def test_unknown_output_name(self):
        graph, sess, _ = build_model()
        with self.assertRaisesRegex(export.TensorNameError,
                                    r"output tensor 'outptu'.*did you mean 'output'"):
            export.freeze_session(sess, ["outptu"])
        with self.assertRaisesRegex(export.TensorNameError, r"input tensor 'in:0'.*'input'"):
            export.export_tflite(["in:0"], ["output"], "/tmp/unused", sess=sess)
        with self.assertRaisesRegex(export.TensorNameError, "has only 1 output"):
            export.freeze_session(sess, ["output:3"])
        sess.close()

    def test_missing_checkpoint(self):
        graph, sess, saver = build_model()
        with tempfile.TemporaryDirectory() as tmp:
            meta = os.path.join(tmp, "m.meta")
            with graph.as_default():
                saver.export_meta_graph(meta)
            with self.assertRaisesRegex(export.CheckpointError,
                                        r"checkpoint '.*nothing' not found.*\.index"):
                export.freeze_graph_file(meta, os.path.join(tmp, "nothing"), ["output"])
            with self.assertRaisesRegex(export.CheckpointError, "no checkpoint was given"):
                export.freeze_graph_file(meta, None, ["output"])
            with self.assertRaisesRegex(export.CheckpointError, "holds no checkpoint"):
                export.freeze_graph_file(meta, tmp, ["output"])
        sess.close()

    def test_malformed_graph_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bad.pb")
            with open(path, "wb") as f:
                f.write(b"\x00\xffnot a graph at all")
            with self.assertRaisesRegex(export.GraphLoadError,
                                        r"'.*bad.pb' is not a GraphDef or MetaGraphDef"):
                export.load_graph_file(path)
            with self.assertRaisesRegex(export.GraphLoadError, "does not exist"):
                export.load_graph_file(os.path.join(tmp, "absent.pb"))


if __name__ == "__main__":
    tf1.disable_eager_execution()
    absltest.main()
