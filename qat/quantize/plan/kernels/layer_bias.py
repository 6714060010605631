"""The int32 bias the converter gives a layer, as tensors of the graph.

TFLite's CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED and TRANSPOSE_CONV add
an int32 bias the converter quantizes at scale s_in * s_w,c; it saturates
at 2^31 - 1 without a word (`kernel_preconditions.LAYER_BIAS`). The floor
on the layer's input range that keeps it representable is computed in the
graph from the bias as the converter will compute it, which in a training
graph is not a tensor yet: `layer_bias` describes it (`LayerBias`) from the
layer's tail, and the emitter (`qat.quantize.emit.range_floors`) computes it.
"""
import dataclasses
from typing import Dict, List, Optional, Set, Tuple, Union

import tensorflow as tf

from qat.engine import marks
from qat.matching import batch_norm as batch_norm_lib
from qat.matching import layer_patterns
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.ops import converter_rewrites

_PASS_THROUGH = frozenset(["Identity", "Reshape", "Squeeze", "ExpandDims",
                           "BatchToSpaceND", "SpaceToBatchND"])
_BIAS_ADDS = frozenset(["BiasAdd", "Add", "AddV2", "Sub"])


@dataclasses.dataclass
class BatchNormBias:
    """A batch norm on a layer's path: bias = beta + (x - mean) * gamma / sqrt(var + eps).

    `mean` and `variance` hold the moving statistics: tensors, or the
    variables themselves when `*_is_variable` (a read is emitted). `scale`,
    when the training fold computed it already, is gamma / sqrt(var + eps).
    """
    gamma: Optional[tf.Tensor]
    beta: Optional[tf.Tensor]
    mean: tf.Tensor
    variance: tf.Tensor
    epsilon: Union[float, tf.Tensor]
    mean_is_variable: bool = False
    variance_is_variable: bool = False
    dtype: tf.DType = tf.float32
    scale: Optional[tf.Tensor] = None


@dataclasses.dataclass
class LayerBias:
    """The int32 bias the converter gives a layer, as tensors of the graph.

    bias = batch_norm(sum of `before`) + sum of `after` (without a batch
    norm, the sum of both); each term is (tensor, sign).
    """
    before: List[Tuple[tf.Tensor, float]]
    batch_norm: Optional[BatchNormBias]
    after: List[Tuple[tf.Tensor, float]]

    def tensors(self) -> List[tf.Tensor]:
        """Every tensor the bias is computed from."""
        found = [t for t, _ in self.before + self.after]
        bn = self.batch_norm
        if bn is not None:
            found += [t for t in (bn.gamma, bn.beta, bn.mean, bn.variance, bn.epsilon, bn.scale)
                      if isinstance(t, tf.Tensor)]
        return found


def within(starts, ops: Set[tf.Operation], forward: bool) -> Set[tf.Operation]:
    """Ops of `ops` reachable from `starts` (an op or a list, included) forward or backward."""
    starts = [starts] if isinstance(starts, tf.Operation) else list(starts)
    seen, stack = set(starts), list(starts)
    while stack:
        op = stack.pop()
        nxt = ([c for out in op.outputs for c in out.consumers()] if forward
               else [t.op for t in op.inputs])
        for n in nxt:
            if n in ops and n not in seen:
                seen.add(n)
                stack.append(n)
    return seen


def _bias_term(op: tf.Operation, chain: Set[tf.Operation]) -> Optional[Tuple[tf.Tensor, float]]:
    """(parameter, sign) of a bias add whose data input comes from `chain`."""
    if op.type not in _BIAS_ADDS or len(op.inputs) != 2:
        return None
    data = [k for k, t in enumerate(op.inputs) if t.op in chain]
    if len(data) != 1 or (op.type == "Sub" and data[0] != 0):
        return None
    return op.inputs[1 - data[0]], (-1.0 if op.type == "Sub" else 1.0)


def _terms(ops: Set[tf.Operation], chain: Set[tf.Operation]
           ) -> Optional[List[Tuple[tf.Tensor, float]]]:
    """The bias terms of `ops` (adds and pass-throughs only), or None."""
    terms = []
    for op in sorted(ops, key=lambda o: o._id):  # pylint: disable=protected-access
        if op.type in _PASS_THROUGH:
            continue
        term = _bias_term(op, chain)
        if term is None:
            return None
        terms.append(term)
    return terms


def _batch_norm_on(path: Set[tf.Operation]):
    """The one batch norm whose ops lie on `path` (None if none or several:
    then `layer_bias` gives up with the marker `_SEVERAL`)."""
    found = []
    for op in sorted(path, key=lambda o: o._id):  # pylint: disable=protected-access
        if op.type in _PASS_THROUGH or any(op in bn.ops for bn in found):
            continue
        bn = batch_norm_lib.describe_batch_norm(op)
        if bn is not None and not any(b.op is bn.op for b in found):
            found.append(bn)
    if len(found) > 1:
        return _SEVERAL
    return found[0] if found else None


_SEVERAL = object()


def _batch_norm_bias(bn) -> Optional[BatchNormBias]:
    mean, variance = bn.moving_mean, bn.moving_variance
    mean_var = variance_var = False
    if mean is None:
        mean, mean_var = bn.mean_variable, True
    if variance is None:
        variance, variance_var = bn.variance_variable, True
    if mean is None or variance is None:
        return None
    return BatchNormBias(bn.gamma, bn.beta, mean, variance, bn.epsilon, mean_var, variance_var,
                         bn.mean.dtype.base_dtype)


