"""Ranges an earlier call built, shared with the replicas a later call quantizes.

Called inside a replica function (contrib's model_fn style, once per
replica), the first call builds the ranges of replica 0; each later call
finds them by name (`qat.distribute.replicas` strips the replica scope).

Under a strategy with several replicas in the process, the first call knows
later calls will come (`later_calls_expected`): it combines its ranges'
statistics once per step at a join (`qat.quantize.emit.step_statistics`),
and each later call's quantizers move those ranges with their own replica's
batch in the forward and join their statistics there (`statistics_joins`):
one more Minimum per call, the update the same min of mins and max of maxes
as when all replicas are quantized in one call.

Where the first call could not know (TF1 towers or clones rewritten one by
one), its quantizers update each range in the forward; a later call's
quantizers read the updated range and its batch statistics join each
update (`join_statistics`): the consumers of the earlier quantizer's batch
max (min) read the maximum (minimum) of it and the new replica's. Each
replica's reduction runs on its own device.
"""
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from qat.engine import marks
from qat.engine import op_index
from qat.engine import placement
from qat.matching.tensors import FAKE_QUANT_TYPES
from qat.quantize.emit import finite_ranges
from qat.quantize.emit import statistics_packs

_FLOAT = tf.float32
# (earlier quantizer's op name, reduction, combination) per side of a range.
_SIDES = (("BatchMax", "Max", "Maximum"), ("BatchMin", "Min", "Minimum"))


def earlier_ranges(graph: tf.Graph) -> Dict[str, Tuple[tf.Tensor, ...]]:
    """The ranges qat built in `graph`, by name (the variables' scope).

    Returns:
      {prefix: (min, max as its own FakeQuant reads them, min, max as before
      this step's update)} for every range with variables `<prefix>/min|max`.
      A range whose statistics a join combines (`statistics_joins`) is found
      through the join; its FakeQuant reads its replica's own step, so the
      first two are the reads before the update too, and a fifth is its
      skipped-batch counter before the update.
    """
    found = {}
    for prefix in statistics_joins(graph):
        sides = ("min", "max", finite_ranges.SKIPPED_BATCHES)
        snapshots = [_snapshot_read(graph, f"{prefix}/{side}") for side in sides]
        if None not in snapshots:
            reads = tuple(s.outputs[0] for s in snapshots)
            found[prefix] = reads[:2] * 2 + reads[2:]
    for op in op_index.ops_of_types(graph, FAKE_QUANT_TYPES):
        if not marks.made_by_qat(op):
            continue
        variable = placement.variable_op(op.inputs[1], max_ops=8)
        if variable is None or not variable.name.endswith("/min"):
            continue
        prefix = variable.name[:-len("/min")]
        if prefix in found or not op.name.startswith(prefix + "/"):
            continue  # Found through its join, or another quantizer's; its owner names it.
        snapshots = [_snapshot_read(graph, f"{prefix}/{side}") for side in ("min", "max")]
        if None in snapshots:
            continue
        found[prefix] = (op.inputs[1], op.inputs[2]) + tuple(s.outputs[0] for s in snapshots)
    return found


def _snapshot_read(graph: tf.Graph, variable: str) -> Optional[tf.Operation]:
    """The read of the variable before its update: a ref variable's copy its
    update waits for, a resource variable's snapshot read, a ref variable's read."""
    for name in (variable + "/before_update", variable + "/Read/ReadVariableOp",
                 variable + "/read"):
        try:
            return graph.get_operation_by_name(name)
        except KeyError:
            pass
    return None


def statistics_joins(graph: tf.Graph) -> Dict[str, tf.Operation]:
    """{range prefix: the join combining its statistics} of an earlier call."""
    found = {}
    for op in op_index.ops_of_types(graph, ("Identity",)):
        if marks.made_by_qat(op, marks.RANGE_STATISTICS):
            for name in op.get_attr(statistics_packs.RANGES_ATTR):
                found[name.decode()] = op
    return found


def later_calls_expected() -> bool:
    """Whether the rewrite runs in one replica's function of several in this
    process (graph mode), so later calls quantize the other replicas."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return False
    strategy = tf.distribute.get_replica_context().strategy
    return len(getattr(strategy.extended, "worker_devices", ())) > 1


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
