"""Issue #33 (part A.2): the input range's place and name do not depend on the feed.

The model starts as slim ResNet v1 does (`conv2d_same`: an explicit
`tf.pad`, then a VALID conv with stride 2, batch norm and ReLU), maybe after
preprocessing (`x / 127.5 - 1`) and a same-scale op (reshape, transpose,
nearest resize, a concatenation). It is fed by a placeholder, a `tf.data`
iterator, a FIFO, padding-FIFO or random-shuffle queue, `tf.train.batch`,
`tf.train.shuffle_batch` or slim's prefetch queue, and maybe split between
two clones (`tf.split`). The training graph (rewritten, then an optimizer) and
an eval graph with the same feed must quantize what the export graph (a
placeholder named `input`) does: the quantizers of one model, named the same,
each read by the same ops (the input range before the pad, read by the pad),
with the same range variables, so a training checkpoint restores strictly
(`qat/quantize/plan/model/feeds.py`).
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import compat  # pylint: disable=g-import-not-at-top
import boundary_util  # pylint: disable=g-import-not-at-top

compat.enable_slim()
import tf_slim as slim  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
tf1.disable_eager_execution()

H = 8
SHAPE = [H, H, 3]
BATCH = 4


def _model(x, training, preprocess=False, before=None):
    """`before`: the same-scale op between the feed and the pad."""
    with tf1.variable_scope("resnet", reuse=tf1.AUTO_REUSE):
        if preprocess:
            x = x / 127.5 - 1.0
        if before == "reshape":
            x = tf.reshape(x, [-1] + SHAPE)
        elif before == "transpose":
            x = tf.transpose(x, [0, 2, 3, 1])
        elif before == "resize":
            x = tf1.image.resize_nearest_neighbor(x, [H, H])
        elif before == "concat":  # One input twice: the range before the concatenation.
            x = tf.concat([x, x], axis=-1)
        elif before == "concat_flipped":  # Two tensors: the range after it.
            x = tf.concat([x, tf.reverse(x, [2])], axis=-1)
        net = tf.pad(x, [[0, 0], [3, 3], [3, 3], [0, 0]])
        with slim.arg_scope([slim.conv2d], normalizer_fn=slim.batch_norm,
                            normalizer_params={"is_training": training}):
            net = slim.conv2d(net, 4, 7, stride=2, padding="VALID", scope="conv1")
            net = slim.conv2d(net, 4, 3, scope="conv2")
        net = tf.reduce_mean(net, [1, 2])
        return slim.fully_connected(net, 3, activation_fn=None, scope="logits")


def _feed_shape(before):
    return {"reshape": [int(np.prod(SHAPE))], "transpose": [3, H, H],
            "resize": [H // 2, H // 2, 3]}.get(before, SHAPE)


def _queue(queue, shape, example):
    tf1.train.add_queue_runner(tf1.train.QueueRunner(queue, [queue.enqueue(example)]))
    return queue.dequeue_many(BATCH)


def _feed(kind, before):
    """The image batch, fed by `kind` (and labels beside it where the feed has them)."""
    shape = _feed_shape(before)
    example = tf.random.uniform(shape, 0.0, 255.0)
    label = tf.random.uniform([], 0, 3, tf.int32)
    if kind == "placeholder":
        return tf1.placeholder(tf.float32, [None] + shape, name="input")
    if kind == "tf.data":  # Images and labels from one iterator.
        ds = tf.data.Dataset.from_tensors((np.zeros(shape, np.float32), np.int32(0)))
        return tf1.data.make_one_shot_iterator(ds.repeat().batch(BATCH)).get_next()[0]
    if kind == "FIFOQueue":
        q = tf1.FIFOQueue(16, [tf.float32, tf.int32], [shape, []])
        tf1.train.add_queue_runner(tf1.train.QueueRunner(q, [q.enqueue([example, label])]))
        return q.dequeue_many(BATCH)[0]
    if kind == "PaddingFIFOQueue":
        return _queue(tf1.PaddingFIFOQueue(16, [tf.float32], [shape]), shape, example)
    if kind == "RandomShuffleQueue":
        return _queue(tf1.RandomShuffleQueue(16, 4, [tf.float32], [shape]), shape, example)
    if kind == "tf.train.batch":
        return tf1.train.batch([example, label], BATCH)[0]
    if kind == "tf.train.shuffle_batch":
        return tf1.train.shuffle_batch([example], BATCH, capacity=16, min_after_dequeue=4)
    if kind == "prefetch_queue":  # slim's model_deploy: batch -> prefetch queue -> dequeue.
        batch = tf1.train.batch([example], BATCH)
        return slim.prefetch_queue.prefetch_queue([batch]).dequeue()
    raise ValueError(kind)


def _build(kind, mode, preprocess=False, before=None, clones=1):
    """(graph, the tensor the model reads, train op) for `mode` train, eval or export."""
    training = mode == "train"
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(0)
        x = _feed(kind, before)
        if clones == 1:
            out = _model(x, training, preprocess, before)
        else:  # Data-parallel clones (slim model_deploy style) on a split batch.
            outs = []
            for k, part in enumerate(tf.split(x, clones)):
                with tf.name_scope("clone_%d" % k):
                    outs.append(_model(part, training, preprocess, before))
            out = tf.concat(outs, 0)
        if mode == "export":
            tf.identity(out, name="output")
            qat.experimental_create_eval_graph(g)
            return g, x, None
        loss = tf.reduce_mean(tf.square(out - 1.0))
        train_op = None
        if training:
            qat.experimental_create_training_graph(g)
            with tf1.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train_op = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
        else:
            qat.experimental_create_eval_graph(g)
    return g, x, train_op


FEEDS = ("placeholder", "tf.data", "FIFOQueue", "PaddingFIFOQueue", "RandomShuffleQueue",
         "tf.train.batch", "tf.train.shuffle_batch", "prefetch_queue")
# (name, feed, preprocessing, same-scale op before the pad, clones)
CASES = [(k.replace(".", "_"), k, False, None, 1) for k in FEEDS] + [
    ("placeholder_preprocessed", "placeholder", True, None, 1),
    ("tf_data_preprocessed", "tf.data", True, None, 1),
    ("FIFOQueue_preprocessed", "FIFOQueue", True, None, 1),
    ("batch_preprocessed_reshape", "tf.train.batch", True, "reshape", 1),
    ("FIFOQueue_reshape", "FIFOQueue", False, "reshape", 1),
    ("FIFOQueue_transpose", "FIFOQueue", False, "transpose", 1),
    ("shuffle_batch_resize", "tf.train.shuffle_batch", False, "resize", 1),
    ("FIFOQueue_concat", "FIFOQueue", False, "concat", 1),
    ("tf_data_concat_flipped", "tf.data", False, "concat_flipped", 1),
    ("placeholder_split", "placeholder", False, None, 2),
    ("tf_data_split", "tf.data", False, None, 2),
    ("FIFOQueue_preprocessed_split", "FIFOQueue", True, None, 2),
]


# The first model op the input's range is read by.
_FIRST_READER = {None: "resnet/Pad", "reshape": "resnet/Reshape",
                 "transpose": "resnet/transpose", "resize": "resnet/ResizeNearestNeighbor",
                 "concat": "resnet/concat", "concat_flipped": "resnet/Pad"}


def _model_readers(quantizers):
    """{quantizer name: the model ops reading it} (the loss and the output left out)."""
    return {name: tuple(r for r in readers if "resnet/" in r)
            for name, (_, readers) in quantizers.items()}


class InputFeedTest(parameterized.TestCase):

    @parameterized.named_parameters(*CASES)
    def test_same_place_and_name_as_the_export_graph(self, kind, preprocess, before, clones):
        export_graph, _, _ = _build("placeholder", "export", preprocess, before)
        export = _model_readers(boundary_util.activation_quantizers(export_graph))
        # The input's range before the pad (or what comes before it), named after the model.
        first = "resnet/truediv" if preprocess else _FIRST_READER[before]
        self.assertEqual(export["resnet/input_quant"], (first,))
        for mode in ("train", "eval"):
            g, _, _ = _build(kind, mode, preprocess, before, clones)
            found = _model_readers(boundary_util.activation_quantizers(g))
            if clones == 2:  # The range is on the whole batch, before the split.
                self.assertEqual(found.pop("resnet/input_quant"), (), mode)
                found = {name: tuple(r[len("clone_0/"):] for r in readers)
                         for name, readers in found.items() if not name.startswith("clone_1/")}
                found["resnet/input_quant"] = export["resnet/input_quant"]
            self.assertEqual(found, export, mode)
            self.assertEqual(boundary_util.range_variables(g),
                             boundary_util.range_variables(export_graph), mode)


class StrictRestoreTest(absltest.TestCase):

    def test_queue_fed_checkpoint_restores_strictly_into_the_export_graph(self):
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        g, x, train_op = _build("FIFOQueue", "train", preprocess=True)
        images = np.random.RandomState(0).uniform(0, 255, [BATCH] + SHAPE)
        with g.as_default(), tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for _ in range(2):  # The dequeued batch, fed (no queue runner needed).
                sess.run(train_op, {x: images})
            path = tf1.train.Saver().save(sess, os.path.join(workdir, "model"))
        g, x, _ = _build("placeholder", "export", preprocess=True)
        with g.as_default(), tf1.Session() as sess:
            tf1.train.Saver().restore(sess, path)  # Strict: every variable.
            ranges = {v.op.name: v for v in tf1.global_variables()}
            low, high = sess.run([ranges["resnet/input_quant/min"],
                                  ranges["resnet/input_quant/max"]])
        # Learnt on the raw images (before the preprocessing and the pad).
        self.assertGreater(high, 100.0)
        self.assertGreaterEqual(low, 0.0)


if __name__ == "__main__":
    absltest.main()
