"""Shared ranges: where TFLite imposes one scale on several tensors, one range.

Why this module exists: the eval graph must round where TFLite rounds, with
the scale TFLite uses, or TFLite and the eval graph disagree by more than a
step (issue #21: InceptionV3 and DenseNet121 differed by tens of steps at
single layers next to a concatenation). CONCATENATION keeps one scale for
its inputs and its output. The converter gives every input the
concatenation's scale: an input with a range of its own is requantized
(int8), an input with none (a pool's output) takes the concatenation's
scale, and every other reader of that tensor reads the requantized values.
So a concatenation and the tensors it reads form one group with one range,
as PyTorch's quantizer shares one observer across `cat`. Each member tensor
is quantized once, at its source (back through same-scale ops such as max
pools and reshapes, as `RangeReader.source` finds it), and all its readers
read that value: the no-raw-reader invariant holds. A concatenation reading
another's output (DenseNet's dense blocks), and two concatenations reading
one tensor (whose one quantized value both read), join one group
(union-find). PACK and SELECT_V2 of two values keep one scale as well
(`patterns.GROUP_SCALE_TYPES`), and the steps of a recurrence share one
range per cell value (`qat.quantize.plan.model.recurrences`).

Roundings (`qat.quantize.plan.ranges.roundings`) are planned before the
groups. An average pool or resize whose output a concatenation reads is a
member of its group: TFLite runs it in the concatenation's scale. A bilinear
resize in a group goes further: the converter requantizes its input to the
group's scale, and when the resize is the only reader of the tensor it reads
(through same-scale ops), it merges that requantize into the op computing
the tensor (DeepLab's image pooling: the conv before the resize gets the
concatenation's scale). That tensor is then a member of the group too; with
other readers it keeps its own range and TFLite adds a QUANTIZE before the
resize. A reduction over axes of size 1 (or a reverse) that a concatenation
reads has a FakeQuant reading its input's range; the converter removes the
reduction, so the concatenation reads that range's tensor, which joins the
group.

The group's range: one pair of variables, named after the group's last
concatenation in graph order (`<concat scope>/concat_quant/min|max`), so
training and eval graphs name the same variables and checkpoints restore
strictly. Its statistics (training) are the batch min and max over every
member. Every other member keeps its own quantizer name (`<layer>/act_quant`,
...), reading the group's variables.

The training-graph cycle: in DenseNet a member (the output of a conv inside
the block) is computed from an earlier member's quantized value, so a
member's FakeQuant cannot read the range as updated from all the members'
statistics of this step. Members therefore read the variables as they were
before this step's update (the snapshot the moving average itself reads),
and only the last concatenation's FakeQuant reads the updated range: it is
the member latest in graph order, so no member depends on it and the update
depends on no quantized value that depends on the update. The ranges the
members use lag one step behind in training; eval graphs read the variables
everywhere, identically.

Identical ops (one type, attributes and inputs of the same values: two
ReLUs of one tensor, as NASNet-A's cell operations start; a recurrent
loop's first step and the one Keras computes outside the loop) are one op
for the converter, which keeps one of them and its scale: in eval graphs
each later one reads the first one's range (`share_identical_outputs`). In
training graphs each plain one keeps its own (the same statistics: they
compute one value), so a reader only the training graph has never owns the
range the eval graph reads: PNASNet's auxiliary head reads a cell's output
through a ReLU of its own, made before the next cell's identical ReLU, whose
range the eval graph then restores from the training checkpoint under its
own name. Where one of them is in a group or reads another's range (the
constant zero states of stacked recurrent layers), all read that range in
both graphs.

Not grouped: concatenation inputs with no range planned in this call (a
FakeQuant the user or an earlier call built), which keep their own scale; those
on a kernel's fixed grid (a sigmoid's) keep it and add no statistics to the group.
"""
from typing import Dict, List

import tensorflow as tf

from qat.matching import tensors
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import recurrences
from qat.quantize.plan.ops import converter_rewrites
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ops import patterns as qp
from qat.quantize.plan.ranges import book as book_lib
from qat.quantize.plan.ranges import reader as reader_lib

# Ops whose inputs and output TFLite keeps in one scale (CONCATENATION, PACK,
# SELECT_V2 of two values).
CONCAT_TYPES = qp.GROUP_SCALE_TYPES
# Ops whose TFLite kernel needs one scale for its values and output, which the
# converter does not requantize to ("same scale constraint"): unlike a
# CONCATENATION's, their inputs cannot keep a kernel's fixed grid of their own.
_ONE_SCALE_TYPES = frozenset(["Select", "SelectV2", "Pack"])


