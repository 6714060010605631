"""A small graph with hand-placed FakeQuant ops, shared by the export tests."""
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def _fq(x, lo, hi, name, narrow=False):
    return tf.quantization.fake_quant_with_min_max_vars(
        x, tf1.constant(lo), tf1.constant(hi), narrow_range=narrow, name=name)


def build_model(use_resource=True, unquantized_add=False, seed=0, weight_range=(-1.0, 1.0)):
    """A conv -> relu -> conv -> relu -> dense net with FakeQuant ranges.

    Returns (graph, session with initialized variables, saver).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        init = tf1.random_normal_initializer(stddev=0.3, seed=seed)
        x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="input")
        net = x
        with tf1.variable_scope("net", use_resource=use_resource):
            for i, channels in enumerate((4, 8)):
                with tf1.variable_scope(f"conv{i + 1}"):
                    w = tf1.get_variable("weights", [3, 3, net.shape[-1], channels],
                                         initializer=init)
                    b = tf1.get_variable("biases", [channels],
                                         initializer=tf1.constant_initializer(0.1))
                    wq = _fq(w, *weight_range, "weights_quant/FakeQuantWithMinMaxVars", True)
                    net = tf.nn.relu(tf.nn.bias_add(
                        tf.nn.conv2d(net, wq, [1, 1, 1, 1], "SAME"), b))
                    net = _fq(net, 0.0, 6.0, "act_quant/FakeQuantWithMinMaxVars")
            if unquantized_add:
                net = tf.add(net, net * 0.5, name="res/add")  # No FakeQuant: no range.
            net = tf.reshape(net, [-1, 8 * 8 * 8])
            with tf1.variable_scope("logits"):
                w = tf1.get_variable("weights", [8 * 8 * 8, 10], initializer=init)
                b = tf1.get_variable("biases", [10], initializer=tf1.zeros_initializer())
                wq = _fq(w, *weight_range, "weights_quant/FakeQuantWithMinMaxVars", True)
                logits = tf.nn.bias_add(tf.matmul(net, wq), b)
                logits = _fq(logits, -12.0, 12.0, "act_quant/FakeQuantWithMinMaxVars")
        tf.identity(logits, name="output")
        saver = tf1.train.Saver()
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return graph, sess, saver


def make_inputs(n=64, seed=1):
    return np.random.RandomState(seed).uniform(0.0, 1.0, (n, 8, 8, 1)).astype(np.float32)
