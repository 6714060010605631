"""Planning the quantize pass: which tensors get a range, named how.

The plan is tensor-centric. `Planner` visits the data path in graph order and
decides for every float tensor, from the op that produces it and the ops
that read it (`qat.quantize.plan.ops.op_table`, TFLite's integer op requirements),
whether it needs a range. A tensor gets at most one quantizer, at its
producer, and every consumer reads the quantized value: never a raw path
beside a quantized one.

* Layers (Conv2D, DepthwiseConv2dNative, MatMul, transposed conv): their
  weights (`<ctx>/weights_quant`), their data input, and their output after
  the tail (bias add, folded batch norm): `<ctx>/act_quant`, or
  `<ctx>/conv_quant` when a residual add reads it. A RELU / RELU6 (or a
  `tf.maximum(x, 0)`, `qat.quantize.plan.ops.clamps`) that is the sole reader of a
  layer, ADD or SUB output is fused by TFLite: the range goes after it
  instead (`<ctx>/act_quant`).
* OWN_RANGE ops (ADD, MUL, MEAN, CONCATENATION, LEAKY_RELU, an unfused RELU,
  ...) whose float data inputs all have ranges: their output, named
  `<op scope>/<kind>` (`add_quant`, `mul_quant`, `mean_quant`, ...;
  `post_activation_bypass_quant` for an add reading an activation).
* Activations written as several ops (hard-swish, GELU;
  `qat.quantize.plan.ops.activation_patterns`): their output only (`act_quant`), so
  the converter makes each one integer HARD_SWISH / GELU op.
* Same-scale ops (pools, reshapes, pads, ...) and training-only dropout get
  no range of their own; fixed-range ops (LOGISTIC, TANH, SOFTMAX) a constant
  one, their kernel's grid, where the model reads them
  (`qat.quantize.plan.ranges.fixed_ranges`).
* A tensor an integer op reads that has no range yet (a model source, found
  by structure whatever feeds it: `qat.quantize.plan.model.feeds`; a tensor from
  outside `scope`): `<scope of its first model reader>/input_quant` (what
  feeds the model differs between its training and export graphs).
* Nothing outside the model (`qat.quantize.plan.model.boundary`, decided once):
  loss arithmetic gets no range and no warning; arithmetic after the
  model's last range that something else reads is named in `left_float`.
* A recipe (`qat.quantize.plan.ranges.precisions`): each layer's weight and
  output bits and per channel; the ops of a layer it keeps float are
  planned as ops outside `scope` (no range; their integer readers' inputs
  get `input_quant`).
* Batch norms after no layer: `qat.quantize.emit.standalone_batch_norm`.
* A concatenation and its inputs share one range
  (`qat.quantize.plan.ranges.shared_ranges`); average pools and bilinear
  resizes round to their input's range (`qat.quantize.plan.ranges.roundings`).

Names derive from the producing op (for a tensor entering the model, from
the model op that reads it), never from what only one of the graphs has:
ops that exist only in training graphs (gradients, dropout, the loss) are
looked through, so training and eval graphs plan the same names. What is left in float, and
why, is listed in `Planner.left_float`.
"""
import dataclasses
from typing import List, Optional, Tuple

import tensorflow as tf

from qat.engine import marks
from qat.engine import recipes
from qat.matching import standalone_batch_norms
from qat.quantize.plan import replication as replication_lib
from qat.quantize.plan.kernels import kernel_requirements
from qat.quantize.plan.model import boundary
from qat.quantize.plan.model import control_flow
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import layout as layout_lib
from qat.quantize.plan.model import recurrences
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ops import patterns as qp
from qat.quantize.plan.ranges import book as book_lib
from qat.quantize.plan.ranges import embeddings as plan_embeddings
from qat.quantize.plan.ranges import fixed_ranges
from qat.quantize.plan.ranges import precisions as precisions_lib
from qat.quantize.plan.ranges import reader as reader_lib
from qat.quantize.plan.ranges import roundings
from qat.quantize.plan.ranges import rules
from qat.quantize.plan.ranges import shared_ranges
from qat.quantize.plan.ranges import structures as plan_structures
from qat.quantize.plan.ranges import weights as plan_weights
from qat.quantize.plan.ranges.book import Plan

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


