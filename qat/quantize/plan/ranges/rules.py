"""The range rules of the visits: which tensor gets a range, where.

* `require`: a tensor an integer op reads gets a range at its source (back
  through same-scale ops, dropout, lookups: `RangeReader.source`), named
  after the model op that reads it first when it enters the model
  (`entries`).
* `plan_output`: an output's range, or the range after the activation that
  alone reads it (TFLite fuses RELU / RELU6 into the op before).
* `visit_layer`: a layer's data input and its output after the tail (bias
  add, folded batch norm, the constant adds the converter folds into the
  bias): `act_quant`, or `conv_quant` when a residual add reads it.
* `visit_own_range`: ops with a range of their own (ADD, MUL, MEAN,
  CONCATENATION, ...) whose data inputs all have ranges, and the parameters
  they compute with.

`qat.quantize.plan.planner` documents the rules as a whole; `structures`,
`weights`, `embeddings`, `fixed_ranges`, `roundings` and `shared_ranges`
hold the rest.
"""
from typing import List, Optional

import tensorflow as tf

from qat.matching import layer_patterns
from qat.matching import tensors
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import layout as layout_lib
from qat.quantize.plan.model.graph import is_quantized_output
from qat.quantize.plan.ops import clamps
from qat.quantize.plan.ops import converter_rewrites
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ops import patterns as qp
from qat.quantize.plan.ranges import book as book_lib
from qat.quantize.plan.ranges import entries
from qat.quantize.plan.ranges import reader as reader_lib

_context = plan_graph.context
_is_float = plan_graph.is_float


