"""Small layers with batch norms for tests/fold_batch_norms_test.py and its structure tests.

`build` makes a conv, depthwise, atrous or matmul layer (`make_layer`) with one
of the batch norm styles of `add_batch_norm` (fused, unfused, Keras, compat.v1,
contrib's avg-factor form) in a new graph; `random_values` draws its variables,
`loaded_session` loads them, `cpu_runnable` makes NCHW convs runnable on any CPU.
`PARAMS` and `TRAIN_PARAMS` are the (name, layer, batch norm[, cond]) cases.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras  # pylint: disable=g-import-not-at-top
from tensorflow.python.training import moving_averages  # pylint: disable=g-import-not-at-top

from qat.matching import layer_patterns  # pylint: disable=g-import-not-at-top

BATCH = 4
SIZE = 6


def variable(name, shape, resource=True):
    """A new variable (resource or ref) in the current variable scope."""
    return tf.compat.v1.get_variable(name, shape, use_resource=resource)


def make_layer(kind, x):
    """Builds the layer; returns its output (before any batch norm)."""
    resource = not kind.endswith("_ref")
    if kind.startswith("conv"):
        w = variable("w", [3, 3, 3, 4], resource)
        y = tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")
        if kind == "conv_bias":
            y = tf.nn.bias_add(y, variable("b", [4]))
        if kind == "conv_add_bias":
            y = y + variable("b", [4])
        return y
    if kind == "depthwise":
        w = variable("w", [3, 3, 3, 2])
        return tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
    if kind == "atrous":
        w = variable("w", [3, 3, 3, 4])
        return tf.compat.v1.nn.atrous_conv2d(x, w, rate=2, padding="SAME")
    if kind == "matmul":
        w = variable("w", [SIZE * SIZE * 3, 5])
        return tf.matmul(tf.reshape(x, [BATCH, -1]), w)
    raise ValueError(kind)


def _manual_batch_norm(y, training, fused):
    """compat.v1 style: ref variables, moving_averages.assign_moving_average."""
    channels = y.shape[-1]
    gamma = variable("gamma", [channels], resource=False)
    beta = variable("beta", [channels], resource=False)
    mean = variable("moving_mean", [channels], resource=False)
    var = variable("moving_variance", [channels], resource=False)
    if training:
        if fused:
            out, batch_mean, batch_var = tf.compat.v1.nn.fused_batch_norm(
                y, gamma, beta, epsilon=1e-3, is_training=True)
        else:
            batch_mean, batch_var = tf.nn.moments(y, [0, 1, 2])
            out = tf.nn.batch_normalization(y, batch_mean, batch_var, beta, gamma, 1e-3)
        for v, value in ((mean, batch_mean), (var, batch_var)):
            tf.compat.v1.add_to_collection(
                tf.compat.v1.GraphKeys.UPDATE_OPS,
                moving_averages.assign_moving_average(v, value, 0.9, zero_debias=False))
        return out
    if fused:
        return tf.compat.v1.nn.fused_batch_norm(
            y, gamma, beta, mean=mean, variance=var, epsilon=1e-3, is_training=False)[0]
    return tf.nn.batch_normalization(y, mean, var, beta, gamma, 1e-3)


def _avg_factor_batch_norm(y, training):
    """FusedBatchNormV3 computing the new moving statistics itself
    (exponential_avg_factor), assigned with AssignVariableOp."""
    channels = y.shape[-1]
    gamma, beta, mean, var = [variable(n, [channels]) for n in
                              ("gamma", "beta", "moving_mean", "moving_variance")]
    out, new_mean, new_var = tf.compat.v1.nn.fused_batch_norm(
        y, gamma, beta, mean=mean.read_value(), variance=var.read_value(), epsilon=1e-3,
        is_training=training, exponential_avg_factor=0.1 if training else 1.0)
    if training:
        for v, value in ((mean, new_mean), (var, new_var)):
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, v.assign(value))
    return out


def add_batch_norm(kind, y, training):
    """Batch norm `kind` (fused, unfused, keras_*, v1_*, fused_avg_factor) of `y`."""
    reshaped = y.shape.rank == 2 and kind == "fused"
    if reshaped:
        y = tf.reshape(y, [BATCH, 1, 1, -1])
    if kind in ("fused", "unfused", "unfused_noscale", "unfused_nocenter", "unfused_neither"):
        out = tf.compat.v1.layers.batch_normalization(
            y, fused=(kind == "fused"), training=training, momentum=0.9,
            scale=kind not in ("unfused_noscale", "unfused_neither"),
            center=kind not in ("unfused_nocenter", "unfused_neither"))
    elif kind == "keras_unfused":
        out = tf_keras.layers.BatchNormalization(fused=False, momentum=0.9)(y, training=training)
    elif kind in ("v1_fused", "v1_unfused"):
        out = _manual_batch_norm(y, training, fused=(kind == "v1_fused"))
    elif kind == "fused_avg_factor":
        out = _avg_factor_batch_norm(y, training)
    else:
        raise ValueError(kind)
    if reshaped:
        out = tf.reshape(out, [BATCH, -1])
    return out


def build(layer, bn, training):
    """`layer` -> batch norm `bn` -> ReLU6 in a new graph; returns (graph, x, out, weights)."""
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(1)
        x = tf.compat.v1.placeholder(tf.float32, [BATCH, SIZE, SIZE, 3], name="x")
        y = make_layer(layer, x)
        out = tf.nn.relu6(add_batch_norm(bn, y, training), name="out")
    layer_op = [op for op in layer_patterns.layer_ops(g)][0]
    return g, x, out, layer_op.inputs[1]


def random_values(graph, seed, gamma_zero=False):
    """{variable name: value} drawn for every variable of `graph` (gammas 0 if gamma_zero)."""
    rng = np.random.RandomState(seed)
    values = {}
    with graph.as_default():
        for v in sorted(tf.compat.v1.global_variables(), key=lambda v: v.name):
            shape = v.shape.as_list()
            if "variance" in v.name or "gamma" in v.name:
                value = rng.uniform(0.5, 1.5, shape)
                if gamma_zero and "gamma" in v.name:
                    value[:] = 0.0
            else:
                value = rng.normal(0.0, 0.5, shape)
            values[v.name] = value.astype(v.dtype.as_numpy_dtype)
    return values


def _transpose_node(graph_def, name, x, perm):
    perm_node = graph_def.node.add()
    perm_node.name = name + "/perm"
    perm_node.op = "Const"
    perm_node.attr["dtype"].type = tf.int32.as_datatype_enum
    perm_node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(perm, tf.int32))
    node = graph_def.node.add()
    node.name = name
    node.op = "Transpose"
    node.input.extend([x, perm_node.name])
    node.attr["T"].type = tf.float32.as_datatype_enum
    node.attr["Tperm"].type = tf.int32.as_datatype_enum
    return node


def cpu_runnable(graph):
    """A copy of `graph` whose NCHW Conv2D ops run on any CPU.

    TensorFlow's own CPU kernel runs Conv2D in NHWC only (oneDNN, which only
    some CPUs enable, also runs NCHW): each NCHW Conv2D becomes transpose ->
    NHWC Conv2D -> transpose back, under the same output name.
    """
    with graph.as_default():
        meta = tf.compat.v1.train.export_meta_graph()
    graph_def = meta.graph_def
    for node in list(graph_def.node):
        if node.op != "Conv2D" or node.attr["data_format"].s != b"NCHW":
            continue
        name = node.name
        node.name = name + "/nhwc"
        node.attr["data_format"].s = b"NHWC"
        del node.attr["_output_shapes"]
        for key in ("strides", "dilations"):
            n, c, h, w = node.attr[key].list.i
            node.attr[key].list.i[:] = [n, h, w, c]
        to_nhwc = _transpose_node(graph_def, name + "/to_nhwc", node.input[0], [0, 2, 3, 1])
        node.input[0] = to_nhwc.name
        _transpose_node(graph_def, name, node.name, [0, 3, 1, 2])
    copy = tf.Graph()
    with copy.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
    return copy


def loaded_session(graph, values):
    """A Session of `graph` with its variables initialized, then set to `values`."""
    sess = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        sess.run(tf.compat.v1.global_variables_initializer())
        for v in tf.compat.v1.global_variables():
            if v.name in values:
                v.load(values[v.name], sess)
    return sess


def moving_variables(graph):
    """The batch norms' moving mean and variance variables of `graph`."""
    with graph.as_default():
        return [v for v in tf.compat.v1.global_variables() if "moving" in v.name]


