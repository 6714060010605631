"""Recurrent models of the digit-rows task for the recurrence tests.

The UCI digits (`digits_util`) read as sequences: each image's 8 rows are 8
steps of 8 features, classified by a recurrent layer and a dense head. Graph
path models are TF1 cells (`static_rnn` / `dynamic_rnn`); TF 2 path models are
Keras 3 or tf_keras layers.
"""
import os
import tempfile

import numpy as np
import tensorflow as tf

import digits_util

tf1 = tf.compat.v1
STEPS, FEATURES, CLASSES = 8, 8, 10


def digit_rows():
    """((train rows, labels), (test rows, labels)): [n, 8 steps, 8 features]."""
    (x, y), (xt, yt) = digits_util.digits_split()
    return (x[..., 0], y), (xt[..., 0], yt)


def tf1_cell(kind: str, units: int):
    """A TF1 cell: lstm, basic_lstm, gru, rnn, or multi (LSTMCell over GRUCell)."""
    cells = tf1.nn.rnn_cell
    if kind == "multi":
        return cells.MultiRNNCell([cells.LSTMCell(units), cells.GRUCell(units)])
    return {"lstm": cells.LSTMCell, "basic_lstm": cells.BasicLSTMCell, "gru": cells.GRUCell,
            "rnn": cells.BasicRNNCell}[kind](units)


def tf1_model(rows, cell: str, loop: str, units: int = 16):
    """Logits of a TF1 recurrent model of `rows` [batch, steps, features].

    `loop`: "static" (`static_rnn` of the unstacked steps) or "dynamic"
    (`dynamic_rnn`: a While loop, or a TF1 loop after
    `disable_control_flow_v2()`). The output is named "output".
    """
    with tf1.variable_scope("net"):
        if loop == "static":
            outputs, _ = tf1.nn.static_rnn(tf1_cell(cell, units), tf.unstack(rows, axis=1),
                                           dtype=tf.float32)
            last = outputs[-1]
        else:
            outputs, _ = tf1.nn.dynamic_rnn(tf1_cell(cell, units), rows, dtype=tf.float32)
            last = outputs[:, -1]
        logits = tf1.layers.dense(last, CLASSES, name="logits")
    return tf.identity(logits, name="output")


def train_tf1(cell: str, loop: str, steps: int, quant_delay: int = 0, units: int = 16,
              learning_rate: float = 3e-3, seed: int = 0):
    """Trains the TF1 model with qat's training rewrite; returns the checkpoint."""
    (x, y), _ = digit_rows()
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        rows = tf1.placeholder(tf.float32, [None, STEPS, FEATURES], name="input")
        labels = tf1.placeholder(tf.int32, [None])
        logits = tf1_model(rows, cell, loop, units)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        import qat  # pylint: disable=import-outside-toplevel
        qat.experimental_create_training_graph(graph, symmetric_weights=True,
                                               quant_delay=quant_delay)
        train = tf1.train.AdamOptimizer(learning_rate).minimize(loss)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            rng = np.random.RandomState(seed)
            for _ in range(steps):
                batch = rng.randint(0, len(x), 32)
                sess.run(train, {rows: x[batch], labels: y[batch]})
            checkpoint = os.path.join(tempfile.mkdtemp(), "model")
            tf1.train.Saver().save(sess, checkpoint)
    return checkpoint


def eval_session(cell: str, loop: str, checkpoint: str, units: int = 16):
    """The eval graph (qat's eval rewrite) restored with a plain Saver: a session."""
    graph = tf.Graph()
    with graph.as_default():
        rows = tf1.placeholder(tf.float32, [None, STEPS, FEATURES], name="input")
        tf1_model(rows, cell, loop, units)
        import qat  # pylint: disable=import-outside-toplevel
        qat.experimental_create_eval_graph(graph, symmetric_weights=True)
        sess = tf1.Session(graph=graph)
        tf1.train.Saver().restore(sess, checkpoint)
    return sess
