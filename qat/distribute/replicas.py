"""Data-parallel replicas in one graph share one range per tensor.

Why this module exists: TF1's multi-GPU towers (`tf.name_scope("tower_%d")`
with `variable_scope(reuse=True)`), TF-Slim's `model_deploy` clones and
`tf.distribute.MirroredStrategy` (graph mode, `call_for_each_replica`) build
the model once per device. Planned per op, every replica got ranges of its
own (`tower_1/model/conv1/act_quant/*`), a name the single-replica eval graph
does not have, so its strict `Saver()` restore failed.

Recognising replicas (structure, not names): layer ops whose weights come
from the same variables (one variable read by several layers, or the
components of one `tf.distribute` variable) are replicas of one layer. The
name scope that distinguishes them is what is left of each op name once
their common trailing scopes are removed (`tower_0/`, `tower_1/`; `""` and
`replica_1/` under a strategy). Every group of such layers must give the same
set of leading scopes, one per device or at least two groups: a layer applied
twice inside one model (shared weights under `conv` and `conv_1`) gives
another set per layer and is not a replica; nor are layers that feed each
other (a loop unrolled with shared weights), whose shared range update would
depend on its own result. A whole model applied twice to two inputs in one
graph (a siamese network) is recognised like replicas, in its training and
eval graphs alike: both applications share the ranges.

Sharing (`share`, after the planner's visits): plans whose names are equal
once their replica scope is removed are one range, owned by the first
replica's plan and named without the scope (`model/conv1/act_quant`), as the
single-replica eval graph names it. The other replicas' quantizers own no
variables; each keeps its FakeQuant on its own device. In training they move
the owner's range with their own replica's batch (`Plan.replica_of`); in
eval graphs they read it (`Plan.shared`). A weight read by layers on several
devices gets one quantizer per device (the weights are never read across
devices), all reading one range.

Combination rule: each step the shared range's update takes the min of the
replicas' batch mins and the max of their batch maxes, then one moving-average
step (weights: one last-value step). That is the range of the whole batch
the replicas split between them, so training with N replicas updates ranges
exactly as one replica training on the total batch would, whatever the
split; min and max are exact, so the result does not depend on the order of
the replicas (deterministic). The statistics of every range are combined at
once, after the forward (`qat.quantize.emit.step_statistics`): each replica
reduces its own tensors on its own device, and one packed vector per device
crosses devices. Each replica's forward reads the range moved by its own
batch, so no replica waits for another's statistics.

Called inside the replica function (contrib's model_fn style), the first call
sees one replica and plans as for one model; a later call finds the earlier
ranges by their names without the replica scope (`earlier_ranges`): its
quantizers read them and its batch statistics join their updates
(`qat.distribute.replica_stats`).
"""
import collections
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from qat.distribute import replica_stats
from qat.engine import marks
from qat.engine import placement
from qat.matching import layer_patterns
from qat.matching import tensors
from qat.quantize.plan.planner import Plan

# How many ops the backward search from a layer's weights visits at most.
_MAX_WEIGHT_SEARCH = 48


def canonical_variables(graph: tf.Graph) -> Dict[tf.Operation, str]:
    """Variable op -> the name of the variable it belongs to.

    A `tf.distribute` variable (MirroredVariable, SyncOnReadVariable) has
    one component variable per replica: all map to the distributed
    variable's name.
    """
    found: Dict[tf.Operation, str] = {}
    keys = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    for key in keys:
        for variable in graph.get_collection(key):
            components = getattr(variable, "values", None)
            if getattr(variable, "_primary", None) is not None and components:
                name = variable._primary.op.name  # pylint: disable=protected-access
                for component in components:
                    found[component.op] = name
            elif hasattr(variable, "op") and variable.op.type in placement.VARIABLE_OP_TYPES:
                found.setdefault(variable.op, variable.op.name)
    return found


