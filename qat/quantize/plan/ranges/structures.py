"""The ranges of structures recognised whole.

* Activations written as several ops (`qat.quantize.plan.ops.activation_patterns`:
  hard-swish, GELU; found by `qat.quantize.plan.model.layout`): their output
  gets a range, their interior none.
* Divisions by a constant (`x / c`, which TFLite runs as MUL by 1/c): their
  output.
* Batch norms after no layer: a range, and in eval graphs a 1x1 depthwise
  conv (`qat.quantize.emit.standalone_batch_norm`).

Ops visited before their inputs had ranges are deferred to the planner's
second look (`RangeRules.defer`).
"""
import tensorflow as tf

from qat.matching import standalone_batch_norms
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.ops import converter_rewrites
from qat.quantize.plan.ranges import book as book_lib
from qat.quantize.plan.ranges import reader as reader_lib
from qat.quantize.plan.ranges import rules as rules_lib


class StructureRules(object):
    """The rules for whole activations, constant divisions and standalone batch norms.

    Args:
      view: the graph's `GraphView`.
      book: the `PlanBook` the rules plan into.
      reader: the `RangeReader` over that book.
      rules: the `RangeRules` (`require`, `plan_output`, `defer`).
    """

    def __init__(self, view: plan_graph.GraphView, book: book_lib.PlanBook,
                 reader: reader_lib.RangeReader, rules: rules_lib.RangeRules):
        self.view = view
        self.book = book
        self.reader = reader
        self.rules = rules

    def is_constant_division(self, op: tf.Operation) -> bool:
        """Whether `op` is `x / c` with a constant c (`converter_rewrites`)."""
        return converter_rewrites.is_constant_division(op, self.view.is_data)

    def visit_constant_division(self, op: tf.Operation) -> None:
        """`x / c`, which TFLite runs as MUL by 1/c: a range on its output.

        The constant stays unquantized here: TFLite quantizes 1/c, not c.
        """
        x = op.inputs[0]
        if not self.reader.is_ranged(x) and not self.reader.is_input(x):
            self.rules.defer(op)
            return
        self.rules.require(x)
        out = op.outputs[0]
        self.book.plan(out, plan_graph.own_context(op), "div_quant", -6.0,
                       self.view.consumers(out), allow_unused=True)

    def visit_whole_activation(self, op: tf.Operation, x: tf.Tensor) -> None:
        """A range on the output of the activation `op` reading `x` (and on x).

        Args:
          op: the output op of a `WHOLE_ACTIVATIONS` formula.
          x: its input.
        """
        if not self.reader.is_ranged(x) and not self.reader.is_input(x):
            self.rules.defer(op)
            return
        self.rules.require(x)
        out = op.outputs[0]
        self.book.plan(out, plan_graph.own_context(op), "act_quant", -6.0,
                       self.view.consumers(out), allow_unused=True)

    def plan_standalone_batch_norm(self, bn: tf.Operation) -> None:
        """A range for a batch norm that follows no layer (contrib had none).

        Input normalisation, or a batch norm after a concat or an add: the
        fold pass leaves it alone. Its input gets a range as a layer input
        would, its output `<bn ctx>/bn_quant`, or `<bn ctx>/act_quant` after
        the activation that alone reads it. Eval graphs then replace it by a
        1x1 depthwise conv TFLite runs in integer
        (`qat.quantize.emit.standalone_batch_norm`).
        """
        if standalone_batch_norms.is_replaced(bn):
            return  # An earlier pass moved its consumers to the depthwise form.
        self.book.standalone_bns.append(bn)
        x = standalone_batch_norms.data_input(bn, self.view.is_data)
        if x is not None:
            self.rules.require(x)
        self.rules.plan_output(bn.outputs[0], plan_graph.context(bn), "bn_quant", -6.0)