class Planner(object):
    """Plans the quantizers of one graph without changing it.

    The planner visits the data path and hands each op to the rule for it;
    what the rules share is held by collaborators, each made once here with
    what it needs:

    * `view` (`qat.quantize.plan.model.graph.GraphView`): what the planner
      reads off the graph (layers, data path, consumers, the model boundary);
    * `layout` (`qat.quantize.plan.model.layout.ModelLayout`): the model's
      structures (layer tails, whole activations, dropout, batch statistics);
    * `steps` (`qat.quantize.plan.model.recurrences.Steps`): recurrences;
    * `settings` (`qat.quantize.plan.ranges.book.PlanSettings`);
    * `book` (`qat.quantize.plan.ranges.book.PlanBook`): the plans, their
      names and what stays float, the one state the rules write;
    * `reader` (`qat.quantize.plan.ranges.reader.RangeReader`): the range a
      tensor reads, from the book;
    * `rules`, `structures` (`RangeRules`, `StructureRules`): the visits' rules.

    `replication` (`qat.quantize.plan.replication`): how replicas of the
    model in the graph share ranges; by default there are none.
    """

    def __init__(self, graph, is_training, scope, per_channel,
                 per_channel_matmul=None,
                 replication: replication_lib.Replication = replication_lib.SINGLE_MODEL,
                 recipe: Optional[recipes.Recipe] = None,
                 base: recipes.Precision = recipes.Precision()):
        self.replication = replication
        self.view = plan_graph.GraphView(graph)
        self.layout = layout_lib.find_layout(self.view)
        self.steps = recurrences.find(self.view)
        in_scope = lambda op: not scope or op.name.startswith(scope)  # pylint: disable=unnecessary-lambda-assignment
        # Each layer's precision under the recipe (RecipeError before any plan).
        # Matmul weights per channel too (default: as `per_channel`).
        per_channel_matmul = per_channel if per_channel_matmul is None else per_channel_matmul
        self.precisions = precisions_lib.LayerPrecisions(
            self.view, self.steps, recipe, base, in_scope, per_channel, per_channel_matmul)
        self.settings = book_lib.PlanSettings(
            is_training=is_training, scope=scope, per_channel=per_channel,
            per_channel_matmul=per_channel_matmul,
            precisions=self.precisions if recipe else None)
        self.book = book_lib.PlanBook()
        self.reader = reader_lib.RangeReader(self.view, self.layout, self.book, self.steps)
        self.rules = rules.RangeRules(self.view, self.layout, self.book, self.reader,
                                      self.settings)
        self.structures = plan_structures.StructureRules(self.view, self.book, self.reader,
                                                         self.rules)

    @property
    def left_float(self) -> List[Tuple[str, str]]:
        """(tensor or op name, reason) for what the plan leaves in float."""
        return self.book.left_float

    def visit(self, op: tf.Operation) -> None:
        """Hands `op` to the rule for it (see the module docstring)."""
        view, layout, book = self.view, self.layout, self.book
        if (op in layout.tail_ops and op not in layout.tails) or op in book.fused \
                or op in layout.interior or op in layout.looked_through:
            return
        if op in layout.tails:
            self.rules.visit_layer(op)
            return
        if not self.settings.in_scope(op) or not op.outputs:
            return
        if marks.made_by_qat(op, marks.QUANTIZER, marks.QUANTIZER_OUTPUT):
            return  # An earlier call's quantizer (a second call): never a float layer.
        if marks.is_replaced(op):
            return  # Unconnected: a rewrite moved its consumers.
        if op not in view.model:
            self._after_model(op)
            return  # Loss arithmetic, or after the model: no range (`boundary`).
        if (op.type in qp.BATCH_NORM_TYPES or op in layout.unfused_batch_norms
                or (op.type in op_table.FUNCTIONAL_TYPES
                    and standalone_batch_norms.is_batch_norm_cond(
                        op, view.function_library()))):
            self.structures.plan_standalone_batch_norm(op)
        elif op in layout.whole_activations:
            self.structures.visit_whole_activation(op, layout.whole_activations[op])
        elif self.reader.same_scale(op) and op.type not in op_table.SAME_SCALE_TYPES:
            return  # The converter removes it (`converter_rewrites`).
        elif op.type in op_table.OWN_RANGE_TYPES:
            self.rules.visit_own_range(op)
        elif self.structures.is_constant_division(op):
            self.structures.visit_constant_division(op)
        elif op.type in op_table.FIXED_RANGE_TYPES:
            fixed_ranges.plan(view, self.reader, book, op)
        elif (op.type in op_table.SAME_SCALE_TYPES
              or op.type in op_table.FIXED_RANGE_TYPES
              or op.type in qp.METADATA_TYPES):  # Read shapes, not values.
            return
        elif op.type in op_table.FUSED_RECURRENCE_TYPES:
            book.leave(op.name, _FUSED_RECURRENCE_REASON % op.type)
        elif any(self.reader.is_ranged(i) for i in op.inputs if view.is_data(i)
                 and _is_float(i)):
            if op.type in op_table.FUNCTIONAL_TYPES:
                reason = "functional control flow (%s): not visible" % op.type
            else:
                reason = "%s has no integer TFLite kernel in qat's table" % op.type
            book.leave(op.name, reason)

    def _after_model(self, op: tf.Operation) -> None:
        """Names an op after the model that reads a model output (`boundary`)."""
        view = self.view
        if (op not in view.after_model or self.reader.same_scale(op)
                or op.type in qp.METADATA_TYPES or op.type in op_table.FUNCTIONAL_TYPES):
            # A same-scale op keeps the range it reads (a reshape of the softmax);
            # the layers inside a function call are named apart (`control_flow`).
            return
        read = [i.name for i in op.inputs if view.is_data(i) and _is_float(i)
                and self.reader.source(i).op in view.model]
        if not read:
            return
        if boundary.has_integer_kernel(op):
            self.book.leave(op.name, _AFTER_MODEL_REASON % (op.type, ", ".join(read)))
        else:
            self.book.leave(op.name, "%s has no integer TFLite kernel in qat's table (it reads "
                            "the model's %s)" % (op.type, ", ".join(read)))

    def _revisit_deferred(self) -> None:
        """Visits again the ops whose inputs had no range yet.

        Graph order is creation order: an op an earlier rewrite made (the
        unfused layer norm of `qat.prepare.layer_norm`) comes after the user
        ops that read it. Repeated until no new range appears.
        """
        while self.rules.deferred:
            count = len(self.book.plans)
            for op in self.rules.take_deferred():
                self.book.unleave(op.name)
                self.visit(op)
            if len(self.book.plans) == count:
                return

    # --- Driver -------------------------------------------------------------

    def run(self) -> List[Plan]:
        """Plans every range of the graph (once).

        Returns:
          The plans, in planning order, as the replication hook shares them.
        """
        view, book, settings = self.view, self.book, self.settings
        for layer in view.gradient_layers:
            book.leave(layer.name, "gradient op")
        weights = plan_weights.WeightRules(view, book, settings)
        for layer in [op for op in view.layers if settings.in_scope(op)]:
            weights.plan_weights(layer)
        plan_embeddings.plan_embeddings(view, book, settings)
        ordered = view.ordered_ops()
        for op in ordered:
            self.visit(op)
        self._revisit_deferred()
        book.name_shared()
        # Roundings first, then the groups (a pool a concatenation reads joins
        # its group), then identical ops (a group's where one is a member).
        roundings.Roundings(view, self.layout, book, self.reader, settings).plan(ordered)
        shared_ranges.ConcatGroups(view, book, self.reader, self.steps).share(ordered)
        shared_ranges.share_identical_outputs(view, book, settings.is_training, ordered)
        self.precisions.mark_recurrent_ranges(book.plans.values())
        return self.replication.share(self, list(book.plans.values()))


