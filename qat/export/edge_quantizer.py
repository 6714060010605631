"""Mixed int8/int16 LiteRT models from qat's own ranges, by ai-edge-quantizer.

Why this module exists: TF's converter refuses a 16-bit activation FakeQuant
inside an 8-bit graph (`'tfl.tanh' op failed to verify that input and output
must have same element type`): it never inserts the int8 <-> int16
requantization. ai-edge-quantizer (PyPI `ai-edge-quantizer`, Google's LiteRT
quantizer) quantizes a float `.tflite` op by op, int8 and int16 activations
mixed, and takes calibration results it did not compute. This module hands
it the ranges and bits qat trained, so nothing is calibrated again:

1. The frozen eval graph is made float: each weight FakeQuant becomes the
   constant it computes (the float weights on qat's grid), each activation
   FakeQuant an Identity; TF's converter (no optimizations) makes the float
   `.tflite`. Its tensors are named after the TF ops whose values they hold
   (`qat.tflite.names`), so each one is matched to the FakeQuant that
   quantizes that value.
2. The calibration result is those FakeQuants' (min, max); tensors no
   FakeQuant quantizes (pass-through ops such as SPLIT, UNPACK, TRANSPOSE,
   which ai-edge-quantizer gives their input's scale) take the min and max
   the float model computes on `sample_inputs`.
3. The recipe: one `min_max_uniform_quantize` rule per op, int8 asymmetric
   activations (FakeQuant's grid: scale (max - min) / 255, zero point rounded)
   or int16 symmetric ones (LiteRT's int16 kernels want zero point 0), and
   symmetric per-tensor weights of the weight FakeQuant's `num_bits` (8 or 4;
   qat's narrow symmetric grid is max|w| / (2**(bits-1) - 1), ai-edge-quantizer's too).

A FakeQuant is 16-bit when its `num_bits` is 16, or when `activation_bits`
asks for it. A 16-bit FakeQuant must span [-32768 s, 32767 s] (LiteRT's int16
grid, zero point 0); one asked for by `activation_bits` is rewritten so, and
`reference_graph_def` holds the eval graph with those rewrites: the model's
reference (the eval function it reproduces).
"""
import dataclasses
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from qat.export import edge_quantizer_graphs as graphs
from qat.export.errors import ExportError
from qat.export.freeze import op_name

_ALGORITHM = "min_max_uniform_quantize"
int16_range = graphs.int16_range


class EdgeQuantizerUnavailableError(ExportError):
    """ai-edge-quantizer is not installed (`pip install ai-edge-quantizer`)."""


@dataclasses.dataclass
class EdgeQuantizedModel:
    """A mixed-precision LiteRT model and what it was made from.

    Attributes:
      model: the `.tflite` bytes (float input and output, integer inside).
      reference_graph_def: the frozen eval graph the model reproduces (16-bit
        FakeQuants on LiteRT's int16 grid).
      tensor_bits: {TFLite tensor name: 8 or 16} of every tensor given a qat range.
      calibrated: TFLite tensors no FakeQuant quantizes (ranges from `sample_inputs`).
      recipe: the ai-edge-quantizer recipe used (JSON-ready).
    """
    model: bytes
    reference_graph_def: tf.compat.v1.GraphDef
    tensor_bits: Dict[str, int]
    calibrated: List[str]
    recipe: List[dict]


def _edge_quantizer():
    try:
        from ai_edge_quantizer import quantizer  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise EdgeQuantizerUnavailableError(
            "mixed int8/int16 export needs ai-edge-quantizer: pip install "
            f"'ai-edge-quantizer>=0.10,<0.11' ({e})") from e
    return quantizer

def _convert_float(graph_def, input_names: Sequence[str], output_names: Sequence[str]) -> bytes:
    def load():
        tf.import_graph_def(graph_def, name="")
    wrapped = tf.compat.v1.wrap_function(load, [])
    function = wrapped.prune([wrapped.graph.get_tensor_by_name(n) for n in input_names],
                             [wrapped.graph.get_tensor_by_name(n) for n in output_names])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    return converter.convert()


