"""One range per tensor for the replicas of a `tf.distribute` strategy (TF 2).

Under `tf.distribute.MirroredStrategy`, `strategy.run(step)` calls the
replica function once per device, and each replica calls the quantized
model's training function: TensorFlow traces it once per replica device
(`tf.function` retraces for each device under a strategy), inside that
replica's context. The graph path's rule (issue #27,
`qat.distribute.replicas`) holds here as well:

* Ranges and the step counter are made once, under the strategy: mirrored
  variables (one component per device, aggregation ONLY_FIRST_REPLICA,
  `qat.engine.function_graphs`), so checkpoints hold one value per range and
  restore into the single-device model.
* Each replica's trace reads and updates its own device's component
  (`variable_handles`); nothing is read across devices. Weights are
  quantized once per device, from that device's copy.
* Each replica's forward quantizes with the range moved by its own batch;
  after it, one all-reduce (merge op Min, `ReplicaAllReduce`) combines the
  statistics of every range, packed in one vector by
  `qat.quantize.emit.step_statistics` (the graph path all-reduces across
  workers the same way): every replica then applies the same update to the
  same value, so the components stay equal, and the range follows one
  replica training on the whole batch (min and max are exact, so the result
  does not depend on how the batch was split). Weight ranges too: a weight
  folded with a batch norm's batch statistics may differ between replicas;
  a per-channel range takes the min and max per channel.

The all-reduce is a collective op inside each replica's function, as TF's
own `CollectiveAllReduce` builds them for CPU and GPU replicas, with keys
of qat's own (a group key far above the strategies', instance keys
allocated per device in tracing order, as the replicas trace alike, and
never reused in the process) and an ordering token per device. The token
matters: collectives are stateful, and without a resource input TF's
automatic control dependencies chain every stateful op of a function in
program order, so one device's collective could wait for a stateful op
that waits for the other device's (a hang that ends in "Collective has
timed out waiting for other workers"). With the token each device's
collectives are ordered among themselves only. A function runs every
stateful op it holds, so the update needs nothing to wait for it.

`quantize_model`, called in cross-replica context (under
`strategy.scope()`), traces its plan as replica 0 (`planning_replica`). A
call in cross-replica context (or outside the strategy) reads the primary
component and writes each update to every component: one device, the
single-replica rule (but a Keras batch norm's update is then written to
every device, which the fold pass does not recognise: train in
`strategy.run`).
"""
import contextlib
import threading
from typing import Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.ops import collective_ops
from tensorflow.python.ops import resource_variable_ops

from qat.quantize.plan import replication

class NotMirroredError(ValueError):
    """A range variable read by several replicas is not a mirrored variable."""


def _is_distributed(variable) -> bool:
    return isinstance(variable, tf.distribute.DistributedValues)


def variable_handles(variable: tf.Variable) -> Tuple[tf.Tensor, Sequence[tf.Tensor]]:
    """The handle a trace reads `variable` through, and further ones to update.

    Replica context: the replica's own component (TensorFlow's
    `DistributedVariable.handle`). Cross-replica context, or outside the
    strategy: the primary component, and every other component for the
    updates. A plain variable: its handle.

    Raises:
      NotMirroredError: a plain variable read by a replica of a strategy
        with several replicas (the replicas would update one variable each
        step, and their functions would wait for each other).
    """
    if not _is_distributed(variable):
        context = tf.distribute.get_replica_context()
        if (tf.distribute.has_strategy() and context is not None
                and context.num_replicas_in_sync > 1):
            raise NotMirroredError(
                f"qat: the range variable {variable.name} is not mirrored, but "
                f"{context.num_replicas_in_sync} replicas read it: call "
                "qat.quantize_model inside the strategy's scope (`with "
                "strategy.scope(): qm = qat.quantize_model(model)`), so qat's "
                "variables are made under the strategy as the model's are.")
        return variable.handle, ()
    if not tf.distribute.has_strategy():
        # TensorFlow's handle there: the primary's (or the one a SavedModel
        # saves); the updates go to every component.
        return variable.handle, tuple(c.handle for c in variable.values[1:])
    if tf.distribute.in_cross_replica_context():
        components = variable.values
        return components[0].handle, tuple(c.handle for c in components[1:])
    return variable.handle, ()


