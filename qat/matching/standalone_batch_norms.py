"""Batch norms that follow no layer: recognising them, and their depthwise form.

The fold pass leaves a batch norm with no layer before it alone; the planner
gives it a range and, in eval graphs, the quantize pass replaces it by a 1x1
depthwise conv (`qat.quantize.emit.standalone_batch_norm`). These graph facts
are what both read: whether a batch norm can take that form, whether an
earlier pass already gave it, the If op a batch norm with a `training` tensor
becomes, and the tensor it normalises.
"""
from typing import Optional

import tensorflow as tf

from qat.engine import marks

_BATCH_NORM_TYPES = frozenset(["FusedBatchNorm", "FusedBatchNormV2",
                               "FusedBatchNormV3"])


def is_replaceable(bn: tf.Operation) -> bool:
    """True for an inference-mode NHWC fused batch norm on a 4-D float input."""
    if bn.type not in _BATCH_NORM_TYPES:
        return False
    if bn.get_attr("is_training"):
        return False
    if bn.get_attr("data_format") not in (b"NHWC", "NHWC"):
        return False
    x = bn.inputs[0]
    return (x.dtype == tf.float32 and x.shape.rank == 4
            and x.shape[-1] is not None)


_COND_TYPES = ("If", "StatelessIf")


def is_batch_norm_cond(op: tf.Operation, library) -> bool:
    """True for an If op whose branches run a fused batch norm.

    What a batch norm built with a `training` tensor becomes (the fold pass
    warns about those); its output 0 is the batch norm output.

    Args:
      op: any op.
      library: {function name: FunctionDef} of the graph.
    """
    if op.type not in _COND_TYPES or not op.outputs:
        return False
    for key in ("then_branch", "else_branch"):
        function = library.get(op.get_attr(key).name)
        if function is not None and any(
                node.op in _BATCH_NORM_TYPES for node in function.node_def):
            return True
    return False


def data_input(op: tf.Operation, is_data) -> Optional[tf.Tensor]:
    """The tensor a batch norm (or batch norm If op) normalises.

    Args:
      op: a FusedBatchNorm* op or an If op from `is_batch_norm_cond`.
      is_data: predicate telling data tensors from parameters.
    """
    if op.type not in _COND_TYPES:
        return op.inputs[0]
    for t in op.inputs:
        if t.dtype == tf.float32 and is_data(t):
            return t
    return None


# Attribute of the replacement's depthwise conv naming the batch norm it
# replaces (qat's own mark; see qat.engine.marks).
REPLACES_ATTR = "_qat_replaces"


def is_replaced(bn: tf.Operation) -> bool:
    """True if an earlier pass already replaced `bn`."""
    for op in bn.inputs[0].consumers():
        if marks.made_by_qat(op, marks.STANDALONE_BATCH_NORM):
            try:
                if op.get_attr(REPLACES_ATTR) == bn.name.encode():
                    return True
            except ValueError:
                continue
    return False
