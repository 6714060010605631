"""int8-ready rewrites: symmetric_weights, Identity model outputs, standalone
batch norms, and the warning for a FakeQuant nothing reads - checked in a
Session and by exporting to TFLite and running the models."""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1
_LAYERS = tf1.layers


def _fake_quants(graph):
    return {op.name.rsplit("/", 1)[0]: op for op in graph.get_operations()
            if op.type.startswith("FakeQuantWithMinMaxVars")}


def _var(sess, graph, name):
    found = [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
             if v.op.name == name]
    assert len(found) == 1, name
    return sess.run(found[0])


def _model(x, kind, training, conv1_init=None):
    """Small models whose last layer feeds tf.identity(name="output").

    kind: "plain" (conv -> relu -> dense), "bn_input" (a batch norm on the
    input), "bn_concat" (a batch norm after a concat, no activation) or
    "bn_add_relu" (a batch norm after a residual add, then Relu6).
    """
    bn_args = dict(training=training, momentum=0.5,
                   beta_initializer=tf1.random_uniform_initializer(-0.5, 0.5),
                   gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5))
    net = x
    if kind == "bn_input":
        net = _LAYERS.batch_normalization(net, name="in_bn", **bn_args)
    net = _LAYERS.conv2d(net, 4, 3, padding="same", activation=tf.nn.relu,
                         kernel_initializer=conv1_init, name="conv1")
    if kind == "bn_concat":
        a = _LAYERS.conv2d(net, 4, 3, padding="same", activation=tf.nn.relu,
                           name="a")
        net = tf.concat([net, a], -1, name="cat")
        net = _LAYERS.batch_normalization(net, name="cat_bn", **bn_args)
        net = tf.concat([net, a], -1, name="cat2")
    if kind == "bn_add_relu":
        a = _LAYERS.conv2d(net, 4, 3, padding="same", name="a")
        net = tf.add(net, a, name="res")
        net = _LAYERS.batch_normalization(net, name="res_bn", **bn_args)
        net = tf.nn.relu6(net, name="res_relu")
    net = _LAYERS.flatten(net)
    logits = _LAYERS.dense(net, 5, name="logits")
    return tf.identity(logits, name="output")


def _train_and_export(kind, symmetric_weights, tmp, steps=30,
                      conv1_init=None):
    """Trains a QAT graph briefly, restores it into an eval graph, exports.

    Returns (eval session, {flavour: ExportedModel} or the ExportError).
    """
    rng = np.random.RandomState(0)
    data = rng.uniform(-1.0, 1.0, (64, 6, 6, 2)).astype(np.float32)
    labels = rng.randint(0, 5, 64)
    ckpt = os.path.join(tmp, kind, "model.ckpt")
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
        y = tf1.placeholder(tf.int64, [None])
        out = _model(x, kind, training=True, conv1_init=conv1_init)
        loss = tf1.losses.sparse_softmax_cross_entropy(y, out)
        qat.experimental_create_training_graph(
            graph, symmetric_weights=symmetric_weights)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train = tf1.train.AdamOptimizer(1e-2).minimize(loss)
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for i in range(steps):
                batch = slice((i * 16) % 64, (i * 16) % 64 + 16)
                sess.run(train, {x: data[batch], y: labels[batch]})
            saver.save(sess, ckpt)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
        _model(x, kind, training=False)
        qat.experimental_create_eval_graph(
            graph, symmetric_weights=symmetric_weights)
        sess = tf1.Session(graph=graph)
        tf1.train.Saver().restore(sess, ckpt)
    try:
        results = export.export_tflite(
            ["x"], ["output"], os.path.join(tmp, kind), sess=sess,
            default_input_range=(-1.0, 1.0), parity_inputs=data)
    except export.ExportError as e:
        results = e
    return sess, results


