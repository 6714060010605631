"""The planner's range rules (a mixin of `Planner`): which tensor gets a range, where.

* `_require`: a tensor an integer op reads gets a range at its source (back
  through same-scale ops, dropout, lookups), named after the model op that
  reads it first when it enters the model (`entries`).
* `_plan_output`: an output's range, or the range after the activation that
  alone reads it (TFLite fuses RELU / RELU6 into the op before).
* `visit_layer`: a layer's data input and its output after the tail (bias
  add, folded batch norm): `act_quant`, or `conv_quant` when a residual add
  reads it.
* `visit_own_range`: ops with a range of their own (ADD, MUL, MEAN,
  CONCATENATION, ...) whose data inputs all have ranges.

`qat.quantize.plan.planner` documents the rules as a whole; the other
mixins (`structures`, `weights`, `embeddings`, `entries`) hold the rest.
"""
from typing import List

import tensorflow as tf

from qat.matching import tensors
from qat.quantize.plan.ops import clamps
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ops import patterns as qp
from qat.quantize.plan.model import recurrences
from qat.quantize.plan.model.graph import is_quantized_output

_context = plan_graph.context
_is_float = plan_graph.is_float


class RangeRules(object):
    """Mixin of `qat.quantize.plan.Planner` (uses its state and `_plan`)."""

    def _source(self, t: tf.Tensor) -> tf.Tensor:
        """The tensor whose range `t` has: back through same-scale ops."""
        for _ in range(10000):
            if self._has_range(t):
                return t
            op = t.op
            value = self._filled_value(op)
            if value is not None:
                return value  # TFLite's FILL writes its value operand's scale.
            if not self.is_data(t) and self._constant_state(t) is not None:
                return self._constant_state(t)
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

    def _filled_value(self, op: tf.Operation):
        """The constant a `Fill` of the data path fills with (a zero initial
        state `Fill(batch size, 0)`), else None.

        The converter keeps such a FILL (its shape is the batch's) and CSEs
        identical ones (the zero cell and hidden states of an LSTM): a range
        on its output would be lost. Quantized, the value operand makes each
        FILL integer, writing the value's scale, and keeps them apart.
        """
        if (op.type != "Fill" or op not in self.data_ops or not _is_float(op.outputs[0])
                or self.is_data(op.inputs[1]) or not _is_float(op.inputs[1])):
            return None
        return op.inputs[1]

    def _constant_state(self, t: tf.Tensor):
        """The recurrence's constant initial state `t` is (through Identity ops),
        or None (`recurrences.Steps.initial_states`)."""
        if not self.steps.initial_states:
            return None
        source = recurrences.constant_source(t)
        return source if source in self.steps.initial_states else None

    def _is_filled(self, s: tf.Tensor) -> bool:
        """Whether `s` is a constant the model must quantize itself: the value
        operand of a data-path `Fill` (`_source`), or a recurrence's constant
        initial state (a zero state of a static batch size,
        `recurrences.Steps.initial_states`)."""
        return s in self.steps.initial_states or any(
            self._filled_value(c) is s for c in s.consumers())

    def _is_ranged(self, t: tf.Tensor) -> bool:
        """True if `t` reaches TFLite with a scale (learnt, fixed or constant)."""
        s = self._source(t)
        if self._is_filled(s):
            return self._has_range(s)
        if self._has_range(s) or not self.is_data(s) or s.op in self.interior:
            return True
        if s.op.type in op_table.FIXED_RANGE_TYPES:
            return self._is_ranged(s.op.inputs[0])
        return False

    def _is_input(self, t: tf.Tensor) -> bool:
        """Whether `t`'s range is planned where it is read first: a model
        source's (`qat.quantize.plan.model.feeds`), or the value a `Fill` fills
        with (a recurrence's zero initial state, `_filled_value`)."""
        s = self._source(t)
        return self.is_source(s) or self._is_filled(s)

    def _require(self, t: tf.Tensor) -> None:
        """Gives `t` a range if it has none, at its source, for all readers."""
        if self._is_ranged(t):
            return
        s = self._source(t)
        if not _is_float(s):
            self._leave(s.name, "dtype %s: FakeQuant takes float32, float16 or bfloat16 only"
                        % s.dtype.name)
            return
        if self._is_filled(s):
            fill = next((c for c in s.consumers() if self._filled_value(c) is s), s.op)
            self._plan(s, plan_graph.own_context(fill), "fill_quant", -6.0, self.consumers(s))
            return
        self._plan(s, self._entry_context(s), "input_quant", -6.0,
                   self.consumers(s))

    def _plan_output(self, out: tf.Tensor, ctx: str, kind: str,
                     init_min: float, exclude=(),
                     allow_unused: bool = True, fusable: bool = True) -> None:
        """A range on `out`, or after the activation that is its sole reader.

        Several identical activations reading `out` (NASNet-A's cell
        operations each start with a ReLU of one tensor) are one for the
        converter, which keeps one op and fuses it: they share its range.
        """
        readers = self.final_readers(out, exclude)
        if (fusable and readers
                and (readers[0].type in op_table.FUSABLE_ACTIVATION_TYPES
                     or clamps.is_relu(readers[0], self.is_data))
                and all(tensors.same_computation(r, readers[0]) and self._in_scope(r)
                        and r in self.model for r in readers)):
            act = readers[0]
            self.fused.update(readers)
            act_out = act.outputs[0]
            self._plan(act_out, ctx, "act_quant", 0.0, self.consumers(act_out),
                       allow_unused=True)
            owner = self.plans.get(act_out)  # None: an earlier call's range.
            for other in readers[1:] if owner is not None else ():
                self._plan(other.outputs[0], plan_graph.own_context(other), "act_quant", 0.0,
                           self.consumers(other.outputs[0]), allow_unused=True, shares=owner)
            return
        consumers = self.consumers(out, exclude)
        self._plan(out, ctx, kind, init_min, consumers,
                   allow_unused=allow_unused)

    def _residual_adds(self, t: tf.Tensor, exclude) -> List[tf.Operation]:
        readers = self.final_readers(t, exclude)
        # An eval graph's atrous layer output is read through the
        # BatchToSpaceND the training graph has before its batch norm.
        readers += [c for b in readers if b.type == "BatchToSpaceND"
                    for c in self.final_readers(b.outputs[0])]
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
        values = op.inputs[1:] if op.type in op_table.CONDITION_TYPES else op.inputs
        data = [i for i in values if self.is_data(i) or self._constant_state(i) is not None]
        if not data or (op.type in op_table.REDUCTION_TYPES
                        and op.outputs[0].shape.rank == 0):
            return
        if self.feeds_only_state_updates(op):
            return  # Arithmetic of a variable update (moving averages), not model data.
        ranged = [self._is_ranged(i) for i in data]
        ok = all(r or self._is_input(i) for r, i in zip(ranged, data))
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