# qat's collective keys, for every strategy of the process: group keys far
# above the strategies' own (which start at 1 in every strategy, each with its
# own allocator), instance keys never reused for another collective. Two
# strategies on the same devices share qat's group and its instance counters.
_GROUP_KEY_START = 1 << 30
_KEYS = cross_device_utils.CollectiveKeys(group_key_start=_GROUP_KEY_START)
_KEYS_LOCK = threading.Lock()


class _Collectives(object):
    """qat's collective group of one strategy's devices: keys and ordering tokens.

    Args:
      strategy: MirroredStrategy or MultiWorkerMirroredStrategy.
    """

    def __init__(self, strategy):
        self.devices = tuple(strategy.extended.worker_devices)
        self.group_size = strategy.num_replicas_in_sync
        with _KEYS_LOCK:
            self.group_key = _KEYS.get_group_key(list(self.devices))
        self._tokens = {}
        self._lock = threading.Lock()

    def instance_key(self, device: str) -> int:
        """The next instance key of `device` (every replica's trace asks in the
        same order, so the replicas' collectives meet)."""
        return _KEYS.get_instance_key(self.group_key, device)

    def token(self, device: str) -> tf.Variable:
        """The ordering token of `device`: a plain resource variable there."""
        with self._lock:
            if device not in self._tokens:
                # The class itself, not tf.Variable: no strategy creator (a
                # token per device, not a mirrored one), as TF's
                # CollectiveReplicaLauncher makes its tokens.
                with tf.init_scope(), tf.device(device):
                    self._tokens[device] = resource_variable_ops.ResourceVariable(
                        0.0, trainable=False, name="qat_ordering_token")
            return self._tokens[device]


_BY_DEVICES = {}


def _collectives(strategy) -> _Collectives:
    """The group of the strategy's devices (one per device set and size)."""
    key = (tuple(strategy.extended.worker_devices), strategy.num_replicas_in_sync)
    with _KEYS_LOCK:
        found = _BY_DEVICES.get(key)
    if found is None:
        found = _Collectives(strategy)
        with _KEYS_LOCK:
            found = _BY_DEVICES.setdefault(key, found)
    return found


class ReplicaAllReduce(object):
    """All-reduces one replica's step statistics over the strategy's replicas.

    The `spec.all_reduce` of `qat.quantize.emit.range_updates` (the interface of
    `qat.distribute.worker_ranges.WorkerAllReduce`) for the trace of one replica.

    Args:
      collectives: the strategy's group.
      device: the replica's device (its collectives run there).
    """

    def __init__(self, collectives: _Collectives, device: str):
        self._collectives = collectives
        self.device = device

    def emit(self, nodes, scope: str, value: str, merge_op: str) -> str:
        """Adds the all-reduce of batch node `value` (`name:<i>`, a step's packed
        statistics); returns its output.

        Args:
          nodes: the rewrite's `NodeBatch` (of a function graph).
          scope: the name scope of the new ops.
          value: the float32 node to reduce.
          merge_op: "Min" or "Max".
        """
        shared = self._collectives
        instance_key = shared.instance_key(self.device)
        graph = nodes.graph
        token = shared.token(self.device).handle
        if isinstance(token, tf.__internal__.EagerTensor) or token.graph is not graph:
            token = graph.capture(token)
        group_size, group_key = shared.group_size, shared.group_key

        def build(t, ordering_token):
            return [collective_ops.all_reduce_v2(
                t, group_size=group_size, group_key=group_key, instance_key=instance_key,
                merge_op=merge_op, final_op="Id", ordering_token=ordering_token)]

        ref = value if ":" in value else value + ":0"
        return nodes.python_ops(scope, [(ref, tf.float32, None), token], build,
                                device=self.device)[0]


