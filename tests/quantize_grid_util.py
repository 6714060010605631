"""Builds and checks the quantize grid's tiny graphs (shared by the shards).

One case: input -> layer (conv, fc or depthwise) -> bias or batch norm
(none, fused, unfused) -> activation, with an optional residual add before
or after the activation, rewritten by `experimental_create_training_graph`.
The checks read the graph's structure only (no Session), so each case takes
milliseconds.

Atrous convolutions follow TFLite's lowering of them instead (with a dynamic
batch the converter keeps SPACE_TO_BATCH_ND -> CONV_2D -> BATCH_TO_SPACE_ND:
the range is on the conv output, a bias after the BatchToSpaceND is an ADD
of its own and an activation after it is not fused; docs/what_gets_a_range.md).
The grid's expectations do not encode that; tests/new_arch_test.py (TCN,
DeepLab head, TF-Slim `rate=`) checks those graphs end to end against
TFLite, and the property networks draw atrous layers with every option.
"""
import itertools
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.matching import layer_patterns  # pylint: disable=g-import-not-at-top
from qat.quantize import plan as quantize  # pylint: disable=g-import-not-at-top
from qat.quantize.plan.model import graph as plan_graph  # pylint: disable=g-import-not-at-top

ACTIVATIONS = ("Relu6", "Relu", "Identity", "LeakyRelu")
RESIDUALS = ("none", "pre", "post")
DELAYS = (None, 5000)
VARIABLES = ("resource", "ref")
SCOPES = (None, "test")
LAYERS = ("conv", "fc", "depthwise")
BATCH_NORMS = ("none", "fused", "unfused")
MODES = ("train", "eval")

_ACT_FNS = {
    "Relu6": tf.nn.relu6,
    "Relu": tf.nn.relu,
    "Identity": tf.identity,
    "LeakyRelu": lambda x, name: tf.nn.leaky_relu(x, 0.1, name=name),
}


def grid(layers=LAYERS):
    """Every (activation, residual, delay, variables, scope, layer, bn, mode)."""
    for case in itertools.product(ACTIVATIONS, RESIDUALS, DELAYS, VARIABLES,
                                  SCOPES, layers, BATCH_NORMS, MODES):
        name = "_".join(str(c) for c in case)
        yield (name,) + case


