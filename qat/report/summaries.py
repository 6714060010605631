"""TensorBoard summaries of the quantization ranges, and reading them back.

`add_range_summaries` adds, to a graph qat rewrote, one scalar summary per
range variable (tag: the variable's name, e.g. `net/conv1/act_quant/min`;
per-channel ranges: the smallest minimum / largest maximum), one scalar per
range's count of skipped batches in training graphs (tag
`<prefix>/skipped_batches`: batches whose values were not finite, which the
range did not learn from, `qat.quantize.emit.finite_ranges`) and a histogram
of every quantized layer's weight variable, so a training run shows its ranges
settling. `read_scalars` reads the scalars back from the event files.
"""
import glob
import os
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from qat.quantize.emit import finite_ranges
from qat.tflite import graph_structure as structure

WEIGHT_HISTOGRAM_PREFIX = "weights/"


def _read(graph: tf.Graph, variable: str) -> Optional[tf.Tensor]:
    """A fresh read of a variable, with no control dependency.

    The FakeQuant's own min/max inputs in a training graph run the range
    update (moving average, last value) first: a summary reading them would
    update the ranges an extra time.
    """
    op = graph.get_operation_by_name(variable)
    if op.type == "VarHandleOp":
        return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
    if op.type in structure.VARIABLE_TYPES:
        return tf.identity(op.outputs[0])
    return op.outputs[0] if op.outputs and op.outputs[0].dtype.is_floating else None


def add_range_summaries(graph: Optional[tf.Graph] = None, weight_histograms: bool = True,
                        collections: Optional[Sequence[str]] = None) -> Optional[tf.Tensor]:
    """Adds summaries of every range variable, skipped-batch count and quantized weight tensor.

    Call it after the rewrite (`qat.create_training_graph` & co). The
    summaries read the variables directly (not the FakeQuant's min/max
    inputs, which run the range updates), so running them needs no feed and
    leaves the training unchanged.

    Args:
      graph: the rewritten graph; default: the default graph.
      weight_histograms: also add a histogram of the weight variable of each
        layer whose weights are quantized (tag `weights/<variable>`).
      collections: graph collections to add the summaries to; default
        `tf.compat.v1.GraphKeys.SUMMARIES` (so `merge_all` picks them up).

    Returns:
      One merged summary op of everything added (run it and pass the result
      to a `tf.compat.v1.summary.FileWriter`), or None if the graph has no
      quantizer.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    if collections is None:
        collections = [tf.compat.v1.GraphKeys.SUMMARIES]
    excluded = structure.gradient_ops(graph)
    quantizers = [structure.quantizer_op(op) for op in structure.fake_quant_ops(graph)
                  if op not in excluded]
    weight_variables = []
    for op in graph.get_operations():
        if structure.is_layer(op) and op not in excluded:
            if structure.quantizer_reading(structure.weight_tensor(op)) is not None:
                variable = structure.weight_variable(op)
                if variable and variable not in weight_variables:
                    weight_variables.append(variable)
    summaries = []
    seen = set()
    with graph.as_default(), tf.name_scope("qat_range_summaries"):
        for q in quantizers:
            for variable, tensor, reduce in ((q.min_variable, q.op.inputs[1], tf.reduce_min),
                                             (q.max_variable, q.op.inputs[2], tf.reduce_max)):
                tag = variable or tensor.op.name
                if tag in seen:
                    continue
                seen.add(tag)
                value = _read(graph, variable) if variable else tensor
                value = reduce(value) if value.shape.rank else value
                summaries.append(tf.raw_ops.ScalarSummary(tags=tag, values=value))
        for counter in graph.get_collection(finite_ranges.SKIPPED_BATCHES_COLLECTION):
            summaries.append(tf.raw_ops.ScalarSummary(
                tags=counter.op.name, values=_read(graph, counter.op.name)))
        if weight_histograms:
            for variable in weight_variables:
                value = _read(graph, variable)
                if value is not None:
                    summaries.append(tf.raw_ops.HistogramSummary(
                        tag=WEIGHT_HISTOGRAM_PREFIX + variable, values=value))
        if not summaries:
            return None
        for summary in summaries:
            for collection in collections:
                graph.add_to_collection(collection, summary)
        return tf.raw_ops.MergeSummary(inputs=summaries)


def read_scalars(logdir: str) -> Dict[str, List[Tuple[int, float]]]:
    """Reads every scalar summary of the event files in `logdir`.

    Args:
      logdir: a directory a FileWriter wrote to (its event files, not
        recursively).

    Returns:
      {tag: [(step, value), ...]} in step order.

    Raises:
      FileNotFoundError: `logdir` holds no event file.
    """
    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    if not files:
        raise FileNotFoundError(f"no TensorBoard event file in {logdir!r}")
    scalars: Dict[str, List[Tuple[int, float]]] = {}
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {tag: sorted(points) for tag, points in scalars.items()}


def range_history(scalars: Dict[str, List[Tuple[int, float]]]
                  ) -> Dict[str, Dict[str, List[Tuple[int, float]]]]:
    """Groups `read_scalars` output by quantizer: {quantizer: {"min": ..., "max": ...}}.

    Tags ending in /min or /max (the range variables) are kept.
    """
    history: Dict[str, Dict[str, List[Tuple[int, float]]]] = {}
    for tag, points in scalars.items():
        head, _, end = tag.rpartition("/")
        if end in ("min", "max") and head:
            history.setdefault(head, {})[end] = points
    return history
