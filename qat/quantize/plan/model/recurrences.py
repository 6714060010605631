"""Recurrences: the steps of a recurrent layer share their ranges.

Why this module exists: an unrolled recurrent layer (Keras `LSTM(unroll=True)`,
TF1 `static_rnn`, a `While` loop that `qat.prepare.loops` unrolled) computes
the same cell once per step, reading the same weights, each step reading the
state the step before wrote. A loop keeps one tensor per cell value (one scale
for the state a step writes and the state the next step reads); unrolled, the
graph has one tensor per step. The steps share one range per cell value, so
that:

* the state a step writes and the state the next step reads are one range,
  as the loop's would be, whatever the sequence length (a checkpoint written
  with 8 steps restores into a graph of 16);
* a zero initial state (a `Fill` of the batch size: the converter keeps a
  FILL) is quantized on the state's grid;
* the outputs a `Pack` of every step's output stacks (`return_sequences`)
  have the one scale TFLite's PACK requires (`shared_ranges` joins them).

Steps are found by structure, never by layer class: a *recurrent layer* is a
set of layer ops reading the same weights (one variable, however often it is
read) where each one computes from the one before (a chain: the next step's
input is computed from this step's output; two towers sharing weights are
not one). Consecutive applications (L_k, L_k+1) are matched: forward from
their outputs, a consumer of L_k's output matches the consumer of L_k+1's
output of the same type at the same input whose other inputs are the same
tensors, reads of the same variable, equal constants, or data; and so on
through the cell. Matched ops are one cell op at two steps: their outputs
are one cell value, and so are the tensors they read at the same input
(`f * c_prev` at step k reads the state step k-1 wrote, at step 1 the zero
initial state). A layer's data input is matched the same way (a TF1 cell's
concatenation of the input with the state).

`find(planner)` returns the pairs of tensors that are one cell value, and
the cell op classes (for naming a shared range after the first step).
"""
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf

from qat.engine import node_attrs
from qat.matching import tensors
from qat.quantize.plan.ops import patterns as qp

# Ops a weight is read through: one variable however often it is read.
_READ_TYPES = frozenset(["Identity", "ReadVariableOp", "Cast"])
# How many ops a weight read is walked back through at most.
_MAX_READ_DEPTH = 8


@dataclasses.dataclass
class Steps:
    """The recurrences of a graph.

    Attributes:
      tensor_pairs: (tensor at step k, tensor at step k+1) that are one cell
        value (outputs of matched ops, inputs matched ops read at one index).
      op_class: a matched op -> a representative of its cell op (the same for
        every step of one cell op).
      layers: the layer ops of recurrent layers.
      initial_states: constants a step reads where the next step reads the
        state a step wrote (a zero state of a static batch size is a Const):
        they are quantized as the state is.
      next_step: a matched op -> the same cell op at the next step.
    """
    tensor_pairs: List[Tuple[tf.Tensor, tf.Tensor]] = dataclasses.field(default_factory=list)
    op_class: Dict[tf.Operation, tf.Operation] = dataclasses.field(default_factory=dict)
    layers: Set[tf.Operation] = dataclasses.field(default_factory=set)
    initial_states: Set[tf.Tensor] = dataclasses.field(default_factory=set)
    next_step: Dict[tf.Operation, tf.Operation] = dataclasses.field(default_factory=dict)

    def step_of(self) -> Dict[tf.Operation, int]:
        """Each matched op's step, counted from 0 along `next_step`."""
        earlier = {b: a for a, b in self.next_step.items()}
        found: Dict[tf.Operation, int] = {}
        for op in set(self.next_step) | set(earlier):
            chain = []
            while op not in found and op in earlier and len(chain) < 100000:
                chain.append(op)
                op = earlier[op]
            base = found.setdefault(op, 0)
            for k, later in enumerate(reversed(chain), 1):
                found[later] = base + k
        return found


def weight_key(t: tf.Tensor) -> tf.Tensor:
    """The tensor a weight is a read of: back through reads, identities, casts."""
    for _ in range(_MAX_READ_DEPTH):
        if t.op.type not in _READ_TYPES or not t.op.inputs:
            return t
        t = t.op.inputs[0]
    return t


def constant_source(t: tf.Tensor) -> tf.Tensor:
    """The constant a constant tensor is an Identity of (a TF1 loop reads its
    initial state through one), or `t`."""
    for _ in range(_MAX_READ_DEPTH):
        if t.op.type != "Identity" or not t.op.inputs:
            return t
        t = t.op.inputs[0]
    return t


def _attrs(op: tf.Operation) -> Dict[str, bytes]:
    return {k: v.SerializeToString()
            for k, v in node_attrs.public_attrs(op.node_def.attr).items()}


