"""per_channel_weights=True: TFLite int8's own weight scheme, end to end.

The flag of `experimental_create_training_graph` / `experimental_create_eval_graph`
gives symmetric narrow-range weights with one range per output channel for
Conv2D and DepthwiseConv2dNative (depth multipliers 1 and 2), one symmetric
range for MatMul (TFLite's FULLY_CONNECTED weights are per-tensor), and
asymmetric per-tensor activations. Checked: the range variables (contrib's
names, vectors of the output channels), the refusals (bad flag, a second
rewrite with other settings, a per-tensor eval graph restoring a per-channel
checkpoint, uint8 export), and the int8 TFLite models, through `qat.export`
and through TF's converter with the flags of docs/int8_export.md: per-channel int8 kernels
in the flatbuffer, no float compute op, TFLite agreeing with the eval graph;
then a short fine-tune on the digits, int8 within 1 point of float.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import digits_util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.engine import config as config_lib  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1

_SHAPE = [6, 6, 2]
# Output channels of each weight quantizer: conv 6, depthwise 6 x 1 and
# 6 x 2 (TFLite's [1, h, w, in * multiplier] layout), the dense layer none
# (one range).
_CHANNELS = {"conv/weights_quant": 6, "dw1/weights_quant": 6,
             "dw2/weights_quant": 12, "logits/weights_quant": None}
_KERNEL_AXES = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3}


def _model(x, training):
    """conv -> BN -> ReLU -> depthwise x1 -> ReLU6 -> depthwise x2 -> BN -> ReLU6 -> dense.

    The batch norm after the depthwise conv is folded into its weights (in
    training graphs the conv reads them through the fold's unscale Mul).
    """
    net = tf1.layers.conv2d(x, 6, 3, padding="same", use_bias=False, name="conv")
    net = tf.nn.relu(tf1.layers.batch_normalization(
        net, training=training, momentum=0.5, name="bn"))
    for name, multiplier in (("dw1", 1), ("dw2", 2)):
        with tf1.variable_scope(name):
            kernel = tf1.get_variable("depthwise_kernel",
                                      [3, 3, net.shape[-1], multiplier])
            net = tf.nn.depthwise_conv2d(net, kernel, [1, 1, 1, 1], "SAME")
            if multiplier == 1:
                bias = tf1.get_variable("bias", [net.shape[-1]],
                                        initializer=tf1.constant_initializer(0.05))
                net = tf.nn.bias_add(net, bias)
            else:
                net = tf1.layers.batch_normalization(
                    net, training=training, momentum=0.5, name="bn",
                    gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5))
            net = tf.nn.relu6(net)
    logits = tf1.layers.dense(tf1.layers.flatten(net), 5, name="logits")
    return tf.identity(logits, name="output")


def _data(n=32):
    rng = np.random.RandomState(0)
    return (rng.uniform(0.0, 1.0, [n] + _SHAPE).astype(np.float32),
            rng.randint(0, 5, n))


def _train(path, steps=8, **settings):
    """A few QAT steps; saves the checkpoint at `path`."""
    images, labels = _data()
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None] + _SHAPE, name="x")
        y = tf1.placeholder(tf.int64, [None])
        loss = tf1.losses.sparse_softmax_cross_entropy(y, _model(x, True))
        qat.experimental_create_training_graph(g, **settings)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.AdamOptimizer(1e-2).minimize(loss)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for _ in range(steps):
                sess.run(train_op, {x: images, y: labels})
            tf1.train.Saver().save(sess, path)


def _eval_session(path, **settings):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None] + _SHAPE, name="x")
        _model(x, False)
        qat.experimental_create_eval_graph(g, **settings)
        sess = tf1.Session(graph=g)
        tf1.train.Saver().restore(sess, path)
    return sess


def _tempdir():
    return tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())


def _weight_quantization(model):
    """[(builtin name, weight tensor details, bias tensor details)] of the
    CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED ops of a .tflite model."""
    from ai_edge_litert import interpreter as litert  # pylint: disable=g-import-not-at-top
    interp = litert.Interpreter(model_content=model)
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    found = []
    for op in interp._get_ops_details():  # pylint: disable=protected-access
        if op["op_name"] in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            found.append((op["op_name"], tensors[op["inputs"][1]], tensors[op["inputs"][2]]))
    return found


class FlagTest(absltest.TestCase):

    def _graph(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None] + _SHAPE, name="x")
            _model(x, True)
        return g

    def test_rejects_a_flag_that_is_not_a_bool_leaving_the_graph_unchanged(self):
        with self.assertRaisesRegex(TypeError, "per_channel_weights must be a bool"):
            config_lib.RewriteConfig(per_channel_weights=1)
        g = self._graph()
        before = g.as_graph_def()
        for rewrite in (qat.experimental_create_training_graph,
                        qat.experimental_create_eval_graph):
            with self.assertRaisesRegex(TypeError, "per_channel_weights"):
                rewrite(g, per_channel_weights="yes")
        self.assertEqual(g.as_graph_def(), before)

    def test_implies_symmetric_weights_per_output_channel_of_convs(self):
        config = config_lib.RewriteConfig(per_channel_weights=True)
        self.assertTrue(config.weights_symmetric())
        self.assertTrue(config.conv_weights_per_channel())
        self.assertFalse(config.matmul_weights_per_channel())
        self.assertFalse(config_lib.RewriteConfig().conv_weights_per_channel())

    def test_training_ranges_are_symmetric_vectors_of_the_output_channels(self):
        g = self._graph()
        with g.as_default():
            qat.experimental_create_training_graph(g, per_channel_weights=True)
            variables = {v.op.name: v for v in tf1.global_variables()}
            fake_quants = {op.name.rsplit("/", 1)[0]: op for op in g.get_operations()
                           if op.type.startswith("FakeQuantWithMinMaxVars")}
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                # The weights as quantized: folded conv weights, depthwise
                # weights reshaped to [h, w, in * multiplier].
                kernels, _ = sess.run((
                    {p: fake_quants[p].inputs[0] for p in _CHANNELS},
                    {p: fake_quants[p].outputs[0] for p in _CHANNELS}),  # Range updates.
                    {g.get_tensor_by_name("x:0"): _data()[0]})
                ranges = sess.run(
                    {p: (variables[p + "/min"], variables[p + "/max"]) for p in _CHANNELS})
        for prefix, channels in _CHANNELS.items():
            fake_quant = fake_quants[prefix]
            self.assertTrue(fake_quant.get_attr("narrow_range"), prefix)
            lo, hi = ranges[prefix]
            kernel = kernels[prefix]
            if channels is None:
                self.assertEqual(fake_quant.type, "FakeQuantWithMinMaxVars")
                self.assertEqual(lo.shape, ())
                expected = np.abs(kernel).max()
            else:
                self.assertEqual(fake_quant.type, "FakeQuantWithMinMaxVarsPerChannel")
                self.assertEqual(lo.shape, (channels,), prefix)
                self.assertEqual(kernel.shape[-1], channels, prefix)
                expected = np.abs(kernel.reshape(-1, channels)).max(0)
            np.testing.assert_allclose(hi, expected, rtol=1e-6, err_msg=prefix)
            np.testing.assert_allclose(lo, -hi, err_msg=prefix)
        # Activations stay asymmetric and per tensor.
        self.assertEqual(fake_quants["dw1/act_quant"].type, "FakeQuantWithMinMaxVars")
        self.assertFalse(fake_quants["dw1/act_quant"].get_attr("narrow_range"))

    def test_a_second_rewrite_with_other_settings_is_refused(self):
        g = self._graph()
        qat.experimental_create_training_graph(g, per_channel_weights=True)
        before = g.as_graph_def()
        qat.experimental_create_training_graph(g, per_channel_weights=True)  # Same: no-op.
        self.assertEqual(g.as_graph_def(), before)
        for settings in ({}, {"symmetric_weights": True}):
            with self.assertRaisesRegex(ValueError, r"already rewritten by qat \(quantize:.*"
                                        "per_channel_weights=True"):
                qat.experimental_create_training_graph(g, **settings)
        with self.assertRaisesRegex(ValueError, "already rewritten by qat"):
            qat.experimental_create_eval_graph(g, per_channel_weights=True)
        self.assertEqual(g.as_graph_def(), before)

    def test_eval_graph_with_other_weight_ranges_fails_at_its_first_run(self):
        # TF restores a vector into a scalar resource variable (and back)
        # without a shape check; the weight FakeQuant then refuses to run.
        images, _ = _data()
        for trained, evaluated, rank in (("per_channel_weights", "symmetric_weights", 0),
                                         ("symmetric_weights", "per_channel_weights", 1)):
            path = os.path.join(_tempdir(), "model")
            _train(path, steps=1, **{trained: True})
            sess = _eval_session(path, **{evaluated: True})
            with sess, self.assertRaisesRegex(
                    tf.errors.InvalidArgumentError,
                    rf"(?s)`min` must be rank {rank}.*/weights_quant/FakeQuantWithMinMaxVars"):
                sess.run(sess.graph.get_tensor_by_name("output:0"),
                         {sess.graph.get_tensor_by_name("x:0"): images})


class Int8ExportTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._dir = _tempdir()
        cls._ckpt = os.path.join(cls._dir, "per_channel", "model")
        _train(cls._ckpt, per_channel_weights=True)

    def _check_int8_model(self, model):
        layers = _weight_quantization(model)
        # One scale per output channel: 6 for the conv, 6 x 1 and 6 x 2 for
        # the depthwise convs; one for the dense layer.
        self.assertCountEqual(
            [(name, len(w["quantization_parameters"]["scales"])) for name, w, _ in layers],
            [("CONV_2D", 6), ("DEPTHWISE_CONV_2D", 6), ("DEPTHWISE_CONV_2D", 12),
             ("FULLY_CONNECTED", 1)])
        for name, weights, bias in layers:
            params = weights["quantization_parameters"]
            self.assertEqual(weights["dtype"], np.int8, name)
            self.assertEqual(bias["dtype"], np.int32, name)
            np.testing.assert_array_equal(params["zero_points"], 0)
            if name == "FULLY_CONNECTED":
                self.assertLen(params["scales"], 1)
                continue
            axis = _KERNEL_AXES[name]
            self.assertEqual(params["quantized_dimension"], axis, name)
            self.assertLen(params["scales"], weights["shape"][axis])
            self.assertLen(bias["quantization_parameters"]["scales"], weights["shape"][axis])
            # Really one range per channel: the scales differ.
            self.assertGreater(len(set(params["scales"].tolist())), 1, name)
        self.assertEqual(export.find_float_ops(export.describe_model(model)), [])

    @parameterized.named_parameters(("qat_export", "qat_export"),
                                    ("tf_converter_readme_flags", "tf_converter"))
    def test_int8_per_channel_kernels_match_the_eval_graph(self, path):
        images, _ = _data()
        sess = _eval_session(self._ckpt, per_channel_weights=True)
        with sess:
            if path == "qat_export":
                model = export.export_tflite(
                    ["x"], ["output"], os.path.join(self._dir, "qat_export"), sess=sess,
                    flavours=("int8",), default_input_range=(0.0, 1.0))["int8"].model
            else:  # The flags of docs/int8_export.md, on the live eval session.
                converter = tf1.lite.TFLiteConverter.from_session(
                    sess, [sess.graph.get_tensor_by_name("x:0")],
                    [sess.graph.get_tensor_by_name("output:0")])
                lo, hi = 0.0, 1.0
                std = 255.0 / (hi - lo)
                mean = -lo * std
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
                converter.inference_type = tf.int8
                converter.quantized_input_stats = {"x": (mean - 128, std)}
                model = converter.convert()
            self._check_int8_model(model)
            report = export.check_parity(model, sess, "x", "output", images,
                                         min_top1_agreement=0.9, max_diff_steps=4.0)
        print(f"{path}: int8 per-channel parity: {report.format()}")

    def test_uint8_is_refused_before_anything_is_converted(self):
        out_dir = os.path.join(self._dir, "uint8_refused")
        sess = _eval_session(self._ckpt, per_channel_weights=True)
        with sess:
            frozen = export.freeze_session(sess, ["output"])
            with self.assertRaisesRegex(export.ExportError,
                                        r"uint8 export refused.*conv/weights_quant.*int8"):
                export.export_tflite(["x"], ["output"], out_dir, sess=sess,
                                     flavours=("int8", "uint8"),
                                     default_input_range=(0.0, 1.0))
        self.assertFalse(os.path.exists(out_dir))
        with self.assertRaisesRegex(export.ExportError, "per-channel"):
            export.convert_frozen_graph(frozen, ["x"], ["output"], "uint8",
                                        default_input_range=(0.0, 1.0))
        self.assertEqual(export.per_channel_fake_quants(frozen),
                         ["conv/weights_quant/FakeQuantWithMinMaxVars",
                          "dw1/weights_quant/FakeQuantWithMinMaxVars",
                          "dw2/weights_quant/FakeQuantWithMinMaxVars"])


def _digits_network(training):
    x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="x")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    h = tf1.layers.conv2d(x, 8, 3, padding="same", use_bias=False, name="conv")
    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=training, momentum=0.9,
                                                  name="bn"))
    kernel = tf1.get_variable("dw/depthwise_kernel", [3, 3, 8, 2])
    h = tf.nn.relu6(tf.nn.depthwise_conv2d(h, kernel, [1, 2, 2, 1], "SAME"))
    logits = tf.identity(tf1.layers.dense(tf1.layers.flatten(h), 10, name="logits"),
                         name="output")
    return x, labels, logits, tf1.losses.sparse_softmax_cross_entropy(labels, logits)


class DigitsFineTuneTest(absltest.TestCase):

    def _train(self, data, path, quantize, init_path=None, steps=200):
        g = tf.Graph()
        with g.as_default():
            tf1.set_random_seed(1)
            x, labels, _, loss = _digits_network(training=True)
            float_saver = tf1.train.Saver()
            if quantize:
                qat.experimental_create_training_graph(g, per_channel_weights=True)
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train_op = tf1.train.AdamOptimizer(
                    1e-2 if init_path is None else 1e-3).minimize(loss)
            rng = np.random.RandomState(2)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                if init_path is not None:
                    float_saver.restore(sess, init_path)
                for _ in range(steps):
                    idx = rng.randint(0, len(data[1]), 64)
                    sess.run(train_op, {x: data[0][idx], labels: data[1][idx]})
                tf1.train.Saver().save(sess, path)

    def _eval(self, path, quantize):
        g = tf.Graph()
        with g.as_default():
            x, _, logits, _ = _digits_network(training=False)
            if quantize:
                qat.experimental_create_eval_graph(g, per_channel_weights=True)
            sess = tf1.Session(graph=g)
            tf1.train.Saver().restore(sess, path)
        return sess, x, logits

    def test_int8_tflite_within_one_point_of_float(self):
        train_data, (images, targets) = digits_util.digits_split()
        tmp = _tempdir()
        paths = {k: os.path.join(tmp, k, "model") for k in ("pretrained", "float", "qat")}
        self._train(train_data, paths["pretrained"], False, steps=300)
        self._train(train_data, paths["float"], False, paths["pretrained"])
        self._train(train_data, paths["qat"], True, paths["pretrained"])
        sess, x, logits = self._eval(paths["float"], False)
        with sess:
            float_acc = 100.0 * np.mean(sess.run(logits, {x: images}).argmax(1) == targets)
        sess, x, logits = self._eval(paths["qat"], True)
        with sess:
            models = export.export_tflite(["x"], ["output"], tmp, sess=sess,
                                          flavours=("int8",),
                                          input_ranges={"x": (0.0, 1.0)})
        int8_acc = 100.0 * np.mean(
            export.run_tflite(models["int8"].model, images).argmax(1) == targets)
        print(f"digits: float {float_acc:.2f}%, TFLite int8 per-channel {int8_acc:.2f}%")
        self.assertGreater(float_acc, 90.0)
        self.assertGreaterEqual(int8_acc, float_acc - 1.0)


if __name__ == "__main__":
    absltest.main()
