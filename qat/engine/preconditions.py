"""What every public entry point checks before a rewrite plans anything.

One module, used by `create_*_graph`, `fold_batch_norms` and
`insert_quant_ops` alike, so each refusal has one rule and one message. A
refused call leaves the graph unchanged.
"""
from typing import Optional

from absl import logging
import tensorflow as tf

from qat.engine import op_index

# Collection of the strings recording each pass already applied to a graph.
REWRITES_COLLECTION = "qat_rewrites"


def resolve_graph(input_graph: Optional[tf.Graph], caller: str) -> tf.Graph:
    """The graph a public function rewrites: `input_graph` or the default.

    Args:
      input_graph: the graph passed by the user, or None.
      caller: the public function's name, for messages.

    Returns:
      The graph to rewrite.

    Raises:
      RuntimeError: in eager mode with no graph, or for a finalized graph.
      TypeError: if `input_graph` is not a tf.Graph.
      ValueError: for the graph of a tf.function.
    """
    if input_graph is None:
        if tf.executing_eagerly():
            raise RuntimeError(
                f"qat.{caller}() was called in eager mode, outside any graph. It "
                "rewrites a tf.compat.v1 graph: build the model inside "
                "`with tf.Graph().as_default() as g:` and call "
                f"qat.{caller}(g) (or call "
                "tf.compat.v1.disable_eager_execution() at program start).")
        input_graph = tf.compat.v1.get_default_graph()
    if not isinstance(input_graph, tf.Graph):
        raise TypeError(
            f"qat.{caller}(): input_graph must be a tf.Graph or None, got "
            f"{type(input_graph).__name__}.")
    if isinstance(input_graph, tf.__internal__.FuncGraph):
        raise ValueError(
            f"qat.{caller}() got the graph of a tf.function ({input_graph.name}); "
            "it rewrites tf.compat.v1 graphs: build the model in a tf.Graph.")
    if input_graph.finalized:
        raise RuntimeError(
            f"qat.{caller}(): the graph is finalized (a Session, "
            "MonitoredSession or Supervisor finalized it), so it cannot be "
            "rewritten. Call it after building the model and before creating "
            "the session.")
    return input_graph


def is_optimizer_op(op: tf.Operation) -> bool:
    """True for optimizer update ops (Apply*, ResourceApply*, SparseApply*)."""
    return _is_optimizer_type(op.type)


def _is_optimizer_type(t: str) -> bool:
    return (t.startswith("Apply") or t.startswith("ResourceApply")
            or t.startswith("SparseApply") or t.startswith("ResourceSparseApply"))


def check_no_optimizer_ops(graph: tf.Graph) -> None:
    """Raises ValueError if `graph` has optimizer update ops.

    Raises:
      ValueError: naming the first optimizer op found.
    """
    # The graph's op types, from its index: most graphs have no optimizer op.
    found = op_index.ops_of_types(
        graph, [t for t in op_index.op_types(graph) if _is_optimizer_type(t)])
    for op in found[:1]:
        raise ValueError(
                f"The graph already has optimizer update ops (e.g. '{op.name}', "
                f"{op.type}): the quantization rewrite must come before "
                "`optimizer.minimize()` / `apply_gradients()`. Build the model, "
                "call qat's create_*_graph, then add the optimizer.")


def warn_existing_gradients(graph: tf.Graph) -> bool:
    """Warns if `tf.gradients` already ran on `graph`; returns whether it did.

    Gradients built before the rewrite differentiate the float model: they
    keep reading the float tensors, and a train op made from them trains
    the float path. qat refuses optimizer ops; plain gradients get this
    warning, naming them.
    """
    found = [op.name for op in graph.get_operations()
             if getattr(op, "_original_op", None) is not None]
    if found:
        logging.warning(
            "qat: the graph already has %d gradient ops (e.g. %s) built before "
            "the rewrite; they differentiate the float model and keep reading "
            "float tensors. Call tf.gradients / the optimizer after "
            "create_training_graph.", len(found), ", ".join(found[:3]))
    return bool(found)


def check_previous_rewrite(graph: tf.Graph, pass_name: str, record: str) -> bool:
    """Refuses a pass that would redo a rewrite with other settings.

    Args:
      graph: the graph about to be rewritten.
      pass_name: "fold" or "quantize".
      record: the pass's settings (`RewriteConfig.describe()` and the like).

    Returns:
      True if the same pass already ran with the same settings (the call then
      changes nothing), False if it never ran.

    Raises:
      ValueError: if it ran with other settings (for instance a training
        rewrite followed by an eval rewrite of the same graph).
    """
    prefix = pass_name + ": "
    previous = [r for r in graph.get_collection(REWRITES_COLLECTION)
                if isinstance(r, str) and r.startswith(prefix)]
    entry = prefix + record
    for old in previous:
        if old != entry:
            raise ValueError(
                f"This graph was already rewritten by qat ({old}); this call "
                f"asks for ({entry}). A graph is rewritten once per setting: "
                "build a fresh graph from the same model code for the other "
                "one (e.g. a separate eval graph).")
    return bool(previous)


def record_rewrite(pass_name: str, record: str) -> str:
    """The collection entry `check_previous_rewrite` compares against."""
    return pass_name + ": " + record