@dataclasses.dataclass
class PlannedGraph:
    """The planner's decisions for one graph, what the emitter builds from.

    Attributes:
      plans: every quantizer to build, in planning order.
      left_float: (tensor or op name, reason) for what stays float: the
        planner's, then the layers inside functional control flow.
      standalone_bns: batch norms after no layer (eval graphs give them a
        depthwise form, `qat.quantize.emit.standalone_batch_norm`).
      layers: with a recipe, each layer and the precision it resolved to.
    """
    plans: List[Plan]
    left_float: List[Tuple[str, str]]
    standalone_bns: List[tf.Operation]
    layers: List[precisions_lib.Layer] = dataclasses.field(default_factory=list)


def check_recipe(graph: tf.Graph, config) -> None:
    """Raises RecipeError when `config.recipe` cannot apply to `graph`'s layers.

    Reads the graph only: the rewrite calls it before the fold, so a bad
    recipe changes nothing (the planner resolves it again after the fold,
    on the same layers).
    """
    view = plan_graph.GraphView(graph)
    scope = config.scope
    precisions_lib.LayerPrecisions(view, recurrences.find(view), config.recipe,
                                   config.base_precision(),
                                   lambda op: not scope or op.name.startswith(scope),
                                   config.conv_weights_per_channel(),
                                   config.matmul_weights_per_channel())


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
                      replication=replication, recipe=config.recipe,
                      base=config.base_precision())
    plans = planner.run()
    kernel_requirements.attach(planner, plans)
    left_float = list(planner.left_float)
    # Layers inside functional control flow (If / While bodies, functions
    # called from the graph) are not rewritten: each is named.
    left_float += [(f"{layer.function}/{layer.layer}", layer.describe())
                   for layer in control_flow.find_function_layers(graph)
                   if not config.scope or layer.call_op.startswith(config.scope)]
    return PlannedGraph(plans=plans, left_float=left_float,
                        standalone_bns=list(planner.book.standalone_bns),
                        layers=list(planner.precisions.layers))