def _weight_key(layer: tf.Operation, names: Dict[tf.Operation, str]
                ) -> FrozenSet[str]:
    """The user variables behind a layer's weights (not qat's own ranges)."""
    start = layer_patterns.weight_input(layer)
    queue = collections.deque([start.op])
    seen, key = set(), set()
    while queue and len(seen) < _MAX_WEIGHT_SEARCH:
        op = queue.popleft()
        if op in seen:
            continue
        seen.add(op)
        if op.type in placement.VARIABLE_OP_TYPES:
            if not marks.made_by_qat(op):
                key.add(names.get(op, op.name))
            continue
        inputs = list(op.inputs)
        if marks.made_by_qat(op) and op.type in tensors.FAKE_QUANT_TYPES:
            inputs = inputs[:1]  # An earlier call's quantizer: its input only.
        queue.extend(t.op for t in inputs)
    return frozenset(key)


def _split_name(names: Sequence[str]) -> Optional[List[str]]:
    """Each name's leading scopes not shared by all (None unless all differ)."""
    parts = [n.split("/") for n in names]
    common = 0
    while all(len(p) > common for p in parts) and len(
            {p[-1 - common] for p in parts}) == 1:
        common += 1
    if common == 0:
        return None
    prefixes = ["/".join(p[:-common]) for p in parts]
    prefixes = [p + "/" if p else "" for p in prefixes]
    return prefixes if len(set(prefixes)) == len(prefixes) else None


class Replicas(object):
    """The replica scopes of a graph, found from its layers.

    Args:
      layers: the graph's layer ops (quantized ones included).
      graph: their graph.
      is_data: whether a tensor is on the data path (a MatMul of two
        activations, attention's scores, has no weights).
    """

    def __init__(self, layers: Sequence[tf.Operation], graph: tf.Graph,
                 is_data: Callable[[tf.Tensor], bool] = lambda t: False):
        names = canonical_variables(graph)
        groups: Dict[FrozenSet[str], List[tf.Operation]] = collections.OrderedDict()
        for layer in layers:
            if len(layer.inputs) < 2 or is_data(layer_patterns.weight_input(layer)):
                continue
            key = _weight_key(layer, names)
            if key:
                groups.setdefault(key, []).append(layer)
        prefix_sets = []
        devices_differ = False
        for members in groups.values():
            if len(members) < 2:
                continue
            prefixes = _split_name([op.name for op in members])
            if prefixes is None:
                prefix_sets.append(None)
                continue
            prefix_sets.append(frozenset(prefixes))
            devices_differ |= len({op.device for op in members}) == len(members)
        self.prefixes: List[str] = []
        if not prefix_sets or None in prefix_sets or len(set(prefix_sets)) != 1:
            return
        if len(prefix_sets) < 2 and not devices_differ:
            return
        first_op = {}
        for members in groups.values():
            for op in members:
                p = self._match(op.name, prefix_sets[0])
                if p is not None:
                    first_op[p] = min(first_op.get(p, op._id), op._id)  # pylint: disable=protected-access
        # Replica order: where each replica starts in the graph.
        prefixes = sorted(prefix_sets[0], key=lambda p: first_op.get(p, 0))
        if not _independent([[op for op in layers if self._match(op.name, prefixes) == p]
                             for p in prefixes]):
            logging.info("qat: layers under %s share weights but feed each other "
                         "(an unrolled loop): not replicas", prefixes)
            return
        self.prefixes = prefixes
        logging.info("qat: replicas found, scopes %s", self.prefixes)

    @staticmethod
    def _match(name: str, prefixes) -> Optional[str]:
        best = None
        for p in prefixes:
            if p and name.startswith(p) and (best is None or len(p) > len(best)):
                best = p
        if best is None and "" in prefixes:
            return ""
        return best

    def __bool__(self) -> bool:
        return len(self.prefixes) > 1

    def index(self, name: str) -> Optional[int]:
        """The replica an op or quantizer name belongs to (None: none)."""
        p = self._match(name, self.prefixes)
        return None if p is None else self.prefixes.index(p)

    def strip(self, name: str) -> Tuple[Optional[int], str]:
        """(replica index, `name` without its replica scope)."""
        k = self.index(name)
        if k is None:
            return None, name
        return k, name[len(self.prefixes[k]):]


