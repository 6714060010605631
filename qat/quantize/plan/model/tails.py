"""A layer's tail: the ops after a layer op that TFLite fuses into it.

Why this module exists: the planner puts a layer's one output range where
TFLite writes the layer's output tensor, which is after the bias add, the
batch norm (folded or, in training graphs, still there) and the fold's
training tail, and before whatever else follows (a pool, a squeeze, a
residual add, the loss). `LayerTails.walk_tail` finds that tensor by
structure, the same in training and eval graphs.
"""
from typing import Callable, Dict, Optional, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import function_library
from qat.engine import marks
from qat.matching import layer_patterns
from qat.matching import tensors
from qat.matching.tensors import forward_closure
from qat.quantize.plan.model import feeds
from qat.quantize.plan.ops import patterns as qp

# A tf_keras batch norm's functional cond returns the layer's normalized value.


def is_float(t: tf.Tensor) -> bool:
    """Whether FakeQuant can quantize `t` (float16 / bfloat16 through float32).

    A fused batch norm's statistics outputs are not data (only output 0 is).
    """
    return tensors.is_float(t) and not (
        t.value_index and t.op.type in qp.BATCH_NORM_TYPES)


def _scales_by_scalar(op: tf.Operation, is_data) -> bool:
    """A multiply or divide by a scalar: user arithmetic, not a batch norm.

    Batch-norm scales are per-channel vectors; a scalar factor after a layer
    is an op of its own (hard-sigmoid, swish's beta, a scaled residual). In
    the tail, the converter would fold it into the already quantized weights
    and leave the layer in float.
    """
    if op.type not in ("Mul", "RealDiv", "Div"):
        return False
    return any(not is_data(i) and i.shape.rank == 0 for i in op.inputs)


def _channel_axis(layer: tf.Operation, rank: int) -> int:
    try:
        channels_first = layer.get_attr("data_format").startswith(b"NC")
    except ValueError:  # MatMul: [batch, channels].
        channels_first = False
    return 1 if channels_first else rank - 1


def _reduces_channels(op: tf.Operation, layer: tf.Operation) -> bool:
    """A reduction over the layer's channel axis: never part of its tail.

    A batch norm's statistics are per channel (the reduction keeps the
    channel axis); layer norm reduces over the channels of each example, a
    computation of its own that TFLite runs as MEAN, SQUARED_DIFFERENCE, ...
    with ranges between them. Unknown axes count as a channel reduction.
    """
    if op.type not in qp.REDUCTION_TYPES:
        return False
    rank = op.inputs[0].shape.rank
    axes = tensor_util.constant_value(op.inputs[1])
    if rank is None or axes is None:
        return True
    return _channel_axis(layer, rank) in {int(a) % rank for a in np.ravel(axes)}


def _reshapes_channels(op: tf.Operation) -> bool:
    """A reshape that changes the last axis (a dense output split into heads).

    The converter fuses a bias add into the layer across a reshape that
    keeps the channels (a rank-3 Dense's MatMul reshaped back to rank 3),
    not across one that splits them (Keras 3 MultiHeadAttention's
    projections: FULLY_CONNECTED, RESHAPE to [.., heads, size], ADD of a
    [heads, size] bias): the layer's range is on the tensor it reshapes.
    """
    if op.type != "Reshape":
        return False
    before, after = op.inputs[0].shape, op.outputs[0].shape
    if not before.rank or not after.rank:
        return False
    return (before[-1] is not None and after[-1] is not None
            and before[-1] != after[-1])




def _restores_rank(op: tf.Operation, rank: Optional[int]) -> bool:
    """A reshape from another rank back to the layer's `rank`."""
    return (op.type in ("Reshape", "Squeeze") and rank is not None
            and op.outputs[0].shape.rank == rank
            and op.inputs[0].shape.rank not in (None, rank))


