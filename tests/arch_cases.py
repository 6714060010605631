"""Issue #21's building blocks as zoo cases (registered in zoo_util.EXTRA_CASES).

Each builder maps the input placeholder to logits, like zoo_util's:

* tcn: dilated causal Conv1D (rates 2, 4) with a gated tanh * sigmoid unit and
  residual 1x1 convs.
* transformer: Dense embedding, 2-head MultiHeadAttention, residual +
  LayerNormalization, GELU MLP, residual + LayerNormalization.
* convnext: depthwise 7x7, LayerNormalization, Dense x4, GELU, Dense, layer
  scale (tf_keras ConvNeXt's LayerScale), stochastic depth (training
  graphs), residual.
* deeplab: atrous convs at rates 2 (tf_keras, the native `dilations`
  attribute) and 4 (tf.nn.atrous_conv2d, SpaceToBatchND / BatchToSpaceND) in
  parallel, concatenated, bilinear upsampling.
* keras_layer_norm: tf_keras LayerNormalization with its default epsilon
  (a fused batch norm on a reshaped input) after Dense layers and an add.
* gelu_mlp: tanh-approximated GELU after a conv, tf_keras "gelu" Dense.
* layer_norm_mlp: layer norm written as moments -> rsqrt arithmetic after
  Dense layers (int8 only).
* slim_atrous: TF-Slim conv2d(rate=2) with slim's (fused) batch norm.
* nn_attention (no tf_keras): single-head attention written with tf.nn and
  matmuls, hand-written layer norm (moments, rsqrt), tanh-approximated GELU.
"""
import math

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.applications import convnext

import zoo_util

tf1 = tf.compat.v1
layers = keras.layers


def _tcn(x):
    net = layers.Conv1D(8, 1, name="in_proj")(x)
    for i, rate in enumerate((2, 4)):
        a = layers.Conv1D(8, 3, dilation_rate=rate, padding="causal",
                          use_bias=False, name=f"dil{i}_tanh")(net)
        a = layers.BatchNormalization(name=f"dil{i}_tanh_bn")(a)
        a = layers.Activation("tanh", name=f"dil{i}_tanh_act")(a)
        b = layers.Conv1D(8, 3, dilation_rate=rate, padding="causal",
                          name=f"dil{i}_gate")(net)
        b = layers.Activation("sigmoid", name=f"dil{i}_gate_act")(b)
        gated = layers.Multiply(name=f"dil{i}_gated")([a, b])
        res = layers.Conv1D(8, 1, name=f"dil{i}_res")(gated)
        net = layers.Add(name=f"dil{i}_add")([net, res])
    net = layers.GlobalAveragePooling1D(name="pool")(net)
    return layers.Dense(10, name="logits")(net)


def _transformer(x):
    net = layers.Dense(16, name="embed")(x)
    att = layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(net, net)
    net = layers.Add(name="att_add")([net, att])
    net = layers.LayerNormalization(epsilon=1e-6, name="att_norm")(net)
    mlp = layers.Dense(32, activation="gelu", name="mlp_in")(net)
    mlp = layers.Dense(16, name="mlp_out")(mlp)
    net = layers.Add(name="mlp_add")([net, mlp])
    net = layers.LayerNormalization(epsilon=1e-6, name="mlp_norm")(net)
    net = layers.GlobalAveragePooling1D(name="pool")(net)
    return layers.Dense(10, name="logits")(net)


def _drop_path(x, rate=0.1):
    """tf_keras ConvNeXt's StochasticDepth in training graphs (its own call
    takes len() of a symbolic shape, which graph mode refuses)."""
    if not keras.backend.learning_phase():  # zoo_util.build_graph sets it.
        return x
    keep = 1.0 - rate
    mask = tf.floor(keep + tf.random.uniform([tf.shape(x)[0], 1, 1, 1]))
    return (x / keep) * mask


def _convnext(x):
    net = layers.Conv2D(16, 2, strides=2, name="stem")(x)
    net = layers.LayerNormalization(epsilon=1e-6, name="stem_norm")(net)
    block = layers.DepthwiseConv2D(7, padding="same", name="dw")(net)
    block = layers.LayerNormalization(epsilon=1e-6, name="norm")(block)
    block = layers.Dense(64, name="pw_in")(block)
    block = layers.Activation("gelu", name="gelu")(block)
    block = layers.Dense(16, name="pw_out")(block)
    block = convnext.LayerScale(1e-1, 16, name="layer_scale")(block)
    block = layers.Lambda(_drop_path, name="drop_path")(block)
    net = layers.Add(name="add")([net, block])
    net = layers.GlobalAveragePooling2D(name="pool")(net)
    net = layers.LayerNormalization(epsilon=1e-6, name="head_norm")(net)
    return layers.Dense(10, name="logits")(net)


