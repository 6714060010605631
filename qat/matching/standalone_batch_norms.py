"""Batch norms that follow no layer: recognising them, and their depthwise form.

The fold pass leaves a batch norm with no layer before it alone; the planner
gives it a range and, in eval graphs, the quantize pass replaces it by a 1x1
depthwise conv (`qat.quantize.emit.standalone_batch_norm`). These graph facts
are what both read: whether a batch norm can take that form, whether an
earlier pass already gave it, the If op a batch norm with a `training` tensor
becomes, and the tensor it normalises. A batch norm written as arithmetic
(`x * inv + offset`, Keras 3's BatchNormalization) counts too
(`unfused_parts`).
"""
from typing import Optional, Tuple

import tensorflow as tf

from qat.engine import function_library
from qat.engine import marks
from qat.matching import layer_patterns
from qat.matching.matcher import GraphMatcher

_BATCH_NORM_TYPES = frozenset(["FusedBatchNorm", "FusedBatchNormV2",
                               "FusedBatchNormV3"])


_UNFUSED_MATCHER = GraphMatcher(layer_patterns.UNFUSED_BATCH_NORM)


def unfused_parts(op: tf.Operation) -> Optional[Tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """(x, inv, offset) of a batch norm written as arithmetic, `x * inv + offset`
    (`layer_patterns.UNFUSED_BATCH_NORM`, Keras 3's BatchNormalization), on a
    4-D channels-last input with one scale and offset per channel; else None."""
    if op.type not in ("Add", "AddV2"):
        return None
    match = _UNFUSED_MATCHER.match_op(op)
    if match is None:
        return None
    x, inv, offset = (match.get_tensor(name) for name in ("bn_input", "inv", "offset"))
    channels = x.shape[-1] if x.shape.rank == 4 else None
    if channels is None or op.outputs[0].shape.rank != 4:
        return None
    for t in (inv, offset):
        if t.shape.num_elements() != channels or (t.shape.rank or 0) > 4 or (
                t.shape.rank and t.shape[-1] != channels):
            return None
    return x, inv, offset


def normalised_input(bn: tf.Operation) -> tf.Tensor:
    """The tensor a batch norm op (fused, or the final add of its arithmetic) reads."""
    parts = unfused_parts(bn)
    return parts[0] if parts else bn.inputs[0]


def is_replaceable(bn: tf.Operation) -> bool:
    """True for an inference-mode NHWC fused batch norm on a 4-D float input,
    or the arithmetic of one (`unfused_parts`) whose scale and offset are
    constants here (eval graphs: moving statistics)."""
    parts = unfused_parts(bn)
    if parts is not None:
        x, inv, offset = parts
        return (x.dtype == tf.float32 and not _computed_from(inv, x)
                and not _computed_from(offset, x))
    if bn.type not in _BATCH_NORM_TYPES:
        return False
    if bn.get_attr("is_training"):
        return False
    if bn.get_attr("data_format") not in (b"NHWC", "NHWC"):
        return False
    x = bn.inputs[0]
    return (x.dtype == tf.float32 and x.shape.rank == 4
            and x.shape[-1] is not None)




def is_batch_norm_cond(op: tf.Operation, library) -> bool:
    """True for an If op whose branches run a fused batch norm.

    What a batch norm built with a `training` tensor becomes (the fold pass
    warns about those); its output 0 is the batch norm output.

    Args:
      op: any op.
      library: {function name: FunctionDef} of the graph.
    """
    if op.type not in function_library.CONDITIONAL_TYPES or not op.outputs:
        return False
    for key in ("then_branch", "else_branch"):
        function = library.get(op.get_attr(key).name)
        if function is not None and any(
                node.op in _BATCH_NORM_TYPES for node in function.node_def):
            return True
    return False


def _computed_from(t: tf.Tensor, x: tf.Tensor, depth: int = 12) -> bool:
    """Whether `t` depends on `x` (batch statistics) within `depth` ops."""
    frontier, seen = [t], set()
    for _ in range(depth):
        following = []
        for u in frontier:
            if u is x:
                return True
            if u.op not in seen:
                seen.add(u.op)
                following.extend(u.op.inputs)
        frontier = following
    return False


def data_input(op: tf.Operation, is_data) -> Optional[tf.Tensor]:
    """The tensor a batch norm (or batch norm If op) normalises.

    Args:
      op: a FusedBatchNorm* op, the final add of a batch norm's arithmetic
        (`unfused_parts`) or an If op from `is_batch_norm_cond`.
      is_data: predicate telling data tensors from parameters.
    """
    if op.type not in function_library.CONDITIONAL_TYPES:
        return normalised_input(op)
    for t in op.inputs:
        if t.dtype == tf.float32 and is_data(t):
            return t
    return None


# Attribute of the replacement's depthwise conv naming the batch norm it
# replaces (qat's own mark; see qat.engine.marks).
REPLACES_ATTR = "_qat_replaces"


def is_replaced(bn: tf.Operation) -> bool:
    """True if an earlier pass already replaced `bn`."""
    for op in normalised_input(bn).consumers():
        if marks.made_by_qat(op, marks.STANDALONE_BATCH_NORM):
            try:
                if op.get_attr(REPLACES_ATTR) == bn.name.encode():
                    return True
            except ValueError:
                continue
    return False
