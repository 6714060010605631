"""Converting a frozen eval graph to a fully integer TFLite model.

Two flavours, both from the FakeQuant ranges trained by qat:
  * "uint8": the legacy (TF1) integer model: `inference_type=tf.uint8` with
    `quantized_input_stats`; uint8 input and output tensors.
  * "int8": `optimizations=[tf.lite.Optimize.DEFAULT]` with int8 kernels; float
    input/output (QUANTIZE/DEQUANTIZE at the edges) unless `int8_io=True`.
    Per-channel weight ranges (`per_channel_weights=True`) give per-channel
    int8 kernels; they have no uint8 form, which `check_flavour` refuses.
"""
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from qat.export.errors import ConversionError, ExportError
from qat.export.freeze import check_finite, check_tensor_names, op_name, tensor_name

FLAVOURS = ("uint8", "int8")
_FAKE_QUANT_OPS = frozenset(["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"])
_PASS_THROUGH_OPS = frozenset(["Identity", "Reshape"])
_WEIGHT_PASS_THROUGH_OPS = frozenset(["Identity", "Reshape", "Transpose", "ReadVariableOp"])
_DENSE_OPS = frozenset(["MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"])


def _const_value(graph_def: tf.compat.v1.GraphDef, name: str) -> Optional[np.ndarray]:
    nodes = {n.name: n for n in graph_def.node}
    node = nodes.get(op_name(name))
    while node is not None and node.op == "Identity":
        node = nodes.get(op_name(node.input[0]))
    if node is None or node.op != "Const":
        return None
    return tf.make_ndarray(node.attr["value"].tensor)


def input_range_from_fake_quant(graph_def: tf.compat.v1.GraphDef, input_name: str
                                ) -> Optional[Tuple[float, float]]:
    """Returns the (min, max) of a FakeQuant reading `input_name` directly.

    Looks through Identity/Reshape consumers. Returns None when the input feeds
    no FakeQuant (contrib never quantizes the model input: pass its range).
    """
    consumers: Dict[str, list] = {}
    for node in graph_def.node:
        for inp in node.input:
            consumers.setdefault(op_name(inp), []).append(node)
    frontier = [op_name(input_name)]
    seen = set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in consumers.get(name, []):
            if node.op == "FakeQuantWithMinMaxArgs":
                return float(node.attr["min"].f), float(node.attr["max"].f)
            if node.op == "FakeQuantWithMinMaxVars":
                lo = _const_value(graph_def, node.input[1])
                hi = _const_value(graph_def, node.input[2])
                if lo is not None and hi is not None and lo.size == 1:
                    return float(lo), float(hi)
            if node.op in _PASS_THROUGH_OPS:
                frontier.append(node.name)
    return None


def is_float_input(graph_def: tf.compat.v1.GraphDef, input_name: str) -> bool:
    """Whether graph input `input_name` is a float tensor (integer ids, masks are not).

    An input whose type the graph does not say (no `dtype` attribute) counts as float.
    """
    for node in graph_def.node:
        if node.name == op_name(input_name) and "dtype" in node.attr:
            return tf.dtypes.as_dtype(node.attr["dtype"].type).is_floating
    return True


def per_channel_fake_quants(graph_def: tf.compat.v1.GraphDef) -> List[str]:
    """Names of the per-channel FakeQuant ops of `graph_def`, in graph order.

    Args:
      graph_def: a (frozen) eval graph.

    Returns:
      The node names (`<prefix>/FakeQuantWithMinMaxVars`, contrib's name,
      of type FakeQuantWithMinMaxVarsPerChannel).
    """
    return [node.name for node in graph_def.node
            if node.op == "FakeQuantWithMinMaxVarsPerChannel"]


