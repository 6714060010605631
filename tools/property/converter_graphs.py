"""Random small convolutional networks as `tf.compat.v1` graphs: `build(net, training)`.

`build` makes a graph of a `tools.property.converter_networks.ConvNet` (the
description, its hypothesis strategy and its inputs) in training or eval
mode, the blocks, pre-processing and head as that module's docstring
describes; `BuiltNet` is what it returns.
"""
import dataclasses
import os
from typing import Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tools.property import network_graphs  # pylint: disable=g-import-not-at-top
from tools.property.converter_networks import CLASSES  # pylint: disable=g-import-not-at-top
from tools.property.converter_networks import ConvBlock  # pylint: disable=g-import-not-at-top
from tools.property.converter_networks import ConvNet  # pylint: disable=g-import-not-at-top
from tools.property.converter_networks import GROUPED  # pylint: disable=g-import-not-at-top
from tools.property.converter_networks import INPUT_CHANNELS  # pylint: disable=g-import-not-at-top
from tools.property.converter_networks import feed_shape  # pylint: disable=g-import-not-at-top


@dataclasses.dataclass
class BuiltNet:
    """A built network: its graph, input, output and (training) loss."""
    graph: tf.Graph
    input: tf.Tensor
    output: tf.Tensor
    loss: Optional[tf.Tensor] = None


def _preprocess(x: tf.Tensor, kind: str) -> tf.Tensor:
    if kind == "scale_offset":
        return x * (1.0 / 127.5) - 1.0
    if kind == "rescaling":
        import tf_keras  # pylint: disable=g-import-not-at-top
        return tf_keras.layers.Rescaling(1.0 / 255.0)(x)
    if kind == "mean_std":
        mean = tf.constant([123.7, 116.3, 103.5])
        std = tf.constant([58.4, 57.1, 57.4])
        return (x - mean) / std
    return x


