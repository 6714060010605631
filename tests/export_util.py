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


VOCAB, SEQ = 50, 8


def build_int_input_model(seed=0):
    """Token ids and a mask (int32) and a float input: embeddings summed under the mask.

    ids [None, 8] index a [50, 6] table; mask [None, 8] (0/1) selects the
    tokens summed; x [None, 6] is added. Returns (graph, session with
    initialized variables, saver).
    """
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [None, SEQ], name="ids")
        mask = tf1.placeholder(tf.int32, [None, SEQ], name="mask")
        x = tf1.placeholder(tf.float32, [None, 6], name="x")
        with tf1.variable_scope("net"):
            table = tf1.get_variable(
                "embeddings", [VOCAB, 6],
                initializer=tf1.random_uniform_initializer(-1.0, 1.0, seed=seed))
            table = _fq(table, -1.0, 1.0, "table_quant/FakeQuantWithMinMaxVars", True)
            emb = _fq(tf.gather(table, ids), -1.0, 1.0, "emb_quant/FakeQuantWithMinMaxVars")
            # The mask picks a weight 0 or 1 per token (a gather: integer in TFLite,
            # where a Cast of the mask to float would compute in float).
            keep = _fq(tf.constant([[0.0], [1.0]]), 0.0, 1.0,
                       "keep_quant/FakeQuantWithMinMaxVars", True)
            weights = _fq(tf.gather(keep, mask), 0.0, 1.0, "mask_quant/FakeQuantWithMinMaxVars")
            kept = _fq(emb * weights, -1.0, 1.0, "kept_quant/FakeQuantWithMinMaxVars")
            pooled = _fq(tf.reduce_sum(kept, 1), -8.0, 8.0,
                         "pool_quant/FakeQuantWithMinMaxVars")
            xq = _fq(x, 0.0, 1.0, "input_quant/FakeQuantWithMinMaxVars")
            out = _fq(pooled + xq, -9.0, 9.0, "act_quant/FakeQuantWithMinMaxVars")
        tf.identity(out, name="output")
        saver = tf1.train.Saver()
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return graph, sess, saver


def make_int_inputs(n=64, seed=1):
    """{input name: examples} for `build_int_input_model`."""
    rng = np.random.RandomState(seed)
    return {"ids": rng.randint(0, VOCAB, (n, SEQ)).astype(np.int32),
            "mask": rng.randint(0, 2, (n, SEQ)).astype(np.int32),
            "x": rng.uniform(0.0, 1.0, (n, 6)).astype(np.float32)}


def _relu_conv(x, channels, seed, act_range, name):
    w = tf.constant(np.random.RandomState(seed).normal(
        0, 0.3, (1, 1, int(x.shape[-1]), channels)), tf.float32)
    wq = _fq(w, -1.0, 1.0, f"{name}/weights_quant", narrow=True)
    y = tf.nn.relu(tf.nn.conv2d(x, wq, 1, "SAME", name=f"{name}/Conv2D"), name=f"{name}/Relu")
    return _fq(y, *act_range, f"{name}/act_quant")


def lost_range_graph(kind: str) -> tf.compat.v1.GraphDef:
    """A frozen eval graph ("input" -> "output", [None, 4, 4, 3] in [0, 1]) whose
    ranges TF's converter does not all keep, built by hand (no planner involved).

    kind "resize_concat": image pooling, a 1x1 conv + ReLU ("pool_conv", range
    [0, 2]) resized into a concatenation ([0, 6]): TFLite gives the conv the
    concatenation's scale. "add_zero_same" / "add_zero_other": a constant
    multiply and an add of 0 (tf_keras Rescaling) whose range ("add_quant")
    equals / differs from the multiply's: TFLite removes the add.
    "size_one_mean": a mean over a 1x1 map after a conv, quantized with the
    conv's own range tensors: the converter removes it, every range kept.
    "clean": conv -> ReLU -> conv, every range kept; "empty": the same, the last
    range [0, 0] (the converter widens it to 1e-6, still a tensor of it).
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4, 4, 3], name="input")
        xq = _fq(x, 0.0, 1.0, "input_quant")
        if kind.startswith("add_zero"):
            m = _fq(xq * 0.5, 0.0, 0.5, "mul_quant")
            a = _fq(m + 0.0, 0.0, 0.5 if kind == "add_zero_same" else 1.0, "add_quant")
            y = _relu_conv(a, 4, 0, (0.0, 4.0), "conv")
        else:
            a = _relu_conv(xq, 4, 0, (0.0, 6.0), "conv")
            if kind == "size_one_mean":
                # A mean over a 1x1 map, which the converter removes, quantized
                # with the very range of the conv before it (as qat does).
                p = _fq(tf.reduce_mean(a, [1, 2], keepdims=True), 0.0, 6.0, "mean_quant")
                q = _relu_conv(p, 4, 1, (0.0, 2.0), "pool_conv")
                shared = q.op.inputs[1:3]
                y = tf.quantization.fake_quant_with_min_max_vars(
                    tf.reduce_mean(q, [1, 2], keepdims=True), shared[0], shared[1],
                    name="identity_quant")
            elif kind == "resize_concat":
                p = _fq(tf.reduce_mean(a, [1, 2], keepdims=True), 0.0, 6.0, "mean_quant")
                p = _relu_conv(p, 4, 1, (0.0, 2.0), "pool_conv")
                p = _fq(tf.compat.v1.image.resize_bilinear(p, [4, 4]), 0.0, 6.0,
                        "resize_quant")
                y = _fq(tf.concat([a, p], -1), 0.0, 6.0, "concat_quant")
            else:  # "clean", or "empty": a ReLU that never fires, range [0, 0].
                y = _relu_conv(a, 3, 1, (0.0, 0.0 if kind == "empty" else 3.0), "conv2")
        tf.identity(y, name="output")
    return graph.as_graph_def()
