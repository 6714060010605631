"""Roundings: ops TFLite runs in their input's scale round to its range.

Why this module exists: the eval graph must round where TFLite rounds, with
the scale TFLite uses, or TFLite and the eval graph disagree by more than a
step. AVERAGE_POOL_2D and RESIZE_BILINEAR output the input's scale and round
to it, where the eval graph kept the exact value: their output gets a
FakeQuant reading the input's range, with no variables of its own
(`avg_pool_quant`, `resize_quant`). The input is the tensor TFLite's op
reads: back through the ops the converter removes (an Identity, such as
research/slim's `depthwise_output` before MobileNet v3's squeeze-excite pool;
a neutral `x * 1`; a 1x1 pool) and the ones the planner looks through
(dropout), whose readers read their input. Nearest-neighbour resizes, max
pools and reshapes copy values already on the grid and need nothing. A
rounding reads its input's range exactly as the input's FakeQuant reads it.

An average pool or resize whose output a concatenation reads is a member of
its group as well (`qat.quantize.plan.ranges.shared_ranges`, run after the
roundings): TFLite then runs it in the concatenation's scale (its input
requantized), and a second FakeQuant on that tensor would not convert
("same scale constraint"); its rounding reads the group's range instead.

A pool that is the identity (`converter_rewrites.is_identity_pool`) is not
rounded. A reduction over axes of size 1 gets a FakeQuant reading its
input's range (`plan_identity_rounding`, `identity_quant`), and so do a
reverse (`converter_rewrites.needs_stated_scale`), a clamp by a constant
TFLite runs in its input's scale (`clamps.is_same_scale_clamp`) and a select
of a constant (`converter_rewrites.is_constant_select`); where a
concatenation reads such a reduction or reverse, the range it reads joins
the group (the converter removes the reduction). An average
pool that reads its range through a same-scale op TFLite keeps, such as a
max pool (InceptionV3's first mixed block), is not rounded: there (measured
with a max pool) the converter left the max pool's other readers in float.
A Mean has a range of its own (MEAN is an OWN_RANGE op); the converter keeps
it a MEAN whose kernel rounds to that range, so it needs nothing here
either.
"""
from typing import List

import tensorflow as tf

from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import layout as layout_lib
from qat.quantize.plan.ops import clamps
from qat.quantize.plan.ops import converter_rewrites
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ranges import book as book_lib
from qat.quantize.plan.ranges import reader as reader_lib

# Ops TFLite runs with their input's scale and a rounded output.
ROUNDING_TYPES = frozenset(["AvgPool", "ResizeBilinear"])
_ROUNDING_NAMES = {"AvgPool": "avg_pool_quant", "ResizeBilinear": "resize_quant"}


class Roundings(object):
    """Plans the roundings of one graph (see the module docstring).

    Args:
      view: the graph's `GraphView`.
      layout: the model's `ModelLayout` (dropout looked through).
      book: the `PlanBook` the roundings are planned into.
      reader: the `RangeReader` over that book.
      settings: the pass's `PlanSettings` (its scope).
    """

    def __init__(self, view: plan_graph.GraphView, layout: layout_lib.ModelLayout,
                 book: book_lib.PlanBook, reader: reader_lib.RangeReader,
                 settings: book_lib.PlanSettings):
        self.view = view
        self.layout = layout
        self.book = book
        self.reader = reader
        self.settings = settings

    def plan(self, ordered: List[tf.Operation]) -> None:
        """Plans every rounding, once every other range is planned.

        So a pool whose input gets its range from a later reader (a graph
        input) is rounded too.

        Args:
          ordered: the data ops in graph order.
        """
        view = self.view
        for op in ordered:
            if op not in view.model:
                continue  # Never past the model's boundary (`boundary`).
            if op.type in ROUNDING_TYPES and self.settings.in_scope(op):
                self.plan_rounding(op)
            elif ((converter_rewrites.is_size_one_reduction(op)
                   or converter_rewrites.needs_stated_scale(op)
                   or clamps.is_same_scale_clamp(op, view.is_data)
                   or (converter_rewrites.is_constant_select(op, view.is_data)
                       and op not in self.layout.looked_through))
                  and self.settings.in_scope(op)):
                self.plan_identity_rounding(op)

    def plan_rounding(self, op: tf.Operation) -> None:
        """A FakeQuant on `op`'s output reading its input's range."""
        if (not self.view.is_data(op.inputs[0]) or not plan_graph.is_float(op.outputs[0])
                or converter_rewrites.is_identity_pool(op)):
            return
        source = self.book.plans.get(self._converted_input(op.inputs[0]))
        if source is None or source.is_weight:
            # A range planned by no one here (an earlier call's), or one that
            # reaches the pool through same-scale ops TFLite keeps: there the
            # converter leaves the other readers of the pool's input in float (a
            # max pool read by InceptionV3's branches), so the pool stays
            # unrounded, as before.
            return
        out = op.outputs[0]
        if self.book.plan(out, plan_graph.own_context(op), _ROUNDING_NAMES[op.type],
                          source.init_min, self.view.consumers(out), allow_unused=True):
            self.book.plans[out].shared = source

    def _converted_input(self, t: tf.Tensor) -> tf.Tensor:
        """The tensor TFLite's op reads in place of `t`: back through the ops the
        converter removes (`converter_rewrites.removed_input`: an Identity such as
        slim's `depthwise_output`, a neutral `x * 1`) and the ones the planner
        looks through (dropout, an Identity in eval graphs), up to a planned range."""
        looked_through = self.layout.looked_through
        for _ in range(10000):
            if t in self.book.plans:
                return t
            if t.op in looked_through:
                before = looked_through[t.op]
            else:
                before = converter_rewrites.removed_input(t, self.view.is_data)
            if before is None or not self.view.is_data(before):
                return t
            t = before
        return t

    def plan_identity_rounding(self, op: tf.Operation) -> None:
        """A reduction over size-1 axes: a FakeQuant with its input's range.

        The converter removes it or keeps it (a MEAN after a REDUCE_MAX over
        the same 1x1 map stays): either way its output has its input's scale,
        which this FakeQuant states, so TFLite's op is integer when kept.
        """
        x = op.inputs[op_table.same_scale_input(op, 0)]
        if not self.view.is_data(x) or not plan_graph.is_float(op.outputs[0]):
            return
        source = self.book.plans.get(self.reader.source(x))
        if source is None or source.is_weight or source.per_channel:
            return
        out = op.outputs[0]
        if self.book.plan(out, plan_graph.own_context(op), "identity_quant",
                          source.init_min, self.view.consumers(out), allow_unused=True):
            if source.fixed is not None:
                self.book.plans[out].fixed = source.fixed  # A softmax's grid, say: constant.
            else:
                self.book.plans[out].shared = source
