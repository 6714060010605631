"""Numeric tests of qat.fold_batch_norms on small layers: eval, training, freeze."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tf_keras
from tensorflow.python.training import moving_averages

# qat/__init__ exports the function under the module's name: import from the module.
from qat.api import fold_batch_norms
from qat.matching import layer_patterns
from qat.engine import step_counter

_BATCH = 4
_SIZE = 6


def _variable(name, shape, resource=True):
    return tf.compat.v1.get_variable(name, shape, use_resource=resource)


def _layer(kind, x):
    """Builds the layer; returns its output (before any batch norm)."""
    resource = not kind.endswith("_ref")
    if kind.startswith("conv"):
        w = _variable("w", [3, 3, 3, 4], resource)
        y = tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")
        if kind == "conv_bias":
            y = tf.nn.bias_add(y, _variable("b", [4]))
        if kind == "conv_add_bias":
            y = y + _variable("b", [4])
        return y
    if kind == "depthwise":
        w = _variable("w", [3, 3, 3, 2])
        return tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
    if kind == "atrous":
        w = _variable("w", [3, 3, 3, 4])
        return tf.compat.v1.nn.atrous_conv2d(x, w, rate=2, padding="SAME")
    if kind == "matmul":
        w = _variable("w", [_SIZE * _SIZE * 3, 5])
        return tf.matmul(tf.reshape(x, [_BATCH, -1]), w)
    raise ValueError(kind)


def _manual_batch_norm(y, training, fused):
    """compat.v1 style: ref variables, moving_averages.assign_moving_average."""
    channels = y.shape[-1]
    gamma = _variable("gamma", [channels], resource=False)
    beta = _variable("beta", [channels], resource=False)
    mean = _variable("moving_mean", [channels], resource=False)
    var = _variable("moving_variance", [channels], resource=False)
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
    gamma, beta, mean, var = [_variable(n, [channels]) for n in
                              ("gamma", "beta", "moving_mean", "moving_variance")]
    out, new_mean, new_var = tf.compat.v1.nn.fused_batch_norm(
        y, gamma, beta, mean=mean.read_value(), variance=var.read_value(), epsilon=1e-3,
        is_training=training, exponential_avg_factor=0.1 if training else 1.0)
    if training:
        for v, value in ((mean, new_mean), (var, new_var)):
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, v.assign(value))
    return out


def _batch_norm(kind, y, training):
    reshaped = y.shape.rank == 2 and kind == "fused"
    if reshaped:
        y = tf.reshape(y, [_BATCH, 1, 1, -1])
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
        out = tf.reshape(out, [_BATCH, -1])
    return out


def _build(layer, bn, training):
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(1)
        x = tf.compat.v1.placeholder(tf.float32, [_BATCH, _SIZE, _SIZE, 3], name="x")
        y = _layer(layer, x)
        out = tf.nn.relu6(_batch_norm(bn, y, training), name="out")
    layer_op = [op for op in layer_patterns.layer_ops(g)][0]
    return g, x, out, layer_op.inputs[1]


def _values(graph, seed, gamma_zero=False):
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


def _cpu_runnable(graph):
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


def _session(graph, values):
    sess = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        sess.run(tf.compat.v1.global_variables_initializer())
        for v in tf.compat.v1.global_variables():
            if v.name in values:
                v.load(values[v.name], sess)
    return sess


def _moving(graph):
    with graph.as_default():
        return [v for v in tf.compat.v1.global_variables() if "moving" in v.name]


def _rel_err(a, b):
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
_PARAMS = [("%s_%s" % case, case[0], case[1]) for case in _CASES]
# Training tests: every case with the Select tail, some with the cond tail.
_COND_CASES = [("conv", "fused"), ("conv_bias", "unfused"), ("depthwise", "unfused"),
               ("atrous", "fused"), ("matmul", "fused"), ("conv", "v1_fused")]
_TRAIN_PARAMS = ([(name, layer, bn, False) for name, layer, bn in _PARAMS]
                 + [("%s_%s_cond" % case, case[0], case[1], True) for case in _COND_CASES])


class FoldBatchNormsTest(tf.test.TestCase, parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self._x = np.random.RandomState(7).normal(
            1.0, 1.0, [_BATCH, _SIZE, _SIZE, 3]).astype(np.float32)

    @parameterized.named_parameters(*_PARAMS)
    def test_eval_fold_keeps_output(self, layer, bn):
        g, x, out, _ = _build(layer, bn, training=False)
        values = _values(g, 3)
        with _session(g, values) as sess:
            expected = sess.run(out, {x: self._x})
        result = fold_batch_norms(g, is_training=False)
        self.assertEmpty(result.skipped)
        self.assertLen(result.folded, 1)
        self.assertFalse(result.folded[0].training)
        self.assertEqual(result.folded[0].bias_add.type, "BiasAdd")
        with _session(g, values) as sess:
            got = sess.run(out, {x: self._x})
        self.assertLess(_rel_err(got, expected), 1e-5)
        # The old batch norm no longer reaches the output.
        with g.as_default():
            ops = tf.compat.v1.graph_util.extract_sub_graph(
                g.as_graph_def(), [out.op.name]).node
        self.assertNotIn(result.folded[0].batch_norm, [n.name for n in ops])

    @parameterized.named_parameters(*_TRAIN_PARAMS)
    def test_training_fold_before_freeze(self, layer, bn, use_cond):
        self._check_training_fold(layer, bn, 100, use_cond)

    @parameterized.named_parameters(*_PARAMS)
    def test_training_fold_without_delay(self, layer, bn):
        # No freeze: the consumers read the original batch norm directly.
        self._check_training_fold(layer, bn, None, False)

    def _check_training_fold(self, layer, bn, delay, use_cond):
        ref_g, ref_x, ref_out, ref_w = _build(layer, bn, training=True)
        g, x, out, w = _build(layer, bn, training=True)
        values = _values(g, 5)
        result = fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=delay,
                                  use_cond=use_cond)
        self.assertEmpty(result.skipped)
        self.assertLen(result.folded, 1)
        self.assertTrue(result.folded[0].training)
        self.assertIs(layer_patterns.weight_input(result.folded[0].layer_op),
                      result.folded[0].weights)
        fetches = []
        for graph, xt, o, wt in ((ref_g, ref_x, ref_out, ref_w), (g, x, out, w)):
            with graph.as_default():
                r = tf.constant(np.random.RandomState(9).normal(size=o.shape.as_list()),
                                tf.float32)
                loss = tf.reduce_sum(o * r)
                grads = tf.gradients(loss, [xt, wt])
                updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
            with _session(graph, values) as sess:
                got = sess.run([o] + grads, {xt: self._x})
                sess.run(updates, {xt: self._x})
                got.append(sess.run(_moving(graph)))
            fetches.append(got)
        (ref_o, ref_gx, ref_gw, ref_mv), (o, gx, gw, mv) = fetches
        self.assertLess(_rel_err(o, ref_o), 1e-4)
        self.assertLess(_rel_err(gx, ref_gx), 1e-4)
        self.assertLess(_rel_err(gw, ref_gw), 1e-4)
        for a, b in zip(mv, ref_mv):
            self.assertLess(_rel_err(a, b), 1e-4)

    @parameterized.named_parameters(*_TRAIN_PARAMS)
    def test_training_fold_after_freeze(self, layer, bn, use_cond):
        eval_g, eval_x, eval_out, eval_w = _build(layer, bn, training=False)
        g, x, out, w = _build(layer, bn, training=True)
        values = _values(g, 11)
        fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=1, use_cond=use_cond)
        fetches = []
        for graph, xt, o, wt in ((eval_g, eval_x, eval_out, eval_w), (g, x, out, w)):
            with graph.as_default():
                r = tf.constant(np.random.RandomState(9).normal(size=o.shape.as_list()),
                                tf.float32)
                fetches.append([o] + tf.gradients(tf.reduce_sum(o * r), [xt, wt]))
        with g.as_default():
            updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        with _session(g, values) as sess:
            sess.run(out, {x: self._x})  # Step 1: batch statistics.
            before = sess.run(_moving(g))
            for _ in range(2):
                got, _ = sess.run([fetches[1], updates], {x: self._x})
            after = sess.run(_moving(g))
            step = sess.run(step_counter.get_quantization_step_variable(g))
        self.assertEqual(step, 3)  # One increment per run that evaluates the fold.
        for a, b in zip(after, before):
            self.assertAllEqual(a, b)
        with _session(eval_g, values) as sess:
            expected = sess.run(fetches[0], {eval_x: self._x})
        # Output and gradients (input, weights) of the moving-statistics layer.
        for a, b in zip(got, expected):
            self.assertLess(_rel_err(a, b), 1e-4)

    @parameterized.named_parameters(
        ("conv_fused", "conv", "fused", False), ("conv_unfused", "conv", "unfused", False),
        ("depthwise_fused", "depthwise", "fused", False),
        ("matmul_unfused", "matmul", "unfused", False),
        ("conv_fused_cond", "conv", "fused", True))
    def test_zero_gamma_gives_no_nan(self, layer, bn, use_cond):
        g, x, out, w = _build(layer, bn, training=True)
        values = _values(g, 13, gamma_zero=True)
        fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=1, use_cond=use_cond)
        with g.as_default():
            grads = tf.gradients(tf.reduce_sum(out), [x, w])
        with _session(g, values) as sess:
            for _ in range(2):  # Before and after the freeze.
                results = sess.run([out] + grads, {x: self._x})
                for r in results:
                    self.assertTrue(np.all(np.isfinite(r)))


class FoldStructureTest(tf.test.TestCase):

    def test_op_reading_the_batch_norm_twice_is_rerouted_once_per_input(self):
        # tf.compat.v1.Print(y, [y]) and y * y read y at two inputs each.
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [_BATCH, _SIZE, _SIZE, 3], name="x")
            y = _batch_norm("unfused", _layer("conv_bias", x), training=False)
            square = tf.multiply(y, y, name="square")
            printed = tf.compat.v1.Print(y, [y], "watched")
        result = fold_batch_norms(g, is_training=False)
        self.assertLen(result.folded, 1)
        folded = result.folded[0].bias_add.outputs[0]
        self.assertEqual(list(square.op.inputs), [folded, folded])
        self.assertEqual(list(printed.op.inputs)[:2], [folded, folded])

    def test_second_call_changes_nothing(self):
        for training, bn, use_cond in ((False, "fused", False), (True, "fused", False),
                                       (False, "unfused", False), (True, "unfused", False),
                                       (True, "fused", True)):
            g, _, _, _ = _build("conv_bias", bn, training=training)
            first = fold_batch_norms(g, is_training=training, freeze_batch_norm_delay=5,
                                     use_cond=use_cond)
            self.assertLen(first.folded, 1)
            before = g.as_graph_def()
            second = fold_batch_norms(g, is_training=training, freeze_batch_norm_delay=5,
                                      use_cond=use_cond)
            self.assertEqual(second.folded, [])
            self.assertEqual(second.skipped, [])
            self.assertProtoEquals(before, g.as_graph_def())

    def test_training_tail_structure(self):
        g, _, out, _ = _build("conv_bias", "fused", training=True)
        folded = fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=5).folded[0]
        layer = folded.layer_op
        self.assertEqual(layer.name, "Conv2D")
        self.assertEqual(folded.weights.op.name, "mul_fold")
        self._assert_unscaled_weights(g, layer, folded.weights)
        # The layer feeds the original bias (-> batch norm) and y * s.
        self.assertEqual(sorted(c.name for c in layer.outputs[0].consumers()),
                         ["BiasAdd", "rescale_fold"])
        rescale = g.get_operation_by_name("rescale_fold")
        self.assertIs(rescale.inputs[0], layer.outputs[0])
        self.assertEqual(rescale.inputs[1].op.type, "StopGradient")
        self.assertEqual(folded.bias_add.name, "BiasAdd_Fold")
        self.assertIs(folded.bias_add.inputs[0], rescale.outputs[0])
        self.assertEqual([c.type for c in folded.bias_add.outputs[0].consumers()], ["Select"])
        self.assertEqual(folded.output.op.type, "Select")
        self.assertEqual(out.op.inputs[0].op, folded.output.op)

    def test_training_tail_structure_without_delay(self):
        for use_cond in (False, True):  # No freeze: nothing to choose.
            g, _, out, _ = _build("conv_bias", "fused", training=True)
            bn_op = out.op.inputs[0].op
            folded = fold_batch_norms(g, is_training=True, use_cond=use_cond).folded[0]
            layer = folded.layer_op
            self.assertEqual(folded.weights.op.name, "mul_fold")
            self.assertEqual(folded.weights.op.inputs[1].op.type, "StopGradient")
            self._assert_unscaled_weights(g, layer, folded.weights)
            # The layer output feeds the original bias and batch norm only.
            self.assertEqual([c.type for c in layer.outputs[0].consumers()], ["BiasAdd"])
            self.assertIs(bn_op.inputs[0].op.inputs[0], layer.outputs[0])
            self.assertNotIn("div_fold", [op.name for op in g.get_operations()])
            self.assertIsNone(folded.bias_add)
            self.assertIsNone(folded.frozen)
            self.assertIs(folded.output, bn_op.outputs[0])
            self.assertIs(out.op.inputs[0], folded.output)
            # No choice on the data path; the moving-average updates keep a
            # batch's non-finite statistics out (a select feeding the update).
            selects = [op for op in g.get_operations()
                       if op.type in ("Select", "SelectV2", "If", "StatelessIf")]
            self.assertLen(selects, 2)  # The moving mean's and variance's.
            for op in selects:
                self.assertEqual(op.inputs[0].op.type, "IsFinite")
                self.assertEqual([c.type for c in op.outputs[0].consumers()],
                                 ["AssignSubVariableOp"])
            self.assertEmpty([op.name for op in g.get_operations()
                              if "_Fold" in op.name or "select_fold" in op.name])

    def _assert_unscaled_weights(self, g, layer, weights):
        """The layer reads unscale_fold = Mul(w*s, DivNoNan(1, stop_gradient(s)))."""
        unscale = layer.inputs[1].op
        self.assertEqual(unscale.name, "unscale_fold")
        self.assertEqual(unscale.type, "Mul")
        self.assertIs(unscale.inputs[0], weights)
        inverse = unscale.inputs[1].op
        self.assertEqual(inverse.type, "DivNoNan")
        self.assertEqual(inverse.inputs[1].op.type, "StopGradient")
        self.assertEqual(weights.consumers(), [unscale])
        self.assertIs(layer_patterns.weight_input(layer), weights)

    def test_cond_tail_structure(self):
        g, _, out, _ = _build("conv_bias", "fused", training=True)
        folded = fold_batch_norms(g, is_training=True, use_cond=True,
                                  freeze_batch_norm_delay=5).folded[0]
        self.assertIsNone(folded.bias_add)
        self.assertEqual(folded.output.op.type, "Identity")
        cond = folded.output.op.inputs[0].op
        self.assertIn(cond.type, ("If", "StatelessIf"))
        self._assert_unscaled_weights(g, folded.layer_op, folded.weights)
        # The layer feeds the original bias (-> batch norm) and the cond,
        # whose true branch computes y * s + b_fold.
        self.assertEqual(sorted(c.type for c in folded.layer_op.outputs[0].consumers()),
                         sorted(["BiasAdd", cond.type]))
        self.assertIs(out.op.inputs[0], folded.output)

    def test_eval_tail_structure_and_scope(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            with tf.compat.v1.variable_scope("net"):
                y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False, name="conv1")
                y = tf.compat.v1.layers.batch_normalization(y, training=False)
                out = tf.nn.relu(y)
        folded = fold_batch_norms(g, is_training=False).folded[0]
        self.assertEqual(folded.layer_op.name, "net/conv1/Conv2D")
        self.assertEqual(folded.bias_add.name, "net/conv1/BiasAdd_Fold")
        self.assertEqual(sorted(c.type for c in folded.layer_op.outputs[0].consumers()),
                         ["BiasAdd", "Mul"])
        self.assertIs(out.op.inputs[0], folded.output)

    def test_nchw_and_fetched_old_output(self):
        for training in (False, True):
            g = tf.Graph()
            with g.as_default():
                x = tf.compat.v1.placeholder(tf.float32, [2, 3, 6, 6])
                y = tf.nn.conv2d(x, _variable("w", [3, 3, 3, 4]), 1, "SAME", data_format="NCHW")
                y = tf.nn.bias_add(y, _variable("b", [4]), data_format="NCHW")
                bn_out = tf.compat.v1.layers.batch_normalization(
                    y, axis=1, fused=True, training=training)
                out = tf.nn.relu(bn_out)
            values = _values(g, 17)
            xv = np.random.RandomState(1).normal(size=[2, 3, 6, 6]).astype(np.float32)

            def run(fetches):
                runnable = _cpu_runnable(g)
                with _session(runnable, values) as sess:
                    return sess.run([t.name for t in fetches], {x.name: xv})

            expected, = run([out])
            result = fold_batch_norms(g, is_training=training)
            self.assertLen(result.folded, 1)
            got, old = run([out, bn_out])
            self.assertLess(_rel_err(got, expected), 1e-5)
            # The old batch-norm output, fetched directly, still computes the
            # unfolded value.
            self.assertLess(_rel_err(np.maximum(old, 0), expected), 1e-5)

    def test_device_is_kept(self):
        g = tf.Graph()
        with g.as_default(), g.device("/cpu:0"):
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False)
            tf.nn.relu(tf.compat.v1.layers.batch_normalization(y, training=True))
        folded = fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=5).folded[0]
        for t in (folded.weights, folded.output, folded.bias_add.outputs[0]):
            self.assertEqual(t.op.device, folded.layer_op.device)

    def test_device_is_kept_without_delay(self):
        g = tf.Graph()
        with g.as_default(), g.device("/cpu:0"):
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False)
            tf.nn.relu(tf.compat.v1.layers.batch_normalization(y, training=True))
        folded = fold_batch_norms(g, is_training=True).folded[0]
        new_ops = [folded.weights.op] + folded.layer_op.outputs[0].consumers()
        self.assertLen(new_ops, 2)
        for op in new_ops:
            self.assertEqual(op.device, folded.layer_op.device)

    def _graph_with_unfoldable(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            # No layer before it.
            tf.compat.v1.layers.batch_normalization(x, training=False, name="bn_input")
            # A layer output with another consumer.
            y = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False, name="shared")
            tf.compat.v1.layers.batch_normalization(y, training=False, name="bn_shared")
            tf.nn.relu(y, name="other_consumer")
            # A foldable one.
            z = tf.compat.v1.layers.conv2d(x, 4, 3, use_bias=False, name="ok")
            tf.compat.v1.layers.batch_normalization(z, training=False, name="bn_ok")
        return g

    def test_unfoldable_batch_norms_are_reported_and_left_alone(self):
        g = self._graph_with_unfoldable()
        with self.assertLogs(level="WARNING") as logs:
            result = fold_batch_norms(g, is_training=False)
        self.assertEqual([f.batch_norm for f in result.folded], ["bn_ok/FusedBatchNormV3"])
        reasons = {s.name: s.reason for s in result.skipped}
        self.assertCountEqual(reasons, ["bn_input/FusedBatchNormV3", "bn_shared/FusedBatchNormV3"])
        self.assertIn("no Conv2D", reasons["bn_input/FusedBatchNormV3"])
        self.assertIn("other_consumer", reasons["bn_shared/FusedBatchNormV3"])
        self.assertTrue(any("bn_shared/FusedBatchNormV3" in line for line in logs.output))
        self.assertEqual(g.get_operation_by_name("bn_shared/FusedBatchNormV3").inputs[0].op.name,
                         "shared/Conv2D")
        self.assertEqual(g.get_operation_by_name("shared/Conv2D").inputs[1].op.type,
                         "ReadVariableOp")

    def test_batch_norms_after_no_layer_share_one_warning(self):
        """DenseNet-like: a batch norm after every concat; one line, not one each."""
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            for i in range(5):
                x = tf.concat([x, tf.compat.v1.layers.batch_normalization(
                    x, training=False, name="bn%d" % i)], axis=-1)
        with self.assertLogs(level="WARNING") as logs:
            result = fold_batch_norms(g, is_training=False)
        self.assertLen(result.skipped, 5)
        lines = [line for line in logs.output if "not folded" in line]
        self.assertLen(lines, 1)
        self.assertIn("5 batch norm(s) not folded", lines[0])
        self.assertIn("bn0/FusedBatchNormV3 (input Placeholder:0)", lines[0])
        self.assertIn("and 2 more", lines[0])

    def test_batch_norm_inside_functional_cond_is_reported(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3])
            training = tf.compat.v1.placeholder_with_default(False, [])
            y = tf_keras.layers.Conv2D(4, 3, use_bias=False)(x)
            tf_keras.layers.BatchNormalization()(y, training=training)
        result = fold_batch_norms(g, is_training=True)
        self.assertEmpty(result.folded)
        self.assertNotEmpty(result.skipped)
        self.assertTrue(all("Python bool" in s.reason for s in result.skipped))

    def test_finalized_graph_is_refused(self):
        g, _, _, _ = _build("conv", "fused", training=False)
        g.finalize()
        with self.assertRaisesRegex(RuntimeError, "finalized"):
            fold_batch_norms(g, is_training=False)

    def test_negative_delay_is_refused(self):
        g, _, _, _ = _build("conv", "fused", training=True)
        before = g.as_graph_def()
        with self.assertRaisesRegex(ValueError, "freeze_batch_norm_delay"):
            fold_batch_norms(g, is_training=True, freeze_batch_norm_delay=-1)
        self.assertProtoEquals(before, g.as_graph_def())


if __name__ == "__main__":
    absltest.main()
