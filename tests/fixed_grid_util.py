"""Small trained networks converted with TF's plain converter (fixed-range and clamp tests)."""
import os

import numpy as np
import tensorflow as tf

import qat
from qat.report import numerics

tf1 = tf.compat.v1


def conv(x, channels, name, activation=tf.nn.relu, training=False):
    """A 1x1 conv + batch norm (+ activation)."""
    y = tf1.layers.conv2d(x, channels, 1, padding="same", use_bias=False, name=name)
    y = tf1.layers.batch_normalization(y, training=training, name=name + "_bn")
    return activation(y) if activation else y


def build(network, training):
    """`network(x, training)` on an 8x8x3 input: (graph, input, output)."""
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, (None, 8, 8, 3), name="input")
        y = tf.identity(network(x, training), name="output")
    return g, x, y


def variables(graph):
    """Sorted names of the global variables."""
    return sorted(v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))


def calibrate(network, directory, steps=3):
    """A trained graph's ranges: a few training steps on random data, saved.

    Returns:
      (checkpoint path, the training graph's variable names).
    """
    g, x, y = build(network, training=True)
    with g.as_default():
        qat.experimental_create_training_graph(g, symmetric_weights=True)
        loss = tf.reduce_mean(tf.square(y))
        train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
        saver = tf1.train.Saver()
    rng = np.random.RandomState(0)
    path = os.path.join(directory, network.__name__, "model")
    with tf1.Session(graph=g) as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(steps):
            sess.run(train, {x: rng.uniform(-1, 1, (4, 8, 8, 3))})
        saver.save(sess, path)
    return path, variables(g)


def convert(frozen, x, y, flavour):
    """TF's plain converter, uint8 or int8, on a frozen graph."""
    g = tf.Graph()
    with g.as_default():
        tf.import_graph_def(frozen, name="")
        with tf1.Session(graph=g) as sess:
            converter = tf1.lite.TFLiteConverter.from_session(
                sess, [g.get_tensor_by_name(x.name)], [g.get_tensor_by_name(y.name)])
    mean = 127.5 - (128.0 if flavour == "int8" else 0.0)
    converter.inference_type = tf.int8 if flavour == "int8" else tf.uint8
    if flavour == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.quantized_input_stats = {x.op.name: (mean, 127.5)}
    return converter.convert()


def check_layers(test, frozen, model, flavour):
    """Every layer within one step given TFLite's inputs."""
    rng = np.random.RandomState(1)
    images = rng.uniform(-1, 1, (8, 8, 8, 3)).astype(np.float32)
    report = numerics.layer_numerics(frozen, "input", ["output"], images,
                                     flavour=flavour, model=model)
    test.assertLessEqual(report.worst_own.max_own_steps, 1.0 + 1e-3,
                         "%s\n%s" % (flavour, report.format()))
