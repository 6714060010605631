"""Random small networks as `tf.compat.v1` graphs: `build(net, training)`.

`build` turns a `tools.property.networks.Network` (the description and its
hypothesis strategy) into a graph, in training or eval mode (what differs
between the two: dropout, batch-norm mode, the loss), or an export graph;
the blocks and head are built as that module's docstring describes.
`BuildHooks` is what a generator family adds while a network is built
(`tools.property.training_branches`), `activation` and `training_loss` the
activations and losses the other families build too.
"""
import dataclasses
import os
from typing import List, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from tools.property.networks import BATCH  # pylint: disable=g-import-not-at-top
from tools.property.networks import Block  # pylint: disable=g-import-not-at-top
from tools.property.networks import Network  # pylint: disable=g-import-not-at-top
from tools.property.networks import feed_shape  # pylint: disable=g-import-not-at-top
from tools.property.networks import model_shape  # pylint: disable=g-import-not-at-top


class BuildHooks(object):
    """What a generator family adds to a network while `build` builds it (nothing here).

    `block_input(i, x)` at the start of block i, in its variable scope, returns
    the tensor the block reads; `before_activation(i, y, block)` sees a
    block's layer output (after its bias, batch norm and adds);
    `after_activation(i, y)` returns what the block goes on with after its
    activation; `finish(output, loss)` returns the loss (None in export graphs).
    """

    def block_input(self, index: int, x: tf.Tensor) -> tf.Tensor:
        del index
        return x

    def before_activation(self, index: int, y: tf.Tensor, block) -> None:
        del index, y, block

    def after_activation(self, index: int, y: tf.Tensor) -> tf.Tensor:
        del index
        return y

    def finish(self, output: tf.Tensor, loss: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
        del output
        return loss


_NO_HOOKS = BuildHooks()


@dataclasses.dataclass
class Built:
    """A built network: its graph and what the checks need."""
    graph: tf.Graph
    input: tf.Tensor
    output: tf.Tensor
    kernels: List[tf.Operation]  # the variable op of each layer's weights
    loss: tf.Tensor = None


def activation(x: tf.Tensor, kind: str) -> tf.Tensor:
    """`x` through the activation `kind` (one of ACTIVATIONS; "none": `x`)."""
    if kind == "relu":
        return tf.nn.relu(x)
    if kind == "relu6":
        return tf.nn.relu6(x)
    if kind == "leaky_relu":
        return tf.nn.leaky_relu(x, alpha=0.2)
    if kind == "hard_swish":
        return x * tf.nn.relu6(x + 3.0) * (1.0 / 6.0)
    if kind == "swish":
        return x * tf.sigmoid(x)
    if kind == "sigmoid":
        return tf.sigmoid(x)
    if kind == "tanh":
        return tf.tanh(x)
    if kind == "gelu":
        return tf.nn.gelu(x)
    return x


def _layer(x: tf.Tensor, block: Block, kernels: list) -> tf.Tensor:
    init = tf.compat.v1.glorot_uniform_initializer()
    if block.layer == "dense":
        if x.shape.rank == 4:
            x = tf.reshape(x, [BATCH, -1])
        w = tf.compat.v1.get_variable("kernel", [int(x.shape[-1]), block.channels],
                                      initializer=init)
        y = tf.matmul(x, w)
    elif block.layer == "depthwise":
        w = tf.compat.v1.get_variable("depthwise_kernel",
                                      [3, 3, int(x.shape[-1]), 1], initializer=init)
        y = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
    else:
        w = tf.compat.v1.get_variable(
            "kernel", [3, 3, int(x.shape[-1]), block.channels], initializer=init)
        if block.layer == "atrous":
            y = tf.compat.v1.nn.atrous_conv2d(x, w, 2, "SAME")
        else:
            y = tf.nn.conv2d(x, w, 1, "SAME")
    kernels.append(w.op)
    return _bias(y, block.bias, 0.0 if block.batch_norm != "none" else block.offset)


def _bias(y: tf.Tensor, kind: str, offset: float = 0.0) -> tf.Tensor:
    if kind == "none":
        return y
    b = tf.compat.v1.get_variable(
        "bias", [int(y.shape[-1])],
        initializer=tf.compat.v1.random_normal_initializer(mean=offset, stddev=0.3))
    return tf.nn.bias_add(y, b) if kind == "bias_add" else y + b


def _dropout(x: tf.Tensor, kind: str, training: bool) -> tf.Tensor:
    """Dropout the ways TF1 models wrote it; eval graphs run it off."""
    if kind == "nn":
        # A rate fed while training and left at 0 in eval (the placeholder
        # is in both graphs, as in the speech_commands models).
        rate = tf.compat.v1.placeholder_with_default(
            0.5 if training else 0.0, [], name="dropout_rate")
        return tf.nn.dropout(x, rate=rate)
    if kind == "slim":
        return _slim().dropout(x, 0.5, is_training=training)
    if kind == "keras":
        import tf_keras  # pylint: disable=g-import-not-at-top
        return tf_keras.layers.Dropout(0.5)(x, training=training)
    return x


def _slim():
    from qat import compat  # pylint: disable=g-import-not-at-top
    compat.enable_slim()
    import tf_slim  # pylint: disable=g-import-not-at-top
    return tf_slim


def _head(x: tf.Tensor, net: Network, training: bool, kernels: list) -> tf.Tensor:
    """A logits layer with a bias and no activation, read by `net.head`."""
    classes = 3
    kind = net.head
    init = tf.compat.v1.glorot_uniform_initializer()
    if x.shape.rank == 4:
        x = tf.reduce_mean(x, [1, 2], keepdims=True)
    x = _dropout(x, net.head_dropout, training)
    if x.shape.rank == 4:
        w = tf.compat.v1.get_variable("kernel", [1, 1, int(x.shape[-1]), classes],
                                      initializer=init)
        y = _bias(tf.nn.conv2d(x, w, 1, "VALID"), "bias_add")
    else:
        w = tf.compat.v1.get_variable("kernel", [int(x.shape[-1]), classes],
                                      initializer=init)
        y = _bias(tf.matmul(x, w), "plus")
    kernels.append(w.op)
    if kind == "squeeze":
        return tf.squeeze(y, [1, 2]) if y.shape.rank == 4 else tf.squeeze(
            tf.expand_dims(y, 1), [1])
    if kind == "reshape":
        return tf.reshape(y, [BATCH, classes])
    return tf.identity(y, name="logits")


def _batch_norm(y: tf.Tensor, kind: str, training: bool, offset: float = 0.0) -> tf.Tensor:
    fused = kind == "fused" and y.shape.rank == 4
    return tf.compat.v1.layers.batch_normalization(
        y, training=training, fused=fused, name="bn",
        beta_initializer=tf.compat.v1.random_normal_initializer(mean=offset, stddev=0.3),
        gamma_initializer=tf.compat.v1.random_uniform_initializer(0.5, 1.5),
        moving_mean_initializer=tf.compat.v1.random_normal_initializer(stddev=0.3),
        moving_variance_initializer=tf.compat.v1.random_uniform_initializer(0.5, 2.0))


def _feed(net: Network, kind: str) -> tf.Tensor:
    """The fed batch: a placeholder's, a tf.data iterator's or a FIFO queue's
    (with labels beside it, which are not model data)."""
    shape = feed_shape(net)
    if kind == "placeholder":
        return tf.compat.v1.placeholder(tf.float32, shape, name="input")
    by_example = shape[0] == BATCH  # Else batch last (a transposed feed): whole batches.
    element = shape[1:] if by_example else shape
    if kind == "tf.data":
        ds = tf.data.Dataset.from_tensors((np.zeros(element, np.float32), np.int32(0))).repeat()
        if by_example:
            ds = ds.batch(BATCH, drop_remainder=True)
        return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()[0]
    queue = tf.compat.v1.FIFOQueue(8, [tf.float32, tf.int32], [element, []])
    return queue.dequeue_many(BATCH)[0] if by_example else queue.dequeue()[0]


def _pipeline(x: tf.Tensor, net: Network) -> tf.Tensor:
    """From the fed batch to the first block's input (see PIPELINES)."""
    kind = net.pipeline
    if kind in ("scale", "scale_pad"):
        x = x / 2.0 - 0.25
    if kind in ("pad", "scale_pad"):
        pads = [[0, 0], [1, 1], [1, 1], [0, 0]] if x.shape.rank == 4 else [[0, 0], [1, 1]]
        x = tf.pad(x, pads)
    elif kind == "reshape":
        x = tf.reshape(x, model_shape(net))
    elif kind == "transpose":
        x = tf.transpose(x, [0, 2, 3, 1] if x.shape.rank == 4 else [1, 0])
    return x


def training_loss(out: tf.Tensor, kind: str, batch: Optional[int] = BATCH) -> tf.Tensor:
    """The training loss `kind` (one of LOSSES) of `out`, under the scope `loss/`.

    The cross-entropies and the hinge read fed labels: with a static `batch`,
    one class per example by default; with None, any batch, class 0 by default.
    """
    with tf.name_scope("loss"):
        if kind == "mse":
            return tf.reduce_mean(tf.square(out))
        if kind == "mse_const":
            return tf.reduce_mean(tf.square(out - 1.0))
        if batch is None:
            classes = int(np.prod(out.shape.as_list()[1:]))
            logits = tf.reshape(out, [-1, classes])
            default = tf.zeros(tf.shape(logits)[:1], tf.int32)
        else:
            logits = tf.reshape(out, [batch, -1])
            classes = int(logits.shape[-1])
            default = tf.constant(np.arange(batch) % classes, tf.int32)
        labels = tf.compat.v1.placeholder_with_default(default, [batch], name="labels")
        if kind == "temperature":
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits / 2.0))
        one_hot = tf.one_hot(labels, classes)
        if kind == "label_smoothing":
            return tf.compat.v1.losses.softmax_cross_entropy(one_hot, logits,
                                                             label_smoothing=0.1)
        return tf.compat.v1.losses.hinge_loss(one_hot, logits)


