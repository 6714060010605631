"""The frozen eval graph as ai-edge-quantizer needs it (`qat.export.edge_quantizer`).

Why this module exists: ai-edge-quantizer quantizes a float `.tflite`, so the
eval graph's FakeQuants are taken apart: weight FakeQuants become the
constants they compute (qat's grid), activation FakeQuants Identity ops whose
ranges and bits are kept; and the reference, the eval graph the mixed model
reproduces, gets each 16-bit FakeQuant on LiteRT's int16 grid and the
int16 -> int8 requantization LiteRT does where an 8-bit layer reads a 16-bit value.
"""
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.export.errors import ExportError
from qat.export.freeze import op_name

FAKE_QUANTS = frozenset(["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"])
THROUGH = frozenset(["Identity", "Reshape", "Transpose", "ReadVariableOp"])
_INPUTS = frozenset(["Placeholder", "PlaceholderWithDefault"])
_INT16 = (-32768, 32767)


def nodes_by_name(graph_def) -> Dict[str, tf.compat.v1.NodeDef]:
    return {n.name: n for n in graph_def.node}


def reads_input(name: str, nodes) -> bool:
    """Whether the value of node `name` depends on a graph input."""
    stack, seen = [name], set()
    while stack:
        node = nodes.get(op_name(stack.pop()))
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op in _INPUTS:
            return True
        stack.extend(i for i in node.input if not i.startswith("^"))
    return False


def _const(nodes, name: str) -> Optional[np.ndarray]:
    node = nodes.get(op_name(name))
    while node is not None and node.op == "Identity":
        node = nodes.get(op_name(node.input[0]))
    if node is None or node.op != "Const":
        return None
    return tensor_util.MakeNdarray(node.attr["value"].tensor)


def _activation_range(node, nodes) -> Tuple[float, float]:
    if node.op == "FakeQuantWithMinMaxArgs":
        return float(node.attr["min"].f), float(node.attr["max"].f)
    lo, hi = _const(nodes, node.input[1]), _const(nodes, node.input[2])
    if lo is None or hi is None or lo.size != 1:
        raise ExportError(f"FakeQuant {node.name}: its min/max are not per-tensor constants of "
                          "a frozen graph; freeze the eval graph first (qat.export.freeze_function)")
    return float(lo), float(hi)


def int16_range(lo: float, hi: float) -> Tuple[float, float]:
    """The FakeQuant range on LiteRT's int16 grid covering [lo, hi]: [-32768 s, 32767 s].

    A range already on the grid (qat's symmetric 16-bit ranges) is its own.
    """
    scale = max(abs(lo) / -_INT16[0], abs(hi) / _INT16[1], 1e-9 / _INT16[1])
    return _INT16[0] * scale, _INT16[1] * scale


def _on_int16_grid(lo: float, hi: float) -> bool:
    want = int16_range(lo, hi)
    return np.allclose((lo, hi), want, rtol=1e-5, atol=0)


def split_fake_quants(graph_def, activation_bits: Mapping[str, int]):
    """(float graph_def, reference graph_def, activations, weights): activations
    {FakeQuant: (min, max, bits)} and weights {FakeQuant: bits}."""
    nodes = nodes_by_name(graph_def)
    unknown = sorted(set(activation_bits) - set(nodes))
    if unknown:
        raise ExportError(f"activation_bits names FakeQuants not in the graph: {unknown}")
    activations, weights = {}, {}
    for node in graph_def.node:
        if node.op not in FAKE_QUANTS:
            continue
        bits = int(node.attr["num_bits"].i)
        if not reads_input(node.input[0], nodes):
            weights[node.name] = bits
            continue
        lo, hi = _activation_range(node, nodes)
        want = int(activation_bits.get(node.name, bits))
        if want not in (8, 16):
            raise ExportError(f"FakeQuant {node.name}: {want}-bit activations have no LiteRT "
                              "kernels; use 8 or 16")
        if want == 16 and bits == 16 and not _on_int16_grid(lo, hi):
            raise ExportError(
                f"16-bit FakeQuant {node.name} spans [{lo}, {hi}], not LiteRT's int16 grid "
                f"[-32768 s, 32767 s] (zero point 0): give it range {int16_range(lo, hi)}")
        if want == 16:
            lo, hi = int16_range(lo, hi)
        activations[node.name] = (lo, hi, want)
    for name, bits in activation_bits.items():
        if name in weights:
            raise ExportError(f"activation_bits names {name}, a weight FakeQuant")
    reference = _reference(graph_def, activations)
    _requantize_boundaries(reference, activations, weights)
    return _float_graph(graph_def, activations, weights), reference, activations, weights


