"""tf_keras's fused layer norm, rewritten as arithmetic an integer model can run.

tf_keras `LayerNormalization` (epsilon >= 1.001e-5, the default 1e-3)
normalises with a training-mode fused batch norm on a reshaped input::

    Reshape(x, [1, pre, in, 1]) -> FusedBatchNormV3(ones, zeros, is_training,
        NCHW) -> Reshape(., shape(x)) -> * gamma -> + beta

The converter lowers the fused batch norm to MEAN, SQUARED_DIFFERENCE, ADD,
RSQRT, MUL, SUB inside the converted model, where no range can reach them,
so they stay float. `unfuse_layer_norms` replaces each one, in training and
eval graphs alike, by the same arithmetic over the normalised axes of x
(`<bn op>_unfused/moments/mean`, `.../moments/variance`, `.../Rsqrt`, ...),
whose intermediates the quantize pass gives ranges like any layer norm
written by hand. The fused batch norm is left unconnected and marked
(`qat.engine.marks.is_replaced`), so the fold and quantize passes skip it.

Keras 3 `LayerNormalization` computes the statistics the same way
(`moments/mean`, `moments/variance` over the normalised axes of each
example) but applies them as `x * inv + (-mean * inv [+ beta])` with
`inv = rsqrt(variance + epsilon) [* gamma]` (`KERAS3_LAYER_NORM`). Every
term of that sum is a per-example tensor of the data path: TFLite would
need a NEG and ranges on `x * inv` and `-mean * inv`, two large terms whose
sum cancels to the normalised value, on grids far coarser than it. The same
rewrite gives it the form above, `(x - mean) * rsqrt(variance + epsilon)
[* gamma] [+ beta]`, reading the model's own statistics; the ops it no
longer reads are marked replaced.
"""
from typing import Dict, List

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import tensor_util

from qat.engine import marks
from qat.engine import op_index
from qat.engine import rewrite as rewrite_lib
from qat.matching.matcher import GraphMatcher, OneofPattern, OpTypePattern

def _filled(name: str) -> OneofPattern:
    """A constant vector: Const, or Fill(shape, Const) (dynamic length)."""
    return OneofPattern([
        OpTypePattern("Const", name=name),
        OpTypePattern("Fill", inputs=["*", OpTypePattern("Const", name=name)]),
    ])


# `in`, the size of the normalised axes: Prod(shape(x)[begin:end]).
_NORMALISED_SIZE = OpTypePattern("Prod", inputs=[
    OpTypePattern("StridedSlice", name="normalised_axes", inputs=[
        OpTypePattern("Shape"), OpTypePattern("Const"), OpTypePattern("Const"),
        OpTypePattern("Const")]), "*"])
FUSED_LAYER_NORM = OpTypePattern("Reshape", name="ln_output", inputs=[
    OpTypePattern("FusedBatchNormV3|FusedBatchNormV2|FusedBatchNorm", name="ln_bn", inputs=[
        OpTypePattern("Reshape", name="ln_input", inputs=[
            OpTypePattern("*", name="x"),
            OpTypePattern("Pack", inputs=["*", "*", _NORMALISED_SIZE, "*"])]),
        _filled("ones"), _filled("zeros"), "*", "*"]),
    "*"])
_MATCHER = GraphMatcher(FUSED_LAYER_NORM)


