"""Builds and checks the quantize grid's tiny graphs (shared by the shards).

One case: input -> layer (conv, fc, depthwise or atrous conv) -> bias or batch
norm (none, fused, unfused) -> activation, with an optional residual add
before or after the activation, rewritten by
`experimental_create_training_graph`. The checks read the graph's structure
only (no Session), so each case takes milliseconds.
"""
import itertools
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import quant_ops  # pylint: disable=g-import-not-at-top

ACTIVATIONS = ("Relu6", "Relu", "Identity", "LeakyRelu")
RESIDUALS = ("none", "pre", "post")
DELAYS = (None, 5000)
VARIABLES = ("resource", "ref")
SCOPES = (None, "test")
LAYERS = ("conv", "fc", "depthwise", "atrous")
BATCH_NORMS = ("none", "fused", "unfused")

_ACT_FNS = {
    "Relu6": tf.nn.relu6,
    "Relu": tf.nn.relu,
    "Identity": tf.identity,
    "LeakyRelu": lambda x, name: tf.nn.leaky_relu(x, 0.1, name=name),
}


def grid(layers=LAYERS):
    """Every (activation, residual, delay, variables, scope, layer, bn) case."""
    for case in itertools.product(ACTIVATIONS, RESIDUALS, DELAYS, VARIABLES,
                                  SCOPES, layers, BATCH_NORMS):
        name = "_".join(str(c) for c in case)
        yield (name,) + case


def build(activation, residual, variables, scope, layer, batch_norm):
    """Builds one case's float graph.

    Returns:
      (graph, tensors): tensors maps "input", "weights", "layer", "act",
      "add", "consumer" to ops/tensors of the float graph.
    """
    g = tf.Graph()
    prefix = scope + "/" if scope else ""
    t = {}
    with g.as_default(), tf.compat.v1.variable_scope(
            "", use_resource=(variables == "resource")):
        if layer == "fc":
            x = tf.compat.v1.placeholder(tf.float32, [2, 6], name="input")
        else:
            x = tf.compat.v1.placeholder(tf.float32, [2, 6, 6, 3], name="input")
        t["input"] = x
        with tf.compat.v1.variable_scope(prefix + "layer") as vs:
            with tf.name_scope(vs.original_name_scope):
                if layer == "fc":
                    w = tf.compat.v1.get_variable("weights", [6, 6])
                    y = tf.matmul(x, w, name="MatMul")
                elif layer == "depthwise":
                    w = tf.compat.v1.get_variable("weights", [3, 3, 3, 1])
                    y = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME",
                                               name="depthwise")
                elif layer == "conv":
                    w = tf.compat.v1.get_variable("weights", [3, 3, 3, 3])
                    y = tf.nn.conv2d(x, w, 1, "SAME", name="Conv2D")
                else:
                    w = tf.compat.v1.get_variable("weights", [3, 3, 3, 3])
                    y = tf.compat.v1.nn.atrous_conv2d(x, w, 2, "SAME")
                t["weights_var"] = w
                t["layer"] = [op for op in g.get_operations()
                              if op.type in ("Conv2D", "MatMul",
                                             "DepthwiseConv2dNative")][0]
                if batch_norm == "none":
                    b = tf.compat.v1.get_variable(
                        "biases", [int(y.shape[-1])],
                        initializer=tf.compat.v1.zeros_initializer())
                    y = tf.nn.bias_add(y, b, name="BiasAdd")
                else:
                    y = tf.compat.v1.layers.batch_normalization(
                        y, training=True, fused=(batch_norm == "fused"),
                        name="BatchNorm")
                if residual == "pre":
                    y = tf.add(y, x, name="bypass/Add")
                    t["add"] = y.op
                    y = _ACT_FNS[activation](y, name="bypass/" + activation)
                else:
                    y = _ACT_FNS[activation](y, name=activation)
                t["act"] = y.op
                if residual == "post":
                    y = tf.add(y, x, name="bypass/Add")
                    t["add"] = y.op
        out = tf.nn.sigmoid(y, name="consumer")
        t["consumer"] = out.op
    return g, t
