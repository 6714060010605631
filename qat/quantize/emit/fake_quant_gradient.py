"""The training gradient of the quantizers' FakeQuant ops.

TensorFlow's gradient of FakeQuantWithMinMaxVars(PerChannel) is one kernel
that returns three things: the straight-through gradient of the input (the
incoming gradient where the input lies inside the nudged range, 0 outside)
and the gradients of min and max (sums of the incoming gradient below and
above the range). Our ranges are not learned by gradient descent: they are
non-trainable variables that the quantizers update by assignment, and the
FakeQuant reads them after the update, so nothing ever uses the min / max
gradients. Computing them anyway is not free: the kernel makes three passes
over the activation, and `Optimizer.minimize` (gate_gradients=GATE_OP) makes
all outputs of a gradient op run together.

The quantizers of a training graph therefore carry the registered gradient
`QatFakeQuantInputGrad`, which returns the same input gradient, bit for bit,
from QuantizeAndDequantizeV4Grad (one pass: the incoming gradient where
nudged_min <= x <= nudged_max) and no gradient for min and max. The nudged
range is recomputed from min and max with the float32 arithmetic of
TensorFlow's FakeQuant kernels. `QuantizerBatch` computes the nudged ranges of
all its per-tensor quantizers at once, as vectors (a few ops per batch rather
than twenty per quantizer), and registers them here; the gradient of any
other FakeQuant carrying the attribute (a copy, a graph re-imported from a
MetaGraph) computes its own.

A ReLU or ReLU6 whose output a training FakeQuant reads directly gets the
registered gradient `QatReluBeforeFakeQuant` (`fuse_relu_gradient`). Where
its output gradient is the FakeQuant's masked gradient and nothing else, it
masks the FakeQuant's incoming gradient once with both masks, by narrowing
the range to [smallest normal float, min(nudged_max, the float below 6)]
(the ReLU gradients pass where 0 < y < 6, or 0 < y, for the ReLU output y;
TensorFlow's CPU kernels treat subnormal values as 0): one pass over the
activation instead of two, the same values. The FakeQuant's own masked
gradient is then left unused, and not run, unless something asks for the
gradient of the ReLU output itself. Any other output gradient (say, summed
with the gradient of another consumer) gets the ReLU's usual gradient op.

Under XLA. QuantizeAndDequantizeV4Grad has no XLA kernel. Where XLA
compiles the gradient (`qat.engine.xla_compilation.compiles_gradient_of`),
the FakeQuant and delayed-quantizer gradients take the forms of
`qat.quantize.emit.xla_gradients` (TensorFlow's own FakeQuant gradient,
which XLA compiles from the same nudge as the FakeQuant it compiles, and
fuses with its neighbours), and a ReLU before a FakeQuant keeps its own
gradient (XLA fuses the two masks).

A process that calls `tf.gradients` on such a graph must have imported qat
(the gradient registry is per process), as for any custom gradient.
"""
from typing import Dict, Sequence, Tuple
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.ops import gen_nn_ops

from qat.engine import marks
from qat.engine import rewrite as rewrite_lib
from qat.engine import xla_compilation
from qat.quantize.emit import xla_gradients

GRADIENT_OP_TYPE = "QatFakeQuantInputGrad"
DELAYED_GRADIENT_OP_TYPE = "QatDelayedQuantGrad"
RELU_GRADIENT_OP_TYPE = "QatReluBeforeFakeQuant"
# A kernel's fixed output grid (`qat.quantize.plan.ranges.fixed_ranges`): the values are
# bounded by the function, the range is no clamp to learn; a softmax of 1.0
# (above the grid's 255/256) keeps its gradient.
FIXED_GRID_GRADIENT_OP_TYPE = "QatFixedGridGrad"

# ReLU op type -> the largest output its gradient passes (None: no bound).
_RELU_UPPER_BOUNDS = {"Relu": None,
                      "Relu6": np.nextafter(np.float32(6), np.float32(0))}
_SMALLEST_NORMAL = np.finfo(np.float32).tiny

