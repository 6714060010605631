"""Export robustness: non-finite weights and ranges, shape-only ops, lost ranges."""
import tempfile

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from qat import export
from qat.export import inspect
from qat.export import range_survival
from export_util import build_int_input_model, build_model, lost_range_graph, make_int_inputs

tf1 = tf.compat.v1


def _variable(sess, name):
    return [v for v in sess.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
            if v.op.name == name][0]


class NonFiniteTest(absltest.TestCase):

    def _export(self, sess):
        return export.export_tflite(["input"], ["output"], tempfile.mkdtemp(), sess=sess,
                                    flavours=("uint8",), input_ranges={"input": (0.0, 1.0)})

    def test_nan_weights_named_before_conversion(self):
        _, sess, _ = build_model()
        variable = _variable(sess, "net/conv2/weights")
        value = sess.run(variable)
        value[0, 0, 0, :3] = np.nan
        with sess.graph.as_default():
            variable.load(value, sess)
        with self.assertRaises(export.NonFiniteError) as ctx:
            self._export(sess)
        sess.close()
        self.assertEqual(ctx.exception.variables, ["net/conv2/weights"])
        message = str(ctx.exception)
        self.assertIn("variable 'net/conv2/weights': 3 of 288 value(s) are NaN", message)
        self.assertIn("restore an earlier checkpoint", message)
        self.assertIsInstance(ctx.exception, export.ExportError)

    def test_inf_range_is_named_as_range(self):
        # A graph whose activation range is a variable (as qat's are).
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="input")
            lo = tf1.get_variable("act_quant/min", initializer=0.0, trainable=False)
            hi = tf1.get_variable("act_quant/max", initializer=np.float32(np.inf),
                                  trainable=False)
            y = tf.quantization.fake_quant_with_min_max_vars(
                tf.nn.relu(x), lo, hi, name="act_quant/FakeQuantWithMinMaxVars")
            tf.identity(y, name="output")
            sess = tf1.Session(graph=graph)
            sess.run(tf1.global_variables_initializer())
        with self.assertRaises(export.NonFiniteError) as ctx:
            self._export(sess)
        sess.close()
        self.assertEqual(ctx.exception.variables, ["act_quant/max"])
        self.assertIn("range 'act_quant/max' of FakeQuant 'act_quant/FakeQuantWithMinMaxVars': "
                      "1 of 1 value(s) are Inf", str(ctx.exception))

    def test_finite_graph_passes(self):
        graph, sess, _ = build_model()
        frozen = export.freeze_session(sess, ["output"])
        sess.close()
        export.check_finite(frozen)  # No error.
        del graph


class ShapeOnlyOpsTest(absltest.TestCase):

    def _report(self, op_name, output_type):
        tensors = {
            0: inspect.TensorInfo(0, "input", np.float32, (1, 4), 0.0, 0),
            1: inspect.TensorInfo(1, "shape", output_type, (2,), 0.0, 0),
        }
        ops = [inspect.OpInfo(0, op_name, [0], [1], [np.float32], [output_type])]
        return inspect.ModelReport(ops, tensors, inputs=[0], outputs=[1], size_bytes=0)

    def test_shape_of_float_tensor_is_not_float_compute(self):
        self.assertEqual(inspect.find_float_ops(self._report("SHAPE", np.int32)), [])
        self.assertEqual(inspect.find_float_ops(self._report("RANK", np.int32)), [])

    def test_other_ops_on_float_tensors_still_reported(self):
        found = inspect.find_float_ops(self._report("CAST", np.int32))
        self.assertEqual([f.tflite_op for f in found], ["CAST"])

    def test_dynamic_batch_reshape_lists_only_the_real_float_ops(self):
        # The batch size is read from a tensor TFLite keeps in float (the
        # activation before its FakeQuant), so the model holds SHAPE of a
        # float tensor: the float conv is reported, the SHAPE is not.
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="input")
            xq = tf.quantization.fake_quant_with_min_max_args(x, 0.0, 1.0)
            w = tf.constant(np.random.RandomState(0).normal(0, 0.3, (3, 3, 1, 4)),
                            tf.float32)
            wq = tf.quantization.fake_quant_with_min_max_args(w, -1.0, 1.0, narrow_range=True)
            relu = tf.nn.relu(tf.nn.conv2d(xq, wq, [1, 1, 1, 1], "SAME"))
            net = tf.quantization.fake_quant_with_min_max_args(relu, 0.0, 6.0)
            net = tf.reshape(net, tf.stack([tf.shape(relu)[0], 8 * 8 * 4]), name="flatten")
            tf.identity(net, name="output")
            sess = tf1.Session(graph=graph)
        results = export.export_tflite(["input"], ["output"], tempfile.mkdtemp(), sess=sess,
                                       flavours=("uint8", "int8"), require_integer=False)
        sess.close()
        for flavour, result in results.items():
            shape_ops = [op for op in result.report.ops if op.name == "SHAPE"]
            self.assertLen(shape_ops, 1, flavour)
            self.assertEqual(np.dtype(shape_ops[0].input_types[0]), np.float32, flavour)
            float_ops = [f.tflite_op for f in export.find_float_ops(result.report)]
            self.assertIn("CONV_2D", float_ops, flavour)
            self.assertNotIn("SHAPE", float_ops, flavour)


