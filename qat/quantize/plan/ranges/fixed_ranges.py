"""Fixed-range outputs read by the model: a FakeQuant on TFLite's fixed grid.

TFLite's integer LOGISTIC, TANH, SOFTMAX and LOG_SOFTMAX kernels write their
output on a grid the kernel fixes, whatever range the graph states
(docs/what_gets_a_range.md): LOGISTIC and SOFTMAX on steps of 1/256 from 0,
TANH on steps of 1/128 from -1, LOG_SOFTMAX on steps of 16/256 up to 0. When
another op of the model reads such an output (a squeeze-excite multiply
`x * sigmoid(s)`, a gate, attention weights), TFLite computes with the
rounded value: the eval graph must too, or the reader differs by up to half
a grid step times its gain.

So such an output gets a FakeQuant whose range is a constant: the fixed grid
itself (`<op scope>/fixed_quant`), the same in training and eval graphs, no
variables (a plain Saver restores strictly either way). Its 8-bit grid is
the same in both flavours: [0, 255/256] has zero point 0 in uint8 and -128
in int8, exactly LOGISTIC's output quantization. The converter keeps the
kernel's scale: the range equals it, so nothing requantizes.

An output that no model op reads (a model output, read by nothing or by the
loss only; `qat.quantize.plan.model.boundary`) gets none: its kernel's rounding
is the last one, as before.
"""
from typing import Optional, Tuple

import tensorflow as tf

from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.ops import patterns as qp
from qat.quantize.plan.ranges import book as book_lib
from qat.quantize.plan.ranges import reader as reader_lib

# Op type -> (min, max) of its 8-bit output grid (scale (max - min) / 255).
FIXED_GRIDS = {
    "Sigmoid": (0.0, 255.0 / 256.0),
    "Softmax": (0.0, 255.0 / 256.0),
    "Tanh": (-1.0, 127.0 / 128.0),
    "LogSoftmax": (-255.0 * 16.0 / 256.0, 0.0),
}
# The bit width whose grids TFLite fixes.
FIXED_BITS = 8
RANGE_NAME = "fixed_quant"


def fixed_grid(op: tf.Operation) -> Optional[Tuple[float, float]]:
    """The constant range of `op`'s output in TFLite, or None.

    Args:
      op: any op.

    Returns:
      (min, max) of the 8-bit grid TFLite's kernel writes, or None when the
      op's output range is not fixed by its kernel.
    """
    return FIXED_GRIDS.get(op.type)


def plan(view: plan_graph.GraphView, reader: reader_lib.RangeReader, book: book_lib.PlanBook,
         op: tf.Operation) -> None:
    """Plans a fixed-range FakeQuant on `op`'s output if the model reads it.

    Args:
      view: the graph's `GraphView`.
      reader: the `RangeReader` (who reads the output).
      book: the `PlanBook` the range is planned into.
      op: a LOGISTIC / TANH / SOFTMAX / LOG_SOFTMAX op of the data path.
    """
    grid = fixed_grid(op)
    out = op.outputs[0]
    if grid is None or not plan_graph.is_float(out) or not view.is_data(op.inputs[0]):
        return
    readers = [r for r in reader.final_readers(out)
               if r in view.model and r.type not in qp.METADATA_TYPES]
    if not readers:
        return
    if book.plan(out, plan_graph.own_context(op), RANGE_NAME, grid[0], view.consumers(out)):
        book.plans[out].fixed = grid
