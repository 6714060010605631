"""Freezing an eval graph: variables become constants, ready for TFLite.

Sources: a live Session, or a graph file (binary or text GraphDef, or a
MetaGraphDef `.meta`) plus a checkpoint. The caller's graph is never edited:
files are imported into fresh graphs and sessions are only read.
"""
import difflib
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf
from google.protobuf import message as protobuf_message
from google.protobuf import text_format

from qat.export.errors import (CheckpointError, GraphLoadError, NonFiniteError,
                               TensorNameError)

_REF_VARIABLE_OPS = frozenset(["Variable", "VariableV2", "AutoReloadVariable"])
_FAKE_QUANT_OPS = frozenset(["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel"])
_RESOURCE_VARIABLE_OPS = frozenset(["VarHandleOp"])

GraphLike = Union[tf.Graph, tf.compat.v1.GraphDef]


def op_name(name: str) -> str:
    """Returns the op name of a tensor or op name ("x:0", "^x" or "x" -> "x")."""
    name = name.lstrip("^")
    return name.split(":")[0]


def tensor_name(name: str) -> str:
    """Returns a full tensor name: "x" -> "x:0", "x:1" unchanged."""
    return name if ":" in name else name + ":0"


def _node_names(graph: GraphLike) -> List[str]:
    if isinstance(graph, tf.Graph):
        return [op.name for op in graph.get_operations()]
    return [node.name for node in graph.node]


def check_tensor_names(graph: GraphLike, names: Sequence[str], role: str) -> None:
    """Raises TensorNameError unless every name is an op (or tensor) of `graph`.

    Args:
      graph: a tf.Graph or GraphDef.
      names: tensor or op names ("logits", "logits:0").
      role: what the names are for ("input", "output"), used in the message.

    Raises:
      TensorNameError: naming the unknown names, with close matches and the
        graph's placeholders as suggestions.
    """
    known = _node_names(graph)
    known_set = set(known)
    if isinstance(graph, tf.Graph):
        n_outputs = {op.name: len(op.outputs) for op in graph.get_operations()}
    else:
        n_outputs = None
    problems = []
    for name in names:
        base = op_name(name)
        if base not in known_set:
            close = difflib.get_close_matches(base, known, n=3)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            problems.append(f"{role} tensor {name!r}: no op named {base!r} in the graph{hint}")
        elif n_outputs is not None and ":" in name:
            index = int(name.split(":")[1])
            if index >= n_outputs[base]:
                problems.append(f"{role} tensor {name!r}: op {base!r} has only "
                                f"{n_outputs[base]} output(s)")
    if problems:
        if isinstance(graph, tf.Graph):
            placeholders = [op.name for op in graph.get_operations() if op.type == "Placeholder"]
        else:
            placeholders = [n.name for n in graph.node if n.op == "Placeholder"]
        raise TensorNameError(
            "; ".join(problems) + f". Placeholders in the graph: {placeholders[:10]}. "
            f"Pass existing names (e.g. --{role}s=NAME).")


def load_graph_file(path: str) -> Tuple[tf.compat.v1.GraphDef,
                                        Optional[tf.compat.v1.MetaGraphDef]]:
    """Reads a GraphDef (.pb binary, .pbtxt text) or a MetaGraphDef (.meta).

    Args:
      path: the file. The format is taken from the content, the extension only
        decides which parser is tried first.

    Returns:
      (graph_def, meta_graph_def); meta_graph_def is None for a plain GraphDef.

    Raises:
      GraphLoadError: the file is missing or none of the formats parse it.
    """
    if not tf.io.gfile.exists(path):
        raise GraphLoadError(f"graph file {path!r} does not exist: pass a GraphDef "
                             "(.pb/.pbtxt) or MetaGraphDef (.meta) of the eval graph")
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    is_text = path.endswith((".pbtxt", ".txt"))
    attempts = []
    for kind in ("meta", "graph") if path.endswith(".meta") else ("graph", "meta"):
        for text in (is_text, not is_text):
            proto = (tf.compat.v1.MetaGraphDef() if kind == "meta"
                     else tf.compat.v1.GraphDef())
            try:
                if text:
                    text_format.Parse(data.decode("utf-8"), proto)
                else:
                    proto.ParseFromString(data)
            except (protobuf_message.DecodeError, text_format.ParseError,
                    UnicodeDecodeError, RuntimeWarning) as e:
                attempts.append(f"{kind}{' (text)' if text else ''}: {str(e)[:80]}")
                continue
            if kind == "meta" and proto.graph_def.node:
                return proto.graph_def, proto
            if kind == "graph" and proto.node:
                return proto, None
            attempts.append(f"{kind}{' (text)' if text else ''}: parsed but holds no nodes")
    raise GraphLoadError(
        f"graph file {path!r} is not a GraphDef or MetaGraphDef ({'; '.join(attempts)}). "
        "Write it with tf.io.write_graph(graph.as_graph_def(), ...) or "
        "tf.compat.v1.train.export_meta_graph(...).")