# gradient graph -> {name of a masked gradient op `_masked_grad` built over a
# fused ReLU's output: that output's name}. Names of the forward graph: a
# function's gradient graph reads the forward tensors through placeholders
# of its own.
_RELU_MASKED: "weakref.WeakKeyDictionary[tf.Graph, Dict[str, str]]" = (
    weakref.WeakKeyDictionary())

# graph -> {FakeQuant op name: ((min, max) it was computed from,
#                                 (nudged min, nudged max))}, as tensor names:
# tensors would hold their graph, and so keep every graph that was ever
# rewritten alive through this weak-keyed table.
_NUDGED_RANGES: "weakref.WeakKeyDictionary[tf.Graph, Dict[str, tuple]]" = (
    weakref.WeakKeyDictionary())


def quant_bounds(num_bits: int, narrow_range: bool) -> Tuple[float, float]:
    """The integer grid [quant_min, quant_max] of a FakeQuant, as floats."""
    return (1.0 if narrow_range else 0.0), float((1 << num_bits) - 1)


def nudged_range(min_value: tf.Tensor, max_value: tf.Tensor, quant_min,
                 quant_max) -> Tuple[tf.Tensor, tf.Tensor]:
    """The range FakeQuant really uses: `min`/`max` moved so 0 is on the grid.

    Mirrors `Nudge` in tensorflow/core/kernels/fake_quant_ops_functor.h step by
    step, so the results are the kernels' float32 values exactly. Where min and
    max are both 0 the kernels pass every gradient through, so the range
    returned there is (-inf, inf).

    Args:
      min_value: min, a float32 scalar or vector.
      max_value: max, same shape.
      quant_min: the grid's lower end (`quant_bounds`): a float, or a float32
        array or tensor broadcastable to min_value.
      quant_max: the grid's upper end, likewise.

    Returns:
      (nudged_min, nudged_max), shaped like the inputs.
    """
    quant_min = tf.convert_to_tensor(quant_min, tf.float32)
    quant_max = tf.convert_to_tensor(quant_max, tf.float32)
    # DivNoNan divides exactly like RealDiv here (the divisor is not 0), but
    # Grappler's constant folding does not turn it into a multiplication by
    # the rounded reciprocal, as it does for a division by a constant.
    scale = tf.math.divide_no_nan(max_value - min_value, quant_max - quant_min)
    zero_point_from_min = quant_min - min_value / scale
    # std::round (halves away from zero) of a clamped value: rounding is
    # monotonic and the bounds are integers, so clamping after rounding is
    # the same; tf.round would round halves to even.
    floor = tf.floor(zero_point_from_min)
    rounded = floor + tf.cast(zero_point_from_min - floor >= 0.5, tf.float32)
    zero_point = tf.minimum(tf.maximum(rounded, quant_min), quant_max)
    nudged_min = (quant_min - zero_point) * scale
    nudged_max = (quant_max - zero_point) * scale
    both_zero = tf.logical_and(tf.equal(min_value, 0.0),
                               tf.equal(max_value, 0.0))
    return (tf.where(both_zero, -np.inf, nudged_min),
            tf.where(both_zero, np.inf, nudged_max))


