"""The plans of one graph: each range planned, how it is named, what stays float.

Why this module exists: every range rule writes its decisions into one
record, the `PlanBook`, and reads the others' back from it; the book is the
planner's one mutable state, and its contract is stated here rather than
spread over the rules:

* a tensor gets at most one plan: `plan` refuses a tensor that has a range
  already (planned here, or a quantizer an earlier call or the user built);
* names are unique within the book (`<ctx>/<kind>`, numbered when taken); a
  plan that reads another's range (`shares`) is named once every visit is
  done (`name_shared`), so it never shifts the numbers of the ranges that own
  variables;
* a plan's fields are set by the rule that made it and, after the visits,
  by the passes that share ranges (`shared_ranges`, `roundings`, the
  replication hook, kernel requirements); no plan is removed;
* `left_float` names each tensor or op once, with the reason it stays
  float; `unleave` takes a name back when its op is visited again.

`PlanSettings` are the pass's settings the rules read.
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf

from qat.matching import tensors
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model.graph import existing_quantizer
from qat.quantize.plan.model.graph import is_quantized_output
from qat.quantize.plan.ops import patterns as qp


@dataclasses.dataclass
class Plan:
    tensor: tf.Tensor
    prefix: str
    is_weight: bool
    init_min: float
    consumers: List[tf.Operation]  # Ops whose inputs are rerouted.
    per_channel: bool = False
    # Weights of a depthwise conv (read directly, or through the training
    # fold's unscale Mul): per channel means per `in * multiplier`.
    depthwise: bool = False
    # Layer ops reading the same weights through another read of the same
    # resource variable: their input 1 is set to the quantized weights.
    weight_sharers: List[tf.Operation] = dataclasses.field(default_factory=list)
    # Shared ranges (`qat.quantize.plan.ranges.shared_ranges`): the plan whose range this
    # one reads (no variables of its own); as that plan's FakeQuant reads it,
    # or, for a member of a concatenation's group, as before the update.
    shared: Optional["Plan"] = None
    before_update: bool = False
    # A group's own plan: the other members, whose statistics join its own.
    members: List[tf.Tensor] = dataclasses.field(default_factory=list)
    earlier: Optional[tuple] = None  # An earlier call's range (`qat.distribute.replica_stats`).
    # The join of that call's step statistics (`qat.quantize.emit.step_statistics`), or None.
    earlier_join: Optional[tf.Operation] = None
    # Training: another replica's plan, owning the range this one moves with
    # its own replica's batch (`qat.distribute.replicas`).
    replica_of: Optional["Plan"] = None
    # A constant range, TFLite's fixed output grid (`qat.quantize.plan.ranges.fixed_ranges`).
    fixed: Optional[Tuple[float, float]] = None
    # TFLite kernel preconditions this range must meet, on the plan owning its
    # variables (`qat.quantize.plan.kernels.kernel_requirements.Requirement`).
    requirements: List = dataclasses.field(default_factory=list)
    # The name scope of its variables when not `prefix`: a recurrence's range
    # is named after its first step (`qat.quantize.plan.model.recurrences`).
    variables_prefix: Optional[str] = None
    # Its bit width when a recipe decides it (`qat.quantize.plan.ranges.precisions`);
    # None: the rewrite's weight_bits / activation_bits.
    bits: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The settings of one quantize pass that the rules read.

    Attributes:
      is_training: a training graph (ranges learnt) or an eval graph.
      scope: only ops whose names start with it are planned (None or "": all).
      per_channel: conv weights per output channel.
      per_channel_matmul: matmul weights per output channel.
      precisions: each layer's precision under a recipe
        (`qat.quantize.plan.ranges.precisions.LayerPrecisions`), or None.
    """
    is_training: bool
    scope: Optional[str]
    per_channel: bool
    per_channel_matmul: bool
    precisions: Optional[object] = None

    def in_scope(self, op: tf.Operation) -> bool:
        """Whether `op` is planned: its name starts with `scope`, and it is
        in no layer a recipe keeps float."""
        return ((not self.scope or op.name.startswith(self.scope))
                and (self.precisions is None or not self.precisions.is_float_op(op)))

    def outside_reason(self, op: tf.Operation) -> str:
        """Why `op` is not planned (`in_scope` is False)."""
        if self.scope and not op.name.startswith(self.scope):
            return "outside scope %r" % self.scope
        return self.precisions.float_reason(op)