class _Matcher(object):
    """Matches the ops of consecutive steps (see the module docstring)."""

    def __init__(self, view):
        self.view = view
        self.pairs: Dict[tf.Operation, tf.Operation] = {}  # step k op -> step k+1 op
        self.tensor_pairs: List[Tuple[tf.Tensor, tf.Tensor]] = []
        self.initial_states: Set[tf.Tensor] = set()
        self._attr_memo: Dict[tf.Operation, Dict[str, bytes]] = {}
        self.numbers = tensors.ValueNumbers()

    def _same_operand(self, a: tf.Tensor, b: tf.Tensor) -> bool:
        """Whether operands `a` and `b` of two matched ops are one operand
        (the same tensor, reads of one variable, equal constants) or both
        data (then they are one cell value)."""
        if a is b:
            return True
        if a.dtype != b.dtype:
            return False
        data_a, data_b = self.view.is_data(a), self.view.is_data(b)
        if not data_a and data_b:
            # A state's first value may be a constant (a zero state of a static
            # batch size), where the next step reads the state written.
            return tensors.is_float(a)
        if data_a or data_b:
            return data_a and data_b
        # Parameters: one value (reads of one variable, equal constants, a
        # bias sliced from one variable at every step).
        return (a.value_index == b.value_index
                and self.numbers.number(a.op) == self.numbers.number(b.op))

    def _attrs(self, op: tf.Operation) -> Dict[str, bytes]:
        if op not in self._attr_memo:
            self._attr_memo[op] = _attrs(op)
        return self._attr_memo[op]

    def _same_op(self, a: tf.Operation, b: tf.Operation) -> bool:
        return (a is not b and a.type == b.type and len(a.inputs) == len(b.inputs)
                and len(a.outputs) == len(b.outputs)
                and self._attrs(a) == self._attrs(b)
                and all(self._same_operand(x, y) for x, y in zip(a.inputs, b.inputs)))

    def _record(self, a: tf.Operation, b: tf.Operation) -> bool:
        """Records a ~ b (and what they read at one index); False if `a` has
        its match already (the first one found stands)."""
        if a in self.pairs:
            return False
        self.pairs[a] = b
        for x, y in zip(a.inputs, b.inputs):
            if x is y:
                continue
            data_x, data_y = self.view.is_data(x), self.view.is_data(y)
            if data_x and data_y:
                self.tensor_pairs.append((x, y))
            elif data_y and tensors.is_float(x):
                self.initial_states.add(constant_source(x))
                self.tensor_pairs.append((x, y))
        self.tensor_pairs.extend(zip(a.outputs, b.outputs))
        return True

    def match_forward(self, a: tf.Operation, b: tf.Operation) -> None:
        """Matches `a` ~ `b` and, through the cell, the ops that read them."""
        stack = [(a, b)]
        while stack:
            a, b = stack.pop()
            if not self._record(a, b):
                continue
            for out_a, out_b in zip(a.outputs, b.outputs):
                readers_b = [c for c in out_b.consumers() if self._is_cell_op(c)]
                for c in out_a.consumers():
                    if not self._is_cell_op(c):
                        continue
                    indices = [k for k, t in enumerate(c.inputs) if t is out_a]
                    found = [d for d in readers_b if d is not c
                             and len(d.inputs) == len(c.inputs)
                             and all(d.inputs[k] is out_b for k in indices)
                             and self._same_op(c, d)]
                    if len(found) == 1:
                        stack.append((c, found[0]))

    def _is_cell_op(self, op: tf.Operation) -> bool:
        return op in self.view.data_ops and op not in self.view.gradient_ops and (
            op.type not in qp.METADATA_TYPES)


def _recurrent_chains(view, layers: List[tf.Operation]) -> List[List[tf.Operation]]:
    """Layers reading one weight, each computing from the one before."""
    by_weight: Dict[tf.Tensor, List[tf.Operation]] = {}
    for layer in layers:
        if len(layer.inputs) < 2:
            continue
        by_weight.setdefault(weight_key(layer.inputs[1]), []).append(layer)
    chains = []
    for group in by_weight.values():
        if len(group) < 2:
            continue
        chain = [group[0]]
        for later in group[1:]:
            if _depends_on(view, later, chain[-1]):
                chain.append(later)
            else:
                if len(chain) > 1:
                    chains.append(chain)
                chain = [later]
        if len(chain) > 1:
            chains.append(chain)
    return chains


def _depends_on(view, op: tf.Operation, earlier: tf.Operation) -> bool:
    """Whether `op`'s data inputs are computed from `earlier`'s output."""
    stack, seen = [op], {op}
    while stack:
        top = stack.pop()
        for t in top.inputs:
            if t.op is earlier:
                return True
            if t.op not in seen and view.is_data(t):
                seen.add(t.op)
                stack.append(t.op)
    return False


def find(view, layers: Optional[List[tf.Operation]] = None) -> Steps:
    """The recurrences of `view`'s graph (see the module docstring).

    Args:
      view: the planner's `GraphView`.
      layers: the layer ops to look at (default: all of `view.layers`).

    Returns:
      The matched steps; empty when the graph has no recurrent layer.
    """
    ordered = sorted(layers if layers is not None else view.layers,
                     key=lambda o: o._id)  # pylint: disable=protected-access
    chains = _recurrent_chains(view, ordered)
    steps = Steps()
    if not chains:
        return steps
    matcher = _Matcher(view)
    for chain in chains:
        steps.layers.update(chain)
        for a, b in zip(chain, chain[1:]):
            matcher.match_forward(a, b)
            x, y = qp.data_input(a), qp.data_input(b)
            if x is not y and view.is_data(x) and view.is_data(y):
                matcher.tensor_pairs.append((x, y))
                if matcher._same_op(x.op, y.op):  # pylint: disable=protected-access
                    matcher.match_forward(x.op, y.op)
    # Cell op classes: each op's first step.
    parent: Dict[tf.Operation, tf.Operation] = {}

    def root(op):
        while parent.get(op, op) is not op:
            op = parent[op]
        return op

    for a, b in matcher.pairs.items():
        ra, rb = root(a), root(b)
        if ra is not rb:
            first, second = sorted((ra, rb), key=lambda o: o._id)  # pylint: disable=protected-access
            parent[second] = first
    steps.op_class = {op: root(op) for op in set(matcher.pairs) | set(matcher.pairs.values())}
    steps.tensor_pairs = matcher.tensor_pairs
    steps.initial_states = matcher.initial_states
    steps.next_step = dict(matcher.pairs)
    return steps
