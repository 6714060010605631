"""Ranges equal on every worker of a `MultiWorkerMirroredStrategy`.

Why this module exists: with collective all-reduce between processes
(`tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy`, graph
mode), every worker builds the same graph and owns a copy of every variable,
qat's ranges included; the strategy keeps the model's variables equal by
all-reducing gradients, but nothing would keep the ranges equal: each worker
would average its own batches' statistics and the chief's checkpoint would
hold the chief's ranges only.

So, when the rewrite runs under such a strategy (inside `strategy.scope()`
or a replica function), each step all-reduces the statistics of every range
across the workers in one collective (`CollectiveReduceV2`, merge op Min, on
the worker's first device) of the vector `qat.quantize.emit.step_statistics`
packs (the batch mins and the negated batch maxes), after the worker's own
replicas were combined (`qat.distribute.replicas`), and before the updates.
Every worker then applies the same update to the same initial value: the
ranges stay equal, step after step, and follow the same combination rule as
replicas in one process (the min of all mins, the max of all maxes; exact, so
order-independent). The collective uses the strategy's own collective keys;
every worker builds the same graph, so every worker's vector has the same
layout.
"""
from typing import Optional, Tuple

import tensorflow as tf
from tensorflow.python.ops import collective_ops


class WorkerAllReduce(object):
    """All-reduces a step's range statistics across the workers of a strategy.

    Args:
      keys: the strategy's `CollectiveKeys`.
      device: the worker's first device (the collectives run there).
      workers: how many workers take part.
    """

    def __init__(self, keys, device: str, workers: int):
        self._keys = keys
        self.device = device
        self.workers = workers
        self._group_key = keys.get_group_key([device])

    def emit(self, nodes, scope: str, value: str, merge_op: str) -> str:
        """Adds the all-reduce of batch node `value` (`name:<i>`, a step's packed
        statistics); returns its output.

        Args:
          nodes: the rewrite's `NodeBatch`.
          scope: the name scope of the new ops.
          value: the float32 node to reduce.
          merge_op: "Min" or "Max".
        """
        instance_key = self._keys.get_instance_key(self._group_key, self.device)
        group_size, group_key = self.workers, self._group_key

        def build(t):
            return [collective_ops.all_reduce_v2(
                t, group_size=group_size, group_key=group_key, instance_key=instance_key,
                merge_op=merge_op, final_op="Id")]

        ref = value if ":" in value else value + ":0"
        return nodes.python_ops(scope, [(ref, tf.float32, None)], build, device=self.device)[0]


def for_current_strategy() -> Optional[WorkerAllReduce]:
    """The all-reduce of the strategy the rewrite runs under, if it spans workers.

    Returns:
      None outside a strategy, or when it has one worker (MirroredStrategy:
      `qat.distribute.replicas` combines its replicas in the graph).
    """
    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    extended = strategy.extended
    keys = getattr(extended, "_collective_keys", None)
    devices: Tuple[str, ...] = tuple(getattr(extended, "worker_devices", ()))
    if keys is None or not devices:
        return None
    workers = strategy.num_replicas_in_sync // len(devices)
    if workers < 2:
        return None
    return WorkerAllReduce(keys, devices[0], workers)
