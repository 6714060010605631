"""The weight ranges of layers.

Every layer's weights get one last-value range, `<layer scope>/weights_quant`,
read by the layer (or by the training fold's unscale Mul in front of it);
reads of one resource variable by several layers are one weight, quantized
once. Per channel means along the output channels (not for transposed
layouts, nor for MatMuls unless asked).
"""
from typing import List

import tensorflow as tf

from qat.matching import layer_patterns
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.ops import patterns as qp
from qat.quantize.plan.ranges import book as book_lib


class WeightRules(object):
    """Plans the weight ranges of layers.

    Args:
      view: the graph's `GraphView` (its gradient ops).
      book: the `PlanBook` the ranges are planned into (`weight_plans`).
      settings: the pass's `PlanSettings` (per channel or not).
    """

    def __init__(self, view: plan_graph.GraphView, book: book_lib.PlanBook,
                 settings: book_lib.PlanSettings):
        self.view = view
        self.book = book
        self.settings = settings

    def _weight_readers(self, w: tf.Tensor) -> List[tf.Operation]:
        """Layers reading weights `w`, or the training fold's unscale Mul
        (`layer_patterns.UNSCALED_WEIGHTS`) they read `w` through."""
        def reads(c):
            return c.type in qp.LAYER_TYPES and c.inputs[1] is w
        return [c for c in w.consumers() if c not in self.view.gradient_ops and (
            reads(c) or c.type == "Mul" and any(
                op.type in layer_patterns.FOLDABLE_TYPES
                and layer_patterns.weight_input(op) is w
                for op in c.outputs[0].consumers()))]

    def plan_weights(self, layer: tf.Operation) -> None:
        """The range of `layer`'s weights, or `layer` as a reader of a planned one."""
        # Input 1 for every layer type; w*s behind the fold's unscale Mul.
        w = layer_patterns.weight_input(layer)
        if plan_graph.is_quantized_output(w):
            return
        # Reads of one resource variable are one weight: quantized once.
        key = w.op.inputs[0] if w.op.type == "ReadVariableOp" else w
        shared = self.book.weight_plans.get(key)
        if shared is not None:
            if shared.tensor is not w and layer not in shared.weight_sharers:
                shared.weight_sharers.append(layer)
            return
        sharing = self._weight_readers(w)
        # Per channel means along the output channels, the last axis of the
        # weights (depthwise: reshaped in _spec); not for transposed layouts.
        # A recipe's per_channel (resolved for the layer's kind,
        # `precisions.LayerPrecisions`), else the options'.
        precisions = self.settings.precisions
        precision = precisions.of(layer) if precisions is not None else None
        if precision is not None:
            wanted = precision.per_channel
        elif layer.type == "MatMul":
            wanted = self.settings.per_channel_matmul
        else:
            wanted = self.settings.per_channel
        per_channel = (wanted and w.shape.rank in (2, 4)
                       and layer.type not in qp.TRANSPOSED_CONV_TYPES
                       and not (layer.type == "MatMul" and layer.get_attr("transpose_b")))
        if self.book.plan(w, plan_graph.context(layer), "weights_quant", -6.0, sharing,
                          is_weight=True, per_channel=per_channel):
            plan = self.book.plans[w]
            plan.depthwise = layer.type == "DepthwiseConv2dNative"
            plan.bits = precision.weight_bits if precision is not None else None
            self.book.weight_plans[key] = plan
