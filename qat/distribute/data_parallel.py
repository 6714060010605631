"""`DataParallel`: the quantize pass's `Replication` hook, filled for replicas.

The planner calls `share` after its visits (replicas of one tensor share one
range, `qat.distribute.replicas`); the emitter asks `all_reduce` for the
collective of a multi-worker strategy (`qat.distribute.worker_ranges`),
`joins_later_replicas` whether later calls will quantize more replicas, and
calls `join_statistics` so that a later call's replicas join the ranges an
earlier call built (`qat.distribute.replica_stats`). `qat.api` passes it to
both; neither imports this room.
"""
from typing import Dict, List

import tensorflow as tf

from qat.distribute import replica_stats
from qat.distribute import replicas
from qat.distribute import worker_ranges
from qat.quantize.plan import replication


class DataParallel(replication.Replication):
    """Replicas in one graph, and workers of a strategy, share their ranges."""

    def share(self, planner, plans: List) -> List:
        return replicas.share(planner, plans)

    def all_reduce(self):
        return worker_ranges.for_current_strategy()

    def joins_later_replicas(self) -> bool:
        return replica_stats.later_calls_expected()

    def join_statistics(self, rewrite, plans: List) -> None:
        replica_stats.join_statistics(rewrite, _earlier_members(plans))


def _earlier_members(plans: List) -> Dict[str, List[tf.Tensor]]:
    """{earlier range's variable scope: the tensors of this call that read it}."""
    members = {}
    for plan in plans:
        if plan.earlier is not None and plan.earlier_join is None:
            prefix = plan.earlier[2].op.inputs[0].op.name.rsplit("/", 1)[0]  # <prefix>/min
            members.setdefault(prefix, []).append(plan.tensor)
    return members


DATA_PARALLEL = DataParallel()