def build(net: Network, training: bool, seed: int = 0, export: bool = False,
          hooks: Optional[BuildHooks] = None) -> Built:
    """Builds `net` in a new graph; `training` sets the batch norms' mode.

    The output is `tf.identity(..., name="output")`, the input the fed batch
    (`net.feed`; before `net.pipeline`). Training and eval graphs compute
    `net.loss` from the output (`loss/`); the export graph (`export`: an eval
    graph) has a placeholder feed and no loss. `hooks` add what a generator
    family builds around the model (`BuildHooks`).
    """
    hooks = hooks or _NO_HOOKS
    g = tf.Graph()
    kernels = []
    with g.as_default():
        with tf.compat.v1.variable_scope("net", use_resource=net.resource):
            tf.compat.v1.set_random_seed(seed)
            fed = _feed(net, "placeholder" if export else net.feed)
            with tf.name_scope("pipeline"):
                x = _pipeline(fed, net)
            net_in = x
            for i, block in enumerate(net.blocks):
                with tf.compat.v1.variable_scope(f"block{i}"):
                    x = _block(hooks.block_input(i, x), net_in, block, training, kernels,
                               hooks, i)
            if net.head != "none" and net.head_in_scope:
                with tf.compat.v1.variable_scope("head"):
                    x = _head(x, net, training, kernels)
        if net.head != "none" and not net.head_in_scope:
            with tf.compat.v1.variable_scope("head", use_resource=net.resource):
                x = _head(x, net, training, kernels)
        out = tf.identity(x, name="output")
        loss = hooks.finish(out, None if export else training_loss(out, net.loss))
    return Built(g, fed, out, kernels, loss)


def _block(x: tf.Tensor, net_in: tf.Tensor, block: Block, training: bool,
           kernels: list, hooks: BuildHooks = _NO_HOOKS, index: int = 0) -> tf.Tensor:
    block_in = x
    y = _layer(_dropout(x, block.dropout, training), block, kernels)
    if block.batch_norm != "none":
        y = _batch_norm(y, block.batch_norm, training, block.offset)
    elif block.bias == "none" and block.offset:
        y = y + block.offset
    if block.residual == "pre":
        y = y + block_in
    hooks.before_activation(index, y, block)
    y = hooks.after_activation(index, activation(y, block.activation))
    if block.residual == "post":
        y = y + block_in
    if block.concat == "block_input":
        y = tf.concat([y, block_in], axis=-1)
    elif block.concat == "net_input":
        y = tf.concat([y, net_in], axis=-1)
    return y