def checkpoint_prefix(checkpoint: str) -> str:
    """Resolves a checkpoint prefix or directory to an existing prefix.

    Raises:
      CheckpointError: nothing readable is there.
    """
    if tf.io.gfile.isdir(checkpoint):
        latest = tf.train.latest_checkpoint(checkpoint)
        if latest is None:
            raise CheckpointError(f"checkpoint directory {checkpoint!r} holds no checkpoint "
                                  "(no 'checkpoint' state file); pass the prefix, "
                                  "e.g. dir/model.ckpt-100")
        checkpoint = latest
    if not tf.io.gfile.exists(checkpoint + ".index"):
        raise CheckpointError(
            f"checkpoint {checkpoint!r} not found: expected {checkpoint + '.index'!r}. "
            "Pass the prefix that Saver.save returned (e.g. model.ckpt-100), or its directory.")
    return checkpoint


def freeze_session(sess: tf.compat.v1.Session, output_names: Sequence[str]
                   ) -> tf.compat.v1.GraphDef:
    """Freezes the subgraph that computes `output_names` with `sess`'s values.

    Args:
      sess: a session whose variables hold the trained (restored) values.
      output_names: output tensor or op names.

    Returns:
      A GraphDef with every variable read replaced by a constant; the session's
      graph is not modified.

    Raises:
      TensorNameError: an output name is not in the graph.
    """
    check_tensor_names(sess.graph, output_names, "output")
    outputs = sorted({op_name(n) for n in output_names})
    return tf.compat.v1.graph_util.convert_variables_to_constants(
        sess, sess.graph.as_graph_def(), outputs)


def _variable_ops_needed(graph_def: tf.compat.v1.GraphDef, outputs: Sequence[str]) -> List[str]:
    sub = tf.compat.v1.graph_util.extract_sub_graph(graph_def, list(outputs))
    return [n.name for n in sub.node if n.op in _REF_VARIABLE_OPS | _RESOURCE_VARIABLE_OPS]


def _restore_from_reader(graph: tf.Graph, sess: tf.compat.v1.Session, checkpoint: str,
                         variable_ops: Sequence[str]) -> None:
    """Loads each variable op from the checkpoint key of the same name."""
    reader = tf.train.load_checkpoint(checkpoint)
    shapes = reader.get_variable_to_shape_map()
    missing = [name for name in variable_ops if name not in shapes]
    if missing:
        raise CheckpointError(
            f"checkpoint {checkpoint!r} lacks variable(s) {missing[:10]} read by the outputs "
            f"(it holds {sorted(shapes)[:10]}...). Use the checkpoint saved from this model, or a "
            ".meta file whose Saver maps the names.")
    with graph.as_default():
        feeds, assigns = {}, []
        for name in variable_ops:
            op = graph.get_operation_by_name(name)
            value = reader.get_tensor(name)
            placeholder = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape)
            if op.type in _RESOURCE_VARIABLE_OPS:
                assigns.append(tf.raw_ops.AssignVariableOp(resource=op.outputs[0],
                                                           value=placeholder))
            else:
                assigns.append(tf.compat.v1.assign(op.outputs[0], placeholder))
            feeds[placeholder] = np.asarray(value)
    sess.run(assigns, feed_dict=feeds)