class SymmetricWeightsTest(absltest.TestCase):

    def _ranges(self, **kwargs):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [4, 3], name="x")
            w = tf1.get_variable("dense/kernel", initializer=np.array(
                [[-0.5, 1.0], [0.25, 2.0], [0.1, 0.3]], np.float32))
            out = tf.nn.relu(tf.matmul(x, w, name="dense/MatMul"),
                             name="dense/Relu")
            total = tf.reduce_sum(out)
            qat.experimental_create_training_graph(g, **kwargs)
            fqs = _fake_quants(g)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                data = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]],
                                np.float32)
                sess.run(total, {x: data})
                weights_q = sess.run(fqs["dense/weights_quant"].outputs[0])
                ranges = {name: (_var(sess, g, name + "/min"),
                                 _var(sess, g, name + "/max"))
                          for name in ("dense/weights_quant", "dense/act_quant")}
        return ranges, weights_q, fqs

    def test_weights_symmetric_activations_not(self):
        ranges, weights_q, fqs = self._ranges(symmetric_weights=True)
        self.assertTrue(fqs["dense/weights_quant"].get_attr("narrow_range"))
        lo, hi = ranges["dense/weights_quant"]
        self.assertAlmostEqual(lo, -2.0)
        self.assertAlmostEqual(hi, 2.0)
        # Zero point 0 in int8: every weight is a multiple of max / 127.
        steps = weights_q / (2.0 / 127)
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
        self.assertAlmostEqual(-32 * 2.0 / 127, float(weights_q[0, 0]), places=6)
        # The ReLU output's EMA range stays asymmetric: [0, max].
        lo, hi = ranges["dense/act_quant"]
        self.assertEqual(lo, 0.0)
        self.assertGreater(hi, 0.0)

    def test_default_is_contrib_asymmetric(self):
        ranges, _, _ = self._ranges()
        self.assertEqual(tuple(ranges["dense/weights_quant"]), (-0.5, 2.0))

    def test_symmetric_also_makes_activations_symmetric(self):
        ranges, _, _ = self._ranges(symmetric=True, symmetric_weights=True)
        self.assertAlmostEqual(ranges["dense/weights_quant"][0], -2.0)
        lo, hi = ranges["dense/act_quant"]
        self.assertLess(lo, 0.0)  # A bit spent on negatives after a ReLU.

    def test_bad_value_leaves_graph_unchanged(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 3])
            tf1.layers.dense(x, 2)
            before = len(g.get_operations())
            with self.assertRaisesRegex(TypeError, "symmetric_weights"):
                qat.experimental_create_eval_graph(g, symmetric_weights="yes")
            # One rule for every entry point: a flag of the wrong type.
            with self.assertRaisesRegex(TypeError, "symmetric_weights"):
                qat.insert_quant_ops(g, symmetric_weights=1)
        self.assertLen(g.get_operations(), before)


class Int8ExportTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()

    def test_symmetric_weights_int8_runs(self):
        sess, results = _train_and_export("plain", True, self.tmp)
        sess.close()
        self.assertNotIsInstance(results, Exception, str(results))
        report = results["int8"].report
        self.assertEqual([op.name for op in report.ops],
                         ["QUANTIZE", "CONV_2D", "RESHAPE", "FULLY_CONNECTED",
                          "DEQUANTIZE"])
        for op in report.ops:
            if op.name in ("CONV_2D", "FULLY_CONNECTED"):
                weights = report.tensors[op.inputs[1]]
                self.assertEqual(np.dtype(weights.dtype).name, "int8")
                self.assertEqual(weights.zero_point, 0)
        for flavour in ("uint8", "int8"):
            self.assertGreaterEqual(results[flavour].parity.top1_agreement, 0.95)
            self.assertLessEqual(results[flavour].parity.max_diff_steps, 3.0)

    def test_asymmetric_int8_refused_with_instructions(self):
        # Mostly positive conv weights: an asymmetric range whose int8 zero
        # point is far from 0 (a near-symmetric one could round to 0).
        sess, results = _train_and_export(
            "plain", False, self.tmp,
            conv1_init=tf1.random_uniform_initializer(0.05, 0.5))
        sess.close()
        self.assertIsInstance(results, export.ConversionError)
        self.assertIn("the TFLite runtime refuses the model", str(results))
        self.assertIn("symmetric_weights=True", str(results))
        self.assertIn("conv1/weights_quant", str(results))


