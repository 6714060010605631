"""Replicas' range statistics combined once per step (issue #36), graph path.

The training graph of data-parallel replicas (TF1 towers on two logical CPU
devices; MultiWorkerMirroredStrategy graphs of two workers, built in this
process and never run) combines every range's statistics at one join: one
elementwise Minimum of the replicas' packed vectors in a graph, one
collective across workers, whatever the model's depth. No replica's forward
reads a value computed from another replica's activations. Towers of a
network with a concatenation group and per-channel symmetric weights train
two steps: each range holds the bias-corrected moving-average step (rate 1
at step 1) from the min of every replica's batch mins and the max of their
maxes, and each replica's FakeQuant read the range moved by its own batch.
The rewrite called inside a MirroredStrategy replica function joins the
first call's statistics. A single-device graph keeps its range updates in
the forward.
"""
import json
import os
import socket
import sys
from unittest import mock

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tools"))
import qat  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat.engine import marks  # pylint: disable=g-import-not-at-top,wrong-import-position
import _replica_models as replica_models  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
tf1.disable_eager_execution()
DEVICES = replica_models.DEVICES
BATCH = 4   # Per replica.
EMA_DECAY = 0.999


def _deep(images, depth: int):
    """`depth` conv + batch norm + ReLU layers and a dense head (variables reused)."""
    with tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
        net = images
        for k in range(depth):
            net = tf1.layers.conv2d(net, 4, 3, padding="same", use_bias=False, name=f"conv{k}")
            net = tf.nn.relu(tf1.layers.batch_normalization(net, training=True,
                                                            name=f"conv{k}/bn"))
        return tf1.layers.dense(tf1.layers.flatten(net), 3, name="logits")


def _concat_net(images):
    """A ReLU branch and a linear branch concatenated (one range), a conv, a head."""
    with tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
        a = tf.nn.relu(tf1.layers.conv2d(images, 4, 3, padding="same", name="a"), name="a_relu")
        b = tf1.layers.conv2d(images, 4, 1, name="b")
        net = tf.concat([a, b], -1, name="cat")
        net = tf.nn.relu(tf1.layers.conv2d(net, 6, 3, padding="same", name="c"))
        return tf1.layers.dense(tf1.layers.flatten(net), 3, name="logits")


def _floored_net(images):
    """Ranges kernel floors widen: a large bias (its input's range), a residual
    add (its inputs'), a dead ReLU (an empty range)."""
    with tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
        a = tf1.layers.conv2d(images, 4, 3, padding="same", name="a",
                              kernel_initializer=tf1.constant_initializer(1e-4),
                              bias_initializer=tf1.constant_initializer(30.0))
        b = tf1.layers.conv2d(tf.nn.relu(a), 4, 3, padding="same", name="b")
        net = tf.nn.relu(a + b, name="sum")
        dead = tf.nn.relu(tf1.layers.conv2d(net, 4, 1, name="dead",
                                            bias_initializer=tf1.constant_initializer(-1e3)))
        return tf1.layers.dense(tf1.layers.flatten(tf.concat([net, dead], -1)), 3,
                                kernel_initializer=tf1.constant_initializer(1e-4),
                                bias_initializer=tf1.constant_initializer(1e3), name="logits")