def keep_per_tensor_weights(converter, graph_def: tf.compat.v1.GraphDef) -> None:
    """Tells TF's int8 converter to keep the per-tensor weight ranges of dense layers.

    The converter quantizes a weight that several FULLY_CONNECTED ops read
    (the steps of a recurrent layer, two layers of equal weights) per channel
    again, ignoring its FakeQuant's range, and quantizes a bias whose values
    are all equal (a GRU's gate bias as initialized) with the first channel's
    scale only: the model then computes something else than the eval graph.
    Dense layers are kept per tensor
    (`_experimental_disable_per_channel_quantization_for_dense_layers`) unless
    a MatMul reads a per-channel FakeQuant (convolutions keep theirs).

    Args:
      converter: a `TFLiteConverter` set up for int8.
      graph_def: the graph it converts (its function library included).
    """
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes += function.node_def
    per_channel = {node.name for node in nodes if node.op == "FakeQuantWithMinMaxVarsPerChannel"}
    passed = True
    while passed:  # What reads a per-channel range through Identity / Reshape / Transpose.
        passed = False
        for node in nodes:
            if (node.name not in per_channel and node.op in _WEIGHT_PASS_THROUGH_OPS
                    and any(op_name(i) in per_channel for i in node.input[:1])):
                per_channel.add(node.name)
                passed = True
    if not any(node.op in _DENSE_OPS and any(op_name(i) in per_channel for i in node.input)
               for node in nodes):
        converter._experimental_disable_per_channel_quantization_for_dense_layers = True  # pylint: disable=protected-access


def check_flavour(graph_def: tf.compat.v1.GraphDef, flavour: str) -> None:
    """Refuses a flavour the graph's ranges cannot give, before converting.

    Args:
      graph_def: the (frozen) eval graph to convert.
      flavour: "uint8" or "int8".

    Raises:
      ExportError: an unknown flavour, or "uint8" for a graph with
        per-channel weight ranges (TFLite's uint8 kernels take per-tensor
        weights only: the converter writes the model, the runtime refuses it).
    """
    if flavour not in FLAVOURS:
        raise ExportError(f"unknown flavour {flavour!r}: use one of {FLAVOURS}")
    if flavour != "uint8":
        return
    per_channel = per_channel_fake_quants(graph_def)
    if per_channel:
        shown = ", ".join(repr(name) for name in per_channel[:3])
        more = f" and {len(per_channel) - 3} more" if len(per_channel) > 3 else ""
        raise ExportError(
            f"uint8 export refused: the graph has per-channel weight ranges ({shown}{more}), "
            "and TFLite's uint8 kernels take one range per weight tensor only. Export int8 "
            "(flavours=('int8',); CLI --flavour=int8), the flavour per_channel_weights=True "
            "is meant for, or build the training and eval graphs without per_channel_weights "
            "(e.g. symmetric_weights=True) for a uint8 model.")


def quantized_input_stats(input_range: Tuple[float, float], flavour: str
                          ) -> Tuple[float, float]:
    """Converts a real input range to the converter's (mean, std_dev).

    The converter maps real = (q - mean) / std_dev; uint8 q spans [0, 255],
    int8 q spans [-128, 127].

    Raises:
      ExportError: the range is empty or reversed.
    """
    lo, hi = float(input_range[0]), float(input_range[1])
    if not hi > lo:
        raise ExportError(f"input range ({lo}, {hi}) is empty: pass (min, max) with min < max")
    std = 255.0 / (hi - lo)
    mean = -lo * std
    if flavour == "int8":
        mean -= 128.0
    return mean, std