class LayerTails(object):
    """Walks the tails of one graph's layers, given what it reads off the graph.

    Args:
      is_data: whether a tensor is model data (`GraphView.is_data`).
      params: the parameter test of the graph (`feeds.Parameters`).
      gradient_ops: the gradient computation's ops (never in a tail).
      unfused_batch_norm_matches: batch norms written as arithmetic: final
        add -> its match (`GraphView.unfused_batch_norm_matches`).
    """

    def __init__(self, is_data: Callable[[tf.Tensor], bool], params: feeds.Parameters,
                 gradient_ops: Set[tf.Operation],
                 unfused_batch_norm_matches: Dict[tf.Operation, object]):
        self.is_data = is_data
        self.params = params
        self.gradient_ops = gradient_ops
        self.unfused_batch_norm_matches = unfused_batch_norm_matches

    def walk_tail(self, layer: tf.Operation, stop=frozenset()
                  ) -> Tuple[Set[tf.Operation], Optional[tf.Tensor]]:
        """Returns (tail ops, layer output tensor) of a layer op.

        An op joins the tail when it is a tail type, not in `stop`, and
        every input it has comes from the tail or is a parameter (a float
        operand that is not data but a label or target is neither), so
        residual adds and `labels * logits` never join. The tail then
        ends at a bias add or batch norm (`qat.quantize.plan.ops.patterns.is_tail_end`):
        a Squeeze, Reshape or Identity after it reads the layer output, so
        training and eval graphs put the layer's one range at the same op
        whatever follows it.
        """
        tail = {layer}
        # The converter lowers a weighted Einsum to FULLY_CONNECTED and a
        # RESHAPE, and adds the bias after the reshape: an ADD of its own.
        stack = [] if layer.type in layer_patterns.EINSUM_TYPES else [layer]
        while stack:
            op = stack.pop()
            for out in op.outputs:
                for c in out.consumers():
                    if (c in tail or c in self.gradient_ops or c in stop
                            or not qp.is_tail_op(c)):
                        continue
                    if _scales_by_scalar(c, self.is_data):
                        continue  # A MUL of its own, never folded.
                    if c.type in function_library.CONDITIONAL_TYPES and not any(is_float(o) for o in c.outputs):
                        continue  # No value of the layer's: an observer's (zero_fraction's count).
                    if _reduces_channels(c, layer):
                        continue  # Layer-norm statistics: ops of their own.
                    if _reshapes_channels(c):
                        continue  # The layer output is before it.
                    if all(i.op in tail or self._is_tail_parameter(i, c)
                           for i in c.inputs):
                        tail.add(c)
                        stack.append(c)
        self._cut_at_batch_to_space(tail)
        self._prune_leaves(layer, tail)
        exits = []
        for op in tail:
            for out in op.outputs:
                if not is_float(out):
                    continue
                outside = [c for c in out.consumers()
                           if c not in tail and c not in self.gradient_ops
                           and not qp.is_state_update(c)
                           and c.type not in qp.METADATA_TYPES]
                if outside:
                    exits.append(out)
        if not exits:
            # Nothing reads the tail yet (a final layer the user fetches).
            exits = [out for op in tail for out in op.outputs
                     if is_float(out) and not out.consumers()]
        rank = layer.outputs[0].shape.rank
        same_rank = [t for t in exits if t.shape.rank == rank]
        exits = same_rank or exits
        if not exits:
            return tail, None
        exits.sort(key=lambda t: (t.op._id, t.value_index))  # pylint: disable=protected-access
        return tail, exits[-1]

    def _is_tail_parameter(self, t: tf.Tensor, op: tf.Operation) -> bool:
        """An operand tail op `op` may take besides the tail: never data, and a
        parameter of the layer when it is a float (labels, targets or a
        teacher's outputs never join a layer's tail, nor a constant with one
        value per example; shapes and predicates may)."""
        if self.is_data(t) or not is_float(t):
            return not self.is_data(t)
        return self.params(t) and not (op.outputs and feeds.per_example(t, op.outputs[0]))

    def _is_batch_norm(self, op: tf.Operation) -> bool:
        return (op.type in qp.BATCH_NORM_TYPES or marks.made_by_qat(op, marks.FOLD)
                or op in self.unfused_batch_norm_matches)

    def _cut_at_batch_to_space(self, tail) -> None:
        """Ends an atrous layer's tail before its BatchToSpaceND.

        With a dynamic batch the converter does not fuse SpaceToBatchND ->
        conv -> BatchToSpaceND into one dilated conv: TFLite's CONV_2D writes
        the tensor the BatchToSpaceND reads, so that tensor carries the
        layer's range (the eval fold adds b_fold before it), and a bias add
        after it is an ADD of its own. Only a batch norm that still follows
        (training graphs, where the fold keeps it) keeps the tail going: the
        range is then after it, named the same.
        """
        for bts in [op for op in tail if op.type == "BatchToSpaceND"]:
            after = forward_closure([bts]) & tail
            if not any(self._is_batch_norm(op) for op in after - {bts}):
                tail -= after

    @staticmethod
    def _prune_leaves(layer, tail) -> None:
        """Drops ops that end a tail without being a bias add or batch norm.

        `conv -> Mean` (global pooling), `conv -> BiasAdd -> Squeeze ->
        Identity` (a logits head) or `dense -> Reshape` leave the layer at
        the last bias add or batch norm, not at the pooled, squeezed or
        renamed tensor. A reshape back to the layer's rank stays: TF-Slim
        normalises a dense layer as `Reshape(4-D) -> FusedBatchNorm ->
        Reshape(2-D)`, and the 2-D tensor is the layer output.
        """
        rank = layer.outputs[0].shape.rank
        changed = True
        while changed:
            changed = False
            for op in list(tail):
                if op is layer or qp.is_tail_end(op) or _restores_rank(op, rank):
                    continue
                if not any(c in tail for out in op.outputs for c in out.consumers()):
                    tail.discard(op)
                    changed = True
