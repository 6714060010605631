"""The range a tensor reads, from the plans made so far.

Why this module exists: TFLite gives a tensor its own scale only where an op
writes one; a same-scale op (a reshape, a max pool, an op the converter
removes), a lookup, dropout or a `Fill` passes the scale of what it reads on.
Every range rule asks where that is (`RangeReader.source`), whether it has a
range yet (`is_ranged`) and which model ops read a tensor once the ops TFLite
drops are looked through (`final_readers`). The reader answers from the view,
the model's layout, the recurrences and the book; it never plans.
"""
from typing import Dict, List

import tensorflow as tf

from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import layout as layout_lib
from qat.quantize.plan.model import recurrences
from qat.quantize.plan.ops import converter_rewrites
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ranges import book as book_lib

_is_float = plan_graph.is_float


class RangeReader(object):
    """Where the range of a tensor is, given the plans of `book` so far.

    Args:
      view: the graph's `GraphView`.
      layout: the model's `ModelLayout`.
      book: the `PlanBook` (read, never written).
      steps: the graph's recurrences (`recurrences.Steps`).
    """

    def __init__(self, view: plan_graph.GraphView, layout: layout_lib.ModelLayout,
                 book: book_lib.PlanBook, steps: recurrences.Steps):
        self.view = view
        self.layout = layout
        self.book = book
        self.steps = steps
        self._same_scale_ops: Dict[tf.Operation, bool] = {}

    def source(self, t: tf.Tensor) -> tf.Tensor:
        """The tensor whose range `t` has: back through same-scale ops."""
        view, layout = self.view, self.layout
        for _ in range(10000):
            if self.book.has_range(t):
                return t
            op = t.op
            value = self.filled_value(op)
            if value is not None:
                return value  # TFLite's FILL writes its value operand's scale.
            if not view.is_data(t) and self.constant_state(t) is not None:
                return self.constant_state(t)
            if view.entries.get(op) is not None:
                return view.entries[op]  # A lookup's output has its table's scale.
            if op in layout.looked_through:
                if not view.is_data(layout.looked_through[op]):
                    return t  # Dropout of what is not data: as its eval Identity.
                t = layout.looked_through[op]
                continue
            if (not self.same_scale(op)
                    or (op in layout.tail_ops and op.type != "Identity")
                    or op not in view.data_ops):
                return t
            index = op_table.same_scale_input(op, t.value_index)
            data = [i for i in op.inputs if view.is_data(i)]
            if index < len(op.inputs) and view.is_data(op.inputs[index]):
                t = op.inputs[index]
            elif len(data) == 1:
                t = data[0]
            else:
                return t
        return t

    def same_scale(self, op: tf.Operation) -> bool:
        """Whether `op`'s output has its input's range: a same-scale op, or
        one the converter removes (`qat.quantize.plan.ops.converter_rewrites`)."""
        if op not in self._same_scale_ops:
            self._same_scale_ops[op] = (
                op.type in op_table.SAME_SCALE_TYPES
                or converter_rewrites.removed_or_same_scale(op, self.view.is_data))
        return self._same_scale_ops[op]

    def filled_value(self, op: tf.Operation):
        """The constant a `Fill` of the data path fills with (a zero initial
        state `Fill(batch size, 0)`), else None.

        The converter keeps such a FILL (its shape is the batch's) and CSEs
        identical ones (the zero cell and hidden states of an LSTM): a range
        on its output would be lost. Quantized, the value operand makes each
        FILL integer, writing the value's scale, and keeps them apart.
        """
        if (op.type != "Fill" or op not in self.view.data_ops
                or not _is_float(op.outputs[0])
                or self.view.is_data(op.inputs[1]) or not _is_float(op.inputs[1])):
            return None
        return op.inputs[1]

    def constant_state(self, t: tf.Tensor):
        """The recurrence's constant initial state `t` is (through Identity ops),
        or None (`recurrences.Steps.initial_states`)."""
        if not self.steps.initial_states:
            return None
        source = recurrences.constant_source(t)
        return source if source in self.steps.initial_states else None

    def is_filled(self, s: tf.Tensor) -> bool:
        """Whether `s` is a constant the model must quantize itself: the value
        operand of a data-path `Fill` (`source`), or a recurrence's constant
        initial state (a zero state of a static batch size,
        `recurrences.Steps.initial_states`)."""
        return s in self.steps.initial_states or any(
            self.filled_value(c) is s for c in s.consumers())

    def is_ranged(self, t: tf.Tensor) -> bool:
        """True if `t` reaches TFLite with a scale (learnt, fixed or constant)."""
        s = self.source(t)
        if self.is_filled(s):
            return self.book.has_range(s)
        if (self.book.has_range(s) or not self.view.is_data(s)
                or s.op in self.layout.interior):
            return True
        if s.op.type in op_table.FIXED_RANGE_TYPES:
            return self.is_ranged(s.op.inputs[0])
        return False

    def is_input(self, t: tf.Tensor) -> bool:
        """Whether `t`'s range is planned where it is read first: a model
        source's (`qat.quantize.plan.model.feeds`), or the value a `Fill` fills
        with (a recurrence's zero initial state, `filled_value`)."""
        s = self.source(t)
        return self.view.is_source(s) or self.is_filled(s)

    def final_readers(self, t: tf.Tensor, exclude=()) -> List[tf.Operation]:
        """Readers of `t`, through ops TFLite drops (Identity, dropout).

        Observers (summaries, prints, asserts, metrics) are not readers: the
        converted model has none, so they neither unfuse an activation from
        the op before it nor make a tensor shared.
        """
        found, stack, seen = [], [t], set()
        while stack:
            for c in self.view.readers(stack.pop(), exclude):
                if c in seen or c in self.view.observers:
                    continue
                seen.add(c)
                if c in self.layout.looked_through:
                    stack.append(c.outputs[0])
                elif c.type == "Identity":
                    stack.append(c.outputs[0])
                else:
                    found.append(c)
        return found
