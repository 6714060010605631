"""Activations written as several TF ops that TFLite runs as one integer op.

The converter fuses each of these formulas into one op (HARD_SWISH, GELU)
when nothing inside the formula is quantized; a range inside (on `x + 3`, on
`erfc(...)`) stops the fusion and leaves float ops or, for GELU, an Erfc the
converter cannot convert at all. So the whole formula is one activation: a
range on its input (as any integer op's) and on its output only.

`WHOLE_ACTIVATIONS` declares them as data, one `WholeActivation` per TFLite
op, each a `qat.matching.matcher` pattern rooted at the formula's output op
that binds the input as "x":

* HARD_SWISH, `x * relu6(x + 3) / 6` in its usual spellings (`* (1/6)`,
  `/ 6`, `x * hard_sigmoid`).
* GELU, exact: `0.5 * x * erfc(-x / sqrt(2))` (TF 2.21's tf.nn.gelu and
  tf_keras "gelu") and `0.5 * x * (1 + erf(x / sqrt(2)))`; approximate:
  `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))` with the cube
  as Pow(x, 3) or x * x * x. The 0.5 may multiply x, the gate or the product.

`match_whole_activation(op)` returns the input and the interior ops of the
activation ending at `op`.
"""
import dataclasses
from typing import FrozenSet, List, Optional, Tuple

import tensorflow as tf

from qat.matching.matcher import GraphMatcher, OneofPattern, OpTypePattern, Pattern


@dataclasses.dataclass(frozen=True)
class WholeActivation:
    """One formula the converter turns into one integer op."""
    tflite_op: str
    pattern: Pattern
    root_types: FrozenSet[str]  # Op types the pattern's root can have.


def _times_const(inner: Pattern, name: Optional[str] = None) -> OpTypePattern:
    return OpTypePattern("Mul", name=name, inputs=[inner, OpTypePattern("Const")],
                         ordered_inputs=False)


def _hard_swish(x: Pattern) -> OneofPattern:
    relu6 = OpTypePattern("Relu6", inputs=[
        OpTypePattern("Add|AddV2", inputs=[x, OpTypePattern("Const")],
                      ordered_inputs=False)])
    sixth = OneofPattern([
        _times_const(relu6),
        OpTypePattern("RealDiv|Div", inputs=[relu6, OpTypePattern("Const")]),
    ])
    inner = OpTypePattern("Mul", inputs=[x, relu6], ordered_inputs=False)
    return OneofPattern([
        OpTypePattern("Mul", inputs=[x, sixth], ordered_inputs=False),
        _times_const(inner),
        OpTypePattern("RealDiv|Div", inputs=[inner, OpTypePattern("Const")]),
    ])


def _scaled_x(x: Pattern) -> OneofPattern:
    """x / sqrt(2), x * (1 / sqrt(2)) or -x * c (erfc's argument)."""
    return OneofPattern([
        _times_const(x),
        OpTypePattern("RealDiv|Div", inputs=[x, OpTypePattern("Const")]),
        _times_const(OpTypePattern("Neg", inputs=[x])),
    ])


def _one_plus(inner: Pattern) -> OpTypePattern:
    return OpTypePattern("Add|AddV2", inputs=[OpTypePattern("Const"), inner],
                         ordered_inputs=False)


def _gelu(x: Pattern) -> OneofPattern:
    cube = OneofPattern([
        OpTypePattern("Pow", inputs=[x, OpTypePattern("Const")]),
        OpTypePattern("Mul", inputs=[x, OpTypePattern("Mul", inputs=[x, x])],
                      ordered_inputs=False),
    ])
    tanh_argument = _times_const(OpTypePattern("Add|AddV2", inputs=[
        x, _times_const(cube)], ordered_inputs=False))
    # The gate multiplying x: 1 + erf(.), erfc(.) or 1 + tanh(.).
    gate = OneofPattern([
        OpTypePattern("Erfc", inputs=[_scaled_x(x)]),
        _one_plus(OpTypePattern("Erf", inputs=[_scaled_x(x)])),
        _one_plus(OpTypePattern("Tanh", inputs=[tanh_argument])),
    ])
    return OneofPattern([
        # (0.5 * x) * gate, x * (0.5 * gate)
        OpTypePattern("Mul", inputs=[_times_const(x), gate], ordered_inputs=False),
        OpTypePattern("Mul", inputs=[x, _times_const(gate)], ordered_inputs=False),
        # (x * gate) * 0.5
        _times_const(OpTypePattern("Mul", inputs=[x, gate], ordered_inputs=False)),
    ])


def _activation(tflite_op: str, build, root_types) -> WholeActivation:
    return WholeActivation(tflite_op, build(OpTypePattern("*", name="x")),
                           frozenset(root_types))


WHOLE_ACTIVATIONS: Tuple[WholeActivation, ...] = (
    _activation("HARD_SWISH", _hard_swish, ["Mul", "RealDiv", "Div"]),
    _activation("GELU", _gelu, ["Mul"]),
)
_MATCHERS = [(a, GraphMatcher(a.pattern)) for a in WHOLE_ACTIVATIONS]


def _interior(out: tf.Operation, x: tf.Tensor) -> List[tf.Operation]:
    """The ops between `x` and `out` (neither included), in no order.

    Walks back from `out` and stops at `x` and at constants: every op found
    computes with `x` (the patterns bind each op to an input of x's formula).
    """
    found, stack = set(), [out]
    while stack:
        op = stack.pop()
        for t in op.inputs:
            if t is x or t.op in found or t.op.type == "Const":
                continue
            found.add(t.op)
            stack.append(t.op)
    return list(found)


def match_whole_activation(op: tf.Operation
                           ) -> Optional[Tuple[WholeActivation, tf.Tensor, List[tf.Operation]]]:
    """The activation that ends at `op`, if one does.

    Args:
      op: a candidate output op.

    Returns:
      (activation, its input tensor x, the ops between x and `op`), or None
      when no formula of `WHOLE_ACTIVATIONS` ends at `op`.
    """
    for activation, matcher in _MATCHERS:
        if op.type not in activation.root_types:
            continue
        match = matcher.match_op(op)
        if match is not None:
            x = match.get_tensor("x")
            return activation, x, _interior(op, x)
    return None