def _towers(model, **rewrite):
    """Two towers on two devices, rewritten after them; (graph, images, labels, train_op)."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, (2 * BATCH,) + replica_models.SIZE, name="images")
        labels = tf1.placeholder(tf.int64, [2 * BATCH], name="labels")
        losses = []
        for k, (x, y) in enumerate(zip(tf.split(images, 2), tf.split(labels, 2))):
            with tf.name_scope(f"tower_{k}"), tf.device(DEVICES[k]):
                losses.append(tf1.losses.sparse_softmax_cross_entropy(
                    y, model(x), loss_collection=None))
        qat.experimental_create_training_graph(graph, quant_delay=0, **rewrite)
        optimizer = tf1.train.GradientDescentOptimizer(0.05)
        grads = [optimizer.compute_gradients(loss) for loss in losses]
        averaged = [(tf.add_n([g for g, _ in pairs]) / 2, pairs[0][1]) for pairs in zip(*grads)]
        train_op = optimizer.apply_gradients(averaged)
    return graph, images, labels, train_op


def _joins(graph):
    return [op for op in graph.get_operations()
            if op.type == "Identity" and marks.made_by_qat(op, marks.RANGE_STATISTICS)]


def _collectives(graph):
    return [op for op in graph.get_operations()
            if op.type.startswith("Collective") and marks.made_by_qat(op)]


def _upstream(tensors):
    """The ops `tensors` are computed from (data inputs only)."""
    found, stack = set(), [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op not in found:
            found.add(op)
            stack.extend(t.op for t in op.inputs)
    return found


def _downstream(tensor):
    """The ops computed from `tensor` (data edges)."""
    found, stack = set(), list(tensor.consumers())
    while stack:
        op = stack.pop()
        if op not in found:
            found.add(op)
            stack.extend(c for out in op.outputs for c in out.consumers())
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_quant(graph, scope):
    return [op for op in graph.get_operations()
            if op.type.startswith("FakeQuant") and op.name.rsplit("/", 1)[0] == scope][0]


def _step(previous, lo, hi, step):
    """One bias-corrected moving-average step in float32, as qat computes it."""
    f32 = np.float32
    lo, hi = min(f32(0), f32(lo)), max(f32(0), f32(hi))
    rate = f32(f32(1) - f32(EMA_DECAY)) / f32(f32(1) - f32(EMA_DECAY) ** f32(step))
    return (f32(previous[0] - f32(f32(previous[0] - lo) * rate)),
            f32(previous[1] - f32(f32(previous[1] - hi) * rate)))


class StepStatisticsTest(tf.test.TestCase):

    def test_towers_one_join_and_forwards_apart_whatever_the_depth(self):
        for depth in (1, 4):
            graph, images, _, _ = _towers(lambda x, d=depth: _deep(x, d),
                                          symmetric_weights=True)
            joins = _joins(graph)
            self.assertLen(joins, 1, f"depth {depth}")
            ranges = [n.decode() for n in joins[0].get_attr("_qat_ranges")]
            # The convs' folded weights and every activation; the head's weights are
            # one read, quantized once per device from the range tower 0 updates.
            self.assertLen(ranges, 2 * depth + 1, ranges)
            self.assertEmpty(_collectives(graph))
            # The join reads one packed vector per tower device.
            packs = [op for op in _upstream([joins[0].outputs[0]])
                     if op.type == "Pack" and op.name.startswith("quant_range_statistics/")]
            self.assertEqual({op.device[-5:] for op in packs}, {"CPU:0", "CPU:1"})
            # Tower 1's forward, to its output's FakeQuant, reads nothing tower 0 computes.
            split = [op for op in graph.get_operations()
                     if op.type == "Split" and op.outputs[0].dtype == tf.float32][0]
            tower_0 = _downstream(split.outputs[0])
            output = _fake_quant(graph, "tower_1/model/logits/act_quant")
            self.assertEmpty([op.name for op in _upstream([output.outputs[0]]) & tower_0])
            # The model outputs wait for the update (a run of the loss updates every range).
            gates = [op.name for op in graph.get_operations()
                     if marks.made_by_qat(op) and op.name.endswith("after_range_update")]
            self.assertEqual(sorted(gates), ["model/logits/act_quant/after_range_update",
                                             "tower_1/model/logits/act_quant/after_range_update"])

    def test_rewrite_inside_the_replica_function_joins_the_first_calls(self):
        # MirroredStrategy, the rewrite in the replica function: replica 1's
        # call packs its statistics into replica 0's join (one more Minimum).
        graph, *_ = replica_models.build_mirrored(BATCH, "inside")
        joins = _joins(graph)
        self.assertLen(joins, 1)
        joined = joins[0].inputs[0].op
        self.assertEqual(joined.type, "Minimum")
        self.assertEqual({t.op.device[-5:] for t in joined.inputs}, {"CPU:0", "CPU:1"})
        self.assertEmpty(_collectives(graph))
        split = [op for op in graph.get_operations()
                 if op.type == "Split" and op.outputs[0].dtype == tf.float32][0]
        output = _fake_quant(graph, "replica_1/model/logits/act_quant")
        self.assertEmpty([op.name for op in _upstream([output.outputs[0]])
                          & _downstream(split.outputs[0])])

    def test_multi_worker_graph_one_collective_whatever_the_depth(self):
        config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{_free_port()}",
                                                    f"127.0.0.1:{_free_port()}"]},
                             "task": {"type": "worker", "index": 0}})
        for depth in (1, 4):
            with mock.patch.dict(os.environ, {"TF_CONFIG": config}), tf.Graph().as_default() as g:
                strategy = tf1.distribute.experimental.MultiWorkerMirroredStrategy()
                with strategy.scope():
                    images = tf1.placeholder(tf.float32, (BATCH,) + replica_models.SIZE)
                    strategy.extended.call_for_each_replica(
                        lambda x, d=depth: tf.reduce_mean(_deep(x, d)), args=(images,))
                    qat.experimental_create_training_graph(quant_delay=0, symmetric_weights=True)
            collectives = _collectives(g)
            self.assertLen(collectives, 1, f"depth {depth}")
            self.assertEqual(collectives[0].get_attr("merge_op"), b"Min")
            ranges = _joins(g)[0].get_attr("_qat_ranges")
            self.assertLen(ranges, 2 * depth + 3)   # With the input's range.

    def test_single_device_updates_in_the_forward(self):
        graph, *_ = replica_models.build_towers(BATCH, num=1)
        self.assertEmpty(_joins(graph))
        fake_quant = _fake_quant(graph, "tower_0/model/conv1/act_quant")
        self.assertIn(fake_quant.inputs[2].op.inputs[0].op.type, ("VarHandleOp", "VariableV2"))

    def test_combined_step_is_each_replicas_step_on_the_same_batch(self):
        # Both towers on the same half-batch: the combined statistics are each
        # tower's, so the assigned range (vector steps, floors after) equals
        # what each tower's FakeQuant read (one range's step), to the bit;
        # with asymmetric and with symmetric activation ranges.
        for symmetric in (False, True):
            self._check_same_batch(symmetric)

    def _check_same_batch(self, symmetric: bool):
        graph, images, labels, train_op = _towers(_floored_net, symmetric_weights=True,
                                                  symmetric=symmetric)
        with graph.as_default():
            variables = {v.op.name: v for v in tf1.global_variables()}
        joined = [n.decode() for n in _joins(graph)[0].get_attr("_qat_ranges")]
        reads = {p: [_fake_quant(graph, p).inputs[1:], _fake_quant(graph, "tower_1/" + p).inputs[1:]]
                 for p in joined}
        ranges = {p: [variables[p + "/min"], variables[p + "/max"]] for p in joined}
        with tf1.Session(graph=graph, config=replica_models.session_config()) as sess:
            sess.run(tf1.variables_initializer(list(variables.values())))
            for step in (1, 2):
                x, y = replica_models.make_batch(BATCH, seed=step)
                _, read, concat = sess.run(
                    [train_op, reads, graph.get_tensor_by_name("tower_0/model/concat:0")],
                    {images: np.concatenate([x, x]), labels: np.concatenate([y, y]) % 3})
                stored = sess.run(ranges)
                for p in joined:
                    for tower in range(2):
                        self.assertAllEqual(read[p][tower], stored[p],
                                            msg=f"{p} tower {tower} symmetric {symmetric}")
            # The floors widened ranges: the concatenation's (combined; the
            # logits' large bias), the input's (one range; the first conv's).
            self.assertGreater(stored["model/concat_quant"][1], concat.max() + 10.0)
            self.assertGreater(sess.run(variables["model/a/input_quant/max"]), 2.0)

    def test_concatenation_and_per_channel_ranges_of_towers(self):
        graph, images, labels, train_op = _towers(_concat_net, symmetric_weights=True,
                                                  per_channel_weights=True)
        members = ["model/a_relu", "model/b/BiasAdd", "model/cat"]
        raw = {k: [graph.get_tensor_by_name(f"tower_{k}/{m}:0") for m in members]
               for k in range(2)}
        owners = {0: "model/concat_quant", 1: "tower_1/model/concat_quant"}
        reads = {k: _fake_quant(graph, scope).inputs[1:] for k, scope in owners.items()}
        member_read = _fake_quant(graph, "tower_1/model/a/act_quant").inputs[1:]
        weights = _fake_quant(graph, "model/c/weights_quant")
        self.assertEqual(weights.type, "FakeQuantWithMinMaxVarsPerChannel")
        with graph.as_default():
            variables = {v.op.name: v for v in tf1.global_variables()}
        concat_range = [variables["model/concat_quant/min"],
                        variables["model/concat_quant/max"]]
        weight_range = [variables["model/c/weights_quant/min"],
                        variables["model/c/weights_quant/max"]]
        with tf1.Session(graph=graph, config=replica_models.session_config()) as sess:
            sess.run(tf1.variables_initializer(list(variables.values())))
            previous = sess.run(concat_range)
            for step in (1, 2):
                x, y = replica_models.make_batch(2 * BATCH, seed=step)
                x[BATCH:] -= 0.5   # Tower 1's branch b sees negative values.
                _, values, read, member, kernel = sess.run(
                    [train_op, raw, reads, member_read, weights.inputs[0]],
                    {images: x, labels: y % 3})
                stored, (w_lo, w_hi) = sess.run([concat_range, weight_range])
                low = {k: min(v.min() for v in values[k]) for k in values}
                high = {k: max(v.max() for v in values[k]) for k in values}
                self.assertNotEqual(low[0], low[1])
                expected = _step(previous, min(low.values()), max(high.values()), step)
                self.assertAllClose(stored, expected, rtol=1e-6, atol=1e-7)
                for k in range(2):   # Each tower's forward: its own batch's step.
                    self.assertAllClose(read[k], _step(previous, low[k], high[k], step),
                                        rtol=1e-6, atol=1e-7, msg=f"tower {k} step {step}")
                # A member reads the range before the step (the group's lag).
                self.assertAllClose(member, previous, rtol=0, atol=0)
                # Per-channel symmetric weights: the kernel's last value, per channel.
                bound = np.maximum(np.abs(kernel.min(axis=(0, 1, 2))),
                                   np.abs(kernel.max(axis=(0, 1, 2))))
                self.assertAllClose(w_hi, bound, rtol=1e-6)
                self.assertAllClose(w_lo, -bound, rtol=1e-6)
                previous = stored


if __name__ == "__main__":
    absltest.main()