def add_nudged_ranges(rewrite, fake_quants: Sequence[tuple], scope: str) -> None:
    """Computes the nudged ranges of per-tensor FakeQuant ops as two vectors.

    The gradients of these ops then read their entries instead of building
    the nudge for each op.

    Args:
      rewrite: the `qat.engine.rewrite.Rewrite` that adds the FakeQuant ops.
      fake_quants: (FakeQuant, min, max, num_bits, narrow_range) of
        per-tensor FakeQuant ops: nodes of the rewrite, or ops and tensors
        of the graph.
      scope: name scope of the new ops.
    """
    if not fake_quants:
        return
    nodes = rewrite.nodes
    count = len(fake_quants)
    bounds = np.array([quant_bounds(num_bits, narrow)
                       for _, _, _, num_bits, narrow in fake_quants], np.float32)

    def ref(x):
        return nodes.external(x) if isinstance(x, tf.Tensor) else x

    def vector(name, values, dtype=tf.float32):
        return (nodes.node(nodes.unique_name(scope + "/" + name), "Pack",
                           [ref(v) for v in values], N=count, T=dtype, axis=0)
                + ":0", dtype, [None])

    vectors = [vector("min", [lo for _, lo, _, _, _ in fake_quants]),
               vector("max", [hi for _, _, hi, _, _ in fake_quants])]
    for k, name in enumerate(("quant_min", "quant_max")):
        vectors.append((nodes.const(nodes.unique_name(scope + "/" + name),
                                    bounds[:, k], tf.float32) + ":0",
                        tf.float32, [None]))
    nudged = nodes.python_ops(scope, vectors, nudged_range, reusable=True)
    refs = []
    for name, vec in zip(("nudged_min", "nudged_max"), nudged):
        unstack = nodes.node(nodes.unique_name(scope + "/" + name), "Unpack",
                             [vec], num=count, T=tf.float32, axis=0)
        refs.append(["%s:%d" % (unstack, k) for k in range(count)])

    def register(ops):
        known = _NUDGED_RANGES.setdefault(rewrite.graph, {})
        for k, (fake_quant, lo, hi, _, _) in enumerate(fake_quants):
            op = fake_quant if isinstance(fake_quant, tf.Operation) else ops[fake_quant]
            pair = (nodes.tensor(ops, refs[0][k]).name, nodes.tensor(ops, refs[1][k]).name)
            known[op.name] = ((op.inputs[1].name, op.inputs[2].name), pair)

    rewrite.after_import(register)


def precompute_nudged_ranges(fake_quant_ops: Sequence[tf.Operation],
                             scope: str = "nudged_ranges") -> None:
    """`add_nudged_ranges` for FakeQuant ops already in a graph.

    Args:
      fake_quant_ops: FakeQuantWithMinMaxVars ops of one graph, with scalar
        min and max (others are ignored).
      scope: name scope of the new ops.
    """
    ops = [op for op in fake_quant_ops
           if op.type == "FakeQuantWithMinMaxVars"
           and op.inputs[1].shape.rank == 0 and op.inputs[2].shape.rank == 0]
    if not ops:
        return
    rewrite = rewrite_lib.Rewrite(ops[0].graph, marks.QUANTIZER)
    add_nudged_ranges(rewrite, [(op, op.inputs[1], op.inputs[2], op.get_attr("num_bits"),
                                 op.get_attr("narrow_range")) for op in ops], scope)
    rewrite_lib.apply(rewrite)


def fuse_relu_gradient(rewrite, relu: tf.Operation) -> None:
    """Gives `relu` the gradient that trusts a FakeQuant mask (see above).

    Only for a ReLU or ReLU6 whose output a training FakeQuant reads
    directly, and only when the op has no registered gradient of its own.

    Args:
      rewrite: the `qat.engine.rewrite.Rewrite` that adds the FakeQuant.
      relu: the op producing the FakeQuant's input.
    """
    # Not over the user's gradient override (or ours, already there).
    if relu.type in _RELU_UPPER_BOUNDS and _registered_gradient(relu) is None:
        rewrite.set_attr(relu, "_gradient_op_type",
                         attr_value_pb2.AttrValue(s=RELU_GRADIENT_OP_TYPE.encode()))


def _registered_gradient(op: tf.Operation):
    """`op`'s `_gradient_op_type` (bytes), or None for TensorFlow's own."""
    try:
        return op.get_attr("_gradient_op_type")
    except ValueError:  # No such attribute.
        return None


def has_input_only_gradient(op: tf.Operation) -> bool:
    """Whether `op` is a FakeQuant carrying `QatFakeQuantInputGrad`."""
    return _registered_gradient(op) == GRADIENT_OP_TYPE.encode()


def _nudged_range_of(op: tf.Operation) -> Tuple[tf.Tensor, tf.Tensor]:
    sources, pair = _NUDGED_RANGES.get(op.graph, {}).get(op.name, (None, None))
    # Unless min or max were rerouted since.
    if sources == (op.inputs[1].name, op.inputs[2].name):
        return (op.graph.get_tensor_by_name(pair[0]),
                op.graph.get_tensor_by_name(pair[1]))
    return nudged_range(op.inputs[1], op.inputs[2], *quant_bounds(
        op.get_attr("num_bits"), op.get_attr("narrow_range")))