class IdentityOutputTest(absltest.TestCase):

    def test_act_quant_feeds_the_identity(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
            out = _model(x, "plain", training=False)
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
        fq = _fake_quants(g)["logits/act_quant"]
        self.assertEqual(fq.inputs[0].op.name, "logits/BiasAdd")
        self.assertIs(out.op.inputs[0], fq.outputs[0])
        self.assertEqual(set(_fake_quants(g)),
                         {"conv1/input_quant", "conv1/weights_quant",
                          "conv1/act_quant", "logits/weights_quant",
                          "logits/act_quant"})

    def test_identity_with_consumer_reads_act_quant(self):
        # Identity is no activation (TFLite drops it): the range goes before
        # it, and what reads the Identity reads the quantized value.
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
            out = _model(x, "plain", training=False)
            probs = tf.nn.softmax(out, name="probs")
            qat.experimental_create_eval_graph(g)
        fq = _fake_quants(g)["logits/act_quant"]
        self.assertEqual(fq.inputs[0].op.name, "logits/BiasAdd")
        self.assertIs(out.op.inputs[0], fq.outputs[0])
        self.assertIs(probs.op.inputs[0], out)

    def test_identity_beside_the_loss_reads_act_quant(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
            out = _model(x, "plain", training=True)
            logits = out.op.inputs[0]
            labels = tf1.placeholder(tf.int64, [None])
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits, name="xent")
            qat.experimental_create_training_graph(g)
        fq = _fake_quants(g)["logits/act_quant"]
        self.assertIs(fq.inputs[0], logits)
        self.assertIs(out.op.inputs[0], fq.outputs[0])
        xent = g.get_operation_by_name("xent/xent")
        self.assertIs(xent.inputs[0], fq.outputs[0])

    def test_identity_output_exports_fully_integer(self):
        with tempfile.TemporaryDirectory() as tmp:
            sess, results = _train_and_export("plain", True, tmp, steps=5)
            sess.close()
        self.assertNotIsInstance(results, Exception, str(results))
        for flavour in ("uint8", "int8"):
            report = results[flavour].report
            fc = [op for op in report.ops if op.name == "FULLY_CONNECTED"]
            self.assertLen(fc, 1)
            self.assertEqual(export.inspect.tensor_types(report, fc[0].outputs),
                             [flavour])
            self.assertEqual(export.find_float_ops(report), [])

    def test_rewrite_twice_changes_nothing(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
            _model(x, "bn_input", training=False)
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            before = len(g.get_operations())
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
        self.assertLen(g.get_operations(), before)


class UnconsumedWarningTest(absltest.TestCase):

    def test_rewrite_before_loss_warns(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 3], name="x")
            logits = tf1.layers.dense(x, 2, name="logits")  # Nothing reads it yet.
            with self.assertLogs("absl", level="WARNING") as logs:
                qat.experimental_create_training_graph(g)
        text = "\n".join(logs.output)
        self.assertIn(f"nothing reads '{logits.name}'", text)
        self.assertIn("logits/act_quant/FakeQuantWithMinMaxVars:0", text)
        self.assertIn("call the rewrite after building the loss", text)

    def test_fetched_activation_gets_a_range_and_a_warning(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 3], name="x")
            out = tf1.layers.dense(x, 2, activation=tf.nn.relu, name="fc")
            with self.assertLogs("absl", level="WARNING") as logs:
                qat.experimental_create_eval_graph(g)
        fq = _fake_quants(g)["fc/act_quant"]
        self.assertIs(fq.inputs[0], out)
        self.assertEmpty(fq.outputs[0].consumers())
        self.assertIn(f"nothing reads '{out.name}'", "\n".join(logs.output))

    def test_no_warning_when_everything_is_read(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 3], name="x")
            tf.reduce_sum(tf1.layers.dense(x, 2, name="logits"))
            with self.assertNoLogs("absl", level="WARNING"):
                qat.experimental_create_training_graph(g)


class StandaloneBatchNormTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()

    @parameterized.parameters(
        ("bn_input", "in_bn/bn_quant"),
        ("bn_concat", "cat_bn/bn_quant"),
        ("bn_add_relu", "res_bn/act_quant"),
    )
    def test_exports_fully_integer_both_flavours(self, kind, range_name):
        sess, results = _train_and_export(kind, True, self.tmp)
        graph = sess.graph
        self.assertIn(range_name, _fake_quants(graph))
        # The eval graph runs the batch norm as a quantized 1x1 depthwise conv.
        bn = [op for op in graph.get_operations()
              if op.type == "FusedBatchNormV3"]
        self.assertLen(bn, 1)
        self.assertEmpty(bn[0].outputs[0].consumers())
        sess.close()
        self.assertNotIsInstance(results, Exception, str(results))
        for flavour in ("uint8", "int8"):
            report = results[flavour].report
            self.assertIn("DEPTHWISE_CONV_2D", report.op_counts())
            self.assertEqual(export.find_float_ops(report), [])
            parity = results[flavour].parity
            # Measured 0.969 to 1.0 (64 examples, 5 classes barely trained).
            self.assertGreaterEqual(parity.top1_agreement, 0.9, flavour)
            # TFLite requantizes concat inputs to one scale (int8: to the
            # batch norm's, then to the concat's), which the eval graph's
            # FakeQuants do not simulate, and training is not bit-exact from
            # run to run: measured 0.03 to 1.1 output steps on average, 2 to
            # 18 at most over 320 outputs (30 runs of the concat model).
            # These are bounds against gross errors.
            self.assertLessEqual(parity.mean_diff_steps, 2.0, flavour)
            self.assertLessEqual(parity.max_diff_steps, 32.0, flavour)

    def test_training_tensor_batch_norm_matches_eval_names(self):
        # A `training` tensor wraps the batch norm in an If op: the training
        # graph still names its range like the eval graph does.
        names = {}
        for mode in ("train", "eval"):
            g = tf.Graph()
            with g.as_default():
                x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
                training = (tf1.placeholder_with_default(True, [])
                            if mode == "train" else False)
                net = _LAYERS.batch_normalization(x, training=training,
                                                  name="in_bn")
                net = _LAYERS.conv2d(net, 4, 3, name="conv1")
                tf.reduce_sum(net)
                if mode == "train":
                    qat.experimental_create_training_graph(g)
                else:
                    qat.experimental_create_eval_graph(g)
            # The range variables (training graphs also count each range's
            # skipped batches, in variables the eval graph does not read).
            names[mode] = {v.op.name for v in g.get_collection(
                tf1.GraphKeys.GLOBAL_VARIABLES)
                if v.op.name.endswith(("/min", "/max"))}
        self.assertEqual(names["train"], names["eval"])
        self.assertIn("in_bn/bn_quant/min", names["eval"])
        self.assertIn("in_bn/input_quant/min", names["eval"])

    def test_depthwise_form_equals_the_batch_norm(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
            bn = _LAYERS.batch_normalization(
                x, training=False, name="bn",
                beta_initializer=tf1.constant_initializer([0.3, -0.2]),
                gamma_initializer=tf1.constant_initializer([0.5, 1.5]),
                moving_mean_initializer=tf1.constant_initializer([0.1, -0.4]),
                moving_variance_initializer=tf1.constant_initializer([2.0, 0.5]))
            out = tf.identity(bn, name="out")
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                data = np.random.RandomState(0).uniform(
                    -1, 1, (3, 6, 6, 2)).astype(np.float32)
                expected = sess.run(out, {x: data})
                qat.experimental_create_eval_graph(g)
                got = sess.run(out, {x: data})
                fq = _fake_quants(g)["bn/FusedBatchNormV3_depthwise/weights_quant"]
                self.assertTrue(fq.get_attr("narrow_range"))
                self.assertEqual(out.op.inputs[0].op.name, "bn/bn_quant/FakeQuantWithMinMaxVars")
                self.assertEqual(fq.outputs[0].consumers()[0].type, "DepthwiseConv2dNative")
        self.assertEqual(fq.type, "FakeQuantWithMinMaxVars")
        # Weight steps of max|scale| / 127 (scale 1.5/sqrt(0.501) = 2.12), and
        # the output's [-6, 6] range: within a few output steps.
        np.testing.assert_allclose(got, expected, atol=0.1)

    def test_per_channel_depthwise_weights(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
            bn = _LAYERS.batch_normalization(
                x, training=False, name="bn",
                gamma_initializer=tf1.constant_initializer([0.01, 1.5]))
            tf.identity(bn, name="out")
            qat.fold_batch_norms(g, is_training=False)
            qat.insert_quant_ops(g, is_training=False, per_channel=True)
            fq = g.get_operation_by_name(
                "bn/FusedBatchNormV3_depthwise/weights_quant/"
                "FakeQuantWithMinMaxVars")
            self.assertEqual(fq.type, "FakeQuantWithMinMaxVarsPerChannel")
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                weights = sess.run(fq.outputs[0]).ravel()
        # One range per channel: the small scale keeps its precision (per
        # tensor it would become one step of 1.5 / 127, 18% too large).
        scale = np.array([0.01, 1.5]) / np.sqrt(1.0 + 1e-3)
        np.testing.assert_allclose(weights, scale, rtol=1e-2)


if __name__ == "__main__":
    absltest.main()
