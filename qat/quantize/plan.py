"""Planning the quantize pass: which tensors get a range, named how.

The plan is tensor-centric. `Planner` visits the data path in graph order and
decides for every float tensor, from the op that produces it and the ops
that read it (`qat.quantize.op_table`, TFLite's integer op requirements),
whether it needs a range. A tensor gets at most one quantizer, at its
producer, and every consumer reads the quantized value: never a raw path
beside a quantized one.

* Layers (Conv2D, DepthwiseConv2dNative, MatMul, transposed conv): their
  weights (`<ctx>/weights_quant`), their data input, and their output after
  the tail (bias add, folded batch norm): `<ctx>/act_quant`, or
  `<ctx>/conv_quant` when a residual add reads it. A RELU / RELU6 (or a
  `tf.maximum(x, 0)`, `qat.quantize.clamps`) that is the sole reader of a
  layer, ADD or SUB output is fused by TFLite: the range goes after it
  instead (`<ctx>/act_quant`).
* OWN_RANGE ops (ADD, MUL, MEAN, CONCATENATION, LEAKY_RELU, an unfused RELU,
  ...) whose float data inputs all have ranges: their output, named
  `<op scope>/<kind>` (`add_quant`, `mul_quant`, `mean_quant`, ...;
  `post_activation_bypass_quant` for an add reading an activation).
* Activations written as several ops (hard-swish, GELU;
  `qat.quantize.activation_patterns`): their output only (`act_quant`), so
  the converter makes each one integer HARD_SWISH / GELU op.
* Same-scale ops (pools, reshapes, pads, ...) and training-only dropout get
  no range of their own; fixed-range ops (LOGISTIC, TANH, SOFTMAX) a constant
  one, their kernel's grid, where the model reads them
  (`qat.quantize.fixed_ranges`).
* A tensor an integer op reads that has no range yet (a graph input, a
  tensor from outside `scope`): `<scope of its first model reader>/input_quant`
  (what feeds the model differs between its training and export graphs).
* Loss arithmetic (`GraphView.loss_ops`, walked back from the scalars it
  reduces to): no range, no warning.
* Batch norms after no layer: `qat.quantize.standalone_batch_norm`.
* A concatenation and its inputs share one range; average pools and
  bilinear resizes round to their input's range:
  `qat.quantize.shared_ranges`.

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
from qat.quantize import clamps
from qat.quantize import fixed_ranges
from qat.quantize import op_table
from qat.quantize import patterns as qp
from qat.quantize import plan_embeddings
from qat.quantize import plan_graph
from qat.quantize import plan_structures
from qat.quantize import plan_weights
from qat.quantize import replicas as replicas_lib
from qat.quantize import shared_ranges
from qat.quantize import standalone_batch_norm
from qat.quantize.plan_graph import existing_quantizer  # pylint: disable=unused-import
from qat.quantize.plan_graph import is_quantized_output

_context = plan_graph.context
_is_float = plan_graph.is_float


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
    # Shared ranges (`qat.quantize.shared_ranges`): the plan whose range this
    # one reads (no variables of its own); as that plan's FakeQuant reads it,
    # or, for a member of a concatenation's group, as before the update.
    shared: Optional["Plan"] = None
    before_update: bool = False
    # A group's own plan: the other members, whose statistics join its own.
    members: List[tf.Tensor] = dataclasses.field(default_factory=list)
    earlier: Optional[tuple] = None  # An earlier call's range (`qat.quantize.replica_stats`).
    # A constant range, TFLite's fixed output grid (`qat.quantize.fixed_ranges`).
    fixed: Optional[Tuple[float, float]] = None


class Planner(plan_structures.StructurePlanning, plan_weights.WeightPlanning,
              plan_embeddings.EmbeddingPlanning, plan_graph.GraphView):
    """Plans the quantizers of one graph without changing it."""

    def __init__(self, graph, is_training, scope, per_channel,
                 per_channel_matmul=None):
        super().__init__(graph)
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
        # Ops visited before their inputs had ranges (`_revisit_deferred`).
        self._deferred: List[tf.Operation] = []
        self._same_scale_ops: Dict[tf.Operation, bool] = {}

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
              per_channel: bool = False, allow_unused: bool = False) -> bool:
        if self._has_range(t) or not _is_float(t):
            return False
        if not consumers and not allow_unused:
            return False
        self.plans[t] = Plan(t, self._unique_prefix(plan_graph.join(ctx, kind)),
                              is_weight, init_min, consumers, per_channel)
        return True

    def _source(self, t: tf.Tensor) -> tf.Tensor:
        """The tensor whose range `t` has: back through same-scale ops."""
        for _ in range(10000):
            if self._has_range(t):
                return t
            op = t.op
            if self.entries.get(op) is not None:
                return self.entries[op]  # A lookup's output has its table's scale.
            if op in self.looked_through:
                if not self.is_data(self.looked_through[op]):
                    return t  # Dropout of what is not data: as its eval Identity.
                t = self.looked_through[op]
                continue
            if (not self._same_scale(op)
                    or (op in self.tail_ops and op.type != "Identity")
                    or op not in self.data_ops):
                return t
            index = op_table.same_scale_input(op, t.value_index)
            data = [i for i in op.inputs if self.is_data(i)]
            if index < len(op.inputs) and self.is_data(op.inputs[index]):
                t = op.inputs[index]
            elif len(data) == 1:
                t = data[0]
            else:
                return t
        return t

    def _is_ranged(self, t: tf.Tensor) -> bool:
        """True if `t` reaches TFLite with a scale (learnt, fixed or constant)."""
        s = self._source(t)
        if self._has_range(s) or not self.is_data(s) or s.op in self.interior:
            return True
        if s.op.type in op_table.FIXED_RANGE_TYPES:
            return self._is_ranged(s.op.inputs[0])
        return False

    def _is_input(self, t: tf.Tensor) -> bool:
        return self._source(t).op.type in qp.INPUT_TYPES

    def _require(self, t: tf.Tensor) -> None:
        """Gives `t` a range if it has none, at its source, for all readers."""
        if self._is_ranged(t):
            return
        s = self._source(t)
        if not _is_float(s):
            self._leave(s.name, "dtype %s: FakeQuant takes float32, float16 or bfloat16 only"
                        % s.dtype.name)
            return
        self._plan(s, self._entry_context(s), "input_quant", -6.0,
                   self.consumers(s))

    def _entry_context(self, s: tf.Tensor) -> str:
        """Where the range of a tensor entering the model is named.

        What feeds a model differs between the graphs of one model (a tf.data
        iterator while training, a placeholder in the export graph, other
        preprocessing), so the range is named after the model op that reads
        it first, which both graphs share: `<reader scope>/input_quant`.
        """
        # A batch norm reads its input for statistics in training graphs
        # only: it reads it where its final add is.
        readers = [self.batch_norm_of.get(r, r) for r in self._final_readers(s)
                   if r in self.inference_ops]
        readers = replicas_lib.behind_batch_splits(readers, self._final_readers)
        if not readers:
            return plan_graph.own_context(s.op)
        return plan_graph.own_context(min(readers, key=lambda o: o._id))  # pylint: disable=protected-access

    def _final_readers(self, t: tf.Tensor, exclude=()) -> List[tf.Operation]:
        """Readers of `t`, through ops TFLite drops (Identity, dropout)."""
        found, stack, seen = [], [t], set()
        while stack:
            for c in self.readers(stack.pop(), exclude):
                if c in seen:
                    continue
                seen.add(c)
                if c in self.looked_through:
                    stack.append(c.outputs[0])
                elif c.type == "Identity":
                    stack.append(c.outputs[0])
                else:
                    found.append(c)
        return found

    def _plan_output(self, out: tf.Tensor, ctx: str, kind: str,
                     init_min: float, exclude=(),
                     allow_unused: bool = True, fusable: bool = True) -> None:
        """A range on `out`, or after the activation that is its sole reader."""
        readers = self._final_readers(out, exclude)
        if (fusable and len(readers) == 1
                and (readers[0].type in op_table.FUSABLE_ACTIVATION_TYPES
                     or clamps.is_relu(readers[0], self.is_data))
                and self._in_scope(readers[0])):
            act = readers[0]
            self.fused.add(act)
            act_out = act.outputs[0]
            self._plan(act_out, ctx, "act_quant", 0.0, self.consumers(act_out),
                       allow_unused=True)
            return
        consumers = self.consumers(out, exclude)
        self._plan(out, ctx, kind, init_min, consumers,
                   allow_unused=allow_unused)

    # --- Layers -------------------------------------------------------------

    def _residual_adds(self, t: tf.Tensor, exclude) -> List[tf.Operation]:
        readers = self._final_readers(t, exclude)
        # An eval graph's atrous layer output is read through the
        # BatchToSpaceND the training graph has before its batch norm.
        readers += [c for b in readers if b.type == "BatchToSpaceND"
                    for c in self._final_readers(b.outputs[0])]
        return [c for c in readers
                if c.type in qp.RESIDUAL_ADD_TYPES and len(c.inputs) == 2
                and all(self.is_data(i) for i in c.inputs)]

    def visit_layer(self, layer: tf.Operation) -> None:
        if not self._in_scope(layer):
            self._leave(layer.name, "outside scope %r" % self.scope)
            return
        self._require(qp.data_input(layer))
        tail, out = self.tails[layer], self.outputs[layer]
        if out is None:
            return
        ctx = _context(layer)
        # An Identity after the tail (`tf.identity(logits, name="output")`)
        # reads the range, so the model output the user fetches or exports
        # under that name is the quantized value; one of the fold's own can
        # end the tail (after its functional cond): the range goes before it.
        exclude = {op for op in tail if op.type != "Identity"}
        while out.op.type == "Identity" and out.op in tail and out.op is not layer:
            out = out.op.inputs[0]
        kind = ("conv_quant" if self._residual_adds(out, exclude)
                else "act_quant")
        # TFLite fuses an activation into the layer op only when nothing
        # reshapes in between (a Conv1D's Squeeze, a Reshape before a batch
        # norm): then the eval graph's layer output is the reshaped one.
        # Nor across an atrous conv's BatchToSpaceND, which eval graphs have
        # between the layer output and the activation.
        fusable = (out.shape.rank == layer.outputs[0].shape.rank
                   and not any(op.type == "BatchToSpaceND" for op in tail))
        if fusable:
            out = self._fold_constant_adds(out, exclude)
        self._plan_output(out, ctx, kind, -6.0, exclude=exclude,
                          fusable=fusable)

    # --- Other ops ----------------------------------------------------------

    def _add_kind(self, op: tf.Operation) -> str:
        if op.type in qp.RESIDUAL_ADD_TYPES and len(op.inputs) == 2:
            for i in op.inputs:
                # Back through what TFLite drops: quantizers, Identity, dropout.
                for _ in range(100):
                    if i.op in self.looked_through:
                        i = self.looked_through[i.op]
                    elif i.op.type == "Identity" or is_quantized_output(i):
                        i = i.op.inputs[0]
                    else:
                        break
                if i.op.type in op_table.ACTIVATION_TYPES:
                    return "post_activation_bypass_quant"
        return op_table.RANGE_NAMES.get(op.type, op_table.DEFAULT_RANGE_NAME)

    def visit_own_range(self, op: tf.Operation) -> None:
        data = [i for i in op.inputs if self.is_data(i)]
        if not data or (op.type in op_table.REDUCTION_TYPES
                        and op.outputs[0].shape.rank == 0):
            return
        if self.feeds_only_state_updates(op):
            return  # Arithmetic of a variable update (moving averages), not model data.
        ranged = [self._is_ranged(i) for i in data]
        ok = all(r or (self._is_input(i) and op in self.model_ops)
                 for r, i in zip(ranged, data))
        if not ok:
            self._deferred.append(op)
            if any(ranged):
                missing = [i.name for r, i in zip(ranged, data) if not r]
                self._leave(op.name, "%s reads %s, which has no range"
                            % (op.type, ", ".join(missing)))
            return
        non_float = [i for i in data if not _is_float(i)]
        if non_float or not _is_float(op.outputs[0]):
            self._leave(op.name, "dtype %s: FakeQuant takes float32, float16 or bfloat16 only"
                        % op.outputs[0].dtype.name)
            return
        for i in data:
            self._require(i)
        self._plan_parameters(op)
        init_min = 0.0 if op.type in ("Relu", "Relu6") else -6.0
        kind = self._add_kind(op)
        if op.type in op_table.FUSING_TYPES:
            self._plan_output(op.outputs[0], plan_graph.own_context(op), kind,
                              init_min)
        else:
            out = op.outputs[0]
            self._plan(out, plan_graph.own_context(op), kind, init_min,
                       self.consumers(out), allow_unused=True)

    def visit(self, op: tf.Operation) -> None:
        if (op in self.tail_ops and op not in self.tails) or op in self.fused \
                or op in self.interior or op in self.looked_through:
            return
        if op in self.tails:
            self.visit_layer(op)
            return
        if not self._in_scope(op) or not op.outputs:
            return
        if op in self.loss:
            return  # Loss arithmetic: no reader needs a range.
        if marks.made_by_qat(op, marks.QUANTIZER, marks.QUANTIZER_OUTPUT):
            return  # An earlier call's quantizer (a second call): never a float layer.
        if marks.is_replaced(op):
            return  # Unconnected: a rewrite moved its consumers.
        if (op.type in qp.BATCH_NORM_TYPES or op in self.unfused_batch_norms
                or (op.type in op_table.FUNCTIONAL_TYPES
                    and standalone_batch_norm.is_batch_norm_cond(
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
        elif any(self._is_ranged(i) for i in op.inputs if self.is_data(i)
                 and _is_float(i)):
            if op.type in op_table.FUNCTIONAL_TYPES:
                reason = "functional control flow (%s): not visible" % op.type
            else:
                reason = "%s has no integer TFLite kernel in qat's table" % op.type
            self._leave(op.name, reason)

    # --- Driver -------------------------------------------------------------

    def _belongs_to_model(self, op: tf.Operation) -> bool:
        """Ops that end a model wherever they are (see `loss_ops`)."""
        return (op in self.tail_ops or op in self.whole_activations
                or op.type in op_table.ACTIVATION_TYPES
                or op.type in op_table.FIXED_RANGE_TYPES
                or op.type in op_table.SAME_SCALE_TYPES
                or op.type in qp.INPUT_TYPES)

    def run(self) -> List[Plan]:
        for layer in self.gradient_layers:
            self._leave(layer.name, "gradient op")
        layers = [op for op in self.layers if self._in_scope(op)]
        for layer in layers:
            self.plan_weights(layer)
        self.plan_embeddings()
        ordered = sorted(self.data_ops, key=lambda o: o._id)  # pylint: disable=protected-access
        self._find_structures(ordered)
        for layer in self.layers:
            tail, out = self.walk_tail(layer, stop=self.interior)
            self.tails[layer], self.outputs[layer] = tail, out
            self.tail_ops |= tail
        self._find_batch_statistics(ordered)
        self.loss = self.loss_ops(self._belongs_to_model)
        for op in ordered:
            self.visit(op)
        self._revisit_deferred()
        shared_ranges.plan(self, ordered)
        return replicas_lib.share(self, list(self.plans.values()))
