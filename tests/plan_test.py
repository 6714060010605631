"""The tensor-centric plan: one range per tensor, structures, names, left float."""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import compat  # pylint: disable=g-import-not-at-top
from qat.quantize.plan import planner as plan_lib  # pylint: disable=g-import-not-at-top

compat.enable_slim()
import tf_slim as slim  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1


def _conv(x, name, channels=4):
    w = tf1.get_variable(name + "/weights", [3, 3, x.shape[-1], channels])
    return tf.nn.conv2d(x, w, 1, "SAME", name=name + "/Conv2D")


def _fake_quants(g):
    return {op.name.rsplit("/", 1)[0]: op for op in g.get_operations()
            if op.type.startswith("FakeQuant")}


class PlanTest(absltest.TestCase):

    def test_tensor_read_by_two_activations_has_one_range(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = _conv(x, "c")
            a = tf.nn.relu(y, name="a/Relu")
            b = tf.nn.relu6(y, name="b/Relu6")
            tf.identity(tf.concat([a, b], 3, name="cat/concat"), name="out")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {"c/input_quant", "c/weights_quant",
                                    "c/act_quant", "a/act_quant",
                                    "b/act_quant", "cat/concat_quant"})
        quantized = fqs["c/act_quant"].outputs[0]
        for name in ("a/Relu", "b/Relu6"):
            self.assertIs(g.get_operation_by_name(name).inputs[0], quantized)

    def test_hard_swish_is_quantized_at_its_output_only(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = _conv(x, "c")
            with tf.name_scope("hswish"):
                h = y * tf.nn.relu6(y + 3.0) * (1.0 / 6.0)
            tf.identity(_conv(h, "next"), name="out")
            qat.insert_quant_ops(g, is_training=True)
        fqs = _fake_quants(g)
        self.assertEqual(set(fqs), {
            "c/input_quant", "c/weights_quant", "c/act_quant",
            "hswish/act_quant", "next/weights_quant", "next/act_quant"})
        self.assertIs(fqs["hswish/act_quant"].inputs[0], h)

    def test_dropout_is_looked_through(self):
        names = []
        for training in (True, False):
            g = tf.Graph()
            with g.as_default():
                x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
                y = _conv(x, "c")
                if training:
                    y = tf.nn.dropout(y, rate=0.5)
                y = tf.nn.relu(y)
                tf.identity(_conv(y, "next"), name="out")
                qat.insert_quant_ops(g, is_training=training)
            names.append(set(_fake_quants(g)))
        self.assertEqual(names[0], names[1])
        self.assertIn("c/act_quant", names[0])

    def test_left_float_names_what_stays_float(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
            y = tf.math.exp(_conv(x, "c"), name="odd/Exp")
            tf.identity(_conv(y, "next"), name="out")
            planner = plan_lib.Planner(g, True, None, False)
            plans = planner.run()
        self.assertIn("odd/Exp", dict(planner.left_float))
        self.assertIn("no integer TFLite kernel",
                      dict(planner.left_float)["odd/Exp"])
        # The tensor the next layer reads still gets its range, named after it.
        prefixes = {p.prefix for p in plans}
        self.assertIn("next/input_quant", prefixes)


def _per_example_uniform(x):
    return tf1.random_uniform([tf.shape(x)[0], 1, 1, 1])


def _scheduled_keep_prob():
    """NASNet-A's: falling with the global step (a scalar, not a constant)."""
    step = tf.cast(tf1.train.get_or_create_global_step(), tf.float32)
    return 1.0 - tf.minimum(1.0, step / 100.0) * 0.4


# Drop path (stochastic depth) and dropout written as a random mask multiply.
_DROP_PATHS = {
    # research/slim nasnet_utils.drop_path: x * (1 / keep) * floor(keep + uniform).
    "slim_nasnet": lambda x, keep: (
        x * tf.cast(1.0 / keep, x.dtype)
        * tf.cast(tf.floor(keep + _per_example_uniform(x)), x.dtype)),
    # TF 1's tf.nn.dropout, tf_keras ConvNeXt's StochasticDepth.
    "divide_then_mask": lambda x, keep: x / keep * tf.floor(keep + _per_example_uniform(x)),
    "mask_then_divide": lambda x, keep: x * tf.floor(keep + _per_example_uniform(x)) / keep,
    "mask_first": lambda x, keep: tf.floor(keep + _per_example_uniform(x)) * (x / keep),
    "scaled_mask": lambda x, keep: x * (tf.floor(keep + _per_example_uniform(x)) / keep),
    "cast_comparison": lambda x, keep: (
        x * tf.cast(_per_example_uniform(x) < keep, tf.float32) / keep),
    "mask_only": lambda x, keep: x * tf.floor(keep + _per_example_uniform(x)),
    "nn_dropout_noise_shape": lambda x, keep: tf.nn.dropout(
        x, rate=1.0 - keep, noise_shape=[tf.shape(x)[0], 1, 1, 1]),
}


def _drop_path_cell(training, drop_path, scheduled):
    """Two conv + BN branches, each dropped in training, added, then a conv."""
    g = tf.Graph()
    with g.as_default():
        tf1.train.get_or_create_global_step()
        x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
        branches = []
        with slim.arg_scope([slim.batch_norm], is_training=training):
            for scope in ("left", "right"):
                y = slim.conv2d(x, 4, 3, normalizer_fn=slim.batch_norm,
                                activation_fn=None, scope=scope)
                if training:
                    with tf.name_scope(scope + "/drop_path"):
                        keep = _scheduled_keep_prob() if scheduled else 0.6
                        y = _DROP_PATHS[drop_path](y, keep)
                branches.append(y)
            y = tf.nn.relu(tf.add(*branches, name="combine/add"))
            y = slim.conv2d(y, 4, 3, normalizer_fn=slim.batch_norm, scope="next")
        out = tf.identity(tf.reduce_mean(y, [1, 2], name="pool"), name="out")
        if training:
            tf1.losses.mean_squared_error(tf.zeros_like(out), out)
            qat.create_training_graph(g, quant_delay=0)
        else:
            qat.create_eval_graph(g)
    return g


class DropPathTest(parameterized.TestCase):
    """A random mask multiply (drop path, hand-written dropout) is looked through."""

    @parameterized.parameters(*[(name, scheduled) for name in _DROP_PATHS
                                for scheduled in (False, True)])
    def test_same_ranges_and_strict_restore(self, drop_path, scheduled):
        train_g = _drop_path_cell(True, drop_path, scheduled)
        eval_g = _drop_path_cell(False, drop_path, scheduled)
        self.assertEqual(set(_fake_quants(train_g)), set(_fake_quants(eval_g)))
        # The range is on each layer's output, where the eval graph has it.
        self.assertContainsSubset({"left/conv_quant", "right/conv_quant"},
                                  set(_fake_quants(train_g)))
        with tempfile.TemporaryDirectory() as workdir:
            with train_g.as_default(), tf1.Session(graph=train_g) as sess:
                sess.run(tf1.global_variables_initializer())
                path = tf1.train.Saver().save(sess, os.path.join(workdir, "model"))
            with eval_g.as_default(), tf1.Session(graph=eval_g) as sess:
                tf1.train.Saver().restore(sess, path)  # Strict: every variable.


if __name__ == "__main__":
    absltest.main()
