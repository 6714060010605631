"""Shared ranges (qat.quantize.plan.ranges.shared_ranges, issue #21).

A concatenation and its inputs share one pair of range variables, named after
the group's last concatenation; chains of concatenations and concatenations
reading one tensor form one group; the group's range covers every member's
batch; members read the range as before the step's update (no cycle in
DenseNet-style chains); average pools and bilinear resizes round to their
input's range. End to end: int8 and uint8 TFLite agree with the eval graph
within one step at every tensor given TFLite's own inputs, and training
checkpoints restore strictly into eval graphs.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.export import kernel_checks  # pylint: disable=g-import-not-at-top
from tools.property import invariants  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1

_ONE_STEP = 1.0 + 1e-3


def _conv(x, scale, name):
    init = tf1.constant_initializer(scale)
    return tf1.layers.conv2d(x, 2, 1, kernel_initializer=init,
                             bias_initializer=tf1.zeros_initializer(), name=name)


def _two_branches(training: bool):
    """Two convs with ranges about +-1 and +-3 into a concatenation, then an average pool."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 4, 4, 1], name="input")
        a = _conv(x, 1.0, "a")
        b = _conv(x, -3.0, "b")
        cat = tf.concat([a, b], -1, name="cat/concat")
        pool = tf.nn.avg_pool2d(cat, 2, 2, "VALID", name="pool")
        y = tf.identity(_conv(pool, 0.5, "head"), name="output")
        if training:
            tf.reduce_mean(y ** 2, name="loss")
    return g, x, y


def _se_behind_identity(x):
    """slim's MobileNet v3 squeeze-excite: the pool reads the depthwise output
    through `tf.identity(x, name="depthwise_output")`."""
    layers = zoo_util.layers
    net = layers.Conv2D(8, 3, padding="same", name="dw")(x)
    net = layers.ReLU(name="dw_relu")(net)
    net = layers.Lambda(lambda t: tf.identity(t, name="depthwise_output"),
                        name="depthwise_output")(net)
    se = layers.AveragePooling2D(8, name="se_pool")(net)  # The full 8x8 map.
    se = layers.Conv2D(4, 1, activation="relu", name="se_squeeze")(se)
    se = layers.Conv2D(8, 1, activation="sigmoid", name="se_excite")(se)
    net = layers.Multiply(name="se_mul")([net, se])
    net = layers.Conv2D(4, 1, name="project")(net)
    return layers.Dense(10, name="logits")(layers.Flatten(name="flat")(net))


zoo_util.EXTRA_CASES["se_behind_identity"] = zoo_util.Case(_se_behind_identity, (8, 8, 3))


def _identical_relus(x):
    """NASNet-A's cells: operations that each start with a ReLU of one tensor,
    the layer output they alone read and an add's output a residual reads too."""
    layers = zoo_util.layers
    net = layers.Conv2D(8, 3, padding="same", name="stem")(x)
    net = layers.BatchNormalization(name="stem_bn")(net)
    a = layers.Conv2D(8, 3, padding="same", name="left")(layers.ReLU(name="left_relu")(net))
    b = layers.Conv2D(8, 1, name="right")(layers.ReLU(name="right_relu")(net))
    s = layers.Add(name="sum")([a, b])
    c = layers.Conv2D(8, 1, name="c")(layers.ReLU(name="c_relu")(s))
    d = layers.Conv2D(8, 1, name="d")(layers.ReLU(name="d_relu")(s))
    net = layers.Add(name="res")([layers.Add(name="cd")([c, d]), s])
    return layers.Dense(10, name="logits")(layers.Flatten(name="flat")(net))


zoo_util.EXTRA_CASES["identical_relus"] = zoo_util.Case(_identical_relus, (8, 8, 3))


def _fake_quants(graph):
    return {op.name.rsplit("/", 1)[0]: op for op in graph.get_operations()
            if op.type == "FakeQuantWithMinMaxVars"}


def _variable_of(t: tf.Tensor) -> str:
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    assert t.op.type == "ReadVariableOp", t.op.name
    return t.op.inputs[0].op.name


