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

How the TF 2 frontend keeps XLA from compiling a nested call's forward
function as a constant is its own (`qat.tf2.xla_outputs`).
"""
import weakref

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

_XLA_COMPILE_ATTR = "_XlaCompile"

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