def convert_frozen_graph(graph_def: tf.compat.v1.GraphDef,
                         input_names: Sequence[str],
                         output_names: Sequence[str],
                         flavour: str,
                         input_ranges: Optional[Mapping[str, Tuple[float, float]]] = None,
                         int8_io: bool = False,
                         default_input_range: Optional[Tuple[float, float]] = None) -> bytes:
    """Converts a frozen eval graph to a TFLite flatbuffer.

    Args:
      graph_def: frozen GraphDef (see freeze.py) with the FakeQuant ops.
      input_names: input tensor names (placeholders).
      output_names: output tensor names.
      flavour: "uint8" (legacy quantized_input_stats model) or "int8".
      input_ranges: {input name: (min, max)} of the real input values, for
        inputs no FakeQuant reads (the converter uses a FakeQuant's range when
        there is one; a different range given here is ignored with a warning).
      int8_io: for "int8", make the model's input and output int8 instead of
        float.
      default_input_range: the range of float inputs neither in
        `input_ranges` nor read by a FakeQuant. Integer inputs (token ids,
        masks) need no range: TFLite keeps them as they are.

    Returns:
      The .tflite model bytes.

    Raises:
      TensorNameError: a name is not in the graph.
      ExportError: a float input has no range, the flavour is unknown, or uint8
        is asked of a graph with per-channel weight ranges.
      NonFiniteError: a weight or range is NaN/Inf (checked before the
        converter runs, which does not check them).
      ConversionError: the converter failed (its message is included).
    """
    check_flavour(graph_def, flavour)
    check_tensor_names(graph_def, input_names, "input")
    check_tensor_names(graph_def, output_names, "output")
    check_finite(graph_def)
    ranges = {op_name(k): v for k, v in (input_ranges or {}).items()}
    stats = {}
    for name in input_names:
        if not is_float_input(graph_def, name):
            # Ids, masks: TFLite keeps the input's own type and reads no stats of it,
            # but the converter wants an entry for every input.
            if op_name(name) in ranges:
                logging.warning("input %s: range %s ignored, the input is not float",
                                name, tuple(ranges[op_name(name)]))
            stats[op_name(name)] = (0.0, 1.0)
            continue
        from_fake_quant = input_range_from_fake_quant(graph_def, name)
        given = ranges.get(op_name(name))
        if from_fake_quant and given and not np.allclose(from_fake_quant, given):
            # The converter takes an input FakeQuant's range over quantized_input_stats.
            logging.warning("input %s: range %s ignored, the FakeQuant reading it has %s",
                            name, tuple(given), from_fake_quant)
        rng = from_fake_quant or given or default_input_range
        if rng is None:
            raise ExportError(
                f"float input {name!r} has no range: it feeds no FakeQuant op, so give the real "
                f"values its quantized form spans, e.g. input_ranges={{{op_name(name)!r}: "
                "(0.0, 1.0)}} (CLI: --input_range=0,1)")
        stats[op_name(name)] = quantized_input_stats(rng, flavour)

    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.import_graph_def(graph_def, name="")
        except (ValueError, tf.errors.OpError) as e:
            raise ConversionError(f"cannot import the frozen graph: {e}") from e
        inputs = [graph.get_tensor_by_name(tensor_name(n)) for n in input_names]
        outputs = [graph.get_tensor_by_name(tensor_name(n)) for n in output_names]
        with tf.compat.v1.Session(graph=graph) as sess:
            try:
                converter = tf.compat.v1.lite.TFLiteConverter.from_session(
                    sess, inputs, outputs)
            except ValueError as e:
                raise ConversionError(f"TFLite converter set-up failed: {e}") from e
    if flavour == "uint8":
        converter.inference_type = tf.uint8
    else:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.inference_type = tf.int8
        keep_per_tensor_weights(converter, graph_def)
        if int8_io:
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
    converter.quantized_input_stats = {
        # The converter keys the stats by the tensor name it reports for the input.
        t.name.split(":")[0]: stats[op_name(t.name)] for t in inputs}
    try:
        return converter.convert()
    except Exception as e:  # The converter raises several unrelated types.
        raise ConversionError(
            f"TFLite {flavour} conversion of outputs {list(output_names)} failed: "
            f"{type(e).__name__}: {str(e)[:2000]}") from e


def write_model(model: bytes, path: str) -> str:
    """Writes model bytes to `path` (parent directories created); returns path."""
    parent = os.path.dirname(path)
    if parent:
        tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(model)
    return path