def freeze_graph_file(graph_path: str, checkpoint: Optional[str],
                      output_names: Sequence[str]) -> tf.compat.v1.GraphDef:
    """Freezes an eval graph stored in a file with a checkpoint's values.

    Args:
      graph_path: a .meta MetaGraphDef (restored through its Saver) or a
        GraphDef (variables loaded by name from the checkpoint).
      checkpoint: checkpoint prefix or directory; may be None only when the
        outputs read no variables (an already frozen graph).
      output_names: output tensor or op names.

    Returns:
      The frozen GraphDef.

    Raises:
      GraphLoadError, CheckpointError, TensorNameError: see their docs.
    """
    graph_def, meta_graph_def = load_graph_file(graph_path)
    check_tensor_names(graph_def, output_names, "output")
    outputs = sorted({op_name(n) for n in output_names})
    variable_ops = _variable_ops_needed(graph_def, outputs)
    if checkpoint is None:
        if variable_ops:
            raise CheckpointError(
                f"the outputs of {graph_path!r} read {len(variable_ops)} variable(s) "
                f"(e.g. {variable_ops[0]!r}) but no checkpoint was given: pass --checkpoint")
        return tf.compat.v1.graph_util.extract_sub_graph(graph_def, outputs)
    checkpoint = checkpoint_prefix(checkpoint)
    graph = tf.Graph()
    with graph.as_default():
        if meta_graph_def is not None:
            try:
                saver = tf.compat.v1.train.import_meta_graph(meta_graph_def, clear_devices=True)
            except (ValueError, KeyError, tf.errors.OpError) as e:
                raise GraphLoadError(f"cannot import the MetaGraphDef {graph_path!r}: {e}") from e
        else:
            saver = None
            try:
                tf.import_graph_def(graph_def, name="")
            except (ValueError, KeyError, tf.errors.OpError) as e:
                raise GraphLoadError(f"cannot import the GraphDef {graph_path!r}: {e}") from e
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        if saver is not None:
            try:
                saver.restore(sess, checkpoint)
            except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as e:
                raise CheckpointError(
                    f"restoring {checkpoint!r} into {graph_path!r} failed: "
                    f"{str(e).splitlines()[0]}") from e
        else:
            _restore_from_reader(graph, sess, checkpoint, variable_ops)
        return tf.compat.v1.graph_util.convert_variables_to_constants(
            sess, graph_def, outputs)


def _range_readers(graph_def: tf.compat.v1.GraphDef) -> dict:
    """{op name: FakeQuant op} for ops a FakeQuant reads as min or max.

    Identity chains between the constant and the FakeQuant are followed, so
    a frozen resource-variable read (Const -> Identity) maps to its Const.
    """
    nodes = {n.name: n for n in graph_def.node}
    readers = {}
    for node in graph_def.node:
        if node.op not in _FAKE_QUANT_OPS:
            continue
        for inp in node.input[1:3]:
            name = op_name(inp)
            while name in nodes and name not in readers:
                readers[name] = node.name
                if nodes[name].op != "Identity" or not nodes[name].input:
                    break
                name = op_name(nodes[name].input[0])
    return readers


def check_finite(graph_def: tf.compat.v1.GraphDef, label: str = "the frozen graph") -> None:
    """Raises NonFiniteError if a float constant (frozen variable) is NaN or Inf.

    A diverged training run saves NaN weights or ranges. The TFLite converter
    does not check them: it may crash, convert NaN weights silently, or make
    a model the runtime refuses with an unrelated scale error (a NaN range).
    So this runs before it.

    Args:
      graph_def: a frozen GraphDef (variables already constants, named after
        the variables they came from).
      label: how to call the graph in the message.

    Raises:
      NonFiniteError: naming every non-finite constant, whether it is a
        FakeQuant range or weights, and how many values are bad.
    """
    readers = _range_readers(graph_def)
    problems, names = [], []
    for node in graph_def.node:
        if node.op != "Const" or not tf.as_dtype(node.attr["dtype"].type).is_floating:
            continue
        value = tf.make_ndarray(node.attr["value"].tensor)
        finite = np.isfinite(value)
        if finite.all():
            continue
        kinds = "/".join(k for k, bad in (("NaN", np.isnan(value).any()),
                                          ("Inf", np.isinf(value).any())) if bad)
        what = (f"range {node.name!r} of FakeQuant {readers[node.name]!r}"
                if node.name in readers else f"variable {node.name!r}")
        problems.append(f"{what}: {value.size - int(finite.sum())} of {value.size} value(s) "
                        f"are {kinds}")
        names.append(node.name)
    if problems:
        raise NonFiniteError(
            f"{label} holds non-finite values, which the TFLite converter does not check: "
            + "; ".join(problems) + ". The checkpoint comes from a run that diverged: "
            "restore an earlier checkpoint (or train again with a lower learning rate) "
            "and export that.", names)
