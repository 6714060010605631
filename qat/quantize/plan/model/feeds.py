"""Where the model's data enters: model sources, found by structure.

Why this module exists: what feeds a model differs between its graphs (a
FIFO queue's dequeue, `tf.train.batch` or a `tf.data` iterator while
training, a placeholder in the export graph), and the range of the tensor
entering the model must have the same place and name in all of them, or a
training checkpoint does not restore strictly into the export graph. So a
model source is not an op type but what the structure says: from each
layer's data input, walk back through the ops that have exactly one value
operand (same-scale ops: pad, reshape, transpose, resize, a split of the
batch between replicas; ops the converter removes; arithmetic with
constants, i.e. preprocessing; casts between float types; dropout) and stop
at the first op with none (a placeholder, an iterator, a queue's dequeue, a
`py_func`, a cast from integers, anything else) or with several
(`x + noise`, a concatenation of two inputs): its output tensor is a model
source. A placeholder (also one with a default) stops the walk too: a value
fed there must pass through the range.

A value operand is a float input that is not a parameter: not a constant,
a variable, a shape, nor computed only from those (`Parameters`).

A graph input a model op reads that no walk from a layer reaches (a second
input added or multiplied in after the first layer) is a source too: the
walk starts from each non-parameter operand of the model's ops as well,
except scalars (a dropout rate, a temperature), dropout's own operands and
random draws (noise added inside the model is no input).

Sources are tensors, not ops: the label output of the dequeue or iterator
that also gives the images is not model data.
"""
from typing import Callable, Dict, List, Optional, Set

import tensorflow as tf

from qat.matching import tensors
from qat.quantize.plan.ops import dropout_patterns
from qat.quantize.plan.ops import op_table

# Parameters: values that do not depend on what the graph is fed.
PARAMETER_TYPES = frozenset([
    "Const", "VariableV2", "Variable", "VarHandleOp", "ReadVariableOp",
    "VarIsInitializedOp"])
# Ops whose output depends on their input's shape only.
SHAPE_TYPES = frozenset(["Shape", "ShapeN", "Size", "Rank", "OnesLike", "ZerosLike"])
# Feed points: a walk back to the model's source stops at them.
FEED_TYPES = frozenset(["Placeholder", "PlaceholderWithDefault"])
# Draws: values of their own (noise, dropout masks), never parameters.
RANDOM_PREFIXES = op_table.RANDOM_PREFIXES


def is_random(op: tf.Operation) -> bool:
    """A random draw (noise, a dropout mask)."""
    return op.type.startswith(RANDOM_PREFIXES)


class Parameters(object):
    """`params(t)`: whether `t` is a parameter (memoized per op).

    A parameter is a constant, a variable, a shape, or computed only from
    those (`tf.ones_like(logits)` is one; `tf.one_hot(labels)` is not). Feed
    points, random draws and other stateful ops (a queue's dequeue, an
    iterator) give values, not parameters; so does an op with no inputs that
    is not a constant or a variable.
    """

    def __init__(self):
        self._memo: Dict[tf.Operation, bool] = {}

    def __call__(self, t: tf.Tensor) -> bool:
        return self.op_is_parameter(t.op)

    def _local(self, op: tf.Operation) -> Optional[bool]:
        op_type = op.type  # Read once: each read is a call into TensorFlow.
        if op_type in PARAMETER_TYPES or op_type in SHAPE_TYPES:
            return True
        if op_type in FEED_TYPES or op_type.startswith(RANDOM_PREFIXES) or not op.inputs:
            return False
        try:
            if op.op_def.is_stateful:
                return False
        except (AttributeError, ValueError):
            pass
        return None

    def op_is_parameter(self, op: tf.Operation) -> bool:
        if op in self._memo:
            return self._memo[op]
        stack = [op]
        pending: Set[tf.Operation] = set()
        while stack:
            top = stack[-1]
            if top in self._memo:
                stack.pop()
                continue
            local = self._local(top)
            if local is not None:
                self._memo[top] = local
                stack.pop()
                continue
            missing = [i.op for i in top.inputs if i.op not in self._memo]
            if missing and top not in pending:
                pending.add(top)
                stack.extend(missing)
                continue
            # A cycle (a TF1 loop) leaves an input unknown: a value.
            self._memo[top] = all(self._memo.get(i.op, False) for i in top.inputs)
            stack.pop()
        return self._memo[op]


def per_example(t: tf.Tensor, like: tf.Tensor) -> bool:
    """Whether `t` holds one value per example of `like`'s batch (axis 0).

    A model parameter broadcasts over the batch (a bias [C], a scale
    [1, 1, 1, C]); a constant with the batch axis (one-hot labels of fixed
    class ids) is a per-example value, a label, even where it is constant.
    """
    rank = like.shape.rank
    return (rank is not None and rank >= 2 and t.shape.rank == rank
            and tf.compat.dimension_value(t.shape[0]) != 1)


def value_operands(op: tf.Operation, index: int, params: Parameters) -> List[tf.Tensor]:
    """The float inputs of `op` that are not parameters (each once).

    For a same-scale op only the input its output `index` takes its scale
    from counts (a Split's axis, a Reshape's shape are not values).
    """
    if op.type in op_table.SAME_SCALE_TYPES:
        k = op_table.same_scale_input(op, index)
        candidates = [op.inputs[k]] if k < len(op.inputs) else []
    else:
        candidates = list(op.inputs)
    found: List[tf.Tensor] = []
    for t in candidates:
        if tensors.is_float(t) and not params(t) and t not in found:
            found.append(t)
    return found


def walk_to_source(t: tf.Tensor, params: Parameters,
                   dropout_input: Callable[[tf.Operation], Optional[tf.Tensor]]) -> tf.Tensor:
    """The model source `t` is computed from (see the module docstring).

    Args:
      t: a float tensor a model op reads that is not on the data path yet.
      params: the parameter test.
      dropout_input: the input of a dropout op, None for other ops.

    Returns:
      The source tensor (maybe `t` itself).
    """
    for _ in range(10000):
        op = t.op
        if op.type in FEED_TYPES:
            return t
        inner = dropout_input(op)
        if inner is not None:
            t = inner
            continue
        operands = value_operands(op, t.value_index, params)
        if len(operands) != 1:
            return t
        t = operands[0]
    return t


def dropout_input(op: tf.Operation) -> Optional[tf.Tensor]:
    """The tensor `op` reads if it is a dropout op (`dropout_patterns`), else None."""
    found = dropout_patterns.dropout_ops(op)
    return None if found is None else found[op]