class SharedRangesTest(parameterized.TestCase):

    @parameterized.parameters(True, False)
    def test_inputs_read_the_concatenation_variables(self, training):
        g, x, _ = _two_branches(training)
        with g.as_default():
            result = qat.insert_quant_ops(g, is_training=training)
        by_name = {q.name: q for q in result.quantizers}
        for name in ("a/act_quant", "b/act_quant", "cat/concat_quant"):
            self.assertEqual(by_name[name].range_name, "cat/concat_quant", name)
        # The pool rounds to its input's range (no variables of its own).
        self.assertEqual(by_name["pool/avg_pool_quant"].range_name, "cat/concat_quant")
        variables = {v.op.name for v in g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
        self.assertIn("cat/concat_quant/min", variables)
        self.assertFalse({"a/act_quant/min", "b/act_quant/min",
                          "pool/avg_pool_quant/min"} & variables)
        fqs = _fake_quants(g)
        for name in ("a/act_quant", "b/act_quant", "cat/concat_quant",
                     "pool/avg_pool_quant"):
            self.assertEqual(_variable_of(fqs[name].inputs[1]), "cat/concat_quant/min")
            self.assertEqual(_variable_of(fqs[name].inputs[2]), "cat/concat_quant/max")
        self.assertEqual(invariants.shared_concat_violations(g, x), [])
        self.assertEqual(invariants.raw_and_quantized_violations(g, x), [])
        if training:
            # Members read the range before this step's update; the
            # concatenation's own FakeQuant the updated one.
            self.assertEqual(fqs["a/act_quant"].inputs[1].op.name,
                             "cat/concat_quant/min/Read/ReadVariableOp")
            self.assertIn("AssignMinEma", fqs["cat/concat_quant"].inputs[1].op.name)
            # The pool reads what its input's quantizer reads.
            self.assertIs(fqs["pool/avg_pool_quant"].inputs[1],
                          fqs["cat/concat_quant"].inputs[1])

    def test_group_range_covers_every_member(self):
        g, x, _ = _two_branches(True)
        with g.as_default():
            qat.experimental_create_training_graph(g)
            a = g.get_tensor_by_name("a/BiasAdd:0")
            b = g.get_tensor_by_name("b/BiasAdd:0")
            cat = g.get_tensor_by_name("cat/concat:0")  # Of the quantized a and b.
            lo, hi = [v for v in tf1.global_variables()
                      if v.op.name in ("cat/concat_quant/min", "cat/concat_quant/max")]
            fq = _fake_quants(g)["cat/concat_quant"]
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                feed = {x: np.random.RandomState(0).uniform(-1, 1, (2, 4, 4, 1))}
                va, vb, vcat, _ = sess.run([a, b, cat, fq.outputs[0]], feed)  # The first step.
                got = sess.run([lo, hi])
        # The first batch sets the range (init_from_first_batch).
        both = np.concatenate([va.ravel(), vb.ravel(), vcat.ravel()])
        np.testing.assert_allclose(got, [min(both.min(), 0), max(both.max(), 0)],
                                   rtol=1e-6)
        self.assertGreater(both.max(), 2.0)  # b's range, wider than a's.

    def test_concatenations_reading_one_tensor_share_a_group(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 4, 4, 1], name="input")
            a, b, c = _conv(x, 1.0, "a"), _conv(x, 2.0, "b"), _conv(x, 3.0, "c")
            first = tf.concat([a, b], -1, name="first/concat")
            second = tf.concat([b, c], -1, name="second/concat")
            tf.identity(_conv(first, 1.0, "d") + _conv(second, 1.0, "e"), name="output")
            result = qat.insert_quant_ops(g, is_training=False)
        names = {q.name: q.range_name for q in result.quantizers}
        for name in ("a/act_quant", "b/act_quant", "c/act_quant",
                     "first/concat_quant", "second/concat_quant"):
            self.assertEqual(names[name], "second/concat_quant", name)
        self.assertEqual(invariants.shared_concat_violations(g, x), [])

    def test_dense_chain_is_one_group_per_block(self):
        g, x, _ = zoo_util.build_graph("dense_chain", training=False)
        with g.as_default():
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
        names = {name: _variable_of(fq.inputs[1]).rsplit("/", 1)[0]
                 for name, fq in _fake_quants(g).items() if "weights_quant" not in name}
        for block in range(2):
            owner = f"b{block}_2_cat/concat_quant"
            for i in range(3):
                self.assertEqual(names[f"b{block}_{i}_cat/concat_quant"], owner)
                self.assertEqual(names[f"b{block}_{i}_conv/act_quant"], owner)
        # The transition's pool output is the next block's first input.
        self.assertEqual(names["t0_pool/avg_pool_quant"], "b1_2_cat/concat_quant")
        self.assertEqual(names["t1_pool/avg_pool_quant"], "t1_conv/act_quant")
        self.assertEqual(invariants.shared_concat_violations(g, x), [])

    @parameterized.parameters((True, "identity"), (False, "identity"),
                              (True, "times_one"), (False, "times_one"))
    def test_pool_behind_a_removed_op_rounds_as_without_it(self, training, between):
        """An op the converter removes between a range and an average pool
        changes nothing: slim's Identity `depthwise_output` before MobileNet
        v3's squeeze-excite pool, a neutral `x * 1`."""

        def quantizers(identity):
            g = tf.Graph()
            with g.as_default():
                x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="input")
                net = tf.nn.relu(_conv(x, 1.0, "conv"))
                if identity and between == "identity":
                    net = tf.identity(tf.identity(net), name="depthwise_output")
                elif identity:
                    net = tf.multiply(net, 1.0, name="times_one")
                pool = tf.nn.avg_pool2d(net, 8, 1, "VALID", name="pool")
                squeeze = tf.nn.relu(_conv(pool, 0.5, "squeeze"))
                y = tf.identity(net * squeeze, name="output")
                if training:
                    tf.reduce_mean(y ** 2, name="loss")
                result = qat.insert_quant_ops(g, is_training=training)
            return {q.name: q.range_name for q in result.quantizers}, g, x

        direct, _, _ = quantizers(False)
        behind, g, x = quantizers(True)
        self.assertEqual(direct["pool/avg_pool_quant"], "conv/act_quant")
        self.assertEqual(behind, direct)
        fqs = _fake_quants(g)
        self.assertIs(fqs["pool/avg_pool_quant"].inputs[1], fqs["conv/act_quant"].inputs[1])
        self.assertEqual(invariants.raw_and_quantized_violations(g, x), [])

    @parameterized.parameters("concat_branches", "dense_chain", "se_behind_identity",
                              "identical_relus")
    def test_train_eval_restore_and_tflite_agree_at_every_tensor(self, name):
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        checkpoint = os.path.join(workdir, "model")
        losses = zoo_util.train_two_steps(name, checkpoint)  # No cycle.
        self.assertTrue(np.all(np.isfinite(losses)), losses)
        sess, x, y = zoo_util.eval_session(name, checkpoint)  # Strict restore.
        inputs = zoo_util.make_inputs(name, 8, seed=5)
        with sess:
            frozen = export.freeze_session(sess, [y.op.name])
            for flavour in ("uint8", "int8"):
                model = zoo_util.convert_with_tf(sess, x, y, flavour,
                                                 zoo_util.case_of(name).input_range)
                export.check_fully_integer(model, frozen, label=f"{name} {flavour}")
                agreement = zoo_util.layer_agreement(frozen, x, y, inputs, flavour, model)
                rows = agreement.numerics.rows
                # Every row but the float output of uint8 / a layer TFLite fuses,
                # and the model input itself (zoo_util.layer_agreement).
                layer_rows = [r for r in rows if r.tflite_tensor != x.op.name]
                self.assertGreaterEqual(len(agreement.checked), len(layer_rows) - 1,
                                        agreement.numerics.format())
                if name == "identical_relus":
                    # One range per value: the converter keeps one of the ReLUs.
                    fqs = _fake_quants(sess.graph)
                    for first, other in (("stem", "right_relu"), ("c_relu", "d_relu")):
                        self.assertEqual(_variable_of(fqs[f"{other}/act_quant"].inputs[1]),
                                         _variable_of(fqs[f"{first}/act_quant"].inputs[1]))
                    # The stem's output range is the ReLUs' one: its kernel
                    # preconditions apply there.
                    self.assertIn(("bias scale", "stem/act_quant/FakeQuantWithMinMaxVars"),
                                  {(r.precondition.name, r.constrained.name)
                                   for r in kernel_checks.graph_requirements(sess.graph)})
                if name == "se_behind_identity":
                    # The pool's rounding is a compared TFLite tensor; unrounded,
                    # the squeeze conv drifted 4 steps from TFLite's (both flavours).
                    self.assertIn("se_pool/avg_pool_quant",
                                  [r.name for r in agreement.checked])
                self.assertLessEqual(agreement.worst.max_own_steps, _ONE_STEP,
                                     f"{flavour}: {agreement.worst.name}\n"
                                     f"{agreement.numerics.format()}")


if __name__ == "__main__":
    absltest.main()
