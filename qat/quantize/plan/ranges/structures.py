"""The planner's structure recognisers and second looks (a mixin of `Planner`).

* Activations written as several ops (`qat.quantize.plan.ops.activation_patterns`:
  hard-swish, GELU): their interior gets no range, their output one.
* Dropout and drop path (`dropout_patterns.dropout_ops`): looked through.
* Parameters an own-range op computes with (layer-norm gamma and beta, a
  layer scale): weight ranges.
* Batch norms after no layer: a range, and in eval graphs a 1x1 depthwise
  conv (`qat.quantize.emit.standalone_batch_norm`).
* Ops the converter removes or runs in their input's scale
  (`qat.quantize.plan.ops.converter_rewrites`): same-scale ops.
* Batch norms written as arithmetic after no layer: their statistics
  arithmetic gets no range (`_find_batch_statistics`).
* Ops visited before their inputs had ranges (a rewrite created the ops
  they read after them): visited again.
"""
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import marks
from qat.matching import layer_patterns
from qat.quantize.plan.ops import activation_patterns
from qat.quantize.plan.ops import converter_rewrites
from qat.quantize.plan.ops import dropout_patterns
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.model import graph as plan_graph
from qat.matching import standalone_batch_norms


def _reduces_batch_axis(op: tf.Operation) -> bool:
    """A reduction whose constant axes include axis 0 (batch statistics)."""
    rank = op.inputs[0].shape.rank
    axes = tensor_util.constant_value(op.inputs[1]) if len(op.inputs) == 2 else None
    if rank is None or axes is None:
        return False
    return 0 in {int(a) % rank for a in np.ravel(axes)}


class StructurePlanning(object):
    """Mixin of `qat.quantize.plan.Planner` (uses its state and `_plan`)."""

    def _same_scale(self, op: tf.Operation) -> bool:
        """Whether `op`'s output has its input's range: a same-scale op, or
        one the converter removes (`qat.quantize.plan.ops.converter_rewrites`)."""
        if op not in self._same_scale_ops:
            self._same_scale_ops[op] = (
                op.type in op_table.SAME_SCALE_TYPES
                or converter_rewrites.removed_or_same_scale(op, self.is_data))
        return self._same_scale_ops[op]

    def _is_constant_division(self, op: tf.Operation) -> bool:
        return converter_rewrites.is_constant_division(op, self.is_data)

    def visit_constant_division(self, op: tf.Operation) -> None:
        """`x / c`, which TFLite runs as MUL by 1/c: a range on its output.

        The constant stays unquantized here: TFLite quantizes 1/c, not c.
        """
        x = op.inputs[0]
        if not self._is_ranged(x) and not self._is_input(x):
            self._deferred.append(op)
            return
        self._require(x)
        out = op.outputs[0]
        self._plan(out, plan_graph.own_context(op), "div_quant", -6.0,
                   self.consumers(out), allow_unused=True)

    def _fold_constant_adds(self, out: tf.Tensor, exclude) -> tf.Tensor:
        """The layer output after the constant adds the converter folds into
        its bias (`converter_rewrites.folded_bias_add`); those join the tail.

        Never across the model's boundary (`qat.quantize.plan.model.boundary`):
        `square(logits - 1.0)` is the loss's, and the logits keep their range.
        """
        for _ in range(100):
            readers = self.final_readers(out, exclude)
            if (len(readers) != 1 or not self._in_scope(readers[0])
                    or readers[0] not in self.model
                    or readers[0] in self.interior or readers[0] in self.tails
                    or not converter_rewrites.folded_bias_add(readers[0], out, self.is_data)):
                return out
            self.tail_ops.add(readers[0])
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
            if (not self.is_data(t) and plan_graph.is_float(t) and t.shape.rank
                    and layer_patterns.is_parameter(t)):
                self._plan(t, plan_graph.own_context(op), "param_quant", -6.0,
                           self.consumers(t), is_weight=True)

    def visit_whole_activation(self, op: tf.Operation, x: tf.Tensor) -> None:
        """A range on the output of the activation `op` reading `x` (and on x).

        Args:
          op: the output op of a `WHOLE_ACTIVATIONS` formula.
          x: its input.
        """
        if not self._is_ranged(x) and not self._is_input(x):
            self._deferred.append(op)
            return
        self._require(x)
        out = op.outputs[0]
        self._plan(out, plan_graph.own_context(op), "act_quant", -6.0,
                   self.consumers(out), allow_unused=True)

    def _find_structures(self, ordered) -> None:
        """Records whole activations (`interior`) and dropout (`looked_through`).

        Args:
          ordered: the data-path ops in graph order.
        """
        for op in ordered:
            found = activation_patterns.match_whole_activation(op)
            if found is not None:
                _, x, inner = found
                # The interior feeds the formula only (a reader outside it
                # would need a range inside).
                if all(c in inner or c is op for o in inner
                       for c in self.readers(o.outputs[0])):
                    self.whole_activations[op] = x
                    self.activation_interiors[op] = set(inner)
                    self.interior.update(inner)
            dropout = dropout_patterns.dropout_ops(op)
            if dropout is not None:
                self.looked_through.update(dropout)

    def _find_batch_statistics(self, ordered) -> None:
        """Records the statistics arithmetic of unfolded batch norms (`interior`).

        A batch norm written as arithmetic (`layer_patterns.UNFUSED_BATCH_NORM`,
        Keras 3's BatchNormalization) that follows no layer is `x * inv +
        offset`: in eval graphs inv and offset are constants, in training
        graphs they are computed from the batch's statistics (a reduction
        over the batch axis). Those computations get no range, as inside a
        fused batch norm. On a 4-D channels-last input it is then planned
        as a fused one (`plan_standalone_batch_norm`: its input and output);
        otherwise `x * inv` and the output get ranges, the same in training
        and eval graphs. Per-example statistics (a layer norm) are data in
        both and keep theirs.

        Args:
          ordered: the data-path ops in graph order.
        """
        for op in ordered:
            if (op.type not in ("Add", "AddV2") or op in self.tail_ops
                    or marks.is_replaced(op)):
                continue
            match = self.unfused_batch_norm_matches.get(op)
            if match is None:
                continue
            x = match.get_tensor("bn_input")
            statistics = [match.get_tensor("mean"), match.get_tensor("variance")]
            arithmetic = set(match.bound_ops()) - {op, match.get_op("scaled"), x.op}
            stack, seen = [t.op for t in statistics], set()
            while stack:
                o = stack.pop()
                if o is x.op or o in seen or o not in self.data_ops:
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
                self.unfused_batch_norms.add(op)
            for o in arithmetic:
                if o in self.data_ops:
                    self.interior.add(o)
                    self.batch_norm_of[o] = op

    def _revisit_deferred(self) -> None:
        """Visits again the ops whose inputs had no range yet.

        Graph order is creation order: an op an earlier rewrite made (the
        unfused layer norm of `qat.prepare.layer_norm`) comes after the user
        ops that read it. Repeated until no new range appears.
        """
        while self._deferred:
            deferred, self._deferred = self._deferred, []
            count = len(self.plans)
            for op in deferred:
                if op.name in self._left:
                    self._left.discard(op.name)
                    self.left_float = [e for e in self.left_float if e[0] != op.name]
                self.visit(op)
            if len(self.plans) == count:
                return

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
        self.standalone_bns.append(bn)
        x = standalone_batch_norms.data_input(bn, self.is_data)
        if x is not None:
            self._require(x)
        self._plan_output(bn.outputs[0], plan_graph.context(bn), "bn_quant", -6.0)