def all_reduce_for_trace() -> Optional[ReplicaAllReduce]:
    """The all-reduce of the replica whose function is being traced, if any.

    Returns:
      None outside a strategy, in cross-replica context, or with one replica.

    Raises:
      NotImplementedError: several replicas under a strategy other than
        MirroredStrategy and MultiWorkerMirroredStrategy (TPUStrategy).
    """
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    context = tf.distribute.get_replica_context()
    strategy = context.strategy
    if context.num_replicas_in_sync < 2:
        return None
    if not isinstance(strategy, (tf.distribute.MirroredStrategy,
                                 tf.distribute.MultiWorkerMirroredStrategy)):
        raise NotImplementedError(
            f"qat: training under {type(strategy).__name__} with "
            f"{context.num_replicas_in_sync} replicas is not supported: qat combines "
            "the replicas' ranges with collective ops (MirroredStrategy, "
            "MultiWorkerMirroredStrategy).")
    shared = _collectives(strategy)
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:
        raise NotImplementedError(
            f"qat: {type(strategy).__name__} gives no static replica id while "
            "tracing; qat needs it to place the range all-reduces.")
    return ReplicaAllReduce(shared, shared.devices[int(replica) % len(shared.devices)])


def planning_replica():
    """The context `quantize_model` traces its plan in, or None (as it is).

    Under a strategy with several replicas, in cross-replica context (how
    `quantize_model` is called, inside `strategy.scope()`): replica 0's
    context on its device. The model then traces as it does in
    `strategy.run` (in cross-replica context a Keras batch norm updates its
    moving statistics on every device, an update the fold pass does not
    recognise), and the plan makes the ranges the replicas' traces read.
    """
    if not tf.distribute.has_strategy() or not tf.distribute.in_cross_replica_context():
        return None
    strategy = tf.distribute.get_strategy()
    if strategy.num_replicas_in_sync < 2:
        return None
    stack = contextlib.ExitStack()
    stack.enter_context(tf.distribute.ReplicaContext(strategy, replica_id_in_sync_group=0))
    stack.enter_context(tf.device(strategy.extended.worker_devices[0]))
    return stack


def model_strategy(model) -> Optional[tf.distribute.Strategy]:
    """The strategy the model's variables were made under, or None."""
    try:
        variables = list(getattr(model, "variables", None) or ())
    except (AttributeError, ValueError, TypeError):
        return None
    for v in variables:
        v = getattr(v, "value", v) if not isinstance(v, tf.Variable) else v
        if _is_distributed(v):
            return v._distribute_strategy  # pylint: disable=protected-access
    return None


def creation_scope(model):
    """Where `quantize_model` makes the model's ranges: under the strategy of
    the model's variables when no strategy is active (the model was built
    under `strategy.scope()`, quantized outside it)."""
    strategy = model_strategy(model)
    if strategy is not None and not tf.distribute.has_strategy():
        return strategy.scope()
    return contextlib.nullcontext()


def container(variable: tf.Variable) -> tf.Variable:
    """The distributed variable a component belongs to, or `variable`."""
    ref = getattr(variable, "_distributed_container", None)
    found = ref() if callable(ref) else None
    return found if found is not None else variable


class TraceReplication(replication.Replication):
    """The quantize pass's replication hook in a quantized model's trace.

    Under a strategy every replica traces the model on its own (one model per
    trace, its variables captured), so nothing in a trace is a replica of
    anything else: what joins the replicas is the all-reduce of a training
    trace's step statistics (`all_reduce_for_trace`; none for the plan,
    which is traced, never run).

    Args:
      store: the model's `qat.tf2.ranges.RangeStore`.
    """

    def __init__(self, store):
        self._store = store

    def all_reduce(self):
        return None if self._store.planning else all_reduce_for_trace()
