"""insert_quant_ops and the public API on small graphs: sharing, separable
convs, concat / mean ranges, gradient ops, scope, per-channel, errors."""
import os
import subprocess
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.quantize import plan as quantize  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()


def _fake_quants(g):
    return {op.name.rsplit("/", 1)[0]: op for op in g.get_operations()
            if op.type.startswith("FakeQuantWithMinMaxVars")}


def _conv(x, name, channels=4, w=None, act=tf.nn.relu):
    with tf.compat.v1.variable_scope(name):
        if w is None:
            w = tf.compat.v1.get_variable(
                "weights", [3, 3, int(x.shape[-1]), channels])
        b = tf.compat.v1.get_variable("biases", [int(w.shape[-1])])
        y = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b)
        return act(y) if act else y


class InsertQuantOpsTest(absltest.TestCase):

    def test_shared_weights_quantized_once(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 4], name="x")
            w = tf.compat.v1.get_variable("shared", [3, 3, 4, 4])
            y = _conv(_conv(x, "c1", w=w), "c2", w=w)
            tf.identity(y, name="out")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        weight_fqs = [n for n in fqs if n.endswith("weights_quant")]
        self.assertEqual(weight_fqs, ["c1/weights_quant"])
        convs = [op for op in g.get_operations() if op.type == "Conv2D"]
        self.assertLen(convs, 2)
        for conv in convs:
            self.assertIs(conv.inputs[1], fqs["c1/weights_quant"].outputs[0])

    def test_separable_conv_quantized_between(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            dw = tf.compat.v1.get_variable("sep/depthwise_weights", [3, 3, 3, 1])
            pw = tf.compat.v1.get_variable("sep/pointwise_weights", [1, 1, 3, 5])
            with tf.name_scope("sep"):
                y = tf.nn.separable_conv2d(x, dw, pw, [1, 1, 1, 1], "SAME")
            y = tf.nn.relu6(y, name="sep/Relu6")
            qat.insert_quant_ops(g, is_training=False)
        fqs = _fake_quants(g)
        dw_op = [op for op in g.get_operations()
                 if op.type == "DepthwiseConv2dNative"][0]
        pw_op = [op for op in g.get_operations() if op.type == "Conv2D"][0]
        dw_ctx = dw_op.name.rsplit("/", 1)[0]
        between = fqs[dw_ctx + "/act_quant"]
        self.assertIs(between.inputs[0], dw_op.outputs[0])
        self.assertIs(pw_op.inputs[0], between.outputs[0])
        self.assertIn(dw_ctx + "/weights_quant", fqs)
        self.assertIn(pw_op.name.rsplit("/", 1)[0] + "/weights_quant", fqs)

    def test_concat_mean_and_input_get_ranges(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            a = _conv(x, "a")
            b = _conv(x, "b", act=lambda t: tf.nn.leaky_relu(t, 0.2))
            c = tf.concat([a, b], axis=3, name="cat/concat")
            m = tf.reduce_mean(c, [1, 2], name="pool/Mean")
            w = tf.compat.v1.get_variable("fc/weights", [8, 2])
            tf.matmul(m, w, name="fc/MatMul")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {
            "a/weights_quant", "b/weights_quant", "fc/weights_quant",
            "a/act_quant", "b/act_quant", "b/leaky_relu_quant",
            "cat/concat_quant", "pool/mean_quant", "fc/act_quant",
            "a/input_quant"})
        # TFLite does not fuse LEAKY_RELU into the conv: both get a range.
        self.assertEqual(fqs["b/act_quant"].inputs[0].op.type, "BiasAdd")
        self.assertEqual(fqs["b/leaky_relu_quant"].inputs[0].op.type,
                         "LeakyRelu")
        concat = g.get_operation_by_name("cat/concat")
        self.assertIs(concat.inputs[0], fqs["a/act_quant"].outputs[0])
        self.assertIs(g.get_operation_by_name("pool/Mean").inputs[0],
                      fqs["cat/concat_quant"].outputs[0])
        self.assertIs(g.get_operation_by_name("fc/MatMul").inputs[0],
                      fqs["pool/mean_quant"].outputs[0])

    def test_transposed_conv_quantized(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 4, 4, 3], name="x")
            w = tf.compat.v1.get_variable("up/weights", [3, 3, 5, 3])
            b = tf.compat.v1.get_variable("up/biases", [5])
            y = tf.nn.conv2d_transpose(x, w, [1, 8, 8, 5], 2,
                                       name="up/conv2d_transpose")
            y = tf.nn.leaky_relu(tf.nn.bias_add(y, b), name="up/LeakyRelu")
            out = _conv(y, "next")
            tf.identity(out, name="out")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {"up/weights_quant", "up/act_quant",
                                    "up/leaky_relu_quant",
                                    "next/weights_quant", "next/act_quant",
                                    "up/input_quant"})
        transposed = g.get_operation_by_name("up/conv2d_transpose")
        self.assertIs(transposed.inputs[1], fqs["up/weights_quant"].outputs[0])
        self.assertIs(transposed.inputs[2], fqs["up/input_quant"].outputs[0])
        self.assertEqual(fqs["up/leaky_relu_quant"].inputs[0].op.type,
                         "LeakyRelu")

    def test_scaled_residual(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 4], name="x")
            branch = _conv(x, "block/conv", act=None)
            scaled = tf.multiply(branch, 0.2, name="block/conv/scale")
            out = tf.nn.relu(tf.add(x, scaled, name="block/add"),
                             name="block/Relu")
            tf.identity(out, name="out")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        # A scalar multiply after a layer is an integer MUL of its own (in
        # the layer's tail the converter would fold it into the quantized
        # weights): the conv output and the product each get a range.
        self.assertEqual(set(fqs), {"block/conv/weights_quant",
                                    "block/conv/act_quant",
                                    "block/conv/mul_quant", "block/act_quant",
                                    "block/conv/input_quant"})
        self.assertIs(scaled.op.inputs[0], fqs["block/conv/act_quant"].outputs[0])
        self.assertIs(fqs["block/conv/mul_quant"].inputs[0], scaled)
        add = g.get_operation_by_name("block/add")
        self.assertIs(add.inputs[1], fqs["block/conv/mul_quant"].outputs[0])
        self.assertIs(add.inputs[0], fqs["block/conv/input_quant"].outputs[0])

    def test_unconsumed_model_output_gets_a_range(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = _conv(x, "logits", act=None)  # Fetched by the user only.
            qat.insert_quant_ops(g, is_training=False)
        fq = _fake_quants(g)["logits/act_quant"]
        self.assertIs(fq.inputs[0], y)
        self.assertEmpty(fq.outputs[0].consumers())
        self.assertEqual(quantize.existing_quantizer(y)[0], fq.outputs[0])

    def test_fold_with_functional_cond_tail(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
            h = tf.compat.v1.layers.conv2d(x, 4, 3, padding="same",
                                           use_bias=False, name="c")
            h = tf.compat.v1.layers.batch_normalization(h, training=True,
                                                        name="bn")
            out = tf.nn.relu(h, name="c/Relu")
            tf.identity(out, name="out")
            qat.fold_batch_norms(g, is_training=True,
                                 freeze_batch_norm_delay=10, use_cond=True)
            self.assertTrue(any(op.type in ("If", "StatelessIf")
                                for op in g.get_operations()))
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {"c/weights_quant", "c/act_quant",
                                    "c/input_quant"})
        self.assertIs(fqs["c/act_quant"].inputs[0], out)

    def test_loss_arithmetic_not_quantized(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
            labels = tf.compat.v1.placeholder(tf.int32, [2], name="labels")
            h = tf.reduce_mean(_conv(x, "c"), [1, 2], name="pool/Mean")
            w = tf.compat.v1.get_variable("fc/weights", [4, 3])
            logits = tf.matmul(h, w, name="fc/MatMul")
            xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits)
            loss = tf.add(tf.reduce_mean(xent, name="loss/Mean"),
                          tf.reduce_mean(tf.square(logits)), name="loss/add")
            qat.insert_quant_ops(g, is_training=True)
        self.assertEqual(set(_fake_quants(g)), {
            "c/weights_quant", "c/act_quant", "pool/mean_quant",
            "fc/weights_quant", "fc/act_quant", "c/input_quant"})
        self.assertEqual(loss.op.inputs[0].op.type, "Mean")

    def test_gradient_ops_never_quantized(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 6], name="x")
            w1 = tf.compat.v1.get_variable("fc1/weights", [6, 6])
            w2 = tf.compat.v1.get_variable("fc2/weights", [6, 3])
            h = tf.nn.relu(tf.matmul(x, w1, name="fc1/MatMul"), name="fc1/Relu")
            logits = tf.matmul(h, w2, name="fc2/MatMul")
            loss = tf.reduce_sum(tf.square(logits))
            grads = tf.compat.v1.gradients(loss, [w1, w2])
            grad_ops = {op for op in g.get_operations()
                        if op.name.startswith("gradients/")}
            grad_inputs = {op: list(op.inputs) for op in grad_ops}
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {"fc1/weights_quant", "fc2/weights_quant",
                                    "fc1/act_quant", "fc2/act_quant",
                                    "fc1/input_quant"})
        for op, inputs in grad_inputs.items():  # Gradients still read float.
            self.assertEqual(list(op.inputs), inputs, op.name)
        for fq in fqs.values():
            self.assertNotIn(fq.inputs[0].op, grad_ops)
        self.assertLen(grads, 2)

    def test_scope_limits_the_rewrite(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = _conv(_conv(x, "outside"), "inside")
            tf.identity(y, name="out")
            qat.insert_quant_ops(g, is_training=True, scope="inside")
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {"inside/weights_quant", "inside/act_quant",
                                    "inside/input_quant"})
        # The input of the scoped layer still gets its range.
        self.assertEqual(fqs["inside/input_quant"].inputs[0].op.type, "Relu")

    def test_per_channel(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = _conv(x, "c", channels=5)
            dw = tf.compat.v1.get_variable("d/weights", [3, 3, 5, 2])
            y = tf.nn.relu(tf.nn.depthwise_conv2d(y, dw, [1, 1, 1, 1], "SAME",
                                                  name="d/depthwise"))
            qat.insert_quant_ops(g, is_training=True, per_channel=True)
            fqs = _fake_quants(g)
            self.assertEqual(fqs["c/weights_quant"].type,
                             "FakeQuantWithMinMaxVarsPerChannel")
            self.assertEqual(fqs["c/act_quant"].type, "FakeQuantWithMinMaxVars")
            variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
            self.assertEqual(variables["c/weights_quant/min"].shape, [5])
            self.assertEqual(variables["d/weights_quant/max"].shape, [10])
            dw_op = g.get_operation_by_name("d/depthwise")
            self.assertEqual(dw_op.inputs[1].shape, [3, 3, 5, 2])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(y, {x: np.ones([1, 8, 8, 3], np.float32)})
                w, lo = sess.run([dw, variables["d/weights_quant/min"]])
            np.testing.assert_allclose(
                lo, np.minimum(w.reshape(3, 3, 10).min(axis=(0, 1)), 0),
                rtol=1e-6)

    def test_refuses_optimizer_ops_and_leaves_graph_unchanged(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            loss = tf.reduce_mean(_conv(x, "c"))
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
            before = g.as_graph_def()
            with self.assertRaisesRegex(ValueError, r"before .*minimize"):
                qat.insert_quant_ops(g)
            with self.assertRaisesRegex(ValueError, r"before .*minimize"):
                qat.create_training_graph(g)
            self.assertEqual(g.as_graph_def(), before)

    def test_eval_graph_has_no_updates(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            tf.identity(_conv(x, "c"), name="out")
            qat.create_eval_graph(g)
        updates = [op for op in g.get_operations()
                   if op.type in ("AssignSubVariableOp", "AssignVariableOp")
                   and not op.name.endswith("/Assign")]
        self.assertEmpty(updates)
        self.assertLen(_fake_quants(g), 3)


class ApiErrorsTest(absltest.TestCase):

    def _graph(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            tf.identity(_conv(x, "c"), name="out")
        return g

    def test_finalized_graph(self):
        g = self._graph()
        g.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            qat.create_training_graph(g)

    def test_bad_bits_leave_graph_unchanged(self):
        g = self._graph()
        before = g.as_graph_def()
        for kwargs in ({"weight_bits": 1}, {"weight_bits": 9},
                       {"activation_bits": 16}, {"activation_bits": 4.0}):
            with self.assertRaisesRegex(ValueError, "bits"):
                qat.experimental_create_training_graph(g, **kwargs)
            with self.assertRaisesRegex(ValueError, "bits"):
                qat.experimental_create_eval_graph(g, **kwargs)
        self.assertEqual(g.as_graph_def(), before)

    def test_bad_delay_and_scope(self):
        g = self._graph()
        with self.assertRaisesRegex(ValueError, "quant_delay"):
            qat.create_training_graph(g, quant_delay=-1)
        with self.assertRaisesRegex(ValueError, "freeze_bn_delay"):
            qat.experimental_create_training_graph(g, freeze_bn_delay="5")
        with self.assertRaisesRegex(TypeError, "scope"):
            qat.experimental_create_training_graph(g, scope=3)

    def test_default_graph_is_used(self):
        g = self._graph()
        with g.as_default():
            self.assertIsNone(qat.experimental_create_training_graph(
                weight_bits=4, activation_bits=6, symmetric=True))
        fqs = _fake_quants(g)
        self.assertEqual(fqs["c/weights_quant"].get_attr("num_bits"), 4)
        self.assertEqual(fqs["c/act_quant"].get_attr("num_bits"), 6)

    def test_ranges_start_from_the_first_batch(self):
        # Activations of a fraction of the [-6, 6] prior would use a few
        # quantization steps until the moving average moved.
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
            y = _conv(x * 0.001, "c", act=tf.nn.leaky_relu)
            loss = tf.reduce_mean(tf.square(y), name="loss")
            qat.create_training_graph(g)
            fake_quant = g.get_operation_by_name("c/act_quant/FakeQuantWithMinMaxVars")
            activation = fake_quant.inputs[0]
            rng = np.random.RandomState(0)
            # Grappler off: the fetched activation and the one the range
            # reduces are then one kernel's output.
            config = tf.compat.v1.ConfigProto(graph_options=tf.compat.v1.GraphOptions(
                rewrite_options=rewriter_config_pb2.RewriterConfig(
                    disable_meta_optimizer=True)))
            with tf.compat.v1.Session(config=config) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                ranges, batch_ranges = [], []
                for _ in range(2):
                    batch = rng.uniform(-4, 4, [2, 8, 8, 3]).astype(np.float32)
                    # The activation comes from the run that updates the range.
                    _, value = sess.run([loss, activation], {x: batch})
                    ranges.append(sess.run(["c/act_quant/min/Read/ReadVariableOp:0",
                                            "c/act_quant/max/Read/ReadVariableOp:0"]))
                    batch_ranges.append([min(value.min(), 0.0), max(value.max(), 0.0)])
        # The first run takes the batch's own range (widened to 0), ...: the
        # update computes v - 1.0 * (v - x) from the initial [-6, 6], exact up
        # to one rounding at 6's magnitude (the relative error at a range of
        # 0.18 was 1.1e-6, past the rtol of 1e-6 this test had).
        np.testing.assert_allclose(ranges[0], batch_ranges[0], rtol=0,
                                   atol=float(np.spacing(np.float32(6.0))))
        self.assertLess(ranges[0][1], 3.0)
        # ... the second run averages the two batches with the bias-corrected
        # rate (1 - 0.999) / (1 - 0.999^2), not 1 - 0.999.
        rate = 0.001 / (1.0 - 0.999 ** 2)
        expected = np.array(ranges[0]) - rate * (np.array(ranges[0]) - batch_ranges[1])
        np.testing.assert_allclose(ranges[1], expected, rtol=1e-4)

    def test_eager_mode_error(self):
        code = ("import qat\n"
                "try:\n"
                "    qat.create_training_graph()\n"
                "except RuntimeError as e:\n"
                "    print('ERROR:', e)\n")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, env=env, timeout=300, check=True).stdout
        self.assertIn("ERROR: qat.create_training_graph() was called in eager "
                      "mode", out)
        self.assertIn("tf.Graph().as_default()", out)


if __name__ == "__main__":
    absltest.main()