def share_identical_outputs(view: plan_graph.GraphView, book: book_lib.PlanBook,
                            is_training: bool, ordered: List[tf.Operation]) -> None:
    """Ops computing the same value (`tensors.ValueNumbers`; see the module
    docstring) are one op for the converter, with one scale: they read one
    range, a group's where one of them is in a group or reads another's
    (`ConcatGroups.share`, a recurrence's state: run before), else, in eval
    graphs only, the first one's.

    Args:
      view: the graph's `GraphView` (its model).
      book: the `PlanBook` whose plans share.
      is_training: a training graph (plain twins keep their own ranges).
      ordered: the data ops in graph order.
    """
    numbers = tensors.ValueNumbers()
    same: Dict[int, List[tf.Operation]] = {}
    for op in ordered:
        if not op.outputs or op not in view.model:
            continue
        plan = book.plans.get(op.outputs[0])
        if plan is None or plan.is_weight or plan.fixed is not None or (
                plan.shared is not None and not plan.before_update):
            continue  # A rounding or a twin of its own reads its range already.
        same.setdefault(numbers.number(op), []).append(op)
    for ops in same.values():
        plans = [book.plans[op.outputs[0]] for op in ops]
        owner = next((p for p in plans if p.shared is not None or p.members), None)
        if owner is None:
            if is_training:
                continue  # Each its own range: one only training has owns none.
            owner = plans[0]
        for plan in plans:
            if (plan is not owner and plan.shared is None and not plan.members
                    and not _reads_range_of(owner, plan)):
                plan.shared = owner


def _reads_range_of(plan, other) -> bool:
    """Whether `plan` reads `other`'s range, through the plans it shares."""
    for _ in range(10000):
        if plan is other:
            return True
        if plan.shared is None:
            return False
        plan = plan.shared
    return True


