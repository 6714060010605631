"""Planning the quantize pass: which tensors get a range, named how.

The plan is tensor-centric. `Planner` visits the data path in graph order and
decides for every float tensor, from the op that produces it and the ops
that read it (`qat.quantize.plan.op_table`, TFLite's integer op requirements),
whether it needs a range. A tensor gets at most one quantizer, at its
producer, and every consumer reads the quantized value: never a raw path
beside a quantized one.

* Layers (Conv2D, DepthwiseConv2dNative, MatMul, transposed conv): their
  weights (`<ctx>/weights_quant`), their data input, and their output after
  the tail (bias add, folded batch norm): `<ctx>/act_quant`, or
  `<ctx>/conv_quant` when a residual add reads it. A RELU / RELU6 (or a
  `tf.maximum(x, 0)`, `qat.quantize.plan.clamps`) that is the sole reader of a
  layer, ADD or SUB output is fused by TFLite: the range goes after it
  instead (`<ctx>/act_quant`).
* OWN_RANGE ops (ADD, MUL, MEAN, CONCATENATION, LEAKY_RELU, an unfused RELU,
  ...) whose float data inputs all have ranges: their output, named
  `<op scope>/<kind>` (`add_quant`, `mul_quant`, `mean_quant`, ...;
  `post_activation_bypass_quant` for an add reading an activation).
* Activations written as several ops (hard-swish, GELU;
  `qat.quantize.plan.activation_patterns`): their output only (`act_quant`), so
  the converter makes each one integer HARD_SWISH / GELU op.
* Same-scale ops (pools, reshapes, pads, ...) and training-only dropout get
  no range of their own; fixed-range ops (LOGISTIC, TANH, SOFTMAX) a constant
  one, their kernel's grid, where the model reads them
  (`qat.quantize.plan.fixed_ranges`).
* A tensor an integer op reads that has no range yet (a model source, found
  by structure whatever feeds it: `qat.quantize.plan.feeds`; a tensor from
  outside `scope`): `<scope of its first model reader>/input_quant` (what
  feeds the model differs between its training and export graphs).
* Nothing outside the model (`qat.quantize.plan.boundary`, decided once):
  loss arithmetic gets no range and no warning; arithmetic after the
  model's last range that something else reads is named in `left_float`.
* Batch norms after no layer: `qat.quantize.emit.standalone_batch_norm`.
* A concatenation and its inputs share one range; average pools and
  bilinear resizes round to their input's range:
  `qat.quantize.plan.shared_ranges`.

Names derive from the producing op (for a tensor entering the model, from
the model op that reads it), never from what only one of the graphs has:
ops that exist only in training graphs (gradients, dropout, the loss) are
looked through, so training and eval graphs plan the same names. What is left in float, and
why, is listed in `Planner.left_float`.
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf

from qat.engine import marks
from qat.matching import standalone_batch_norms
from qat.matching import tensors
from qat.quantize.plan import boundary
from qat.quantize.plan import control_flow
from qat.quantize.plan import embeddings as plan_embeddings
from qat.quantize.plan import entries
from qat.quantize.plan import fixed_ranges
from qat.quantize.plan import graph as plan_graph
from qat.quantize.plan import kernel_requirements
from qat.quantize.plan import op_table
from qat.quantize.plan import patterns as qp
from qat.quantize.plan import recurrences
from qat.quantize.plan import replication as replication_lib
from qat.quantize.plan import rules
from qat.quantize.plan import shared_ranges
from qat.quantize.plan import structures as plan_structures
from qat.quantize.plan import weights as plan_weights
from qat.quantize.plan.graph import existing_quantizer
from qat.quantize.plan.graph import is_quantized_output

_is_float = plan_graph.is_float

_AFTER_MODEL_REASON = (
    "after the model: %s reads the model's %s, but is not a model op "
    "(arithmetic with a constant, or a combination of model tensors or with "
    "a tensor the model does not compute, that only a loss or nothing reads); "
    "it stays float after the model's last range. Name the output with "
    "tf.identity to make it the model's (docs/known_limits.md)")
_FUSED_RECURRENCE_REASON = (
    "%s is a whole recurrent layer in one cuDNN op: TFLite has no kernel for it and qat "
    "cannot quantize its steps. Build the layer on its generic path: Keras 3 LSTM / GRU "
    "with use_cudnn=False (qat.quantize_model traces them so), tf.compat.v1 cells "
    "(tf.compat.v1.nn.rnn_cell) with static_rnn or dynamic_rnn (docs/recurrent_models.md)")


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
    # Shared ranges (`qat.quantize.plan.shared_ranges`): the plan whose range this
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
    # A constant range, TFLite's fixed output grid (`qat.quantize.plan.fixed_ranges`).
    fixed: Optional[Tuple[float, float]] = None
    # TFLite kernel preconditions this range must meet, on the plan owning its
    # variables (`qat.quantize.plan.kernel_requirements.Requirement`).
    requirements: List = dataclasses.field(default_factory=list)
    # The name scope of its variables when not `prefix`: a recurrence's range
    # is named after its first step (`qat.quantize.plan.recurrences`).
    variables_prefix: Optional[str] = None


class Planner(rules.RangeRules, entries.EntryPlanning,
              plan_structures.StructurePlanning, plan_weights.WeightPlanning,
              plan_embeddings.EmbeddingPlanning, plan_graph.GraphView):
    """Plans the quantizers of one graph without changing it.

    `replication` (`qat.quantize.plan.replication`): how replicas of the
    model in the graph share ranges; by default there are none.
    """

    def __init__(self, graph, is_training, scope, per_channel,
                 per_channel_matmul=None,
                 replication: replication_lib.Replication = replication_lib.SINGLE_MODEL):
        super().__init__(graph)
        self.replication = replication
        self.is_training = is_training
        self.scope = scope
        self.per_channel = per_channel
        # Matmul weights per channel too (default: as `per_channel`).
        self.per_channel_matmul = (per_channel if per_channel_matmul is None
                                   else per_channel_matmul)
        self.plans: "collections.OrderedDict[tf.Tensor, Plan]" = (
            collections.OrderedDict())
        self.prefixes: Set[str] = set()
        self.weight_plans: Dict[object, Plan] = {}
        self.standalone_bns: List[tf.Operation] = []
        # Final adds of standalone batch norms written as arithmetic.
        self.unfused_batch_norms: Set[tf.Operation] = set()
        # Statistics arithmetic of such batch norms -> their final add.
        self.batch_norm_of: Dict[tf.Operation, tf.Operation] = {}
        # (tensor or op name, reason) for what the plan leaves in float.
        self.left_float: List[Tuple[str, str]] = []
        self._left: Set[str] = set()
        self.tails: Dict[tf.Operation, Set[tf.Operation]] = {}
        self.outputs: Dict[tf.Operation, Optional[tf.Tensor]] = {}
        self.tail_ops: Set[tf.Operation] = set()
        self.fused: Set[tf.Operation] = set()       # activations fused before
        # Inside an activation written as several ops (hard-swish, GELU).
        self.interior: Set[tf.Operation] = set()
        # Output op of such an activation -> its input.
        self.whole_activations: Dict[tf.Operation, tf.Tensor] = {}
        self.looked_through: Dict[tf.Operation, tf.Tensor] = {}  # dropout
        # Output op of an activation written as several ops -> the ops inside.
        self.activation_interiors: Dict[tf.Operation, Set[tf.Operation]] = {}
        # Ops visited before their inputs had ranges (`_revisit_deferred`).
        self._deferred: List[tf.Operation] = []
        self._named_last: List[Tuple[Plan, str]] = []  # (plan, name), `_plan(shares=...)`
        # (context, op type, inputs, output index) -> plans owning a range there
        # (`_identical_in_context`).
        self._computed: Dict[tuple, List[Plan]] = {}
        self._same_scale_ops: Dict[tf.Operation, bool] = {}
        # The steps of recurrent layers (`qat.quantize.plan.recurrences`).
        self.steps = recurrences.Steps()

    # --- Helpers ------------------------------------------------------------

    def _in_scope(self, op: tf.Operation) -> bool:
        return not self.scope or op.name.startswith(self.scope)

    def _leave(self, name: str, reason: str) -> None:
        if name not in self._left:
            self._left.add(name)
            self.left_float.append((name, reason))

    def _unique_prefix(self, prefix: str) -> str:
        candidate, i = prefix, 0
        # Unique within this plan; QuantizerBatch makes it free in the graph.
        while candidate in self.prefixes:
            i += 1
            candidate = "%s_%d" % (prefix, i)
        self.prefixes.add(candidate)
        return candidate

    def _has_range(self, t: tf.Tensor) -> bool:
        return (t in self.plans or is_quantized_output(t)
                or existing_quantizer(t)[0] is not None)

    def _plan(self, t: tf.Tensor, ctx: str, kind: str, init_min: float,
              consumers: List[tf.Operation], is_weight: bool = False,
              per_channel: bool = False, allow_unused: bool = False,
              shares: Optional[Plan] = None) -> bool:
        """Plans a range on `t` named `<ctx>/<kind>` (numbered when taken).

        `shares`: the plan whose range this one reads. Such a quantizer owns
        no variables and is named after every visit's range, so its name
        never shifts the numbers of the ranges that own variables (a reader
        only the training graph has would otherwise rename the eval graph's).
        """
        if self._has_range(t) or not _is_float(t):
            return False
        if not consumers and not allow_unused:
            return False
        key = (ctx, t.op.type, tuple(t.op.inputs), t.value_index)
        if shares is None and not is_weight:
            shares = self._identical_in_context(t, key)
        base = plan_graph.join(ctx, kind)
        plan = Plan(t, "" if shares is not None else self._unique_prefix(base), is_weight,
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
        graphs alike, and takes no number there (`_plan(shares=...)`). Were it
        numbered, a reader only the training graph has, made before the
        model's identical op in the model's scope (an auxiliary head's ReLU of
        a cell output the next cell's ReLU reads), would shift the numbers of
        every later range of that scope, and the eval graph would restore
        another tensor's range under each of those names. Identical ops in
        different contexts each keep their numbered name
        (`shared_ranges.share_identical_outputs`).
        """
        if t.op.type in shared_ranges.CONCAT_TYPES:
            return None  # A concatenation's group is planned apart.
        for plan in self._computed.get(key, ()):
            if (plan.shared is None and plan.fixed is None and not plan.members
                    and tensors.same_computation(plan.tensor.op, t.op)):
                return plan
        return None

    def visit(self, op: tf.Operation) -> None:
        if (op in self.tail_ops and op not in self.tails) or op in self.fused \
                or op in self.interior or op in self.looked_through:
            return
        if op in self.tails:
            self.visit_layer(op)
            return
        if not self._in_scope(op) or not op.outputs:
            return
        if marks.made_by_qat(op, marks.QUANTIZER, marks.QUANTIZER_OUTPUT):
            return  # An earlier call's quantizer (a second call): never a float layer.
        if marks.is_replaced(op):
            return  # Unconnected: a rewrite moved its consumers.
        if op not in self.model:
            self._after_model(op)
            return  # Loss arithmetic, or after the model: no range (`boundary`).
        if (op.type in qp.BATCH_NORM_TYPES or op in self.unfused_batch_norms
                or (op.type in op_table.FUNCTIONAL_TYPES
                    and standalone_batch_norms.is_batch_norm_cond(
                        op, self.function_library()))):
            self.plan_standalone_batch_norm(op)
        elif op in self.whole_activations:
            self.visit_whole_activation(op, self.whole_activations[op])
        elif self._same_scale(op) and op.type not in op_table.SAME_SCALE_TYPES:
            return  # The converter removes it (`converter_rewrites`).
        elif op.type in op_table.OWN_RANGE_TYPES:
            self.visit_own_range(op)
        elif self._is_constant_division(op):
            self.visit_constant_division(op)
        elif op.type in op_table.FIXED_RANGE_TYPES:
            fixed_ranges.plan(self, op)
        elif (op.type in op_table.SAME_SCALE_TYPES
              or op.type in op_table.FIXED_RANGE_TYPES
              or op.type in qp.METADATA_TYPES):  # Read shapes, not values.
            return
        elif op.type in op_table.FUSED_RECURRENCE_TYPES:
            self._leave(op.name, _FUSED_RECURRENCE_REASON % op.type)
        elif any(self._is_ranged(i) for i in op.inputs if self.is_data(i)
                 and _is_float(i)):
            if op.type in op_table.FUNCTIONAL_TYPES:
                reason = "functional control flow (%s): not visible" % op.type
            else:
                reason = "%s has no integer TFLite kernel in qat's table" % op.type
            self._leave(op.name, reason)

    def _after_model(self, op: tf.Operation) -> None:
        """Names an op after the model that reads a model output (`boundary`)."""
        if (op not in self.after_model or self._same_scale(op)
                or op.type in qp.METADATA_TYPES or op.type in op_table.FUNCTIONAL_TYPES):
            # A same-scale op keeps the range it reads (a reshape of the softmax);
            # the layers inside a function call are named apart (`control_flow`).
            return
        read = [i.name for i in op.inputs if self.is_data(i) and _is_float(i)
                and self._source(i).op in self.model]
        if not read:
            return
        if boundary.has_integer_kernel(op):
            self._leave(op.name, _AFTER_MODEL_REASON % (op.type, ", ".join(read)))
        else:
            self._leave(op.name, "%s has no integer TFLite kernel in qat's table (it reads "
                        "the model's %s)" % (op.type, ", ".join(read)))

    # --- Driver -------------------------------------------------------------

    def run(self) -> List[Plan]:
        for layer in self.gradient_layers:
            self._leave(layer.name, "gradient op")
        layers = [op for op in self.layers if self._in_scope(op)]
        for layer in layers:
            self.plan_weights(layer)
        ordered = self.ordered_ops()
        self._find_structures(ordered)
        for layer in self.layers:
            tail, out = self.walk_tail(layer, stop=self.interior)
            self.tails[layer], self.outputs[layer] = tail, out
            self.tail_ops |= tail
        boundary.find_boundary(self, self.tail_ops, self.whole_activations,
                               self.activation_interiors, self.looked_through)
        # A tail never reaches past the model (a constant the loss adds to the logits).
        outside = self.tail_ops - self.model
        if outside:
            self.tail_ops = set()
            for layer in self.layers:
                if self.tails[layer] & outside:
                    tail, out = self.walk_tail(layer, stop=self.interior | outside)
                    self.tails[layer], self.outputs[layer] = tail, out
                self.tail_ops |= self.tails[layer]
        self._find_batch_statistics(ordered)
        self.plan_embeddings()
        self.steps = recurrences.find(self)
        for op in ordered:
            self.visit(op)
        self._revisit_deferred()
        for plan, base in self._named_last:
            plan.prefix = self._unique_prefix(base)
        shared_ranges.plan(self, ordered)
        return self.replication.share(self, list(self.plans.values()))


@dataclasses.dataclass
class PlannedGraph:
    """The planner's decisions for one graph, what the emitter builds from.

    Attributes:
      plans: every quantizer to build, in planning order.
      left_float: (tensor or op name, reason) for what stays float: the
        planner's, then the layers inside functional control flow.
      standalone_bns: batch norms after no layer (eval graphs give them a
        depthwise form, `qat.quantize.emit.standalone_batch_norm`).
    """
    plans: List[Plan]
    left_float: List[Tuple[str, str]]
    standalone_bns: List[tf.Operation]


def plan_quantizers(graph: tf.Graph, config,
                    replication: replication_lib.Replication = replication_lib.SINGLE_MODEL
                    ) -> PlannedGraph:
    """Plans the quantize pass on a prepared graph, without changing it.

    Args:
      graph: the graph (after `qat.prepare` and the fold).
      config: the pass's validated `qat.engine.config.RewriteConfig`.
      replication: how replicas in the graph share ranges.
    """
    planner = Planner(graph, config.is_training, config.scope,
                      config.conv_weights_per_channel(),
                      per_channel_matmul=config.matmul_weights_per_channel(),
                      replication=replication)
    plans = planner.run()
    kernel_requirements.attach(planner, plans)
    left_float = list(planner.left_float)
    # Layers inside functional control flow (If / While bodies, functions
    # called from the graph) are not rewritten: each is named.
    left_float += [(f"{layer.function}/{layer.layer}", layer.describe())
                   for layer in control_flow.find_function_layers(graph)
                   if not config.scope or layer.call_op.startswith(config.scope)]
    return PlannedGraph(plans=plans, left_float=left_float,
                        standalone_bns=list(planner.standalone_bns))