def _keras3_layer_norm() -> OpTypePattern:
    """`x * inv + (-mean * inv [+ beta])` over per-example statistics of x."""
    x = OpTypePattern("*", name="x")
    mean = OpTypePattern("Mean", name="mean", inputs=[x, OpTypePattern("Const", name="axes")])
    centre = OneofPattern([OpTypePattern("StopGradient", inputs=[mean]), mean])
    variance = OpTypePattern("Mean", name="variance", inputs=[
        OpTypePattern("SquaredDifference", inputs=[x, centre], ordered_inputs=False),
        OpTypePattern("Const", name="variance_axes")])
    rsqrt = OpTypePattern("Rsqrt", name="rsqrt", inputs=[
        OpTypePattern("Add|AddV2", inputs=[variance, OpTypePattern("Const")],
                      ordered_inputs=False)])
    inv = OneofPattern([
        OpTypePattern("Mul", inputs=[rsqrt, OpTypePattern("*", name="gamma")],
                      ordered_inputs=False),
        rsqrt,
    ], name="inv")
    negated = OpTypePattern("Mul", inputs=[OpTypePattern("Neg", inputs=[mean]), inv],
                            ordered_inputs=False)
    offset = OneofPattern([
        OpTypePattern("Add|AddV2", inputs=[negated, OpTypePattern("*", name="beta")],
                      ordered_inputs=False),
        negated,
    ])
    return OpTypePattern("Add|AddV2", name="ln_output", inputs=[
        OpTypePattern("Mul", inputs=[x, inv], ordered_inputs=False), offset],
        ordered_inputs=False)


KERAS3_LAYER_NORM = _keras3_layer_norm()
_KERAS3_MATCHER = GraphMatcher(KERAS3_LAYER_NORM)


def _constant(t: tf.Tensor, value: float) -> bool:
    found = tensor_util.constant_value(t)
    return found is not None and np.all(np.asarray(found) == value)


def _normalised_axes(x: tf.Tensor, axes_slice: tf.Operation) -> List[int]:
    """The axes of x the layer norm reduces over: shape(x)[begin:end]."""
    rank = x.shape.rank
    begin, end = (tensor_util.constant_value(t) for t in axes_slice.inputs[1:3])
    strides = tensor_util.constant_value(axes_slice.inputs[3])
    if (rank is None or begin is None or end is None or strides is None
            or np.size(begin) != 1 or np.ravel(strides)[0] != 1
            or axes_slice.get_attr("begin_mask") or axes_slice.get_attr("shrink_axis_mask")):
        return []
    start = int(np.ravel(begin)[0]) % rank
    stop = rank if axes_slice.get_attr("end_mask") else int(np.ravel(end)[0])
    stop = stop if stop > 0 else stop + rank
    return list(range(start, stop)) if 0 < start < stop <= rank else []


def _per_example_axes(match) -> bool:
    """The statistics reduce the same constant axes, the batch axis not among them."""
    x = match.get_tensor("x")
    rank = x.shape.rank
    axes = [tensor_util.constant_value(match.get_tensor(name))
            for name in ("axes", "variance_axes")]
    if rank is None or any(a is None for a in axes):
        return False
    normalised = [sorted({int(a) % rank for a in np.ravel(found)}) for found in axes]
    return (normalised[0] == normalised[1] and bool(normalised[0])
            and 0 not in normalised[0]
            and all(match.get_op(name).get_attr("keep_dims") for name in ("mean", "variance")))


def _replace_keras3_layer_norm(rewrite: rewrite_lib.Rewrite, match,
                               replaced: Dict[tf.Tensor, str]) -> bool:
    """Rewrites one `KERAS3_LAYER_NORM` match; False if it is not one.

    `replaced` maps the outputs of the layer norms this rewrite replaced
    before to their new tensors (a layer norm reading another's output)."""
    root = match.get_op("ln_output")
    if marks.is_replaced(root) or not _per_example_axes(match):
        return False
    x, mean, rsqrt = (match.get_tensor(name) for name in ("x", "mean", "rsqrt"))
    gamma, beta = match.get_tensor("gamma"), match.get_tensor("beta")
    out = root.outputs[0]
    inputs = [x, mean, rsqrt] + [t for t in (gamma, beta) if t is not None]
    if any(t.dtype.base_dtype != out.dtype.base_dtype for t in inputs):
        return False

    def build(x, mean, rsqrt, *parameters):
        parameters = list(parameters)
        normalised = tf.multiply(tf.subtract(x, mean, name="sub"), rsqrt, name="mul")
        if gamma is not None:
            normalised = tf.multiply(normalised, parameters.pop(0), name="mul_1")
        if beta is not None:
            normalised = tf.add(normalised, parameters.pop(0), name="add")
        return [normalised]

    scope = root.name.rsplit("/", 1)[0] + "/centred" if "/" in root.name else root.name + "_centred"
    refs = [(replaced[t], t.dtype, t.shape) if t in replaced else t for t in inputs]
    new = rewrite.nodes.python_ops(scope, refs, build, device=root.device,
                                   mark=marks.LAYER_NORM)[0]
    replaced[out] = new
    rewrite.reroute_consumers(out, new, out.consumers())
    # The ops only the old sum read (x * inv, the offset, inv itself) are
    # dead now: marked, so the passes plan nothing on them.
    kept = {x.op, mean.op, rsqrt.op, match.get_op("variance")}
    kept.update(t.op for t in (gamma, beta) if t is not None)
    dead = {root}
    candidates = [op for op in match.bound_ops() if op not in kept and op is not root]
    changed = True
    while changed:
        changed = False
        for op in candidates:
            if op not in dead and all(c in dead for o in op.outputs for c in o.consumers()):
                dead.add(op)
                changed = True
    for op in dead:
        rewrite.set_attr(op, marks.REPLACED_BY_ATTR, attr_value_pb2.AttrValue(s=new.encode()))
    return True