class RangeRules(object):
    """The rules for layers, ops with a range of their own and the tensors they read.

    Args:
      view: the graph's `GraphView`.
      layout: the model's `ModelLayout` (the rules add the constant adds a
        layer's bias takes to its `tail_ops`).
      book: the `PlanBook` the rules plan into.
      reader: the `RangeReader` over that book.
      settings: the pass's `PlanSettings`.

    Attributes:
      deferred: ops visited before their data inputs had ranges, in visiting
        order; the planner visits them again (`take_deferred`).
    """

    def __init__(self, view: plan_graph.GraphView, layout: layout_lib.ModelLayout,
                 book: book_lib.PlanBook, reader: reader_lib.RangeReader,
                 settings: book_lib.PlanSettings):
        self.view = view
        self.layout = layout
        self.book = book
        self.reader = reader
        self.settings = settings
        self.deferred: List[tf.Operation] = []

    def defer(self, op: tf.Operation) -> None:
        """Visits `op` again once more ranges are planned."""
        self.deferred.append(op)

    def take_deferred(self) -> List[tf.Operation]:
        """The deferred ops, which are no longer deferred."""
        deferred, self.deferred = self.deferred, []
        return deferred

    def require(self, t: tf.Tensor) -> None:
        """Gives `t` a range if it has none, at its source, for all readers."""
        if self.reader.is_ranged(t):
            return
        s = self.reader.source(t)
        if not _is_float(s):
            self.book.leave(s.name, "dtype %s: FakeQuant takes float32, float16 or bfloat16 "
                            "only" % s.dtype.name)
            return
        if self.reader.is_filled(s):
            fill = next((c for c in s.consumers() if self.reader.filled_value(c) is s), s.op)
            self.book.plan(s, plan_graph.own_context(fill), "fill_quant", -6.0,
                           self.view.consumers(s))
            return
        ctx = entries.entry_context(s, self.view, self.layout, self.reader)
        self.book.plan(s, ctx, "input_quant", -6.0, self.view.consumers(s))

    def plan_output(self, out: tf.Tensor, ctx: str, kind: str,
                    init_min: float, exclude=(),
                    allow_unused: bool = True, fusable: bool = True) -> Optional[book_lib.Plan]:
        """A range on `out`, or after the activation that is its sole reader.

        Returns the plan of that range (None: none, or one built earlier).

        Several identical activations reading `out` (NASNet-A's cell
        operations each start with a ReLU of one tensor) are one for the
        converter, which keeps one op and fuses it: they share its range.
        """
        readers = self.reader.final_readers(out, exclude)
        if (fusable and readers
                and (readers[0].type in op_table.FUSABLE_ACTIVATION_TYPES
                     or clamps.is_relu(readers[0], self.view.is_data))
                and all(tensors.same_computation(r, readers[0]) and self.settings.in_scope(r)
                        and r in self.view.model for r in readers)):
            act = readers[0]
            self.book.fused.update(readers)
            act_out = act.outputs[0]
            self.book.plan(act_out, ctx, "act_quant", 0.0, self.view.consumers(act_out),
                           allow_unused=True)
            owner = self.book.plans.get(act_out)  # None: an earlier call's range.
            for other in readers[1:] if owner is not None else ():
                self.book.plan(other.outputs[0], plan_graph.own_context(other), "act_quant",
                               0.0, self.view.consumers(other.outputs[0]), allow_unused=True,
                               shares=owner)
            return owner
        consumers = self.view.consumers(out, exclude)
        self.book.plan(out, ctx, kind, init_min, consumers,
                       allow_unused=allow_unused)
        return self.book.plans.get(out)

    def _residual_adds(self, t: tf.Tensor, exclude) -> List[tf.Operation]:
        readers = self.reader.final_readers(t, exclude)
        # An eval graph's atrous layer output is read through the
        # BatchToSpaceND the training graph has before its batch norm.
        readers += [c for b in readers if b.type == "BatchToSpaceND"
                    for c in self.reader.final_readers(b.outputs[0])]
        return [c for c in readers
                if c.type in qp.RESIDUAL_ADD_TYPES and len(c.inputs) == 2
                and all(self.view.is_data(i) for i in c.inputs)]

    def visit_layer(self, layer: tf.Operation) -> None:
        if not self.settings.in_scope(layer):
            self.book.leave(layer.name, self.settings.outside_reason(layer))
            return
        self.require(qp.data_input(layer))
        tail, out = self.layout.tails[layer], self.layout.outputs[layer]
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
            out = self.fold_constant_adds(out, exclude)
        planned = self.plan_output(out, ctx, kind, -6.0, exclude=exclude, fusable=fusable)
        precisions = self.settings.precisions
        precision = precisions.of(layer) if precisions is not None else None
        if planned is not None and precision is not None:
            planned.bits = precision.activation_bits  # The recipe's, for its output.

    def _add_kind(self, op: tf.Operation) -> str:
        if op.type in qp.RESIDUAL_ADD_TYPES and len(op.inputs) == 2:
            for i in op.inputs:
                # Back through what TFLite drops: quantizers, Identity, dropout.
                for _ in range(100):
                    if i.op in self.layout.looked_through:
                        i = self.layout.looked_through[i.op]
                    elif i.op.type == "Identity" or is_quantized_output(i):
                        i = i.op.inputs[0]
                    else:
                        break
                if i.op.type in op_table.ACTIVATION_TYPES:
                    return "post_activation_bypass_quant"
        return op_table.RANGE_NAMES.get(op.type, op_table.DEFAULT_RANGE_NAME)

    def visit_own_range(self, op: tf.Operation) -> None:
        values = op.inputs[1:] if op.type in op_table.CONDITION_TYPES else op.inputs
        data = [i for i in values
                if self.view.is_data(i) or self.reader.constant_state(i) is not None]
        if not data or (op.type in op_table.REDUCTION_TYPES
                        and op.outputs[0].shape.rank == 0):
            return
        if self.view.feeds_only_state_updates(op):
            return  # Arithmetic of a variable update (moving averages), not model data.
        ranged = [self.reader.is_ranged(i) for i in data]
        ok = all(r or self.reader.is_input(i) for r, i in zip(ranged, data))
        if not ok:
            self.defer(op)
            if any(ranged):
                missing = [i.name for r, i in zip(ranged, data) if not r]
                self.book.leave(op.name, "%s reads %s, which has no range"
                                % (op.type, ", ".join(missing)))
            return
        non_float = [i for i in data if not _is_float(i)]
        if non_float or not _is_float(op.outputs[0]):
            self.book.leave(op.name, "dtype %s: FakeQuant takes float32, float16 or bfloat16 "
                            "only" % op.outputs[0].dtype.name)
            return
        for i in data:
            self.require(i)
        self._plan_parameters(op)
        init_min = 0.0 if op.type in ("Relu", "Relu6") else -6.0
        kind = self._add_kind(op)
        if op.type in op_table.FUSING_TYPES:
            self.plan_output(op.outputs[0], plan_graph.own_context(op), kind,
                             init_min)
        else:
            out = op.outputs[0]
            self.book.plan(out, plan_graph.own_context(op), kind, init_min,
                           self.view.consumers(out), allow_unused=True)

    def fold_constant_adds(self, out: tf.Tensor, exclude) -> tf.Tensor:
        """The layer output after the constant adds the converter folds into
        its bias (`converter_rewrites.folded_bias_add`); those join the tail.

        Never across the model's boundary (`qat.quantize.plan.model.boundary`):
        `square(logits - 1.0)` is the loss's, and the logits keep their range.
        """
        for _ in range(100):
            readers = self.reader.final_readers(out, exclude)
            if (len(readers) != 1 or not self.settings.in_scope(readers[0])
                    or readers[0] not in self.view.model
                    or readers[0] in self.layout.interior or readers[0] in self.layout.tails
                    or not converter_rewrites.folded_bias_add(readers[0], out,
                                                              self.view.is_data)):
                return out
            self.layout.tail_ops.add(readers[0])
            out = readers[0].outputs[0]
        return out

    def _plan_parameters(self, op: tf.Operation) -> None:
        """Weight ranges on the variables an integer op computes with.

        A layer norm's gamma and beta, a layer scale: TFLite quantizes such a
        constant operand, so the graph does too (with the weights' range,
        `<op scope>/param_quant`); left float, the int8 converter cannot
        always quantize a broadcast operand at all.
        """
        for t in op.inputs:
            if (not self.view.is_data(t) and plan_graph.is_float(t) and t.shape.rank
                    and layer_patterns.is_parameter(t)):
                self.book.plan(t, plan_graph.own_context(op), "param_quant", -6.0,
                               self.view.consumers(t), is_weight=True)