def _fake_quant_of(tensor_name: str, nodes, activations, by_source) -> Optional[str]:
    """The FakeQuant quantizing the value a TFLite tensor holds (its name's first part)."""
    part = tensor_name.split(";")[0]
    node = nodes.get(part) or nodes.get(part.rstrip("0123456789"))
    while node is not None:
        if node.name in activations:
            return node.name
        if node.name in by_source:
            return by_source[node.name]
        if node.op != "Identity":
            return None
        node = nodes.get(op_name(node.input[0]))
    return None


def _weight_bits_of(tensor_name: str, nodes, weights) -> Optional[int]:
    """The bits of the weight FakeQuant behind a constant TFLite tensor.

    The converter names a weight after the op reading it ("dense/MatMul"):
    that op's input, back through Identity, Reshape and Transpose, is the
    FakeQuant.
    """
    for part in tensor_name.split(";"):
        node = nodes.get(part)
        for source in (node.input if node is not None else []):
            n = nodes.get(op_name(source))
            while n is not None and n.op in graphs.THROUGH and n.name not in weights:
                n = nodes.get(op_name(n.input[0]))
            if n is not None and n.name in weights:
                return weights[n.name]
    return None


def _constant_names(model: bytes) -> set:
    """The names of a `.tflite`'s constant tensors (weights: their data in a buffer)."""
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils  # pylint: disable=import-outside-toplevel
    flat = tfl_flatbuffer_utils.read_model(model)
    return {t.name.decode() for g in flat.subgraphs for t in g.tensors
            if flat.buffers[t.buffer].data is not None and len(flat.buffers[t.buffer].data)}


