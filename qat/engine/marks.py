"""The mark qat leaves on every op it creates.

Each op a pass adds carries the attribute `_qat` (TensorFlow keeps attributes
starting with an underscore on any op, through GraphDef and MetaGraphDef
round trips and freezing) whose value names its role: `fold` for the fold
pass's ops, `quantizer` for a quantizer's ops and `quantizer_output` for the
one op whose output consumers read. Idempotence and recognition of qat's own
structures go through these marks, never through op names, so a user op named
like one of qat's (`conv/act_quant/max`) is never mistaken for it.
"""
from typing import Optional
import weakref

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
from tensorflow.python.framework import c_api_util

ATTR = "_qat"

FOLD = "fold"
QUANTIZER = "quantizer"
QUANTIZER_OUTPUT = "quantizer_output"
STANDALONE_BATCH_NORM = "standalone_batch_norm"
LAYER_NORM = "layer_norm"
# A resource variable's lookup split into read + gather (`qat.quantize.plan.model.lookups`).
EMBEDDING = "embedding"
# A layer op a function call computed (tf_keras's grouped Conv2D), now in the graph.
LAYER_CALL = "layer_call"
# The steps of a recurrent loop, unrolled (`qat.prepare.loops`).
LOOP = "loop"
# `zeros_like(x)` as a Fill of x's shape (`qat.prepare.constant_fills`).
CONSTANT_FILL = "constant_fill"
# Training graphs: what a Rsqrt reads where its quantized input is 0.
ZERO_GUARD = "zero_guard"
# A quantized layer computing in float16 / bfloat16 and its casts (`qat.tf2.precision`).
LOW_PRECISION = "low_precision"
# Replicas: where the range statistics of a step are combined
# (`qat.quantize.emit.step_statistics`).
RANGE_STATISTICS = "range_statistics"

# The roles of ops a prepare pass puts in place of the user's: the model's own
# computations, written by qat (not ranges, folds or other machinery).
MODEL_ROLES = frozenset([LAYER_CALL, LOOP, CONSTANT_FILL])

# Set on a user op whose consumers a rewrite moved onto qat's replacement
# (tf_keras's fused layer norm, a grouped conv's function call): its value
# names the replacement's output.
REPLACED_BY_ATTR = "_qat_replaced_by"
STEP_COUNTER = "step_counter"


# op -> its role. An op's mark is set when the op is made and never changes;
# asking TensorFlow for an attribute an op lacks raises and catches an error,
# which the passes would otherwise pay on every look at a user op.
_ROLES: "weakref.WeakKeyDictionary[tf.Operation, Optional[str]]" = (
    weakref.WeakKeyDictionary())


# Ops whose NodeDef can hold a large tensor: their attribute is asked for.
_LARGE_NODE_DEF_TYPES = frozenset(["Const", "HostConst"])


def _attr_value(op: tf.Operation, name: str) -> Optional[attr_value_pb2.AttrValue]:
    """`op`'s attribute `name`, or None when it has none.

    Most ops have no mark, and `get_attr` answers a missing attribute with an
    error raised and caught (about 70 us); reading the op's NodeDef costs
    about 10 us, except where it holds a constant's tensor.
    """
    if op.type in _LARGE_NODE_DEF_TYPES:
        try:
            with c_api_util.tf_buffer() as buf:
                c_api.TF_OperationGetAttrValueProto(op._c_op, name, buf)  # pylint: disable=protected-access
                data = c_api.TF_GetBuffer(buf)
        except tf.errors.InvalidArgumentError:
            return None
        value = attr_value_pb2.AttrValue()
        value.ParseFromString(data)
        return value
    attrs = op.node_def.attr
    return attrs[name] if name in attrs else None


def role(op: tf.Operation) -> Optional[str]:
    """The role qat marked `op` with, or None for an op qat did not create."""
    try:
        return _ROLES[op]
    except KeyError:
        pass
    found = _attr_value(op, ATTR)
    if found is None:
        value = None
    elif found.WhichOneof("value") == "s":
        value = found.s.decode()
    else:  # Not a mark qat writes: as `get_attr` reads it.
        value = op.get_attr(ATTR)
    _ROLES[op] = value
    return value


def made_by_qat(op: tf.Operation, *roles: str) -> bool:
    """Whether qat created `op` (with one of `roles`, when given)."""
    found = role(op)
    return found is not None and (not roles or found in roles)


def computes_the_model(op: tf.Operation) -> bool:
    """Whether `op` is the user's, or one qat wrote in place of the user's
    (`MODEL_ROLES`: a layer a call computed, an unrolled loop's steps)."""
    found = role(op)
    return found is None or found in MODEL_ROLES


def quantizer_of(t: tf.Tensor) -> Optional[tf.Tensor]:
    """The output of the quantizer qat built on `t`, or None.

    The quantizer's ops read `t` (FakeQuant, range reductions, a delayed
    Select, the Reshape of per-channel depthwise weights) and lead, through
    ops of the same quantizer only, to the one marked `quantizer_output`.
    """
    frontier = [c for c in t.consumers() if made_by_qat(c, QUANTIZER, QUANTIZER_OUTPUT)]
    seen = set(frontier)
    for _ in range(_MAX_QUANTIZER_DEPTH):
        following = []
        for op in frontier:
            if role(op) == QUANTIZER_OUTPUT:
                return op.outputs[0]
            for out in op.outputs:
                for c in out.consumers():
                    if c not in seen and made_by_qat(c, QUANTIZER, QUANTIZER_OUTPUT):
                        seen.add(c)
                        following.append(c)
        frontier = following
    return None


# The longest chain from a quantizer's input to its output: reduction, zero
# clamp, symmetric widening (2), moving average (3), FakeQuant, Reshape, Select.
_MAX_QUANTIZER_DEPTH = 12


# op -> whether it carries `REPLACED_BY_ATTR`. Asking TensorFlow for an
# attribute an op lacks raises and catches an error (tens of microseconds),
# and most ops lack this one; qat sets it only through a Rewrite, which tells
# `attribute_set`, so the answer is read from the op once.
_REPLACED: "weakref.WeakKeyDictionary[tf.Operation, bool]" = weakref.WeakKeyDictionary()


def is_replaced(op: tf.Operation) -> bool:
    """Whether a rewrite replaced the user op `op` (`REPLACED_BY_ATTR`)."""
    try:
        return _REPLACED[op]
    except KeyError:
        pass
    value = _attr_value(op, REPLACED_BY_ATTR) is not None
    _REPLACED[op] = value
    return value


def attribute_set(op: tf.Operation, name: str) -> None:
    """Records that the internal attribute `name` was just set on `op`.

    `qat.engine.rewrite` calls it for each attribute it sets, so that
    `is_replaced` sees a mark set after it first looked at the op.

    Args:
      op: the op whose attribute was set.
      name: the attribute's name.
    """
    if name == REPLACED_BY_ATTR:
        _REPLACED[op] = True
