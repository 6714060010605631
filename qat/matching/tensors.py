"""Graph facts about single tensors and ops that several stages read.

What a FakeQuant op is, which dtypes FakeQuant quantizes, whether a gather is
a row lookup, what an op set feeds: facts of the graph, not decisions of a
pass. The resource-gather split (`qat.prepare.resource_gathers`), the
planner's lookups (`qat.quantize.plan.model.lookups`), its graph view
(`qat.quantize.plan.model.graph`) and the quantizer specs
(`qat.quantize.emit.quantizer_spec`) all read them from here.
"""
from typing import Iterable, Set

import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import node_attrs

# The FakeQuant ops qat builds (contrib's), per tensor and per channel.
FAKE_QUANT_TYPES = frozenset(
    ["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel"])
# Mixed precision: tensors of these dtypes are cast to float32 for their
# FakeQuant (`<prefix>/ToFloat32`) and back (`<prefix>/FromFloat32`); the
# range variables are float32 as always.
LOW_PRECISION_DTYPES = frozenset([tf.float16, tf.bfloat16])
# What FakeQuant can quantize (float16 / bfloat16 through float32).
QUANTIZABLE_DTYPES = frozenset([tf.float32]) | LOW_PRECISION_DTYPES


def is_float(t: tf.Tensor) -> bool:
    """Whether `t` has a dtype FakeQuant quantizes (float32, float16, bfloat16)."""
    return t.dtype.base_dtype in QUANTIZABLE_DTYPES


def gathers_rows(op: tf.Operation) -> bool:
    """A gather along axis 0 without batch dimensions (a table lookup)."""
    if op.type == "GatherV2":
        axis = tensor_util.constant_value(op.inputs[2])
        if axis is None or int(axis) != 0:
            return False
    try:
        if op.get_attr("batch_dims"):
            return False
    except ValueError:
        pass
    return True


def forward_closure(seeds: Iterable[tf.Operation]) -> Set[tf.Operation]:
    """`seeds` and every op that reads, directly or not, what they compute."""
    seen = set(seeds)
    stack = list(seen)
    while stack:
        op = stack.pop()
        for out in op.outputs:
            for c in out.consumers():
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
    return seen


def same_computation(a: tf.Operation, b: tf.Operation) -> bool:
    """Whether `a` and `b` compute the same value: one op type, the same input
    tensors and attributes (the converter keeps one of such ops)."""
    if a.type != b.type or list(a.inputs) != list(b.inputs):
        return False
    attrs = lambda op: {k: v.SerializeToString()
                        for k, v in node_attrs.public_attrs(op.node_def.attr).items()}
    return attrs(a) == attrs(b)


class ValueNumbers(object):
    """Numbers ops so that ops computing the same value get the same number.

    One type, the same attributes and inputs of the same values: two ReLUs
    of one tensor, two slices of one tensor with equal bounds, two reads of
    one variable, equal constants. TF's converter keeps one op of such a set
    (it folds constants and merges equal ops), so they have one scale in
    the converted model. A stateful op other than a variable read (a
    placeholder, a random draw, a queue) is a value of its own.
    """

    def __init__(self):
        self._numbers = {}
        self._keys = {}

    def number(self, op: tf.Operation) -> int:
        """The value number of `op` (of all its outputs, told apart by index)."""
        stack = [op]
        while stack:
            top = stack[-1]
            if top in self._numbers:
                stack.pop()
                continue
            top_type = top.type  # Read once: each read is a call into TensorFlow.
            leaf = self._leaf_key(top, top_type)
            if leaf is None:
                missing = [i.op for i in top.inputs if i.op not in self._numbers]
                if missing:
                    stack.extend(missing)
                    continue
                leaf = (top_type, _attrs_key(top),
                        tuple((self._numbers[i.op], i.value_index) for i in top.inputs))
            self._numbers[top] = self._keys.setdefault(leaf, len(self._keys))
            stack.pop()
        return self._numbers[op]

    def _leaf_key(self, op: tf.Operation, op_type: str):
        if op_type == "Const":
            return ("Const", _attrs_key(op))
        if op_type == "ReadVariableOp" or not op.inputs:
            # A read: of its variable's value; an op without inputs: its own.
            return None if op_type == "ReadVariableOp" else ("op", id(op))
        try:
            stateful = op.op_def.is_stateful
        except (AttributeError, ValueError):
            stateful = True
        return ("op", id(op)) if stateful else None


def _attrs_key(op: tf.Operation) -> tuple:
    return tuple(sorted((k, v.SerializeToString())
                        for k, v in node_attrs.public_attrs(op.node_def.attr).items()))