class ConcatGroups(object):
    """Groups each planned concatenation (or stack) with its inputs' sources,
    and the steps of each recurrence (see the module docstring).

    Args:
      view: the graph's `GraphView`.
      book: the `PlanBook` whose plans join groups.
      reader: the `RangeReader` over that book.
      steps: the graph's recurrences (`recurrences.Steps`).
    """

    def __init__(self, view: plan_graph.GraphView, book: book_lib.PlanBook,
                 reader: reader_lib.RangeReader, steps: recurrences.Steps):
        self.view = view
        self.book = book
        self.reader = reader
        self.steps = steps

    def share(self, ordered: List[tf.Operation]) -> None:
        """Makes every group's members read its owner's range.

        Args:
          ordered: the data ops in graph order.
        """
        view, plans, steps = self.view, self.book.plans, self.steps
        parent: Dict[tf.Tensor, tf.Tensor] = {}

        def find(t):
            while parent[t] is not t:
                parent[t] = parent[parent[t]]
                t = parent[t]
            return t

        def join(a, b):
            parent.setdefault(a, a)
            parent.setdefault(b, b)
            parent[find(a)] = find(b)

        concats = []
        for op in ordered:
            out = op.outputs[0] if op.outputs else None
            if (op.type not in CONCAT_TYPES or out not in plans or op not in view.model
                    or plans[out].shared is not None):
                continue  # A select of a constant reads its value's range (a rounding).
            concats.append(out)
            parent.setdefault(out, out)
            for i in op.inputs:
                if not view.is_data(i):
                    continue
                source = self.reader.source(i)
                plan = plans.get(source)
                if plan is None or plan.is_weight or plan.per_channel:
                    continue
                join(source, out)
                for upstream in self._removed_reduction_sources(source):
                    join(upstream, out)
                merged = self._merged_resize_input(source)
                if merged is not None:
                    join(merged, out)
        stepped = set()
        for x, y in steps.tensor_pairs:
            sx, sy = self._step_member(x), self._step_member(y)
            if sx is not None and sy is not None and sx is not sy:
                join(sx, sy)
                stepped.update((sx, sy))
        groups: Dict[tf.Tensor, List[tf.Tensor]] = {}
        for t in parent:
            groups.setdefault(find(t), []).append(t)
        position = {t: k for k, t in enumerate(concats)}
        order = None
        for members in groups.values():
            if (len(members) < 2 or self._takes_fixed_grid(members)
                    or all(plans[t].fixed is not None for t in members)):
                continue  # Fixed grids: the kernels', constants.
            if any(t in stepped for t in members):
                # The last member with a learned range owns it, named as its cell op's
                # first step; a fixed grid after it (a last TANH state) adds no statistics.
                order = order if order is not None else view.topological_index()
                owner = max((t for t in members if plans[t].fixed is None),
                            key=lambda t: (order.get(t.op, -1), t.value_index))
                self._name_after_first_step(owner, members, order)
            else:
                # The last concatenation in graph order owns the range.
                owner = max((t for t in members if t in position), key=position.get)
            owner_plan = plans[owner]
            for t in sorted(members, key=lambda t: (t.op._id, t.value_index)):  # pylint: disable=protected-access
                if t is owner:
                    continue
                plan = plans[t]
                # A rounding (an average pool's output) reads the group's range instead.
                plan.shared, plan.before_update = owner_plan, True
                if plan.fixed is None:  # A fixed grid adds no statistics (module docstring).
                    owner_plan.members.append(t)

    def _takes_fixed_grid(self, members: List[tf.Tensor]) -> bool:
        """Where a group with an op of `_ONE_SCALE_TYPES` has a member on a
        kernel's fixed grid (a SimpleRNN's state: a TANH output, kept by a mask's
        select), every member takes that grid: True when it did."""
        plans = self.book.plans
        grids = {plans[t].fixed for t in members} - {None}
        if len(grids) != 1 or not any(t.op.type in _ONE_SCALE_TYPES for t in members):
            return False
        grid = grids.pop()
        for t in members:
            plan = plans[t]
            plan.fixed, plan.shared, plan.before_update = grid, None, False
        return True

    def _step_member(self, t: tf.Tensor):
        """The planned range a recurrence's cell value `t` has, if it can be shared."""
        if (not (self.view.is_data(t) or self.reader.constant_state(t) is not None)
                or not plan_graph.is_float(t)):
            return None
        source = self.reader.source(t)
        plan = self.book.plans.get(source)
        if plan is None or plan.is_weight or plan.per_channel or plan.shared is not None:
            return None
        return source

    def _name_after_first_step(self, owner: tf.Tensor, members: List[tf.Tensor],
                               order) -> None:
        """Names the group's variables after the first step of its last cell value
        (the last step's, computed last): the same name whatever the number of
        steps, and for a loop and its unrolled form."""
        plans, steps = self.book.plans, self.steps
        stepped = [t for t in members if t.op in steps.op_class and plans[t].fixed is None]
        if not stepped:
            return
        last = max(stepped, key=lambda t: (order.get(t.op, -1), t.value_index))
        first_op = steps.op_class[last.op]
        firsts = [t for t in members if t.op is first_op and plans[t].fixed is None]
        if firsts and firsts[0] is not owner:
            plans[owner].variables_prefix = plans[firsts[0]].prefix

    def _removed_reduction_sources(self, member: tf.Tensor) -> List[tf.Tensor]:
        """The ranges a member that is a reduction over size-1 axes (or a
        `converter_rewrites.needs_stated_scale` op: a reverse) reads by construction.

        Its FakeQuant (`roundings.Roundings.plan_identity_rounding`) reads its
        input's source range; the converter removes the reduction (runs the
        reverse in its input's scale), so the concatenation reads that
        source's tensor in TFLite: the source joins the group (and so on up a
        chain of such reductions), or TFLite sees two scales ("same scale
        constraint").
        """
        found = []
        t = member
        for _ in range(10000):
            op = t.op
            if (not (converter_rewrites.is_size_one_reduction(op)
                     or converter_rewrites.needs_stated_scale(op))
                    or not self.view.is_data(op.inputs[0])):
                break
            t = self.reader.source(op.inputs[0])
            plan = self.book.plans.get(t)
            if plan is None or plan.is_weight or plan.per_channel:
                break
            found.append(t)
        return found

    def _merged_resize_input(self, member: tf.Tensor):
        """The tensor a grouped bilinear resize reads, where the converter merges
        the requantize to the group's scale into the op computing it; else None."""
        view = self.view
        op = member.op
        if op.type != "ResizeBilinear" or not view.is_data(op.inputs[0]):
            return None
        source = self.reader.source(op.inputs[0])
        plan = self.book.plans.get(source)
        if (plan is None or plan.is_weight or plan.per_channel
                or view.is_source(source) or source.op.type in CONCAT_TYPES):
            return None  # Not measured: a graph input's or a concatenation's scale.
        # Only the resize reads it (through the same-scale ops between them).
        t = op.inputs[0]
        for _ in range(10000):
            if t is source:
                break
            if len(view.readers(t)) != 1:
                return None
            t = t.op.inputs[op_table.same_scale_input(t.op, t.value_index)]
            if not view.is_data(t):
                return None
        else:
            return None
        return source if len(view.readers(source)) == 1 else None