def _conv(x: tf.Tensor, out: int, kernel: int = 1, stride: int = 1, groups: int = 1,
          depthwise: bool = False, bias: bool = True, name: str = "conv",
          offset: float = 0.0) -> tf.Tensor:
    init = tf.compat.v1.glorot_uniform_initializer()
    channels = int(x.shape[-1])
    with tf.compat.v1.variable_scope(name):
        if depthwise:
            w = tf.compat.v1.get_variable("depthwise_kernel", [kernel, kernel, channels, 1],
                                          initializer=init)
            y = tf.nn.depthwise_conv2d(x, w, [1, stride, stride, 1], "SAME")
        else:
            w = tf.compat.v1.get_variable("kernel", [kernel, kernel, channels // groups, out],
                                          initializer=init)
            y = tf.nn.conv2d(x, w, stride, "SAME")
        if bias:
            b = tf.compat.v1.get_variable(
                "bias", [int(y.shape[-1])],
                initializer=tf.compat.v1.random_normal_initializer(mean=offset, stddev=0.3))
            y = tf.nn.bias_add(y, b)
    return y


def _block(x: tf.Tensor, b: ConvBlock, training: bool,
           hooks: network_graphs.BuildHooks, index: int) -> tf.Tensor:
    if b.kind in ("conv", "depthwise", GROUPED):
        y = _conv(x, b.channels, b.kernel, b.stride, b.groups, b.kind == "depthwise",
                  bias=not b.batch_norm, offset=b.offset)
        if b.batch_norm:
            y = tf.compat.v1.layers.batch_normalization(
                y, training=training, momentum=0.0, name="bn",
                beta_initializer=tf.compat.v1.random_normal_initializer(mean=b.offset,
                                                                        stddev=0.3),
                gamma_initializer=tf.compat.v1.random_uniform_initializer(0.5, 1.5))
        hooks.before_activation(index, y, b)
        return hooks.after_activation(index, network_graphs.activation(y, b.activation))
    if b.kind == "pool":
        pool = tf.nn.avg_pool2d if b.variant == "avg" else tf.nn.max_pool2d
        return pool(x, 2, 2, "SAME")
    if b.kind == "global_pool":
        reduce = tf.reduce_mean if b.variant == "mean" else tf.reduce_max
        return reduce(x, [1, 2], keepdims=True)
    if b.kind == "se":
        s = tf.reduce_mean(x, [1, 2], keepdims=True)
        s = tf.nn.relu(_conv(s, b.channels, name="squeeze"))
        s = _conv(s, int(x.shape[-1]), name="excite")
        gate = (tf.sigmoid(s) if b.variant == "sigmoid"
                else tf.nn.relu6(s + 3.0) * (1.0 / 6.0))
        return x * gate
    # resize_concat: image pooling as in DeepLab v3.
    p = tf.reduce_mean(x, [1, 2], keepdims=True)
    p = tf.nn.relu(_conv(p, b.channels, name="pooling"))
    size = [int(x.shape[1]), int(x.shape[2])]
    if b.variant == "bilinear":
        p = tf.compat.v1.image.resize_bilinear(p, size)
    else:
        p = tf.compat.v1.image.resize_nearest_neighbor(p, size)
    return tf.concat([x, p], axis=-1)


def _feed(net: ConvNet, kind: str, batch: int) -> tf.Tensor:
    """The fed batch: a placeholder's (`input`), a tf.data iterator's or a FIFO
    queue's, with labels beside it (which are not model data)."""
    shape = feed_shape(net)
    if kind == "placeholder":
        return tf.compat.v1.placeholder(tf.float32, shape, name="input")
    element = (np.zeros(shape[1:], np.float32), np.int32(0))
    if kind == "tf.data":
        ds = tf.data.Dataset.from_tensors(element).repeat().batch(batch, drop_remainder=True)
        return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()[0]
    queue = tf.compat.v1.FIFOQueue(2 * batch, [tf.float32, tf.int32], [shape[1:], []])
    return queue.dequeue_many(batch)[0]


def _pipeline(x: tf.Tensor, net: ConvNet) -> tf.Tensor:
    """Fed batch -> images -> pre-processing -> pad (`PIPELINES`)."""
    x = _preprocess(_layout(x, net), net.preprocessing)
    if net.pipeline == "pad":
        return tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
    return x


def _layout(x: tf.Tensor, net: ConvNet) -> tf.Tensor:
    """A flat or channels-first batch as NHWC images."""
    if net.pipeline == "reshape":
        return tf.reshape(x, [-1, net.spatial, net.spatial, INPUT_CHANNELS])
    if net.pipeline == "transpose":
        return tf.transpose(x, [0, 2, 3, 1])
    return x


def build(net: ConvNet, training: bool, seed: int = 0, batch: int = 8,
          hooks: Optional[network_graphs.BuildHooks] = None) -> BuiltNet:
    """Builds `net` in a new graph (resource variables).

    The output is `tf.identity(..., name="output")`. In training mode the
    batch (`batch` examples) comes from `net.feed` and the loss is `net.loss`;
    in eval mode (the graph that is converted) from the placeholder `input`
    (batch size free), with no loss.
    """
    hooks = hooks or network_graphs.BuildHooks()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        x = _feed(net, net.feed if training else "placeholder", batch)
        with tf.compat.v1.variable_scope("net", use_resource=True):
            y = _pipeline(x, net)
            for i, block in enumerate(net.blocks):
                with tf.compat.v1.variable_scope(f"block{i}"):
                    y = _block(hooks.block_input(i, y), block, training, hooks, i)
            if net.head != "none":
                with tf.compat.v1.variable_scope("head"):
                    y = tf.reduce_mean(y, [1, 2])
                    w = tf.compat.v1.get_variable(
                        "kernel", [int(y.shape[-1]), CLASSES],
                        initializer=tf.compat.v1.glorot_uniform_initializer())
                    b = tf.compat.v1.get_variable(
                        "bias", [CLASSES],
                        initializer=tf.compat.v1.random_normal_initializer(stddev=0.3))
                    y = tf.matmul(y, w) + b
                    if net.head == "softmax":
                        y = tf.nn.softmax(y)
        out = tf.identity(y, name="output")
        loss = hooks.finish(out, network_graphs.training_loss(out, net.loss, batch=None)
                            if training else None)
    return BuiltNet(graph, x, out, loss)
