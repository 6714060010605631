"""Which step of a recurrent layer an op of an eval graph computes.

A recurrent layer's steps are copies of one cell (`static_rnn`, Keras
`unroll=True`, a loop qat unrolled: `qat.prepare.loops`); the planner matches
them (`qat.quantize.plan.model.recurrences`), and the layer numerics label each row
of a recurrent layer with its step (`qat.report.numerics`), so a drift can
be read step by step.
"""
from typing import Dict

import tensorflow as tf

from qat.matching import layer_patterns
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import recurrences


def recurrent_steps(graph: tf.Graph) -> Dict[str, int]:
    """{op name: its step, from 0} for the ops of `graph`'s recurrent layers.

    Args:
      graph: a (frozen) eval graph.

    Returns:
      The steps of every op matched to the same op of another step; empty
      when the graph has no recurrent layer (no two layers read one weight).
    """
    weights = [recurrences.weight_key(layer_patterns.weight_input(op))
               for op in layer_patterns.layer_ops(graph) if len(op.inputs) > 1]
    if len(set(weights)) == len(weights):
        return {}
    steps = recurrences.find(plan_graph.GraphView(graph))
    return {op.name: step for op, step in steps.step_of().items()}