def share(planner, plans: List) -> List:
    """Joins the plans of replicas of one tensor into one range (see above).

    Args:
      planner: the `qat.quantize.plan.Planner` that made `plans` (its
        `view` and `settings`).
      plans: its plans, in planning order.

    Returns:
      The plans, with one added per weight that layers on other devices read.
    """
    view = planner.view
    replicas = Replicas(view.layers, view.graph, view.is_data)
    if not replicas:
        return plans
    plans = plans + _split_weights_by_device(plans, replicas)
    groups: Dict[Tuple[str, bool], List] = collections.OrderedDict()
    for plan in plans:
        if plan.shared is not None or plan.fixed is not None:
            continue  # Reads its concatenation group's range, which joins here; or a constant.
        k, name = replicas.strip(plan.prefix)
        if k is None:
            continue
        groups.setdefault((name, plan.is_weight), []).append((k, plan))
    # Ranges of an earlier call, by their names without a replica scope (replica 0
    # of a strategy has none; a tower's keeps `tower_0/` in its variables' names),
    # with the join of its step statistics if it has one.
    is_training = planner.settings.is_training
    joins = replica_stats.statistics_joins(view.graph) if is_training else {}
    earlier = {replicas.strip(prefix)[1]: (found, joins.get(prefix))
               for prefix, found in replica_stats.earlier_ranges(view.graph).items()}
    for (name, _), members in groups.items():
        members.sort(key=lambda m: m[0])
        if len({k for k, _ in members}) != len(members):
            continue  # Two ranges of one replica: not replicas of one tensor.
        if name in earlier:
            # Built by an earlier call (the first replica's): moved by this
            # replica's batch and joined at its step statistics, or read and
            # joined range by range.
            found, join = earlier[name]
            for _, plan in members:
                plan.earlier, plan.earlier_join, plan.shared = found, join, None
                if join is None:
                    plan.members = []
            continue
        owner = members[0][1]
        owner.prefix = name
        for _, plan in members[1:]:
            if is_training:
                # Its own batch moves the range its forward reads; the update
                # combines every replica's statistics once per step.
                plan.replica_of = owner
                continue
            plan.shared, plan.before_update = owner, False
            plan.members = []
    return plans


def _split_weights_by_device(plans: List, replicas: Replicas) -> List:
    """A weight read by layers on other devices: one plan per device."""
    added = []
    for plan in plans:
        if not plan.is_weight:
            continue
        device = plan.consumers[0].device if plan.consumers else plan.tensor.op.device
        # Per device: (readers of the plan's own tensor, layers reading another read).
        by_device: Dict[str, Tuple[List, List]] = collections.OrderedDict()
        for layer in list(plan.consumers):
            if layer.device != device:
                plan.consumers.remove(layer)
                by_device.setdefault(layer.device, ([], []))[0].append(layer)
        for layer in list(plan.weight_sharers):
            if layer.device != device:
                plan.weight_sharers.remove(layer)
                by_device.setdefault(layer.device, ([], []))[1].append(layer)
        for readers, sharers in by_device.values():
            first = (readers + sharers)[0]
            k = replicas.index(first.name)
            scope = replicas.prefixes[k] if k is not None else ""
            tensor = plan.tensor if readers else sharers[0].inputs[1]
            consumers = readers if readers else sharers[:1]
            added.append(Plan(
                tensor=tensor, prefix=scope + replicas.strip(plan.prefix)[1],
                is_weight=True, init_min=plan.init_min, consumers=consumers,
                per_channel=plan.per_channel, depthwise=plan.depthwise,
                weight_sharers=sharers if readers else sharers[1:], shared=plan))
    return added


def _independent(replica_layers: List[List[tf.Operation]]) -> bool:
    """No replica's layers feed another's (else a shared update would be a cycle)."""
    for k, layers in enumerate(replica_layers):
        reached = tensors.forward_closure(layers)
        for j, others in enumerate(replica_layers):
            if j != k and any(op in reached for op in others):
                return False
    return True
