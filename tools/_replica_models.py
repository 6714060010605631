"""Data-parallel training graphs for bench/bench_replicas.py and tests/replicas_test.py.

One small conv net (two conv + batch norm + ReLU layers, a dense head) built
as TF1 multi-GPU towers, as TF-Slim `model_deploy` clones, or as
`tf.distribute.MirroredStrategy` replicas in graph mode (the rewrite called
once after the replicas, or inside the replica function); the
single-replica eval graph restores their checkpoints.
"""
import os
from typing import List, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
import qat.compat  # pylint: disable=g-import-not-at-top,unused-import

tf1 = tf.compat.v1
SIZE = (8, 8, 3)
CLASSES = 10
DEVICES = ("/cpu:0", "/cpu:1")
INPUT_RANGE = (0.0, 1.0)


def session_config() -> tf1.ConfigProto:
    """Two logical CPU devices."""
    return tf1.ConfigProto(device_count={"CPU": 2}, inter_op_parallelism_threads=2,
                           intra_op_parallelism_threads=1)


def model(images: tf.Tensor, training: bool) -> tf.Tensor:
    """The conv net (variables under `model/`, reused by every replica)."""
    with tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
        net = images
        for k, (filters, stride) in enumerate([(8, 1), (16, 2)]):
            net = tf1.layers.conv2d(net, filters, 3, stride, padding="same", use_bias=False,
                                    name=f"conv{k + 1}")
            net = tf1.layers.batch_normalization(net, training=training, name=f"conv{k + 1}/bn")
            net = tf.nn.relu(net)
        net = tf1.layers.flatten(net)
        return tf1.layers.dense(net, CLASSES, name="logits")


def slim_model(images: tf.Tensor, training: bool) -> tf.Tensor:
    """The same net with TF-Slim layers (model_deploy's model_fn)."""
    import tf_slim as slim  # pylint: disable=g-import-not-at-top
    qat.compat.enable_slim()
    with slim.arg_scope([slim.conv2d], normalizer_fn=slim.batch_norm,
                        normalizer_params={"is_training": training, "fused": True}):
        net = slim.conv2d(images, 8, 3, scope="conv1")
        net = slim.conv2d(net, 16, 3, stride=2, scope="conv2")
    net = slim.flatten(net)
    return slim.fully_connected(net, CLASSES, activation_fn=None, scope="logits")


def make_batch(n: int, seed: int, size=SIZE) -> Tuple[np.ndarray, np.ndarray]:
    """Images in [0, 1] (the first half in [0, 0.5]) and labels."""
    rng = np.random.RandomState(seed)
    images = rng.uniform(0.0, 1.0, (n,) + tuple(size)).astype(np.float32)
    images[: n // 2] *= 0.5      # Replica 0's half has a smaller range than replica 1's.
    return images, np.arange(n) % CLASSES


def _loss(labels, logits):
    return tf1.losses.sparse_softmax_cross_entropy(labels, logits,
                                                   loss_collection=None)


def build_towers(batch: int, num: int = 2, quantize: bool = True, slim: bool = False,
                 size=SIZE):
    """TF1's multi-GPU pattern (or model_deploy's clones with `slim`).

    Returns:
      (graph, images, labels, train_op, per-replica losses).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf1.train.get_or_create_global_step()
        images = tf1.placeholder(tf.float32, (batch * num,) + tuple(size), name="images")
        labels = tf1.placeholder(tf.int64, [batch * num], name="labels")
        xs, ys = tf.split(images, num), tf.split(labels, num)
        losses, update_ops = [], []
        scope_name = "clone_%d" if slim else "tower_%d"
        for k in range(num):
            with tf.name_scope(scope_name % k), tf.device(DEVICES[k % len(DEVICES)]):
                if slim:
                    with tf1.variable_scope(tf1.get_variable_scope(), reuse=k > 0):
                        logits = slim_model(xs[k], True)
                else:
                    logits = model(xs[k], True)
                losses.append(_loss(ys[k], logits))
                if k == 0:
                    update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, scope_name % 0)
        if quantize:
            qat.experimental_create_training_graph(graph, quant_delay=0, symmetric_weights=True)
        optimizer = tf1.train.GradientDescentOptimizer(0.05)
        grads = []
        for k, loss in enumerate(losses):
            with tf.name_scope(scope_name % k), tf.device(DEVICES[k % len(DEVICES)]):
                grads.append(optimizer.compute_gradients(loss))
        averaged = []
        for pairs in zip(*grads):
            variable = pairs[0][1]
            averaged.append((tf.add_n([g for g, _ in pairs]) / num, variable))
        with tf.control_dependencies(update_ops):
            train_op = optimizer.apply_gradients(averaged,
                                                 global_step=tf1.train.get_global_step())
    return graph, images, labels, train_op, losses


def build_mirrored(batch: int, style: str, num: int = 2, quantize: bool = True,
                   size=SIZE):
    """MirroredStrategy in graph mode; `style` "after" or "inside" (the rewrite).

    Returns:
      (graph, images, labels, train_op, per-replica losses).
    """
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.MirroredStrategy(list(DEVICES[:num]))
        with strategy.scope():
            tf1.train.get_or_create_global_step()
            images = tf1.placeholder(tf.float32, (batch * num,) + tuple(size), name="images")
            labels = tf1.placeholder(tf.int64, [batch * num], name="labels")
            xs, ys = tf.split(images, num), tf.split(labels, num)
            x_dist = strategy.experimental_distribute_values_from_function(
                lambda ctx: xs[ctx.replica_id_in_sync_group])
            y_dist = strategy.experimental_distribute_values_from_function(
                lambda ctx: ys[ctx.replica_id_in_sync_group])
            optimizer = tf1.train.GradientDescentOptimizer(0.05)

            def forward(x, y):
                loss = _loss(y, model(x, True))
                if quantize and style == "inside":
                    qat.experimental_create_training_graph(quant_delay=0, symmetric_weights=True)
                return loss

            def step(loss):
                # Replica context: gradients all-reduced by apply_gradients.
                updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
                with tf.control_dependencies(updates):
                    grads = optimizer.compute_gradients(loss / num)
                    return optimizer.apply_gradients(grads)

            losses = strategy.extended.call_for_each_replica(forward, args=(x_dist, y_dist))
            if quantize and style == "after":
                qat.experimental_create_training_graph(graph, quant_delay=0, symmetric_weights=True)
            train_ops = strategy.extended.call_for_each_replica(step, args=(losses,))
            train_op = tf.group(strategy.experimental_local_results(train_ops))
    return graph, images, labels, train_op, list(strategy.experimental_local_results(losses))


def build_eval(slim: bool = False):
    """The single-replica eval graph: (graph, images, probabilities)."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, (None,) + SIZE, name="images")
        logits = slim_model(images, False) if slim else model(images, False)
        probabilities = tf.nn.softmax(logits, name="probabilities")
        qat.experimental_create_eval_graph(graph, symmetric_weights=True)
    return graph, images, probabilities


def range_variables(graph: tf.Graph) -> List[tf.Variable]:
    """qat's range variables (`<prefix>/min|max`), by name."""
    return sorted((v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                   if v.op.name.endswith(("/min", "/max")) and "quant" in v.op.name),
                  key=lambda v: v.op.name)
