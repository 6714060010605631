"""tools/finetune_digits.py's network and data: the upsampled UCI digits and
the 50-layer DenseNet / Inception / transformer network (graph mode,
tf.compat.v1 layers and tf_keras layers) that module's docstring describes.

`Config` sizes it, `build` makes it in a new graph, `count_layers` counts
what it has, `digits_split` gives tests/digits_util.py's split, upsampled.
"""
import dataclasses
import os
from typing import Dict

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras as keras  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
layers = keras.layers


@dataclasses.dataclass(frozen=True)
class Config:
    """Network size and training schedule."""
    size: int = 16          # Input side (the 8x8 digits repeated).
    growth: int = 8         # Channels each dense unit adds.
    dense_units: int = 4    # Units per dense block.
    width: int = 16         # Stem, transitions, Inception branches, tokens.
    float_epochs: int = 20
    fine_tune_epochs: int = 5  # Float and QAT fine-tunes alike.
    batch: int = 32
    float_rate: float = 1e-3
    fine_tune_rate: float = 1e-4
    seed: int = 0


def digits_split(size: int):
    """tests/digits_util.py's split (seed 0; 1,400 train, 397 test), upsampled to size x size."""
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    factor = size // 8
    images = np.repeat(np.repeat(images, factor, axis=1), factor, axis=2)
    return (images[:1400], labels[:1400]), (images[1400:], labels[1400:])


def _conv_bn_relu(h, channels, kernel, name, training):
    h = tf1.layers.conv2d(h, channels, kernel, padding="same", use_bias=False, name=name)
    h = tf1.layers.batch_normalization(h, training=training, momentum=0.9, name=name + "_bn")
    return tf.nn.relu(h)


def _bn_relu_conv(h, channels, kernel, name, training):
    """DenseNet's pre-activation order."""
    h = tf1.layers.batch_normalization(h, training=training, momentum=0.9, name=name + "_bn")
    return tf1.layers.conv2d(tf.nn.relu(h), channels, kernel, padding="same",
                             use_bias=False, name=name)


def _dense_block(h, cfg: Config, name, training):
    for i in range(cfg.dense_units):
        y = _bn_relu_conv(h, 2 * cfg.growth, 1, f"{name}_{i}_a", training)
        y = _bn_relu_conv(y, cfg.growth, 3, f"{name}_{i}_b", training)
        h = tf.concat([h, y], axis=-1, name=f"{name}_{i}_cat")
    return h


def _transition(h, cfg: Config, name, training):
    h = _bn_relu_conv(h, cfg.width, 1, name, training)
    return tf1.layers.average_pooling2d(h, 2, 2, name=name + "_pool")


def _inception(h, cfg: Config, training):
    a = _conv_bn_relu(h, cfg.width // 2, 1, "inc_1x1", training)
    b = _conv_bn_relu(h, cfg.width // 2, 1, "inc_3x3_reduce", training)
    b = _conv_bn_relu(b, cfg.width // 2, 3, "inc_3x3", training)
    c = tf1.layers.average_pooling2d(h, 3, 1, padding="same", name="inc_pool")
    c = _conv_bn_relu(c, cfg.width // 2, 1, "inc_pool_proj", training)
    return tf.concat([a, b, c], axis=-1, name="inc_cat")


def _transformer(h, cfg: Config):
    tokens = h.shape[1] * h.shape[2]
    net = tf.reshape(h, [-1, tokens, h.shape[3]], name="tokens")
    net = layers.Dense(cfg.width, name="embed")(net)
    att = layers.MultiHeadAttention(num_heads=2, key_dim=cfg.width // 2, name="mha")(net, net)
    net = layers.Add(name="att_add")([net, att])
    net = layers.LayerNormalization(epsilon=1e-6, name="att_norm")(net)
    mlp = layers.Dense(2 * cfg.width, activation="gelu", name="mlp_in")(net)
    mlp = layers.Dense(cfg.width, name="mlp_out")(mlp)
    net = layers.Add(name="mlp_add")([net, mlp])
    net = layers.LayerNormalization(epsilon=1e-6, name="mlp_norm")(net)
    return tf.reduce_mean(net, axis=1, name="token_mean")


def build(cfg: Config, training: bool):
    """The network in a new graph; returns (graph, x, labels, logits, loss)."""
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(cfg.seed)
        keras.utils.set_random_seed(cfg.seed)
        x = tf1.placeholder(tf.float32, [None, cfg.size, cfg.size, 1], name="input")
        labels = tf1.placeholder(tf.int32, [None], name="labels")
        h = _conv_bn_relu(x, cfg.width, 3, "stem", training)
        h = _dense_block(h, cfg, "dense1", training)
        h = _transition(h, cfg, "trans1", training)
        h = _inception(h, cfg, training)
        h = _dense_block(h, cfg, "dense2", training)
        h = _transition(h, cfg, "trans2", training)
        h = _transformer(h, cfg)
        logits = tf.identity(layers.Dense(10, name="logits")(h), name="output")
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    return g, x, labels, logits, loss


def count_layers(cfg: Config) -> Dict[str, int]:
    """Layers with weights (conv, Dense, einsum kernels), norms, concatenations, pools."""
    g, _, _, _, _ = build(cfg, training=False)
    names = [v.op.name for v in g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)]
    ops = g.get_operations()
    counts = {"layers": sum(n.endswith("/kernel") for n in names),
              "batch_norms": sum(n.endswith("_bn/gamma") for n in names),
              "layer_norms": sum(n.endswith("_norm/gamma") for n in names),
              "attention_einsums": sum(n.startswith("mha/") and n.endswith("/kernel")
                                       for n in names),
              "concats": sum(op.type == "ConcatV2" and op.name.endswith("_cat") for op in ops),
              "average_pools": sum(op.type == "AvgPool" for op in ops)}
    counts["total"] = counts["layers"] + counts["batch_norms"] + counts["layer_norms"]
    return counts
