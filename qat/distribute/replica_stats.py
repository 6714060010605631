"""Ranges an earlier call built, shared with the replicas a later call quantizes.

Called inside a replica function (contrib's model_fn style, once per
replica), the first call builds the ranges of replica 0; each later call
finds them by name (`qat.distribute.replicas` strips the replica scope) and
its quantizers read them. In training, the later replica's batch statistics
join the earlier range's update: the consumers of the earlier quantizer's
batch max (min) read the maximum (minimum) of it and the new replica's, so
the update takes the min of mins and max of maxes over every replica, as
when all replicas are quantized in one call. Each replica's reduction runs
on its own device.
"""
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from qat.engine import marks
from qat.engine import placement
from qat.matching.tensors import FAKE_QUANT_TYPES

_FLOAT = tf.float32
# (earlier quantizer's op name, reduction, combination) per side of a range.
_SIDES = (("BatchMax", "Max", "Maximum"), ("BatchMin", "Min", "Minimum"))


def earlier_ranges(graph: tf.Graph) -> Dict[str, Tuple[tf.Tensor, ...]]:
    """The ranges qat built in `graph`, by name (the variables' scope).

    Returns:
      {prefix: (min, max as its own FakeQuant reads them, min, max as before
      this step's update)} for every range with variables `<prefix>/min|max`.
    """
    found = {}
    for op in graph.get_operations():
        if op.type not in FAKE_QUANT_TYPES or not marks.made_by_qat(op):
            continue
        variable = placement.variable_op(op.inputs[1], max_ops=8)
        if variable is None or not variable.name.endswith("/min"):
            continue
        prefix = variable.name[:-len("/min")]
        if not op.name.startswith(prefix + "/"):
            continue  # Another quantizer reading the range; its owner names it.
        snapshots = [_snapshot_read(graph, f"{prefix}/{side}") for side in ("min", "max")]
        if None in snapshots:
            continue
        found[prefix] = (op.inputs[1], op.inputs[2]) + tuple(s.outputs[0] for s in snapshots)
    return found


def _snapshot_read(graph: tf.Graph, variable: str) -> Optional[tf.Operation]:
    """The variable's snapshot read: a resource variable's or a ref variable's."""
    for name in (variable + "/Read/ReadVariableOp", variable + "/read"):
        try:
            return graph.get_operation_by_name(name)
        except KeyError:
            pass
    return None


def join_statistics(rewrite, members: Dict[str, List[tf.Tensor]]) -> None:
    """Later replicas' batch statistics join earlier ranges' updates.

    Args:
      rewrite: the quantize pass's `qat.engine.rewrite.Rewrite`.
      members: {earlier range's prefix: the tensors (one per later replica)
        whose batch min and max join its update}. Per-channel ranges (weights:
        copies of one variable) are only read.
    """
    graph, nodes = rewrite.graph, rewrite.nodes
    for prefix, tensors in members.items():
        for batch_name, reduction, combine in _SIDES:
            op = _qat_op(graph, f"{prefix}/{batch_name}")
            if op is None or op.outputs[0].shape.rank != 0:
                continue  # No such side (a ReLU's min is 0), or per channel.
            current = nodes.external(op.outputs[0])
            for t in tensors:
                if t.dtype.base_dtype != _FLOAT or t.shape.rank != op.inputs[0].shape.rank:
                    continue
                name = nodes.unique_name(f"{prefix}/replica_{batch_name}")
                value = nodes.node(name, reduction, [nodes.external(t), nodes.external(op.inputs[1])],
                                   device=t.op.device, T=_FLOAT, Tidx=op.get_attr("Tidx"),
                                   keep_dims=False)
                current = nodes.node(name + "/join", combine, [current, value],
                                     device=op.device, T=_FLOAT)
            consumers = [c for c in op.outputs[0].consumers()]
            rewrite.reroute_consumers(op.outputs[0], current + ":0", consumers)


def _qat_op(graph: tf.Graph, name: str) -> Optional[tf.Operation]:
    try:
        op = graph.get_operation_by_name(name)
    except KeyError:
        return None
    return op if marks.made_by_qat(op) else None
