"""Issue #37 (items 2, 3): what only the training graph has changes nothing in the eval graph.

Training graphs carry branches their export graphs lack: auxiliary heads
(NASNet's and PNASNet's read a cell output through a ReLU of their own, made
before the next cell's identical ReLU), summaries (research/slim's histogram
and `tf.nn.zero_fraction` of every end point), prints, asserts and metrics.
The eval and export graphs must name the same ranges whether or not the
training graph had them, a strict `Saver()` restore of a training checkpoint
into the export graph must work, and what only watches the model (summaries,
prints, asserts, metrics) is no model output left float: no `left_float`
entry, no range (`qat/quantize/plan/model/observers.py`).
"""
import functools
import os
import re
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
tf1.disable_eager_execution()

CLASSES = 5
# Training-only branches (`_build`'s `branches`).
AUX_OF_CELL = "aux_of_cell"      # A ReLU of a cell's output, made before the next cell's.
AUX_OF_LAYER = "aux_of_layer"    # A ReLU of a layer's output that the model's ReLU reads too.
OBSERVERS = "observers"          # Summaries, zero_fraction, prints, asserts, metrics.
ALL = (AUX_OF_CELL, AUX_OF_LAYER, OBSERVERS)


def _observe(tensors, labels, logits):
    """What slim's training script and users add around a model: none of it is the model."""
    for name, t in tensors.items():
        tf1.summary.histogram("activations/" + name, t)
        tf1.summary.scalar("sparsity/" + name, tf.nn.zero_fraction(t))
    tf.print("logits", logits * 2.0, tf.reduce_max(tensors["cell_6"]))
    tf1.Print(logits, [logits], "logits")
    tf.debugging.assert_greater_equal(tensors["stem"], 0.0)
    tf.debugging.assert_all_finite(logits - 1.0, "finite")
    tf.debugging.check_numerics(tensors["cell_5"], "cell_5")
    predictions = tf.argmax(logits, 1)
    tf1.metrics.accuracy(labels, predictions)
    tf1.metrics.mean_tensor(logits * 0.5)
    tf1.metrics.auc(tf.one_hot(labels, CLASSES), tf.nn.softmax(logits))
    tf1.metrics.precision_at_k(tf.cast(labels, tf.int64), logits, 2)


def _build(mode, branches=()):
    """A NASNet-like model: `mode` train (rewritten, then an optimizer), eval
    (rewritten, with the loss) or export (the model alone, its output named)."""
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="input")
        labels = tf1.placeholder(tf.int32, [2], name="labels")
        conv = lambda t, name: tf1.layers.conv2d(t, 4, 1, name=name)
        stem = tf.nn.relu(conv(x, "stem"))
        cell_4 = tf.concat([conv(stem, "c0"), conv(stem, "c1")], 3, name="cell_4/concat")
        cell_5 = tf.concat([conv(stem, "c2"), conv(stem, "c3")], 3, name="cell_5/concat")
        layer = conv(stem, "c4")  # Read by identical ReLUs only.
        aux = []
        if AUX_OF_CELL in branches:  # Made before cell_6's identical ReLU, as PNASNet's.
            aux.append(conv(tf.nn.relu(cell_5), "aux_5/conv"))
        if AUX_OF_LAYER in branches:
            aux.append(conv(tf.nn.relu(layer), "aux_4/conv"))
        with tf1.variable_scope("cell_6"):
            cell_6 = (tf.nn.relu(conv(tf.nn.relu(cell_4), "prev_1x1")
                                 + conv(tf.nn.relu(cell_5), "1x1"))
                      + conv(tf.nn.relu(layer), "layer_1x1"))
        with tf1.variable_scope("cell_7"):
            cell_7 = conv(tf.nn.relu(cell_5), "prev_1x1") + conv(cell_6, "1x1")
        logits = tf1.layers.dense(tf.reduce_mean(cell_7, [1, 2]), CLASSES, name="logits")
        if mode == "export":
            tf.identity(logits, name="output")
            return g, qat.insert_quant_ops(g, is_training=False)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        for head in aux:
            loss += 0.4 * tf.reduce_mean(tf.square(head))
        if OBSERVERS in branches:
            _observe({"stem": stem, "cell_5": cell_5, "cell_6": cell_6, "logits": logits},
                     labels, logits)
        result = qat.insert_quant_ops(g, is_training=mode == "train")
        if mode == "train":
            tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return g, result


@functools.lru_cache(maxsize=None)
def _built(mode, branches=()):
    """`_build`, once per mode and branches (tests share the graphs)."""
    return _build(mode, branches)


def _ranges(graph):
    """Activation range variables (what a checkpoint holds of them), numbered ones too."""
    with graph.as_default():
        return sorted({v.op.name for v in tf1.global_variables()
                       if re.search(r"_quant(_\d+)?/(min|max)$", v.op.name)
                       and "weights_quant" not in v.op.name})


class TrainingBranchesTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.export_graph, cls.export_result = _built("export")
        cls.export_ranges = _ranges(cls.export_graph)

    @parameterized.parameters(AUX_OF_CELL, AUX_OF_LAYER, OBSERVERS)
    def test_the_export_graphs_ranges_are_the_training_graphs_own(self, branch):
        # The export graph's numbered ranges: a training-only reader renames none.
        self.assertIn("cell_6/act_quant_1/min", self.export_ranges)
        train_ranges = _ranges(_built("train", (branch,))[0])
        self.assertContainsSubset(self.export_ranges, train_ranges)
        if branch == OBSERVERS:  # No range for what only watches the model.
            self.assertEqual(train_ranges, _ranges(_built("train")[0]))
            self.assertEqual(_ranges(_built("eval", (branch,))[0]), self.export_ranges)

    def test_observers_are_not_left_float(self):
        self.assertEqual(self.export_result.left_float, [])
        for mode in ("train", "eval"):
            _, result = _built(mode, (OBSERVERS,))
            self.assertEqual([f.name for f in result.left_float], [], mode)

    def test_training_checkpoint_restores_strictly_into_the_export_graph(self):
        graph, _ = _build("train", ALL)
        with graph.as_default(), tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
            feed = {"input:0": np.random.RandomState(0).uniform(-1, 1, [2, 8, 8, 3]),
                    "labels:0": [1, 2]}
            for _ in range(2):
                sess.run("train_op", feed)
            path = tf1.train.Saver().save(
                sess, os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "m"))
        with self.export_graph.as_default(), tf1.Session() as sess:
            tf1.train.Saver().restore(sess, path)  # Strict: every variable.
            out = sess.run("output:0", {"input:0": np.ones([2, 8, 8, 3])})
        self.assertTrue(np.all(np.isfinite(out)))


if __name__ == "__main__":
    absltest.main()