def build(activation, residual, variables, scope, layer, batch_norm,
          is_training=True):
    """Builds one case's float graph.

    Returns:
      (graph, tensors): tensors maps "input", "weights", "layer", "act",
      "add", "consumer", "bn_output" to ops/tensors of the float graph.
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
                        y, training=is_training,
                        fused=(batch_norm == "fused"),
                        name="BatchNorm")
                    t["bn_output"] = y
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


def _output(fq_op):
    """The tensor consumers read from a quantizer: its delay Select, if any."""
    out = fq_op.outputs[0]
    for c in out.consumers():
        if c.type == "Select" and c.name.endswith("/delayed_quant"):
            return c.outputs[0]
    return out


class GridChecks(object):
    """Mixin for an absltest/parameterized TestCase: `check_case(...)`."""

    def _check_gradient(self, op, training, gradient_op_type):
        """Training quantizers carry qat's registered gradient, eval ones
        TensorFlow's."""
        if training:
            self.assertEqual(op.get_attr("_gradient_op_type"),
                             gradient_op_type.encode(), op.name)
        else:
            with self.assertRaises(ValueError, msg=op.name):
                op.get_attr("_gradient_op_type")

    def check_case(self, activation, residual, delay, variables, scope, layer,
                   batch_norm, mode):
        training = mode == "train"
        g, t = build(activation, residual, variables, scope, layer, batch_norm,
                     training)
        rewrite = (qat.experimental_create_training_graph if training
                   else qat.experimental_create_eval_graph)
        layer_op = t["layer"]
        float_weights = layer_op.inputs[1]
        x = t["input"]
        first_op = [c for c in x.consumers() if c.type != "AddV2"][0]
        with g.as_default():
            rewrite(g, quant_delay=delay, scope=scope)
        ctx = layer_op.name.rsplit("/", 1)[0]
        bypass_ctx = (scope + "/" if scope else "") + "layer/bypass"
        fq_ops = {op.name[:-len("/FakeQuantWithMinMaxVars")]: op
                  for op in g.get_operations()
                  if op.type == "FakeQuantWithMinMaxVars"}
        # The input's range is named after the model op that reads it.
        input_prefix = plan_graph.own_context(first_op) + "/input_quant"
        expected = {ctx + "/weights_quant", input_prefix}
        act, add, consumer = t["act"], t.get("add"), t["consumer"]
        # TFLite fuses Relu / Relu6 into the op before them: one range after
        # the activation. LeakyRelu is an op of its own (a range before and
        # after it); Identity disappears (the range is before it).
        fused = activation in ("Relu", "Relu6")
        own = activation == "LeakyRelu"
        act_kind = "/leaky_relu_quant" if own else "/act_quant"
        if residual == "none":
            expected.add(ctx + "/act_quant")
            if own:
                expected.add(ctx + act_kind)
        elif residual == "pre":
            expected.add(ctx + "/conv_quant")
            if fused:
                expected.add(bypass_ctx + "/act_quant")
            else:
                expected.add(bypass_ctx + "/add_quant")
                if own:
                    expected.add(bypass_ctx + act_kind)
        else:
            if activation == "Identity":
                expected |= {ctx + "/conv_quant", bypass_ctx + "/add_quant"}
            else:
                expected |= {ctx + "/act_quant",
                             bypass_ctx + "/post_activation_bypass_quant"}
                if own:
                    expected.add(ctx + act_kind)
        self.assertEqual(set(fq_ops), expected)

        def check(prefix, input_tensor, consumers, narrow=False):
            fq = fq_ops[prefix]
            if input_tensor is not None:
                self.assertIs(fq.inputs[0], input_tensor, prefix)
            self.assertEqual(fq.get_attr("narrow_range"), narrow, prefix)
            self._check_gradient(fq, training, "QatFakeQuantInputGrad")
            out = _output(fq)
            self.assertEqual({c.name for c in out.consumers()},
                             {c.name for c in consumers}, prefix)
            # The range variables are of the model's kind.
            ref = variables != "resource"
            read_type, variable_type = (("Identity", "VariableV2") if ref
                                        else ("ReadVariableOp", "VarHandleOp"))
            assign_types = (("Assign", "AssignSub") if ref
                            else ("AssignVariableOp", "AssignSubVariableOp"))
            for i, var in ((1, "min"), (2, "max")):
                read = fq.inputs[i].op
                self.assertEqual(read.type, read_type, prefix)
                self.assertEqual(read.inputs[0].op.name, prefix + "/" + var)
                self.assertEqual(read.inputs[0].op.type, variable_type, prefix)
                if training:  # The range feeds after its update.
                    self.assertLen(read.control_inputs, 1)
                    self.assertIn(read.control_inputs[0].type, assign_types)
                else:  # Eval: the variable's value, nothing updates it.
                    self.assertEmpty(read.control_inputs)
                    self.assertEqual(
                        [c.type for c in read.inputs[0].consumers()
                         if c.type.startswith("Assign")], [assign_types[0]])
            if delay:
                select = out.op
                self.assertEqual(select.type, "Select", prefix)
                self._check_gradient(select, training, "QatDelayedQuantGrad")
                self.assertIs(select.inputs[1], fq.outputs[0])
                self.assertIs(select.inputs[2], fq.inputs[0])
                cond = select.inputs[0].op
                self.assertEqual(cond.type, "GreaterEqual")
                self.assertIs(cond.inputs[0],
                              qat.engine.step_counter.get_quantization_step(g))
                self.assertEqual(
                    tf.make_ndarray(cond.inputs[1].op.get_attr("value")), delay)
            else:
                self.assertIs(out, fq.outputs[0])
            return fq

        if training and batch_norm != "none":
            # Training fold: the layer reads unscale_fold = fq(w*s) * 1/s
            # (1/s = DivNoNan(1, stop_gradient(s)), per output channel).
            # Depthwise weights: 1/s reshaped to [1, 1, in, multiplier].
            unscale = layer_op.inputs[1].op
            self.assertEqual(unscale.type, "Mul")
            inverse = unscale.inputs[1].op
            if layer_op.type == "DepthwiseConv2dNative":
                self.assertEqual(inverse.type, "Reshape")
                inverse = inverse.inputs[0].op
            self.assertEqual(inverse.type, "DivNoNan")
            self.assertEqual(inverse.inputs[1].op.type, "StopGradient")
            self.assertEqual(layer_op.inputs[1].consumers(), [layer_op])
            w_fq = check(ctx + "/weights_quant", None, [unscale], narrow=True)
            self.assertIs(unscale.inputs[0], _output(w_fq))
        else:
            w_fq = check(ctx + "/weights_quant", None, [layer_op], narrow=True)
            self.assertIs(layer_op.inputs[1], _output(w_fq))
        if batch_norm == "none":
            self.assertIs(w_fq.inputs[0], float_weights)
        else:  # Folded: w * scale.
            self.assertEqual(w_fq.inputs[0].op.type, "Mul")
            self.assertIn(float_weights, list(w_fq.inputs[0].op.inputs))
            self.assertIs(layer_patterns.weight_input(layer_op), _output(w_fq))
        input_consumers = [first_op] + ([add] if residual != "none" else [])
        check(input_prefix, x, input_consumers)
        if training and batch_norm != "none":
            # The fold's training tail without a freeze delay ends in the
            # original batch norm.
            layer_out = t["bn_output"]
        else:
            layer_out = None  # the folded BiasAdd
        if residual == "none":
            if fused:
                check(ctx + "/act_quant", act.outputs[0], [consumer])
            else:
                fq = check(ctx + "/act_quant", layer_out, [act])
                self.assertIs(act.inputs[0], _output(fq))
                if own:
                    check(ctx + act_kind, act.outputs[0], [consumer])
        elif residual == "pre":
            conv_fq = check(ctx + "/conv_quant", layer_out, [add])
            if layer_out is None:
                self.assertEqual(conv_fq.inputs[0].op.type, "BiasAdd")
            if fused:
                self.assertIs(act.inputs[0], add.outputs[0])
                check(bypass_ctx + "/act_quant", act.outputs[0], [consumer])
            else:
                add_fq = check(bypass_ctx + "/add_quant", add.outputs[0], [act])
                self.assertIs(act.inputs[0], _output(add_fq))
                if own:
                    check(bypass_ctx + act_kind, act.outputs[0], [consumer])
        else:
            if activation == "Identity":
                check(ctx + "/conv_quant", layer_out, [act])
                check(bypass_ctx + "/add_quant", add.outputs[0], [consumer])
            else:
                if fused:
                    check(ctx + "/act_quant", act.outputs[0], [add])
                else:
                    check(ctx + "/act_quant", layer_out, [act])
                    check(ctx + act_kind, act.outputs[0], [add])
                check(bypass_ctx + "/post_activation_bypass_quant",
                      add.outputs[0], [consumer])
        # A fused activation reads the layer output without a FakeQuant.
        if residual != "pre" and fused:
            self.assertFalse(quantize.is_quantized_output(act.inputs[0]))
        # Idempotent.
        before = g.as_graph_def()
        with g.as_default():
            rewrite(g, quant_delay=delay, scope=scope)
        self.assertEqual(g.as_graph_def(), before)
