"""The outputs of a function XLA compiles nested, and their gradient.

A `tf.function` the TF 2 frontend traces for a call in an XLA context
(`qat.tf2.rewriter`) is called by the caller's compiled function; its
gradient is a second function, and XLA's constant analysis would otherwise
fold the whole forward call into the step as a constant
(`function_outputs`). The gradient registered here for the Identity ops
`function_outputs` returns makes the gradient graph copy forward tensors of
statically known value as constants of its own: it replaces the gradient
graph's `_capture_helper`, a private method of TensorFlow's `FuncGraph`
(a graph without one is left as it is).
"""
from typing import List, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

# The gradient of `function_outputs`' Identity ops.
OUTPUT_GRADIENT = "QatXlaFunctionOutput"
# A forward tensor of statically known value up to this size is copied into
# the gradient graph as a constant rather than captured.
_MAX_COPIED_ELEMENTS = 1024


def function_outputs(tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Identities of `tensors`, the outputs of a function XLA compiles nested.

    A `tf.function` called by another one gets its gradient as a second
    function, whose inputs are outputs of the first (TensorFlow adds them):
    every forward tensor a gradient function reads. Some are values XLA must
    know when it compiles (reduction axes, paddings, permutations: constants
    of the forward graph). XLA's constant analysis does not look inside the
    forward call for them, so it makes the whole forward call a compile-time
    constant: the caller's inputs and variables are then folded in as
    constants, and the step is compiled again at every call, as their values
    change. The gradient of these Identity ops, the first of the gradient to
    be built, makes the gradient graph copy such tensors of statically known
    value as constants of its own instead.

    Args:
      tensors: the function's outputs, in the function graph being traced.

    Returns:
      Their identities, to return instead.
    """
    graph = tf.compat.v1.get_default_graph()
    with graph.gradient_override_map({"Identity": OUTPUT_GRADIENT}):
        return [tf.identity(t) for t in tensors]


def _copy_constants_into(graph: tf.Graph) -> None:
    """Makes `graph` (a function's gradient graph) copy known values it reads
    from other graphs as constants of its own (see `function_outputs`)."""
    if getattr(graph, "_qat_copies_constants", False) or not hasattr(graph, "_capture_helper"):
        return
    capture = graph._capture_helper  # pylint: disable=protected-access
    copies = {}

    def capture_helper(tensor, name):
        if id(tensor) not in copies:
            copies[id(tensor)] = (tensor, _constant_copy(graph, tensor))
        copy = copies[id(tensor)][1]
        return copy if copy is not None else capture(tensor, name)

    graph._capture_helper = capture_helper  # pylint: disable=protected-access
    graph._qat_copies_constants = True  # pylint: disable=protected-access


def _constant_copy(graph: tf.Graph, tensor: tf.Tensor):
    """A constant of `graph` with `tensor`'s value, or None if not known."""
    size = tensor.shape.num_elements()
    if size is None or size > _MAX_COPIED_ELEMENTS or tensor.dtype == tf.resource:
        return None
    value = tensor_util.constant_value(tensor)
    if value is None:
        return None
    with graph.as_default(), graph.control_dependencies(None):
        return tf.constant(np.asarray(value), dtype=tensor.dtype)


def _output_grad(op: tf.Operation, grad: tf.Tensor):
    building = tf.compat.v1.get_default_graph()
    if building is not op.graph:  # A gradient function of its own.
        _copy_constants_into(building)
    return grad


try:
    tf.RegisterGradient(OUTPUT_GRADIENT)(_output_grad)
except KeyError:  # Module re-imported (importlib.reload): already there.
    pass
