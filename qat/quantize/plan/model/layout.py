"""What the model is made of, found once per graph before any range is planned.

Why this module exists: every range rule asks the same questions of an op (is
it inside an activation written as several ops, dropout, a layer's tail, a
batch norm's statistics, the model at all?), and the answers depend on the
graph alone. `find_layout` finds them once, in the order each needs the one
before, and `ModelLayout` holds them for the rules to read:

* activations written as several ops (`qat.quantize.plan.ops.activation_patterns`:
  hard-swish, GELU): their interior gets no range, their output one;
* dropout and drop path (`qat.quantize.plan.ops.dropout_patterns`): looked
  through;
* each layer's tail and output (`qat.quantize.plan.model.tails`), stopping at
  those interiors;
* the model/loss boundary (`qat.quantize.plan.model.boundary`, set on the
  view), then the tails again where one reached past the model (a constant
  the loss adds to the logits);
* batch norms written as arithmetic after no layer: their statistics
  arithmetic (`interior`), and the 4-D ones planned as fused ones.
"""
import dataclasses
from typing import Dict, List, Optional, Set

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import marks
from qat.matching import standalone_batch_norms
from qat.quantize.plan.model import boundary
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import tails as tails_lib
from qat.quantize.plan.ops import activation_patterns
from qat.quantize.plan.ops import dropout_patterns
from qat.quantize.plan.ops import op_table


@dataclasses.dataclass
class ModelLayout:
    """The structures of one graph's model that the range rules read.

    Found by `find_layout` and read-only afterwards, except `tail_ops`: the
    layer rule adds to it the constant adds the converter folds into a
    layer's bias (`qat.quantize.plan.ranges.rules.RangeRules.fold_constant_adds`),
    which are then the layer's as its tail is.

    Attributes:
      tails: layer op -> the ops of its tail (the layer included).
      outputs: layer op -> the tensor that is the layer's output, or None.
      tail_ops: the ops of every tail.
      interior: ops inside an activation written as several ops or inside a
        batch norm's statistics arithmetic: no range of their own.
      whole_activations: output op of an activation written as several ops
        -> its input.
      activation_interiors: output op of such an activation -> the ops inside.
      looked_through: dropout ops -> the tensor they read.
      unfused_batch_norms: final adds of 4-D batch norms written as
        arithmetic after no layer (planned as standalone batch norms).
      batch_norm_of: statistics arithmetic of such a batch norm -> its final add.
    """
    tails: Dict[tf.Operation, Set[tf.Operation]] = dataclasses.field(default_factory=dict)
    outputs: Dict[tf.Operation, Optional[tf.Tensor]] = dataclasses.field(default_factory=dict)
    tail_ops: Set[tf.Operation] = dataclasses.field(default_factory=set)
    interior: Set[tf.Operation] = dataclasses.field(default_factory=set)
    whole_activations: Dict[tf.Operation, tf.Tensor] = dataclasses.field(default_factory=dict)
    activation_interiors: Dict[tf.Operation, Set[tf.Operation]] = dataclasses.field(
        default_factory=dict)
    looked_through: Dict[tf.Operation, tf.Tensor] = dataclasses.field(default_factory=dict)
    unfused_batch_norms: Set[tf.Operation] = dataclasses.field(default_factory=set)
    batch_norm_of: Dict[tf.Operation, tf.Operation] = dataclasses.field(default_factory=dict)


def find_layout(view: plan_graph.GraphView) -> ModelLayout:
    """The structures of `view`'s model (see the module docstring).

    Sets the view's boundary (`model`, `loss`, `after_model`, `observers`).

    Args:
      view: the graph's `GraphView`.

    Returns:
      The model's layout.
    """
    layout = ModelLayout()
    ordered = view.ordered_ops()
    _find_structures(view, layout, ordered)
    walker = tails_lib.LayerTails(view.is_data, view.params, view.gradient_ops,
                                  view.unfused_batch_norm_matches)
    for layer in view.layers:
        tail, out = walker.walk_tail(layer, stop=layout.interior)
        layout.tails[layer], layout.outputs[layer] = tail, out
        layout.tail_ops |= tail
    boundary.find_boundary(view, layout.tail_ops, layout.whole_activations,
                           layout.activation_interiors, layout.looked_through)
    # A tail never reaches past the model (a constant the loss adds to the logits).
    outside = layout.tail_ops - view.model
    if outside:
        layout.tail_ops = set()
        for layer in view.layers:
            if layout.tails[layer] & outside:
                tail, out = walker.walk_tail(layer, stop=layout.interior | outside)
                layout.tails[layer], layout.outputs[layer] = tail, out
            layout.tail_ops |= layout.tails[layer]
    _find_batch_statistics(view, layout, ordered)
    return layout