def _masked_grad(op: tf.Operation, grad: tf.Tensor, lo: tf.Tensor,
                 hi: tf.Tensor) -> tf.Tensor:
    """`grad` where lo <= op's input <= hi (per channel for per-channel ops)."""
    inputs = op.inputs[0]
    axis = -1
    if op.type == "FakeQuantWithMinMaxVarsPerChannel":
        if inputs.shape.rank is None:
            raise ValueError(
                f"The gradient of '{op.name}' needs its input's rank.")
        axis = inputs.shape.rank - 1
    masked = tf.raw_ops.QuantizeAndDequantizeV4Grad(
        gradients=grad, input=inputs, input_min=lo, input_max=hi,
        axis=axis).input_backprop
    if _registered_gradient(inputs.op) == RELU_GRADIENT_OP_TYPE.encode():
        _RELU_MASKED.setdefault(masked.graph, {})[masked.op.name] = inputs.name
    return masked


def _fake_quant_input_grad(op: tf.Operation, grad: tf.Tensor):
    """Straight-through gradient of the input; none for min and max."""
    if xla_compilation.compiles_gradient_of(op):
        return (xla_gradients.fake_quant_input_grad(op, grad), None, None)
    return (_masked_grad(op, grad, *_nudged_range_of(op)), None, None)


def _delayed_quant_grad(op: tf.Operation, grad: tf.Tensor):
    """Gradient of `Select(active, FakeQuant(x), x)`, a delayed quantizer.

    Before the delay x gets `grad`, after it the straight-through gradient:
    one masked pass over the range (-inf, inf) or the nudged range, all of
    it credited to x (the FakeQuant branch gets none, so its own gradient
    never runs). TensorFlow's Select gradient would instead build zeros and
    two selects, then the FakeQuant gradient and a sum. Any other Select
    carrying this gradient gets the incoming gradient times the scalar
    condition and its complement.
    """
    active, quantized, inputs = op.inputs
    fake_quant = quantized.op
    if (has_input_only_gradient(fake_quant)
            and fake_quant.inputs[0].name == inputs.name):
        if xla_compilation.compiles_gradient_of(op):
            return None, None, xla_gradients.delayed_quant_grad(active, fake_quant, grad)
        lo, hi = _nudged_range_of(fake_quant)
        lo = tf.where(active, lo, -np.inf)
        hi = tf.where(active, hi, np.inf)
        return None, None, _masked_grad(fake_quant, grad, lo, hi)
    chosen = tf.cast(active, grad.dtype)
    return None, grad * chosen, grad * (1.0 - chosen)


def _relu_before_fake_quant_grad(op: tf.Operation, grad: tf.Tensor):
    """Both masks in one pass where `grad` is a FakeQuant's masked gradient."""
    masked = grad.op if isinstance(grad, tf.Tensor) else None
    if (masked is not None
            and _RELU_MASKED.get(masked.graph, {}).get(masked.name) == op.outputs[0].name):
        incoming, y, lo, hi = masked.inputs[:4]
        lo = tf.maximum(lo, _SMALLEST_NORMAL)
        if _RELU_UPPER_BOUNDS[op.type] is not None:
            hi = tf.minimum(hi, _RELU_UPPER_BOUNDS[op.type])
        return tf.raw_ops.QuantizeAndDequantizeV4Grad(
            gradients=incoming, input=y, input_min=lo, input_max=hi,
            axis=masked.get_attr("axis")).input_backprop
    if op.type == "Relu6":
        return gen_nn_ops.relu6_grad(grad, op.outputs[0])
    return gen_nn_ops.relu_grad(grad, op.outputs[0])


def _fixed_grid_grad(op: tf.Operation, grad: tf.Tensor):
    """Straight-through gradient, unmasked; none for the constant min and max."""
    del op
    return (grad, None, None)


for _name, _function in ((GRADIENT_OP_TYPE, _fake_quant_input_grad),
                         (FIXED_GRID_GRADIENT_OP_TYPE, _fixed_grid_grad),
                         (DELAYED_GRADIENT_OP_TYPE, _delayed_quant_grad),
                         (RELU_GRADIENT_OP_TYPE, _relu_before_fake_quant_grad)):
    try:
        tf.RegisterGradient(_name)(_function)
    except KeyError:  # Module re-imported (importlib.reload): already there.
        pass