def layer_bias(planner, layer: tf.Operation) -> Optional[LayerBias]:
    """The bias the converter gives `layer`, or None (no bias, or not readable).

    The path from the layer to its range (its tail's ops that lead there,
    then the constant adds the converter folds into the bias):

    * a folded bias add of the fold pass (eval graphs, training graphs with
      a freeze delay): its b_fold, and the adds after it;
    * a batch norm (training graphs: the fold keeps the original one): its
      offset from the moving statistics, of the bias adds before it, and the
      adds after it;
    * otherwise the bias adds.

    A path with anything else (a functional cond, a multiply after the
    bias) gives None: the precondition is not enforced there.
    """
    tail, out = planner.layout.tails.get(layer), planner.layout.outputs.get(layer)
    if tail is None or out is None or out.op not in tail:
        return None
    path = within(out.op, tail, forward=False) - {layer}
    chain = path | {layer}
    after = _folded_constant_adds(planner, out, tail)
    if after is None:
        return None
    folded = [op for op in path if op.type == "BiasAdd" and marks.made_by_qat(op, marks.FOLD)]
    if len(folded) > 1:
        return None
    if folded:
        region = within(folded[0], path, forward=True) - {folded[0]}
        terms = _terms(region, chain)
        if terms is None:
            return None
        return LayerBias([], None, [(folded[0].inputs[1], 1.0)] + terms + after)
    bn = None
    if any(op.type not in _PASS_THROUGH | _BIAS_ADDS for op in path):
        bn = _batch_norm_on(path)
    if bn is _SEVERAL:
        return None
    if bn is None:
        terms = _terms(path, chain)
        if terms is None or not terms + after:
            return None
        return LayerBias(terms, None, after)
    # Before the batch norm: what its input is computed from; after it: what
    # its output feeds. The rest computes the batch norm itself.
    before_ops = (within(bn.input.op, path, forward=False) if bn.input.op in path
                  else set())
    after_ops = within(bn.op, path, forward=True) - {bn.op}
    before, later = _terms(before_ops, chain), _terms(after_ops, chain)
    term = _batch_norm_bias(bn)
    if before is None or later is None or term is None:
        return None
    term.scale = _fold_scale(layer)
    return LayerBias(before, term, later + after)


# Between the training fold's scale s and the folded weights w * s: its
# stop_gradient (or the freeze delay's select), a reshape to the weight
# layout, a cast in mixed precision.
_SCALE_PATH = frozenset(["StopGradient", "Reshape", "Cast", "Identity"])


def _fold_scale(layer: tf.Operation) -> Optional[tf.Tensor]:
    """The training fold's s = gamma / sqrt(moving variance + eps) of `layer`, or None.

    The fold quantizes w * s ("mul_fold") and feeds the layer fq(w * s) / s;
    its s is what the eval graph's folded bias is computed with.
    """
    try:
        w = layer_patterns.weight_input(layer)
    except ValueError:
        return None
    while plan_graph.is_quantized_output(w) and w.op.inputs:  # The weights' quantizer.
        w = w.op.inputs[1] if w.op.type in ("Select", "SelectV2") else w.op.inputs[0]
    if w.op.type != "Mul" or not marks.made_by_qat(w.op, marks.FOLD):
        return None
    t = w.op.inputs[1]
    for _ in range(6):
        if t.op.type in ("Select", "SelectV2"):  # where(frozen, s, stop_gradient(s))
            t = t.op.inputs[1]
        elif t.op.type in _SCALE_PATH and t.op.inputs:
            t = t.op.inputs[0]
        else:
            break
    if t.op.type not in ("Mul", "Rsqrt") or not marks.made_by_qat(t.op, marks.FOLD) \
            or t.shape.rank != 1:
        return None
    return t


def layer_output(planner, layer: tf.Operation) -> Optional[tf.Tensor]:
    """The tensor TFLite's layer op writes: its tail's output after the constant
    adds the converter folds into the bias (None when the layer has none)."""
    layout = planner.layout
    out = layout.outputs.get(layer)
    if out is None:
        return None
    tail = layout.tails[layer]
    for _ in range(100):
        readers = planner.reader.final_readers(out, tail)
        if (len(readers) != 1 or readers[0] not in planner.layout.tail_ops
                or readers[0] in planner.layout.tails
                or not converter_rewrites.folded_bias_add(readers[0], out,
                                                          planner.view.is_data)):
            return out
        out = readers[0].outputs[0]
    return out


def _folded_constant_adds(planner, out: tf.Tensor, tail) -> Optional[List[Tuple[tf.Tensor, float]]]:
    """The constants added after the layer output that the converter folds into its bias
    (as `RangeRules.fold_constant_adds` found them)."""
    terms = []
    for _ in range(100):
        readers = planner.reader.final_readers(out, tail)
        if (len(readers) != 1 or readers[0] not in planner.layout.tail_ops
                or readers[0] in planner.layout.tails
                or not converter_rewrites.folded_bias_add(readers[0], out,
                                                          planner.view.is_data)):
            return terms
        op = readers[0]
        term = _bias_term(op, {out.op})
        if term is None:
            return None
        terms.append(term)
        out = op.outputs[0]
    return terms