class PlanBook(object):
    """The plans of one graph and what stays float (see the module docstring).

    Attributes:
      plans: tensor -> its plan, in planning order.
      prefixes: the names taken.
      weight_plans: a weight (its resource variable, or the tensor) -> its plan.
      left_float: (tensor or op name, reason) for what the plan leaves in float.
      standalone_bns: batch norms after no layer, planned as such.
      fused: activations TFLite fuses into the op before them (their range
        is the op's).
    """

    def __init__(self):
        self.plans: "collections.OrderedDict[tf.Tensor, Plan]" = collections.OrderedDict()
        self.prefixes: Set[str] = set()
        self.weight_plans: Dict[object, Plan] = {}
        self.left_float: List[Tuple[str, str]] = []
        self.standalone_bns: List[tf.Operation] = []
        self.fused: Set[tf.Operation] = set()
        self._left: Set[str] = set()
        self._named_last: List[Tuple[Plan, str]] = []  # (plan, name), `plan(shares=...)`
        # (context, op type, inputs, output index) -> plans owning a range there
        # (`_identical_in_context`).
        self._computed: Dict[tuple, List[Plan]] = {}

    def leave(self, name: str, reason: str) -> None:
        """Names `name` in `left_float` with `reason` (once)."""
        if name not in self._left:
            self._left.add(name)
            self.left_float.append((name, reason))

    def unleave(self, name: str) -> None:
        """Takes `name` out of `left_float` (its op is visited again)."""
        if name in self._left:
            self._left.discard(name)
            self.left_float[:] = [e for e in self.left_float if e[0] != name]

    def unique_prefix(self, prefix: str) -> str:
        """`prefix`, numbered when taken; taken from then on."""
        candidate, i = prefix, 0
        # Unique within this plan; QuantizerBatch makes it free in the graph.
        while candidate in self.prefixes:
            i += 1
            candidate = "%s_%d" % (prefix, i)
        self.prefixes.add(candidate)
        return candidate

    def has_range(self, t: tf.Tensor) -> bool:
        """Whether `t` has a range: planned here, or a quantizer already built."""
        return (t in self.plans or is_quantized_output(t)
                or existing_quantizer(t)[0] is not None)

    def plan(self, t: tf.Tensor, ctx: str, kind: str, init_min: float,
             consumers: List[tf.Operation], is_weight: bool = False,
             per_channel: bool = False, allow_unused: bool = False,
             shares: Optional[Plan] = None) -> bool:
        """Plans a range on `t` named `<ctx>/<kind>` (numbered when taken).

        `shares`: the plan whose range this one reads. Such a quantizer owns
        no variables and is named after every visit's range, so its name
        never shifts the numbers of the ranges that own variables (a reader
        only the training graph has would otherwise rename the eval graph's).

        Returns:
          Whether a plan was made (not for a tensor with a range, one
          FakeQuant cannot take, or one nothing reads unless `allow_unused`).
        """
        if self.has_range(t) or not plan_graph.is_float(t):
            return False
        if not consumers and not allow_unused:
            return False
        key = (ctx, t.op.type, tuple(t.op.inputs), t.value_index)
        if shares is None and not is_weight:
            shares = self._identical_in_context(t, key)
        base = plan_graph.join(ctx, kind)
        plan = Plan(t, "" if shares is not None else self.unique_prefix(base), is_weight,
                    init_min, consumers, per_channel, shared=shares)
        if shares is not None:
            self._named_last.append((plan, base))
        elif not is_weight:
            self._computed.setdefault(key, []).append(plan)
        self.plans[t] = plan
        return True

    def _identical_in_context(self, t: tf.Tensor, key: tuple) -> Optional[Plan]:
        """The range of an op identical to t's (one type, inputs and attributes)
        in the same context, planned before it, if any.

        Such ops compute one value, and their ranges are named in one context:
        the later one reads the earlier one's range, in training and eval
        graphs alike, and takes no number there (`plan(shares=...)`). Were it
        numbered, a reader only the training graph has, made before the
        model's identical op in the model's scope (an auxiliary head's ReLU of
        a cell output the next cell's ReLU reads), would shift the numbers of
        every later range of that scope, and the eval graph would restore
        another tensor's range under each of those names. Identical ops in
        different contexts each keep their numbered name
        (`shared_ranges.share_identical_outputs`).
        """
        if t.op.type in qp.GROUP_SCALE_TYPES:
            return None  # A concatenation's group is planned apart.
        for plan in self._computed.get(key, ()):
            if (plan.shared is None and plan.fixed is None and not plan.members
                    and tensors.same_computation(plan.tensor.op, t.op)):
                return plan
        return None

    def name_shared(self) -> None:
        """Names the plans that read another's range (after every visit)."""
        for plan, base in self._named_last:
            plan.prefix = self.unique_prefix(base)