def _float_tensors(model: bytes, sample_inputs: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
    """{name: value} of the float tensors the model computes on `sample_inputs`.

    Constants are left out: a weight is named after the op reading it (a
    MatMul whose output FakeQuant reads it directly), and given that
    FakeQuant's range it would be quantized on the activation's grid.
    """
    from ai_edge_litert import interpreter as litert  # pylint: disable=import-outside-toplevel
    constants = _constant_names(model)
    interp = litert.Interpreter(model_content=model, experimental_preserve_all_tensors=True)
    details = interp.get_input_details()
    for d, value in zip(details, sample_inputs):
        interp.resize_tensor_input(d["index"], np.shape(value))
    interp.allocate_tensors()
    for d, value in zip(details, sample_inputs):
        interp.set_tensor(d["index"], np.asarray(value, d["dtype"]))
    interp.invoke()
    values = {}
    for t in interp.get_tensor_details():
        try:
            value = interp.get_tensor(t["index"])
        except ValueError:
            continue
        if value.dtype == np.float32 and value.size and t["name"] not in constants:
            values[t["name"]] = value
    return values


def _op_bits(float_model: bytes, tensor_bits: Mapping[str, int], nodes, weights,
             qsv: Dict[str, Tuple[float, float]], calibrated: Sequence[str]
             ) -> Dict[str, Tuple[int, int]]:
    """{first output tensor name: (activation bits, weight bits)} of each op.

    An op whose output no FakeQuant quantizes (TRANSPOSE, UNPACK, SPLIT, FILL:
    LiteRT gives it its input's scale) computes at the widest bits of its
    inputs, so a 16-bit value is not requantized to 8 bits on its way. The
    weight bits are those of the FakeQuant of the op's constant input (8
    where it has none). Graph inputs are ai-edge-quantizer's INPUT ops. Such
    an op's output takes its input's range in `qsv` (updated), as LiteRT's
    kernels of those ops want.
    """
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils  # pylint: disable=import-outside-toplevel
    model = tfl_flatbuffer_utils.read_model(float_model)
    graph = model.subgraphs[0]
    name = lambda i: graph.tensors[i].name.decode()  # pylint: disable=unnecessary-lambda-assignment

    def constant(i):
        data = model.buffers[graph.tensors[i].buffer].data
        return data is not None and len(data) > 0

    bits_of = dict(tensor_bits)
    out = {name(i): (bits_of.get(name(i), 8), 8) for i in graph.inputs}
    for op in graph.operators:
        outputs = [name(i) for i in op.outputs if i >= 0]
        if not outputs:
            continue
        if outputs[0] not in bits_of:
            data = [name(i) for i in op.inputs if i >= 0 and not constant(i)]
            inherited = max([bits_of.get(n, 8) for n in data] or [8])
            for tensor in outputs:
                bits_of.setdefault(tensor, inherited)
                float_constants = [i for i in op.inputs if i >= 0 and constant(i)
                                   and graph.tensors[i].type == 0]  # TensorType FLOAT32
                if (tensor in calibrated and len(data) == 1 and data[0] in qsv
                        and not float_constants):  # TRANSPOSE, UNPACK, SPLIT; not x + 1.
                    qsv[tensor] = qsv[data[0]]
        weight_bits = [_weight_bits_of(name(i), nodes, weights) for i in op.inputs
                       if i >= 0 and constant(i)]
        out[outputs[0]] = (bits_of[outputs[0]], min([b for b in weight_bits if b] or [8]))
    return out


def _op_config(activation_bits: int, weight_bits: int) -> dict:
    return {
        "activation_tensor_config": {"num_bits": activation_bits,
                                     "symmetric": activation_bits == 16,
                                     "granularity": "TENSORWISE", "dtype": "INT"},
        "weight_tensor_config": {"num_bits": weight_bits, "symmetric": True,
                                 "granularity": "TENSORWISE", "dtype": "INT"},
        "compute_precision": "INTEGER", "explicit_dequantize": False, "skip_checks": False,
        "min_weight_elements": 0}


def _integer_fills(model: bytes) -> bytes:
    """FILL (float) -> QUANTIZE pairs as one integer FILL.

    ai-edge-quantizer has no FILL rule: a recurrent layer's zero initial state
    (a FILL of the batch's shape) stays float, then a QUANTIZE. LiteRT's FILL
    runs on int8 and int16 with the value's scale and zero point the
    output's: each QUANTIZE becomes a FILL of the quantized value.
    """
    from ai_edge_litert import schema_py_generated as schema  # pylint: disable=import-outside-toplevel
    from ai_edge_litert.tools import flatbuffer_utils  # pylint: disable=import-outside-toplevel
    flat = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    codes = [c.builtinCode for c in flat.operatorCodes]
    types = {schema.TensorType.INT8: np.int8, schema.TensorType.INT16: np.int16}
    for graph in flat.subgraphs:
        readers = {}
        for op in graph.operators:
            for i in op.inputs:
                readers.setdefault(i, []).append(op)
        replaced = {}  # id(QUANTIZE op) -> the integer FILL computing its output
        for op in graph.operators:
            value = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 else None
            data = flat.buffers[value.buffer].data if value is not None else None
            users = readers.get(op.outputs[0], [])
            if (codes[op.opcodeIndex] != schema.BuiltinOperator.FILL or data is None
                    or len(data) != 4 or op.outputs[0] in graph.outputs or not users
                    or any(codes[u.opcodeIndex] != schema.BuiltinOperator.QUANTIZE
                           for u in users)):
                continue
            number = float(np.frombuffer(bytes(bytearray(data)), np.float32)[0])
            for user in users:
                out = graph.tensors[user.outputs[0]]
                if out.type not in types or out.quantization is None:
                    break
                scale, zero = float(out.quantization.scale[0]), int(out.quantization.zeroPoint[0])
                info = np.iinfo(types[out.type])
                buffer = schema.BufferT()
                buffer.data = np.array([np.clip(np.round(number / scale) + zero, info.min,
                                                info.max)], types[out.type]).tobytes()
                flat.buffers.append(buffer)
                tensor = schema.TensorT()
                tensor.name, tensor.shape = value.name + b"_int", value.shape
                tensor.type, tensor.buffer = out.type, len(flat.buffers) - 1
                tensor.quantization = out.quantization
                graph.tensors.append(tensor)
                fill = schema.OperatorT()
                fill.opcodeIndex = op.opcodeIndex
                fill.inputs = [op.inputs[0], len(graph.tensors) - 1]
                fill.outputs = [user.outputs[0]]
                replaced[id(user)] = fill
            else:  # Every reader now has its integer FILL.
                replaced[id(op)] = None
        graph.operators = [replaced.get(id(op), op) for op in graph.operators
                           if replaced.get(id(op), op) is not None]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(flat))


