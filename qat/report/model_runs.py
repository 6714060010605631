"""Running the three models `layer_numerics` compares, on the same samples.

  * float: the frozen eval graph with every FakeQuant bypassed
    (`bypass_fake_quants`), run by `run_graph`;
  * QAT: the frozen eval graph itself (`run_graph`), and each of its tensors
    computed from TFLite's own values of the tensors before it
    (`read_forced_inputs`, `run_given_tflite`);
  * TFLite: the integer model, run by the ai_edge_litert interpreter keeping
    every intermediate tensor, dequantized (`run_tflite_tensors`).
"""
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from qat.export import inspect
from qat.export import parity
from qat.tflite import graph_structure as structure


def bypass_fake_quants(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
    """A copy of `graph_def` with each FakeQuant replaced by Identity(input 0)."""
    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    for node in result.node:
        if node.op in structure.FAKE_QUANT_TYPES:
            data = node.input[0]
            controls = [i for i in node.input if i.startswith("^")]
            node.op = "Identity"
            del node.input[:]
            node.input.extend([data] + controls)
            node.attr.clear()
            node.attr["T"].type = tf.float32.as_datatype_enum
    return result


def read_forced_inputs(graph_def: tf.compat.v1.GraphDef, tensors: Sequence[str]
                       ) -> Tuple[tf.compat.v1.GraphDef, Dict[str, str]]:
    """A copy of `graph_def` whose ops read each of `tensors` from a placeholder.

    Each tensor keeps its producer (so it can still be fetched and compared),
    but every op that read it reads the float32 placeholder
    `<op>/forced_<output index>` (made unique with "_") instead: fed with
    another model's values of those tensors, the graph computes each of them
    from the other model's values of the ones before it.

    Args:
      graph_def: a frozen graph.
      tensors: float32 tensor names ("op:0") of `graph_def`.

    Returns:
      (the new GraphDef, {tensor: its placeholder's tensor}); `graph_def` is
      not changed.
    """
    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    taken = {node.name for node in result.node}
    forced = {}
    for name in tensors:
        op_name, index = name.rsplit(":", 1)
        placeholder_name = f"{op_name}/forced_{index}"
        while placeholder_name in taken:
            placeholder_name += "_"
        taken.add(placeholder_name)
        placeholder = result.node.add(name=placeholder_name, op="Placeholder")
        placeholder.attr["dtype"].type = tf.float32.as_datatype_enum
        forced[name] = placeholder.name
        if index == "0":
            forced[op_name] = placeholder.name
    for node in result.node:
        for k, source in enumerate(node.input):
            if source in forced:
                node.input[k] = forced[source]
    return result, {name: forced[name] + ":0" for name in tensors}


def example_axis(shape: Sequence[Optional[int]]) -> int:
    """The examples' axis of a tensor: its one dimension of unknown size (the
    batch; axis 1 of a time-major sequence [steps, batch, features]), else 0.

    Args:
      shape: a static shape (None or -1 for an unknown size), or None.
    """
    if shape is None:
        return 0
    unknown = [k for k, d in enumerate(shape) if d is None or d == -1]
    return unknown[0] if len(unknown) == 1 else 0


def _graph_axis(t: tf.Tensor) -> int:
    shape = t.shape
    return example_axis(shape.as_list()) if shape.rank else 0


def run_graph(graph_def, feeds: Dict[str, np.ndarray], names: Sequence[str], batch_size: int,
              feed_axes: Optional[Dict[str, int]] = None,
              fetch_axes: Optional[Sequence[int]] = None) -> List[np.ndarray]:
    """Runs `graph_def` on `feeds` ({tensor: all examples}) in batches.

    Each feed is cut, and each fetched tensor joined, along its examples'
    axis (`example_axis` of its static shape; `feed_axes` / `fetch_axes`
    where the graph's shapes do not say: feeds default to 0).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    fetches = [graph.get_tensor_by_name(n) for n in names]
    feed_tensors = {graph.get_tensor_by_name(n): v for n, v in feeds.items()}
    axes = {t: (feed_axes or {}).get(t.name, 0) for t in feed_tensors}
    count = len(next(iter(feeds.values())))
    # A feed of k rows per example ([batch * seq, ...]) is cut k rows at a time.
    rows = {t: max(np.shape(v)[axes[t]] // count, 1) if np.ndim(v) else 1
            for t, v in feed_tensors.items()}

    def cut(t, v, i):
        if not np.ndim(v):
            return v
        index = [slice(None)] * np.ndim(v)
        index[axes[t]] = slice(i * rows[t], (i + batch_size) * rows[t])
        return v[tuple(index)]

    chunks = []
    with tf.compat.v1.Session(graph=graph) as sess:
        for i in range(0, count, batch_size):
            chunks.append(sess.run(fetches, {t: cut(t, v, i) for t, v in feed_tensors.items()}))
    if fetch_axes is None:
        fetch_axes = [_graph_axis(t) for t in fetches]
    return [np.concatenate([c[k] for c in chunks], axis=fetch_axes[k])
            if chunks[0][k].ndim else chunks[0][k] for k in range(len(fetches))]


def run_tflite_tensors(model: bytes, samples: "parity.Inputs", batch_size: int = 64
                       ) -> Dict[str, Dict[str, Any]]:
    """Runs a TFLite model keeping every tensor; returns them dequantized.

    `samples`: an array for the first input, or {input name: array} for every
    input (integer ids and masks fed as they are; see `parity.set_input`).

    Returns:
      {TFLite tensor name: {"value": float array over all samples,
      "scale": float or None, "integer": bool, "requantized": bool}} for the model input and every
      op output. A scalar tensor (no example axis, e.g. a reduction over the
      whole batch) is the value of the first batch.
    """
    from ai_edge_litert import interpreter as litert  # pylint: disable=import-outside-toplevel
    report = inspect.describe_model(model)
    wanted = set(report.inputs)
    for op in report.ops:
        wanted.update(op.outputs)
    chunks: Dict[int, List[np.ndarray]] = {i: [] for i in wanted}
    count = len(next(iter(samples.values()))) if isinstance(samples, Mapping) else len(samples)
    for start in range(0, count, batch_size):
        if isinstance(samples, Mapping):
            batch = {k: np.asarray(v[start:start + batch_size]) for k, v in samples.items()}
        else:
            batch = np.asarray(samples[start:start + batch_size], np.float32)
        interp = litert.Interpreter(
            model_content=model, experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        parity.set_input(interp, batch)
        interp.invoke()
        for index in wanted:
            chunks[index].append(np.array(interp.get_tensor(index)))
        signatures = {d["index"]: d.get("shape_signature") for d in interp.get_tensor_details()}
    # A QUANTIZE from an integer tensor: a requantized copy (the converter's
    # `<op>1` before a concatenation of another scale), not an op's own output.
    requantized = {op.outputs[0] for op in report.ops if op.name == "QUANTIZE"
                   and np.issubdtype(np.dtype(op.input_types[0]), np.integer)}
    result = {}
    for index in wanted:
        info = report.tensors[index]
        parts = chunks[index]
        axis = example_axis(signatures.get(index)) if parts[0].ndim else 0
        value = (np.concatenate(parts, axis=axis) if parts[0].ndim else parts[0]).astype(np.float64)
        integer = np.issubdtype(np.dtype(info.dtype), np.integer) and info.scale > 0
        if integer:
            value = (value - info.zero_point) * info.scale
        result[info.name] = {"value": value, "scale": info.scale if integer else None,
                             "integer": integer, "requantized": index in requantized}
    return result


def run_given_tflite(graph_def, inputs: Dict[str, np.ndarray], names: Sequence[str],
                      forced: Dict[str, str], tflite: Dict[str, Dict[str, Any]],
                      batch_size: int) -> List[np.ndarray]:
    """Each of `names` computed by the eval graph from TFLite's values before it.

    `forced` maps the eval graph tensors read from TFLite to their TFLite
    tensors; those without an example axis (values of one batch) are not read.
    """
    count = len(next(iter(inputs.values())))
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")

    def axis_of(name):
        return _graph_axis(graph.get_tensor_by_name(name))

    def per_example(name, value):
        # The examples' axis, or a dynamic one of k rows per example
        # (BERT's [batch * seq, hidden] matrices).
        axis = axis_of(name)
        if not np.ndim(value) or np.ndim(value) <= axis or np.shape(value)[axis] % count:
            return False
        shape = graph.get_tensor_by_name(name).shape
        return np.shape(value)[axis] == count or (shape.rank and shape[axis] is None)

    forced = {name: match for name, match in forced.items()
              if per_example(name, tflite[match]["value"])}
    graph_def, placeholders = read_forced_inputs(graph_def, sorted(forced))
    feeds = dict(inputs)
    feed_axes = {}
    for name, match in forced.items():
        feeds[placeholders[name]] = tflite[match]["value"].astype(np.float32)
        feed_axes[placeholders[name]] = axis_of(name)
    return run_graph(graph_def, feeds, names, batch_size, feed_axes,
                     [axis_of(name) for name in names])
