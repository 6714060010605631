"""Shared ranges: where TFLite imposes one scale, the eval graph uses one range.

Why this module exists: the eval graph must round where TFLite rounds, with
the scale TFLite uses, or TFLite and the eval graph disagree by more than a
step (issue #21: InceptionV3 and DenseNet121 differed by tens of steps at
single layers next to a concatenation). Two places where TFLite decides the scale:

* CONCATENATION keeps one scale for its inputs and its output. The
  converter gives every input the concatenation's scale: an input with a
  range of its own is requantized (int8), an input with none (a pool's
  output) takes the concatenation's scale, and every other reader of that
  tensor reads the requantized values. So a concatenation and the tensors it
  reads form one group with one range, as PyTorch's quantizer shares one
  observer across `cat`. Each member tensor is quantized once, at its
  source (back through same-scale ops such as max pools and reshapes, as
  `Planner._source` finds it), and all its readers read that value: the
  no-raw-reader invariant holds. A concatenation reading another's output
  (DenseNet's dense blocks), and two concatenations reading one tensor
  (whose one quantized value both read), join one group (union-find).
* AVERAGE_POOL_2D and RESIZE_BILINEAR output the input's scale and round to
  it, where the eval graph kept the exact value: their output gets a
  FakeQuant reading the input's range, with no variables of its own. The
  input is the tensor TFLite's op reads: back through the ops the converter
  removes (an Identity, such as research/slim's `depthwise_output` before
  MobileNet v3's squeeze-excite pool; a neutral `x * 1`; a 1x1 pool) and the
  ones the planner looks through (dropout), whose readers read their input.
  Nearest-neighbour resizes, max pools and reshapes copy values already on
  the grid and need nothing. An average pool or resize whose output a
  concatenation reads is a member of its group instead: TFLite then runs it
  in the concatenation's scale (its input requantized), and a second
  FakeQuant on that tensor would not convert ("same scale constraint").
  A bilinear resize in a group goes further: the converter requantizes its
  input to the group's scale, and when the resize is the only reader of the
  tensor it reads (through same-scale ops), it merges that requantize into
  the op computing the tensor (DeepLab's image pooling: the conv before the
  resize gets the concatenation's scale). That tensor is then a member of
  the group too; with other readers it keeps its own range and TFLite adds
  a QUANTIZE before the resize.
  A pool that is the identity (`converter_rewrites.is_identity_pool`) is
  not rounded. A reduction over axes of size 1 gets a FakeQuant reading
  its input's range (`plan_identity_rounding`); where a concatenation reads
  it, the range it reads joins the group (the converter removes the
  reduction, so the concatenation reads that range's tensor).
  An average pool that reads its range through a same-scale op TFLite
  keeps, such as a max pool (InceptionV3's first mixed block), is not
  rounded: there (measured with a max pool) the converter left the max
  pool's other readers in float.
  A Mean has a range of its own (MEAN is an OWN_RANGE op); the converter
  keeps it a MEAN whose kernel rounds to that range, so it needs nothing
  here either.

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
everywhere, identically. A pool's rounding reads its input's range exactly as
the input's FakeQuant reads it.

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
from qat.quantize.plan import clamps
from qat.quantize.plan import converter_rewrites
from qat.quantize.plan import op_table
from qat.quantize.plan import recurrences
from qat.quantize.plan import graph as plan_graph

# Ops whose inputs and output TFLite keeps in one scale (CONCATENATION, PACK,
# SELECT_V2 of two values).
CONCAT_TYPES = frozenset(["ConcatV2", "Concat", "Pack", "Select", "SelectV2"])
# Ops TFLite runs with their input's scale and a rounded output.
ROUNDING_TYPES = frozenset(["AvgPool", "ResizeBilinear"])
_ROUNDING_NAMES = {"AvgPool": "avg_pool_quant", "ResizeBilinear": "resize_quant"}


def plan(planner, ordered: List[tf.Operation]) -> None:
    """After the planner's visits: roundings first, then the groups.

    `ordered`: the data ops in graph order. Roundings are planned once every
    other range is, so a pool whose input gets its range from a later
    reader (a graph input) is rounded too.
    """
    for op in ordered:
        if op not in planner.model:
            continue  # Never past the model's boundary (`boundary`).
        if op.type in ROUNDING_TYPES and planner._in_scope(op):  # pylint: disable=protected-access
            plan_rounding(planner, op)
        elif ((converter_rewrites.is_size_one_reduction(op)
               or converter_rewrites.needs_stated_scale(op)
               or clamps.is_same_scale_clamp(op, planner.is_data)
               or (converter_rewrites.is_constant_select(op, planner.is_data)
                   and op not in planner.looked_through))
              and planner._in_scope(op)):  # pylint: disable=protected-access
            plan_identity_rounding(planner, op)
    share_concat_ranges(planner, ordered, planner.steps)
    share_identical_outputs(planner, ordered)


def share_identical_outputs(planner, ordered: List[tf.Operation]) -> None:
    """Ops computing the same value (`tensors.ValueNumbers`; see the module
    docstring) are one op for the converter, with one scale: they read one
    range, a group's where one of them is in a group or reads another's
    (`share_concat_ranges`, a recurrence's state: run before), else, in eval
    graphs only, the first one's."""
    numbers = tensors.ValueNumbers()
    same: Dict[int, List[tf.Operation]] = {}
    for op in ordered:
        if not op.outputs or op not in planner.model:
            continue
        plan = planner.plans.get(op.outputs[0])
        if plan is None or plan.is_weight or plan.fixed is not None or (
                plan.shared is not None and not plan.before_update):
            continue  # A rounding or a twin of its own reads its range already.
        same.setdefault(numbers.number(op), []).append(op)
    for ops in same.values():
        plans = [planner.plans[op.outputs[0]] for op in ops]
        owner = next((p for p in plans if p.shared is not None or p.members), None)
        if owner is None:
            if planner.is_training:
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


def plan_rounding(planner, op: tf.Operation) -> None:
    """A FakeQuant on `op`'s output reading its input's range."""
    if (not planner.is_data(op.inputs[0]) or not plan_graph.is_float(op.outputs[0])
            or converter_rewrites.is_identity_pool(op)):
        return
    source = planner.plans.get(_converted_input(planner, op.inputs[0]))
    if source is None or source.is_weight:
        # A range planned by no one here (an earlier call's), or one that
        # reaches the pool through same-scale ops TFLite keeps: there the
        # converter leaves the other readers of the pool's input in float (a
        # max pool read by InceptionV3's branches), so the pool stays
        # unrounded, as before.
        return
    out = op.outputs[0]
    if planner._plan(out, plan_graph.own_context(op), _ROUNDING_NAMES[op.type],  # pylint: disable=protected-access
                     source.init_min, planner.consumers(out), allow_unused=True):
        planner.plans[out].shared = source


def _converted_input(planner, t: tf.Tensor) -> tf.Tensor:
    """The tensor TFLite's op reads in place of `t`: back through the ops the
    converter removes (`converter_rewrites.removed_input`: an Identity such as
    slim's `depthwise_output`, a neutral `x * 1`) and the ones the planner
    looks through (dropout, an Identity in eval graphs), up to a planned range."""
    for _ in range(10000):
        if t in planner.plans:
            return t
        if t.op in planner.looked_through:
            before = planner.looked_through[t.op]
        else:
            before = converter_rewrites.removed_input(t, planner.is_data)
        if before is None or not planner.is_data(before):
            return t
        t = before
    return t


def plan_identity_rounding(planner, op: tf.Operation) -> None:
    """A reduction over size-1 axes: a FakeQuant with its input's range.

    The converter removes it or keeps it (a MEAN after a REDUCE_MAX over
    the same 1x1 map stays): either way its output has its input's scale,
    which this FakeQuant states, so TFLite's op is integer when kept.
    """
    x = op.inputs[op_table.same_scale_input(op, 0)]
    if not planner.is_data(x) or not plan_graph.is_float(op.outputs[0]):
        return
    source = planner.plans.get(planner._source(x))  # pylint: disable=protected-access
    if source is None or source.is_weight or source.per_channel:
        return
    out = op.outputs[0]
    if planner._plan(out, plan_graph.own_context(op), "identity_quant",  # pylint: disable=protected-access
                     source.init_min, planner.consumers(out), allow_unused=True):
        if source.fixed is not None:
            planner.plans[out].fixed = source.fixed  # A softmax's grid, say: constant.
        else:
            planner.plans[out].shared = source


def share_concat_ranges(planner, ordered: List[tf.Operation],
                        steps: "recurrences.Steps") -> None:
    """Groups each planned concatenation (or stack) with its inputs' sources,
    and the steps of each recurrence (`qat.quantize.plan.recurrences`)."""
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
        if (op.type not in CONCAT_TYPES or out not in planner.plans or op not in planner.model
                or planner.plans[out].shared is not None):
            continue  # A select of a constant reads its value's range (a rounding).
        concats.append(out)
        parent.setdefault(out, out)
        for i in op.inputs:
            if not planner.is_data(i):
                continue
            source = planner._source(i)  # pylint: disable=protected-access
            plan = planner.plans.get(source)
            if plan is None or plan.is_weight or plan.per_channel:
                continue
            join(source, out)
            for upstream in _removed_reduction_sources(planner, source):
                join(upstream, out)
            merged = _merged_resize_input(planner, source)
            if merged is not None:
                join(merged, out)
    stepped = set()
    for x, y in steps.tensor_pairs:
        sx, sy = _step_member(planner, x), _step_member(planner, y)
        if sx is not None and sy is not None and sx is not sy:
            join(sx, sy)
            stepped.update((sx, sy))
    groups: Dict[tf.Tensor, List[tf.Tensor]] = {}
    for t in parent:
        groups.setdefault(find(t), []).append(t)
    position = {t: k for k, t in enumerate(concats)}
    order = None
    for members in groups.values():
        if (len(members) < 2 or _takes_fixed_grid(planner, members)
                or all(planner.plans[t].fixed is not None for t in members)):
            continue  # Fixed grids: the kernels', constants.
        if any(t in stepped for t in members):
            # The last member with a learned range owns it, named as its cell op's
            # first step; a fixed grid after it (a last TANH state) adds no statistics.
            order = order if order is not None else planner.topological_index()
            owner = max((t for t in members if planner.plans[t].fixed is None),
                        key=lambda t: (order.get(t.op, -1), t.value_index))
            _name_after_first_step(planner, owner, members, steps, order)
        else:
            # The last concatenation in graph order owns the range.
            owner = max((t for t in members if t in position), key=position.get)
        owner_plan = planner.plans[owner]
        for t in sorted(members, key=lambda t: (t.op._id, t.value_index)):  # pylint: disable=protected-access
            if t is owner:
                continue
            plan = planner.plans[t]
            # A rounding (an average pool's output) reads the group's range instead.
            plan.shared, plan.before_update = owner_plan, True
            if plan.fixed is None:  # A fixed grid adds no statistics (module docstring).
                owner_plan.members.append(t)


# Ops whose TFLite kernel needs one scale for its values and output, which the
# converter does not requantize to ("same scale constraint"): unlike a
# CONCATENATION's, their inputs cannot keep a kernel's fixed grid of their own.
_ONE_SCALE_TYPES = frozenset(["Select", "SelectV2", "Pack"])


def _takes_fixed_grid(planner, members: List[tf.Tensor]) -> bool:
    """Where a group with an op of `_ONE_SCALE_TYPES` has a member on a
    kernel's fixed grid (a SimpleRNN's state: a TANH output, kept by a mask's
    select), every member takes that grid: True when it did."""
    grids = {planner.plans[t].fixed for t in members} - {None}
    if len(grids) != 1 or not any(t.op.type in _ONE_SCALE_TYPES for t in members):
        return False
    grid = grids.pop()
    for t in members:
        plan = planner.plans[t]
        plan.fixed, plan.shared, plan.before_update = grid, None, False
    return True


def _step_member(planner, t: tf.Tensor):
    """The planned range a recurrence's cell value `t` has, if it can be shared."""
    if (not (planner.is_data(t) or planner._constant_state(t) is not None)  # pylint: disable=protected-access
            or not plan_graph.is_float(t)):
        return None
    source = planner._source(t)  # pylint: disable=protected-access
    plan = planner.plans.get(source)
    if plan is None or plan.is_weight or plan.per_channel or plan.shared is not None:
        return None
    return source


def _name_after_first_step(planner, owner: tf.Tensor, members: List[tf.Tensor],
                           steps: "recurrences.Steps", order) -> None:
    """Names the group's variables after the first step of its last cell value
    (the last step's, computed last): the same name whatever the number of
    steps, and for a loop and its unrolled form."""
    stepped = [t for t in members if t.op in steps.op_class and planner.plans[t].fixed is None]
    if not stepped:
        return
    last = max(stepped, key=lambda t: (order.get(t.op, -1), t.value_index))
    first_op = steps.op_class[last.op]
    firsts = [t for t in members if t.op is first_op and planner.plans[t].fixed is None]
    if firsts and firsts[0] is not owner:
        planner.plans[owner].variables_prefix = planner.plans[firsts[0]].prefix


def _removed_reduction_sources(planner, member: tf.Tensor) -> List[tf.Tensor]:
    """The ranges a member that is a reduction over size-1 axes (or a
    `converter_rewrites.needs_stated_scale` op: a reverse) reads by construction.

    Its FakeQuant (`plan_identity_rounding`) reads its input's source range;
    the converter removes the reduction (runs the reverse in its input's
    scale), so the concatenation reads that source's tensor in TFLite: the
    source joins the group (and so on up a chain of such reductions), or
    TFLite sees two scales ("same scale constraint").
    """
    found = []
    t = member
    for _ in range(10000):
        op = t.op
        if (not (converter_rewrites.is_size_one_reduction(op)
                 or converter_rewrites.needs_stated_scale(op))
                or not planner.is_data(op.inputs[0])):
            break
        t = planner._source(op.inputs[0])  # pylint: disable=protected-access
        plan = planner.plans.get(t)
        if plan is None or plan.is_weight or plan.per_channel:
            break
        found.append(t)
    return found


def _merged_resize_input(planner, member: tf.Tensor):
    """The tensor a grouped bilinear resize reads, where the converter merges
    the requantize to the group's scale into the op computing it; else None."""
    op = member.op
    if op.type != "ResizeBilinear" or not planner.is_data(op.inputs[0]):
        return None
    source = planner._source(op.inputs[0])  # pylint: disable=protected-access
    plan = planner.plans.get(source)
    if (plan is None or plan.is_weight or plan.per_channel
            or planner.is_source(source) or source.op.type in CONCAT_TYPES):
        return None  # Not measured: a graph input's or a concatenation's scale.
    # Only the resize reads it (through the same-scale ops between them).
    t = op.inputs[0]
    for _ in range(10000):
        if t is source:
            break
        if len(planner.readers(t)) != 1:
            return None
        t = t.op.inputs[op_table.same_scale_input(t.op, t.value_index)]
        if not planner.is_data(t):
            return None
    else:
        return None
    return source if len(planner.readers(source)) == 1 else None
