"""Whether a graph can be edited in place (part of contrib's `util`)."""
import tensorflow as tf
from tensorflow.python.framework import func_graph as _func_graph


def check_graph_modifiable(graph: tf.Graph, what: str = "edit") -> None:
    """Raises if `graph` cannot be edited in place by the graph editor.

    Args:
      graph: the graph about to be modified.
      what: a short description of the modification, used in the message.

    Raises:
      TypeError: if `graph` is not a `tf.Graph`.
      ValueError: if `graph` is a `FuncGraph` (the body of a `tf.function`):
        its ops are traced once and edits would not reach the function.
      RuntimeError: if `graph` is finalized.
    """
    if not isinstance(graph, tf.Graph):
        raise TypeError("Expected a tf.Graph, got: {}".format(type(graph)))
    _check_not_func_graph(graph, what)
    if graph.finalized:
        raise RuntimeError(
            "Cannot {}: the graph is finalized (e.g. by a MonitoredSession); "
            "edit the graph before finalizing it.".format(what))


def _check_not_func_graph(graph, what: str) -> None:
    if isinstance(graph, _func_graph.FuncGraph):
        raise ValueError(
            "Cannot {} ops of FuncGraph {!r}: the graph editor works on tf.Graph "
            "graphs built in graph mode (tf.compat.v1); build the model in a "
            "tf.Graph instead of inside a tf.function.".format(what, graph.name))