def _deeplab(x):
    net = layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False,
                        name="stem")(x)
    net = layers.BatchNormalization(name="stem_bn")(net)
    net = layers.ReLU(name="stem_relu")(net)
    branches = [layers.Conv2D(8, 1, use_bias=False, name="aspp0")(net)]
    branches.append(layers.Conv2D(8, 3, dilation_rate=2, padding="same",
                                  use_bias=False, name="aspp_rate2")(net))
    with tf1.variable_scope("aspp_rate4"):
        kernel = tf1.get_variable("kernel", [3, 3, 16, 8])
        branches.append(tf.nn.atrous_conv2d(net, kernel, rate=4, padding="SAME"))
    for i, branch in enumerate(branches):
        branch = layers.BatchNormalization(name=f"aspp{i}_bn")(branch)
        branches[i] = layers.ReLU(name=f"aspp{i}_relu")(branch)
    net = layers.Concatenate(name="aspp_concat")(branches)
    net = layers.Conv2D(8, 1, use_bias=False, name="project")(net)
    net = layers.BatchNormalization(name="project_bn")(net)
    net = layers.ReLU(name="project_relu")(net)
    net = layers.UpSampling2D(2, interpolation="bilinear", name="upsample")(net)
    net = layers.Conv2D(10, 1, name="classes")(net)
    return layers.GlobalAveragePooling2D(name="logits")(net)


def _layer_norm(x, name):
    with tf1.variable_scope(name):
        channels = x.shape[-1]
        gamma = tf1.get_variable("gamma", [channels], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer())
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-5) * gamma + beta


def _nn_attention(x):
    with tf1.variable_scope("nn_attention"):
        net = tf1.layers.dense(x, 16, name="embed")
        q = tf1.layers.dense(net, 16, name="query")
        k = tf1.layers.dense(net, 16, name="key")
        v = tf1.layers.dense(net, 16, name="value")
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(16.0))
        att = tf.matmul(tf.nn.softmax(scores), v)
        net = _layer_norm(net + att, "norm1")
        h = tf1.layers.dense(net, 32, name="mlp_in")
        h = tf.nn.gelu(h, approximate=True)
        net = _layer_norm(net + tf1.layers.dense(h, 16, name="mlp_out"), "norm2")
        net = tf.reduce_mean(net, axis=1)
        return tf1.layers.dense(net, 10, name="logits")


def _gelu_mlp(x):
    net = layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv")(x)
    net = layers.BatchNormalization(name="conv_bn")(net)
    net = layers.Activation(lambda t: tf.nn.gelu(t, approximate=True),
                            name="conv_gelu_tanh")(net)
    net = layers.Flatten(name="flat")(net)
    net = layers.Dense(16, activation="gelu", name="fc_gelu")(net)
    return layers.Dense(10, name="logits")(net)


def _layer_norm_mlp(x):
    with tf1.variable_scope("ln_mlp"):
        net = tf1.layers.dense(tf1.layers.flatten(x), 16, name="fc0")
        net = _layer_norm(net, "norm0")
        net = tf1.layers.dense(net, 16, activation=tf.nn.relu, name="fc1")
        net = _layer_norm(net, "norm1")
        return tf1.layers.dense(net, 10, name="logits")


def _keras_layer_norm(x):
    net = layers.Reshape((x.shape[1], x.shape[2] * x.shape[3]), name="tokens")(x)
    net = layers.Dense(16, name="embed")(net)
    net = layers.LayerNormalization(name="norm0")(net)  # Fused (epsilon 1e-3).
    mlp = layers.Dense(16, activation="gelu", name="mlp")(net)
    net = layers.LayerNormalization(name="norm1")(layers.Add(name="add")([net, mlp]))
    net = layers.GlobalAveragePooling1D(name="pool")(net)
    return layers.Dense(10, name="logits")(net)


def _slim_atrous(x):
    from qat import compat  # pylint: disable=g-import-not-at-top
    compat.enable_slim()
    import tf_slim as slim  # pylint: disable=g-import-not-at-top
    bn = {"is_training": bool(keras.backend.learning_phase())}
    net = slim.conv2d(x, 8, 3, normalizer_fn=slim.batch_norm, normalizer_params=bn,
                      scope="conv0")
    net = slim.conv2d(net, 8, 3, rate=2, normalizer_fn=slim.batch_norm,
                      normalizer_params=bn, scope="atrous")
    net = tf.reduce_mean(net, [1, 2], name="pool")
    return slim.fully_connected(net, 10, activation_fn=None, scope="logits")


CASES = {
    "slim_atrous": zoo_util.Case(_slim_atrous, (16, 16, 3)),
    "keras_layer_norm": zoo_util.Case(_keras_layer_norm, (4, 4, 3), flavours=("int8",)),
    # TFLite has no uint8 RSQRT kernel: layer norm converts to int8 only.
    "layer_norm_mlp": zoo_util.Case(_layer_norm_mlp, (4, 4, 3), flavours=("int8",)),
    "gelu_mlp": zoo_util.Case(_gelu_mlp, (8, 8, 3)),
    "tcn": zoo_util.Case(_tcn, (32, 4)),
    "transformer": zoo_util.Case(_transformer, (8, 6), flavours=("int8",)),
    "convnext": zoo_util.Case(_convnext, (16, 16, 3), flavours=("int8",)),
    "deeplab": zoo_util.Case(_deeplab, (16, 16, 3)),
    "nn_attention": zoo_util.Case(_nn_attention, (8, 6), flavours=("int8",)),
}
zoo_util.EXTRA_CASES.update(CASES)
