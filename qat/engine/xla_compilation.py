"""Whether XLA compiles the gradient being built, as a gradient function sees it.

Some of TensorFlow's kernels have no XLA kernel (QuantizeAndDequantizeV4Grad,
the one-pass masked gradient of qat's quantizers, is one), so a gradient
function that XLA will compile must build another form. Nothing in
TensorFlow says so reliably when a gradient function runs: a `tf.function`
called inside a `tf.function(jit_compile=True)` reuses a trace made outside
it (its cache key ignores XLA), and its backward function is built once, in
a graph of its own whose parents are the callee's, not the caller's. A
caller that knows (qat's TF 2 path, which routes calls made in an XLA
context to a trace of their own) marks the forward graph with
`mark_compiled`; `compiles_gradient_of` also sees the forms TensorFlow
itself records:

* the forward graph, or a graph it was built in, is marked;
* the forward op was built in an XLA context or carries `_XlaCompile`
  (`control_flow_util.IsInXLAContext`);
* the gradient is built in an XLA context (`GraphOrParentsInXlaContext` of
  the graph being built: a `tf.function(jit_compile=True)` that is tracing
  both), or inside `tf.xla.experimental.jit_scope()` (its `_XlaCompile`
  attribute scope: the gradient ops will be clustered for XLA).
"""
from typing import List, Sequence
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util
from tensorflow.python.ops import control_flow_util

_XLA_COMPILE_ATTR = "_XlaCompile"
# The gradient of `function_outputs`' Identity ops.
OUTPUT_GRADIENT = "QatXlaFunctionOutput"
# A forward tensor of statically known value up to this size is copied into
# the gradient graph as a constant rather than captured.
_MAX_COPIED_ELEMENTS = 1024

_COMPILED_GRAPHS: "weakref.WeakSet[tf.Graph]" = weakref.WeakSet()


def mark_compiled(graph: tf.Graph) -> None:
    """Records that XLA compiles `graph` and the gradients of its ops."""
    _COMPILED_GRAPHS.add(graph)


def _graph_and_parents(graph):
    while graph is not None:
        yield graph
        graph = getattr(graph, "outer_graph", None)


def _in_jit_scope(graph: tf.Graph) -> bool:
    """Whether ops made in `graph` now get `_XlaCompile` (jit_scope)."""
    attr = graph._attr_scope_map.get(_XLA_COMPILE_ATTR)  # pylint: disable=protected-access
    if attr is None:
        return False
    # compile_ops may be a predicate of the NodeDef: it may compile.
    return callable(attr) or bool(attr.b)


def compiles_gradient_of(op: tf.Operation) -> bool:
    """Whether the gradient of `op` being built now will be compiled by XLA.

    Args:
      op: the forward op whose gradient function is running.

    Returns:
      True where XLA compiles (or may cluster) the gradient ops.
    """
    if any(g in _COMPILED_GRAPHS for g in _graph_and_parents(op.graph)):
        return True
    if control_flow_util.IsInXLAContext(op):
        return True
    building = tf.compat.v1.get_default_graph()
    return (control_flow_util.GraphOrParentsInXlaContext(building)
            or _in_jit_scope(building))


def in_xla_context() -> bool:
    """Whether the graph being built now is in an XLA context (traced by a
    `tf.function(jit_compile=True)`, or a function called from one)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


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
