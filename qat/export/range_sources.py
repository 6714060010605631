"""Where a FakeQuant's range comes from, to tell ranges equal by construction.

Why this module exists: the converter removes ops and merges identical ones,
so a range of the eval graph can survive in a TFLite tensor named after
another op (`twins`). Range survival (`qat.export.range_survival`) accepts that only
where qat made the two ranges one: the same variables, or the same fixed
grid (constants qat made, compared by value).
"""
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import marks
from qat.matching import tensors

# The per-tensor FakeQuants whose ranges TFLite tensors carry.
ACTIVATION_FAKE_QUANT_TYPES = frozenset(["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"])


def fake_quants_before(fake_quant: tf.Operation) -> List[tf.Operation]:
    """The nearest FakeQuants up the data path from a FakeQuant's input."""
    frontier, seen, found = [fake_quant.inputs[0].op], set(), []
    while frontier:
        op = frontier.pop(0)
        if op in seen:
            continue
        seen.add(op)
        if op.type in ACTIVATION_FAKE_QUANT_TYPES:
            found.append(op)
        else:
            frontier.extend(t.op for t in op.inputs if t.dtype == tf.float32)
    return found


def range_source(fake_quant: tf.Operation) -> Optional[tuple]:
    """Where a FakeQuant's min and max come from (back through Identity).

    A variable (a frozen one is a Const behind an Identity) by name; a
    kernel's fixed grid (a constant qat made, `fixed_ranges`) by value: two
    quantizers of one grid agree whatever training does.
    """
    if fake_quant.type != "FakeQuantWithMinMaxVars":
        return None
    names = []
    for t in fake_quant.inputs[1:3]:
        if t.op.type == "Const" and marks.made_by_qat(t.op, marks.QUANTIZER):
            value = tensor_util.MakeNdarray(t.op.get_attr("value"))
            names.append(("value", tuple(np.ravel(value).tolist())))
            continue
        while t.op.type in ("Identity", "ReadVariableOp") and t.op.inputs:
            t = t.op.inputs[0]
        names.append(t.op.name)
    return tuple(names)


def twins(fake_quants: List[tf.Operation]) -> Dict[tf.Operation, List[tf.Operation]]:
    """For each FakeQuant, the others quantizing a value computed the same
    way (two ReLUs of one tensor; a recurrent loop's first step and the step
    Keras computes outside the loop): the converter keeps one op of such a
    set, named after any of them (`tensors.ValueNumbers`)."""
    numbers = tensors.ValueNumbers()
    same: Dict[int, List[tf.Operation]] = {}
    for fake_quant in fake_quants:
        same.setdefault(numbers.number(fake_quant.inputs[0].op), []).append(fake_quant)
    return {fake_quant: [o for o in group if o is not fake_quant]
            for group in same.values() for fake_quant in group}