def unfuse_layer_norms(graph: tf.Graph) -> int:
    """Replaces tf_keras's fused layer norms and Keras 3's layer-norm
    arithmetic by `(x - mean) * rsqrt(variance + epsilon)` (see the module doc).

    Args:
      graph: the graph to rewrite (training or eval).

    Returns:
      How many layer norms were replaced.
    """
    rewrite = rewrite_lib.Rewrite(graph, marks.LAYER_NORM)
    count = 0
    replaced: Dict[tf.Tensor, str] = {}
    # Keras 3's form needs a SquaredDifference and an Rsqrt: without both, no
    # Add is its output.
    keras3 = op_index.has_types(graph, ("SquaredDifference",)) and op_index.has_types(
        graph, ("Rsqrt",))
    for op in op_index.ops_of_types(graph, ("Add", "AddV2", "Reshape") if keras3
                                    else ("Reshape",)):
        if op.type in ("Add", "AddV2"):
            match = _KERAS3_MATCHER.match_op(op)
            if match is not None and _replace_keras3_layer_norm(rewrite, match, replaced):
                count += 1
            continue
        if op.type != "Reshape":
            continue
        match = _MATCHER.match_op(op)
        if match is None:
            continue
        bn = match.get_op("ln_bn")
        if (marks.is_replaced(bn) or not bn.get_attr("is_training")
                or bn.get_attr("data_format") not in (b"NCHW", "NCHW")
                or not _constant(match.get_tensor("ones"), 1.0)
                or not _constant(match.get_tensor("zeros"), 0.0)
                or bn.outputs[0].consumers() != [op]):
            continue
        x = match.get_tensor("x")
        axes = _normalised_axes(x, match.get_op("normalised_axes"))
        if not axes or op.outputs[0].shape.rank != x.shape.rank:
            continue
        epsilon = bn.get_attr("epsilon")

        def build(x, axes=axes, epsilon=epsilon):
            with tf.name_scope("moments"):
                mean = tf.reduce_mean(x, axes, keepdims=True, name="mean")
                variance = tf.reduce_mean(
                    tf.math.squared_difference(x, tf.stop_gradient(mean)), axes,
                    keepdims=True, name="variance")
            inverse = tf.math.rsqrt(variance + epsilon, name="Rsqrt")
            return [tf.multiply(tf.subtract(x, mean, name="sub"), inverse, name="mul")]

        out = rewrite.nodes.python_ops(bn.name + "_unfused", [x], build,
                                       device=bn.device, mark=marks.LAYER_NORM)[0]
        rewrite.reroute_consumers(op.outputs[0], out, op.outputs[0].consumers())
        rewrite.set_attr(bn, marks.REPLACED_BY_ATTR, attr_value_pb2.AttrValue(s=out.encode()))
        count += 1
    rewrite_lib.apply(rewrite)
    return count