class RunnableTest(absltest.TestCase):
    """A model whose kernels are prepared only when it first runs is run once."""

    def test_uint8_attention_matmul_is_refused_at_export(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 4, 8], name="x")
            q = tf.quantization.fake_quant_with_min_max_args(x, 0.0, 1.0)
            scores = tf.quantization.fake_quant_with_min_max_args(
                tf.matmul(q, q, transpose_b=True), 0.0, 8.0)
            mean = tf.quantization.fake_quant_with_min_max_args(
                tf.reduce_mean(scores, 1), 0.0, 8.0)
            tf.identity(mean, name="y")
            sess = tf1.Session()
        with self.assertRaisesRegex(export.ConversionError, "BATCH_MATMUL"):
            export.export_tflite(["x"], ["y"], tempfile.mkdtemp(), sess=sess,
                                 flavours=("uint8",), input_ranges={"x": (0.0, 1.0)})


class IntegerInputsTest(absltest.TestCase):
    """Token ids and a mask (int32) beside a float input: fed as they are."""

    def test_export_and_parity_without_a_range_for_integer_inputs(self):
        _, sess, _ = build_int_input_model()
        inputs = make_int_inputs(64)
        results = export.export_tflite(["ids", "mask", "x"], ["output"], tempfile.mkdtemp(),
                                       sess=sess, parity_inputs=inputs, max_diff_steps=1.01,
                                       min_top1_agreement=1.0)
        reference = export.run_graph(sess, ["ids", "mask", "x"], "output", inputs)
        sess.close()
        for flavour, result in results.items():
            types = {result.report.tensors[i].name: np.dtype(result.report.tensors[i].dtype)
                     for i in result.report.inputs}
            self.assertEqual(types["ids"], np.int32, flavour)
            self.assertEqual(types["mask"], np.int32, flavour)
            self.assertEqual(result.parity.num_examples, 64, flavour)
            self.assertLessEqual(result.parity.max_diff_steps, 1.01, flavour)
            # The ids index the table: TFLite's outputs follow the eval graph's.
            lite = export.run_tflite(result.model, inputs)
            self.assertLess(np.abs(lite - reference).max(), 0.1, flavour)
            self.assertGreater(np.std(lite[:, 0]), 0.2, flavour)

    def test_only_a_float_input_needs_a_range(self):
        graph = tf.Graph()
        with graph.as_default():
            ids = tf1.placeholder(tf.int32, [None, 4], name="ids")
            x = tf1.placeholder(tf.float32, [None, 3], name="x")
            table = tf.quantization.fake_quant_with_min_max_args(
                tf.constant(np.linspace(-1, 1, 30, dtype=np.float32).reshape(10, 3)),
                -1.0, 1.0, narrow_range=True)
            emb = tf.quantization.fake_quant_with_min_max_args(
                tf.reduce_sum(tf.gather(table, ids), 1), -4.0, 4.0)
            tf.identity(tf.quantization.fake_quant_with_min_max_args(emb + x, -5.0, 5.0),
                        name="y")
            sess = tf1.Session()
        with self.assertRaisesRegex(export.ExportError, r"float input 'x' has no range") as ctx:
            export.export_tflite(["ids", "x"], ["y"], tempfile.mkdtemp(), sess=sess)
        self.assertNotIn("'ids'", str(ctx.exception))
        rng = np.random.RandomState(0)
        inputs = {"ids": rng.randint(0, 10, (16, 4)).astype(np.int32),
                  "x": rng.uniform(0, 1, (16, 3)).astype(np.float32)}
        results = export.export_tflite(["ids", "x"], ["y"], tempfile.mkdtemp(), sess=sess,
                                       default_input_range=(0.0, 1.0), parity_inputs=inputs,
                                       max_diff_steps=1.01)
        sess.close()
        for flavour, result in results.items():
            self.assertLessEqual(result.parity.max_diff_steps, 1.01, flavour)

    def test_missing_parity_input_is_named(self):
        _, sess, _ = build_int_input_model()
        inputs = make_int_inputs(8)
        del inputs["mask"]
        with self.assertRaisesRegex(export.ParityError, r"no examples for input\(s\) \['mask'\]"):
            export.export_tflite(["ids", "mask", "x"], ["output"], tempfile.mkdtemp(),
                                 sess=sess, flavours=("int8",), parity_inputs=inputs)
        sess.close()