def _reference(graph_def, activations) -> tf.compat.v1.GraphDef:
    """The eval graph with each 16-bit activation FakeQuant on the int16 grid."""
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    for node in list(out.node):
        if node.name not in activations or activations[node.name][2] != 16:
            continue
        lo, hi, _ = activations[node.name]
        inputs = [node.input[0]]
        node.ClearField("input")
        node.op = "FakeQuantWithMinMaxArgs"
        for key in list(node.attr):
            if key not in ("narrow_range",):
                del node.attr[key]
        node.input.extend(inputs)
        node.attr["min"].f, node.attr["max"].f = lo, hi
        node.attr["num_bits"].i = 16
        node.attr["narrow_range"].b = False
    return out


def _requantize_boundaries(reference: tf.compat.v1.GraphDef, activations, weights) -> None:
    """Adds to `reference` the int16 -> int8 requantization LiteRT does.

    An 8-bit layer reading a 16-bit value (through ops with no FakeQuant of
    their own: Reshape, Split) reads it requantized to int8 over the int16
    range [-m, m] (ai-edge-quantizer's 8-bit grid of that range: scale
    2m / 255, zero point 0); the reference gets that FakeQuant on its input.
    A layer is an op with an output FakeQuant or a weight FakeQuant input; its
    bits are those of the first FakeQuant at or after it (a MatMul's BiasAdd).
    """
    nodes = nodes_by_name(reference)
    consumers: Dict[str, List[tf.compat.v1.NodeDef]] = {}
    for node in reference.node:
        for i in node.input:
            consumers.setdefault(op_name(i), []).append(node)
    quantized = {}  # op -> the bits of the FakeQuant of its output
    for name, (_, _, bits) in activations.items():
        source = nodes.get(op_name(nodes[name].input[0]))
        while source is not None and source.op == "Identity":
            source = nodes.get(op_name(source.input[0]))
        if source is not None:
            quantized.setdefault(source.name, bits)

    def layer_bits(node) -> Optional[int]:
        reads_weight = any(weights.get(op_name(i)) for i in node.input) or any(
            nodes.get(op_name(i)) is not None and nodes[op_name(i)].op in THROUGH
            and op_name(nodes[op_name(i)].input[0]) in weights for i in node.input)
        if node.name not in quantized and not reads_weight:
            return None
        while node is not None and node.name not in quantized:
            node = next((c for c in consumers.get(node.name, []) if c.op not in FAKE_QUANTS),
                        None)
        return quantized.get(node.name) if node is not None else None

    added = []
    for name, (_, hi, bits) in activations.items():
        if bits != 16:
            continue
        scale = 2 * hi / 255
        frontier, seen = [name], set()
        while frontier:
            producer = frontier.pop()
            for node in consumers.get(producer, []):
                if node.name in seen or node.op in FAKE_QUANTS:
                    continue
                seen.add(node.name)
                reader_bits = layer_bits(node)
                if reader_bits == 8:
                    for k, i in enumerate(node.input):
                        if op_name(i) == producer:
                            fq = tf.compat.v1.NodeDef(name=f"{node.name}/int8_of_int16_{k}",
                                                      op="FakeQuantWithMinMaxArgs", input=[i])
                            fq.attr["T"].type = tf.float32.as_datatype_enum
                            fq.attr["min"].f, fq.attr["max"].f = -128 * scale, 127 * scale
                            fq.attr["num_bits"].i = 8
                            fq.attr["narrow_range"].b = False
                            node.input[k] = fq.name
                            added.append(fq)
                elif reader_bits is None:
                    frontier.append(node.name)
    reference.node.extend(added)


def _float_graph(graph_def, activations, weights) -> tf.compat.v1.GraphDef:
    """Weight FakeQuants as the constants they compute, activation ones as Identity."""
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        values = sess.run({n: f"{n}:0" for n in weights}) if weights else {}
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.name in values:
            node.op = "Const"
            node.ClearField("input")
            node.ClearField("attr")
            node.attr["dtype"].type = tf.float32.as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(values[node.name]))
        elif node.name in activations:
            source = node.input[0]
            node.op = "Identity"
            node.ClearField("input")
            node.ClearField("attr")
            node.input.append(source)
            node.attr["T"].type = tf.float32.as_datatype_enum
    return out