def mixed_precision_model(graph_def: tf.compat.v1.GraphDef, input_names: Sequence[str],
                          output_names: Sequence[str], sample_inputs: Sequence[np.ndarray],
                          activation_bits: Optional[Mapping[str, int]] = None
                          ) -> EdgeQuantizedModel:
    """A LiteRT model with int8 and int16 activations, from a frozen eval graph.

    Args:
      graph_def: a frozen eval graph (`qat.export.freeze_function(...).graph_def`
        or `freeze_session`), its FakeQuants carrying qat's ranges and bits.
      input_names: its input tensors (`name:0`), in order.
      output_names: its output tensors.
      sample_inputs: one array per input (a batch), for the tensors no
        FakeQuant quantizes (pass-through ops).
      activation_bits: {activation FakeQuant op name: 8 or 16}, over the
        graph's own `num_bits`.

    Returns:
      The model, its reference eval graph and the bits of each tensor.

    Raises:
      EdgeQuantizerUnavailableError: ai-edge-quantizer is not installed.
      ExportError: unknown FakeQuants, bits with no LiteRT kernel, a 16-bit
        FakeQuant off the int16 grid, a FakeQuant range that is not constant.
    """
    quantizer = _edge_quantizer()
    float_graph, reference, activations, weights = graphs.split_fake_quants(
        graph_def, dict(activation_bits or {}))
    float_model = _convert_float(float_graph, input_names, output_names)
    nodes = graphs.nodes_by_name(graph_def)
    by_source = {}
    for name in activations:
        source = nodes.get(op_name(nodes[name].input[0]))
        while source is not None and source.op == "Identity":
            source = nodes.get(op_name(source.input[0]))
        if source is not None:
            by_source.setdefault(source.name, name)
    values = _float_tensors(float_model, sample_inputs)
    qsv, tensor_bits, calibrated = {}, {}, []
    for tensor, value in values.items():
        fake_quant = _fake_quant_of(tensor, nodes, activations, by_source)
        if fake_quant is None:
            qsv[tensor] = (float(value.min()), float(value.max()))
            calibrated.append(tensor)
            continue
        lo, hi, tensor_bits[tensor] = activations[fake_quant]
        qsv[tensor] = (-hi if tensor_bits[tensor] == 16 else lo, hi)  # int16: scale max / 32767.
    recipe = [{"regex": ".*", "operation": "*", "algorithm_key": _ALGORITHM,
               "op_config": _op_config(8, 8)}]
    for tensor, bits in _op_bits(float_model, tensor_bits, nodes, weights, qsv,
                                 set(calibrated)).items():
        if bits != (8, 8):  # A rule per op unlike the default.
            recipe.append({"regex": "^" + re.escape(tensor) + ";", "operation": "*",
                           "algorithm_key": _ALGORITHM, "op_config": _op_config(*bits)})
    qsv = {t: {"min": np.array(lo, np.float32), "max": np.array(hi, np.float32)}
           for t, (lo, hi) in qsv.items()}
    result = quantizer.Quantizer(float_model, recipe).quantize(
        qsv, enable_progress_bar=False, enable_progress_report=False)
    return EdgeQuantizedModel(_integer_fills(bytes(result.quantized_model)), reference,
                              tensor_bits, calibrated, recipe)