def _find_structures(view: plan_graph.GraphView, layout: ModelLayout,
                     ordered: List[tf.Operation]) -> None:
    """Records whole activations (`interior`) and dropout (`looked_through`).

    Args:
      view: the graph's `GraphView`.
      layout: the layout being found.
      ordered: the data-path ops in graph order.
    """
    for op in ordered:
        found = activation_patterns.match_whole_activation(op)
        if found is not None:
            _, x, inner = found
            # The interior feeds the formula only (a reader outside it
            # would need a range inside).
            if all(c in inner or c is op for o in inner
                   for c in view.readers(o.outputs[0])):
                layout.whole_activations[op] = x
                layout.activation_interiors[op] = set(inner)
                layout.interior.update(inner)
        dropout = dropout_patterns.dropout_ops(op)
        if dropout is not None:
            layout.looked_through.update(dropout)


def _reduces_batch_axis(op: tf.Operation) -> bool:
    """A reduction whose constant axes include axis 0 (batch statistics)."""
    rank = op.inputs[0].shape.rank
    axes = tensor_util.constant_value(op.inputs[1]) if len(op.inputs) == 2 else None
    if rank is None or axes is None:
        return False
    return 0 in {int(a) % rank for a in np.ravel(axes)}


def _find_batch_statistics(view: plan_graph.GraphView, layout: ModelLayout,
                           ordered: List[tf.Operation]) -> None:
    """Records the statistics arithmetic of unfolded batch norms (`interior`).

    A batch norm written as arithmetic (`layer_patterns.UNFUSED_BATCH_NORM`,
    Keras 3's BatchNormalization) that follows no layer is `x * inv +
    offset`: in eval graphs inv and offset are constants, in training
    graphs they are computed from the batch's statistics (a reduction
    over the batch axis). Those computations get no range, as inside a
    fused batch norm. On a 4-D channels-last input it is then planned
    as a fused one (`StructureRules.plan_standalone_batch_norm`: its input
    and output); otherwise `x * inv` and the output get ranges, the same in
    training and eval graphs. Per-example statistics (a layer norm) are data
    in both and keep theirs.

    Args:
      view: the graph's `GraphView`.
      layout: the layout being found (its tails known).
      ordered: the data-path ops in graph order.
    """
    for op in ordered:
        # The matches are of Adds only: asked first, so no other op's type is read.
        match = view.unfused_batch_norm_matches.get(op)
        if (match is None or op.type not in ("Add", "AddV2") or op in layout.tail_ops
                or marks.is_replaced(op)):
            continue
        x = match.get_tensor("bn_input")
        statistics = [match.get_tensor("mean"), match.get_tensor("variance")]
        arithmetic = set(match.bound_ops()) - {op, match.get_op("scaled"), x.op}
        stack, seen = [t.op for t in statistics], set()
        while stack:
            o = stack.pop()
            if o is x.op or o in seen or o not in view.data_ops:
                continue
            seen.add(o)
            arithmetic.add(o)
            stack.extend(i.op for i in o.inputs)
        reductions = [o for o in arithmetic if o.type in op_table.REDUCTION_TYPES]
        if any(not _reduces_batch_axis(o) for o in reductions):
            continue  # Per-example statistics: a layer norm.
        if standalone_batch_norms.unfused_parts(op) is not None:
            # A 4-D one is a standalone batch norm as a fused one is:
            # ranges on its input and output only (inside, a FakeQuant on
            # x * inv would break the cancellation of the batch mean's
            # gradient), a 1x1 depthwise conv in eval graphs.
            arithmetic.add(match.get_op("scaled"))
            layout.unfused_batch_norms.add(op)
        for o in arithmetic:
            if o in view.data_ops:
                layout.interior.add(o)
                layout.batch_norm_of[o] = op