class RangeSurvivalTest(absltest.TestCase):
    """Every activation range is a TFLite tensor of its scale, or export says so."""

    def _export(self, kind, **kwargs):
        return export.export_tflite(["input"], ["output"], tempfile.mkdtemp(),
                                    frozen_graph_def=lost_range_graph(kind), **kwargs)

    def test_expected_quantization_is_fake_quants_nudged_grid(self):
        for flavour, zero_point in (("uint8", 0), ("int8", -128)):
            scale, zp = range_survival.expected_quantization(0.0, 2.55, flavour=flavour)
            self.assertAlmostEqual(scale, 0.01)
            self.assertEqual(zp, zero_point)
        scale, zero_point = range_survival.expected_quantization(-1.0, 1.0)
        self.assertAlmostEqual(scale, 2.0 / 255.0)
        self.assertEqual(zero_point, 128)  # 127.5 rounds away from zero, as FakeQuant's.
        self.assertEqual(range_survival.expected_quantization(-2.0, -1.0)[1], 255)

    def test_every_range_of_a_plain_chain_survives(self):
        results = self._export("clean")
        for flavour, result in results.items():
            self.assertEqual(result.survival.lost, [], flavour)
            self.assertEqual(result.survival.checked, 3, flavour)  # input, conv, conv2.

    def test_removed_op_sharing_the_range_before_it_survives(self):
        for flavour, result in self._export("size_one_mean").items():
            self.assertEqual(result.survival.lost, [], flavour)
            self.assertEqual(result.survival.checked, 5, flavour)

    def test_empty_range_survives_as_the_converters_widened_one(self):
        for flavour, result in self._export("empty").items():
            self.assertEqual(result.survival.lost, [], flavour)

    def test_resize_into_concat_is_refused_naming_the_conv(self):
        for flavour in ("uint8", "int8"):
            with self.assertRaises(export.RangeLostError) as ctx:
                self._export("resize_concat", flavours=(flavour,))
            self.assertEqual([r.quantizer for r in ctx.exception.lost],
                             ["pool_conv/act_quant"], flavour)
            lost = ctx.exception.lost[0]
            self.assertEqual(lost.kind, range_survival.DIFFERS)
            self.assertAlmostEqual(lost.scale, 2.0 / 255.0, places=7)
            # TFLite gives the conv the concatenation's scale.
            self.assertEqual(lost.nearest, "pool_conv/Relu;pool_conv/Conv2D")
            self.assertAlmostEqual(lost.nearest_scale, 6.0 / 255.0, places=7)
            message = str(ctx.exception)
            self.assertIn("pool_conv/act_quant (pool_conv/Relu:0, range [0, 2]", message)
            self.assertIn("allow_lost_ranges=True", message)

    def test_allow_lost_ranges_exports_and_reports_them(self):
        results = self._export("resize_concat", allow_lost_ranges=True)
        for flavour, result in results.items():
            self.assertEqual([r.quantizer for r in result.survival.differing],
                             ["pool_conv/act_quant"], flavour)
            self.assertIn("5 of 6 activation ranges", result.survival.format())

    def test_removed_add_with_the_same_range_is_reported_not_refused(self):
        results = self._export("add_zero_same")
        for flavour, result in results.items():
            self.assertEqual([(r.quantizer, r.kind, r.nearest) for r in result.survival.lost],
                             [("add_quant", range_survival.MERGED, "mul")], flavour)
            self.assertEqual(result.survival.differing, [])
        with self.assertRaises(export.RangeLostError):
            range_survival.check_range_survival(lost_range_graph("add_zero_same"),
                                                results["int8"].model, allow_merged=False)

    def test_removed_add_with_another_range_is_refused(self):
        with self.assertRaises(export.RangeLostError) as ctx:
            self._export("add_zero_other", flavours=("uint8",))
        self.assertEqual([(r.quantizer, r.kind) for r in ctx.exception.lost],
                         [("add_quant", range_survival.DIFFERS)])

    def test_session_needs_output_names(self):
        with self.assertRaisesRegex(export.ExportError, "output_names"):
            with tf1.Session(graph=tf.Graph()) as sess:
                range_survival.check_ranges(sess, b"")


if __name__ == "__main__":
    absltest.main()
