"""Where the range of a tensor entering the model is named.

What feeds a model differs between the graphs of one model (a tf.data
iterator while training, a placeholder in the export graph, other
preprocessing), so a tensor entering the model gets its range named after the
model op that reads it first, which both graphs share:
`<reader scope>/input_quant`. Readers are found through the ops TFLite drops
(Identity, dropout: `RangeReader.final_readers`), and through a split of the batch
between data-parallel replicas (`behind_batch_splits`: TF1 towers split one
input batch with Split / SplitV / Unpack along axis 0), so every replica
names the range as the single-replica eval graph does.
"""
from typing import List

import tensorflow as tf

from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import layout as layout_lib
from qat.quantize.plan.ranges import reader as reader_lib

# Ops that split a batch between replicas (axis 0): an input range is named
# after the model op behind them, in every replica.
BATCH_SPLIT_TYPES = frozenset(["Split", "SplitV", "Unpack"])


def splits_batch(op: tf.Operation) -> bool:
    """Whether `op` splits a batch along axis 0 (between replicas)."""
    if op.type not in BATCH_SPLIT_TYPES:
        return False
    if op.type == "Unpack":
        return op.get_attr("axis") == 0
    axis_input = op.inputs[0] if op.type == "Split" else op.inputs[2]
    value = tf.get_static_value(axis_input)
    return value is not None and int(value) == 0


def behind_batch_splits(readers: List[tf.Operation], final_readers) -> List[tf.Operation]:
    """`readers`, with a batch split between replicas replaced by its readers.

    Args:
      readers: ops reading a tensor that enters the model.
      final_readers: `RangeReader.final_readers` (through Identity, dropout).

    Returns:
      The model ops the tensor's range is named after.
    """
    return [c for r in readers for c in (
        [c for out in r.outputs for c in final_readers(out)] if splits_batch(r) else [r])]


def entry_context(s: tf.Tensor, view: plan_graph.GraphView, layout: layout_lib.ModelLayout,
                  reader: reader_lib.RangeReader) -> str:
    """Where the range of a tensor entering the model is named.

    What feeds a model differs between the graphs of one model (a tf.data
    iterator while training, a placeholder in the export graph, other
    preprocessing), so the range is named after the model op that reads
    it first, which both graphs share: `<reader scope>/input_quant`.

    Args:
      s: the tensor entering the model.
      view: the graph's `GraphView` (its boundary).
      layout: the model's `ModelLayout` (batch norms' statistics).
      reader: the `RangeReader` (`final_readers`).

    Returns:
      The name scope of the range.
    """
    # A batch norm reads its input for statistics in training graphs
    # only: it reads it where its final add is.
    readers = [layout.batch_norm_of.get(r, r) for r in reader.final_readers(s)
               if r in view.model]
    readers = behind_batch_splits(readers, reader.final_readers)
    if not readers:
        return plan_graph.own_context(s.op)
    return plan_graph.own_context(min(readers, key=lambda o: o._id))  # pylint: disable=protected-access