def rel_err(a, b):
    """Largest |a - b| relative to the largest |b|."""
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-6)


_CASES = [
    ("conv", "fused"), ("conv", "unfused"), ("conv", "unfused_noscale"),
    ("conv", "unfused_nocenter"), ("conv", "unfused_neither"),
    ("conv", "keras_unfused"), ("conv", "v1_fused"), ("conv", "v1_unfused"),
    ("conv", "fused_avg_factor"),
    ("conv_ref", "fused"), ("conv_bias", "fused"), ("conv_bias", "unfused"),
    ("conv_add_bias", "fused"), ("depthwise", "fused"), ("depthwise", "unfused"),
    ("atrous", "fused"), ("atrous", "unfused"), ("matmul", "fused"),
    ("matmul", "unfused"),
]
PARAMS = [("%s_%s" % case, case[0], case[1]) for case in _CASES]
# Training tests: every case with the Select tail, some with the cond tail.
_COND_CASES = [("conv", "fused"), ("conv_bias", "unfused"), ("depthwise", "unfused"),
               ("atrous", "fused"), ("matmul", "fused"), ("conv", "v1_fused")]
TRAIN_PARAMS = ([(name, layer, bn, False) for name, layer, bn in PARAMS]
                 + [("%s_%s_cond" % case, case[0], case[1], True) for case in _COND_CASES])
