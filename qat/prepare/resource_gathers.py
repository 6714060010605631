"""Embedding lookups of resource variables, split so a quantizer can reach the table.

A resource variable's `sparse_read` (`ResourceGather`, tf_keras's
`Embedding`) reads the table inside the gather, where no quantizer can
reach it: `split_resource_gathers` (run before the passes, in training and
eval graphs alike) replaces each by `ReadVariableOp` + `GatherV2`, the same
values and gradients, and leaves the original unconnected and marked. The
planner's lookups (`qat.quantize.plan.model.lookups`) then see a gather of a
variable read like any other table lookup.
"""
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from qat.engine import marks
from qat.engine import op_index
from qat.engine import rewrite as rewrite_lib
from qat.matching import tensors

RESOURCE_GATHER_TYPES = frozenset(["ResourceGather"])


def split_resource_gathers(graph: tf.Graph) -> int:
    """Replaces each float `ResourceGather` by `ReadVariableOp` + `GatherV2`.

    Only row lookups (no batch dimensions) are split; the others stay and
    are named by the planner's `left_float`.

    Args:
      graph: the graph to rewrite (training or eval).

    Returns:
      How many lookups were replaced.
    """
    rewrite = rewrite_lib.Rewrite(graph, marks.EMBEDDING)
    count = 0
    for op in op_index.ops_of_types(graph, RESOURCE_GATHER_TYPES):
        if (marks.is_replaced(op)
                or not tensors.is_float(op.outputs[0]) or not tensors.gathers_rows(op)):
            continue
        dtype = op.get_attr("dtype")
        # The table's shape: the ops of the scratch graph cannot see the
        # resource's handle data.
        rows = op.outputs[0].shape[op.inputs[1].shape.rank:] \
            if op.inputs[1].shape.rank is not None else None

        def build(handle, ids, dtype=dtype, rows=rows):
            table = tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)
            if rows is not None:
                table.set_shape(tf.TensorShape([None]).concatenate(rows))
            return [tf.gather(table, ids, axis=0)]

        out = rewrite.nodes.python_ops(op.name + "_split", list(op.inputs), build,
                                       device=op.device, mark=marks.EMBEDDING)[0]
        rewrite.reroute_consumers(op.outputs[0], out, op.outputs[0].consumers())
        rewrite.set_attr(op, marks.REPLACED_BY_ATTR,
                         attr_value_pb2.AttrValue(s=out.encode()))
        count += 1
    rewrite_lib.apply(rewrite)
    return count
