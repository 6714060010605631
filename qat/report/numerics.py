"""Per-layer numerics: float model, QAT eval graph and TFLite side by side.

Three models run on the same sample inputs:
  * float: the frozen eval graph with every FakeQuant bypassed (replaced by
    an Identity of its input), so the same (folded) weights in float;
  * QAT: the frozen eval graph itself;
  * TFLite: the integer model converted from it, run by the ai_edge_litert
    interpreter keeping every intermediate tensor.
Each activation quantizer of the eval graph is one row: its output in the
float and QAT graphs (same tensor name) and the TFLite tensor converted from
it (TFLite names a tensor after the TF ops fused into it, "relu;BiasAdd;
Conv2D", so a row matches the TFLite tensor naming the FakeQuant or the op it
reads). Per row: SQNR of QAT vs float and of TFLite vs QAT, and the TFLite vs
QAT difference in quantization steps (the TFLite tensor's scale). The model
outputs are rows too.
"""
import dataclasses
import json
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from qat.export import convert as convert_lib
from qat.export import freeze
from qat.export import inspect
from qat.export import parity
from qat.report import structure

DRIFT_STEPS = 1.0  # A TFLite tensor off by more than this many steps "drifts".
_STEP_TOLERANCE = 1e-3  # Float rounding of diff / scale: 1.0000001 steps is one step.


@dataclasses.dataclass
class TensorNumerics:
    """One compared tensor (an activation quantizer's output or a model output)."""
    name: str                      # Layer op, quantizer or output it belongs to.
    tensor: str                    # The eval graph tensor.
    tflite_tensor: Optional[str]   # The matched TFLite tensor, None if none matched.
    scale: Optional[float]         # One quantization step of the TFLite tensor.
    sqnr_qat_db: float             # QAT vs float.
    sqnr_tflite_db: float          # TFLite vs the QAT eval graph (nan: unmatched).
    max_diff_steps: float          # max |TFLite - QAT| / scale.
    mean_diff_steps: float
    max_qat_float_steps: float     # max |QAT - float| / scale: the quantization error.


@dataclasses.dataclass
class NumericsReport:
    """The rows, in graph order, and the first TFLite drift."""
    flavour: str
    num_examples: int
    rows: List[TensorNumerics]
    drift_steps: float = DRIFT_STEPS

    @property
    def first_drift(self) -> Optional[TensorNumerics]:
        """The first row where TFLite is off by more than `drift_steps`."""
        for row in self.rows:
            if row.max_diff_steps > self.drift_steps + _STEP_TOLERANCE:
                return row
        return None

    def summary_lines(self) -> List[str]:
        """A few lines: worst SQNRs and the first drifting layer."""
        qat = [r.sqnr_qat_db for r in self.rows if not math.isnan(r.sqnr_qat_db)]
        lite = [r.sqnr_tflite_db for r in self.rows if not math.isnan(r.sqnr_tflite_db)]
        steps = [r.max_diff_steps for r in self.rows if not math.isnan(r.max_diff_steps)]
        drift = self.first_drift
        return [
            f"numerics ({self.flavour}, {self.num_examples} examples, {len(self.rows)} "
            f"tensors): lowest SQNR QAT vs float {min(qat, default=math.nan):.1f} dB, "
            f"TFLite vs eval graph {min(lite, default=math.nan):.1f} dB; largest TFLite "
            f"difference {max(steps, default=math.nan):.2f} steps",
            "first layer where TFLite drifts by more than "
            f"{self.drift_steps:g} step: " + (f"{drift.name} ({drift.max_diff_steps:.2f} steps)"
                                              if drift else "none")]

    def format(self) -> str:
        """A readable table."""
        lines = ["== numerics", *self.summary_lines(), "",
                 f"  {'tensor':<36} {'SQNR QAT/float':>14} {'SQNR TFLite/QAT':>15} "
                 f"{'max steps':>9} {'mean steps':>10} {'QAT-float steps':>15}"]
        for r in self.rows:
            lines.append(f"  {r.name:<36} {_db(r.sqnr_qat_db):>14} {_db(r.sqnr_tflite_db):>15} "
                         f"{r.max_diff_steps:>9.2f} {r.mean_diff_steps:>10.3f} "
                         f"{r.max_qat_float_steps:>15.2f}")
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (non-finite numbers as the strings "inf"/"nan")."""
        drift = self.first_drift
        return {"flavour": self.flavour, "num_examples": self.num_examples,
                "drift_steps": self.drift_steps, "summary": self.summary_lines(),
                "first_drift": drift.name if drift else None,
                "rows": [{k: _json_number(v) for k, v in dataclasses.asdict(r).items()}
                         for r in self.rows]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _db(value: float) -> str:
    return f"{value:.1f} dB" if math.isfinite(value) else str(value)


def _json_number(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def sqnr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """10·log10(Σ reference² / Σ (other − reference)²); inf when equal."""
    reference = np.asarray(reference, np.float64)
    noise = float(np.sum((np.asarray(other, np.float64) - reference) ** 2))
    signal = float(np.sum(reference ** 2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


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


def _run(graph_def, input_name: str, names: Sequence[str], samples: np.ndarray,
         batch_size: int) -> List[np.ndarray]:
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    fetches = [graph.get_tensor_by_name(n) for n in names]
    feed = graph.get_tensor_by_name(freeze.tensor_name(input_name))
    chunks = []
    with tf.compat.v1.Session(graph=graph) as sess:
        for i in range(0, len(samples), batch_size):
            chunks.append(sess.run(fetches, {feed: samples[i:i + batch_size]}))
    return [np.concatenate([c[k] for c in chunks]) for k in range(len(names))]


def run_tflite_tensors(model: bytes, samples: np.ndarray, batch_size: int = 64
                       ) -> Dict[str, Dict[str, Any]]:
    """Runs a TFLite model keeping every tensor; returns them dequantized.

    Returns:
      {TFLite tensor name: {"value": float array over all samples,
      "scale": float or None, "integer": bool}} for the model input and every
      op output. A scalar tensor (no example axis, e.g. a reduction over the
      whole batch) is the value of the first batch.
    """
    from ai_edge_litert import interpreter as litert  # pylint: disable=import-outside-toplevel
    report = inspect.describe_model(model)
    wanted = set(report.inputs)
    for op in report.ops:
        wanted.update(op.outputs)
    chunks: Dict[int, List[np.ndarray]] = {i: [] for i in wanted}
    for start in range(0, len(samples), batch_size):
        batch = np.asarray(samples[start:start + batch_size], np.float32)
        interp = litert.Interpreter(
            model_content=model, experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        parity.set_input(interp, batch)
        interp.invoke()
        for index in wanted:
            chunks[index].append(np.array(interp.get_tensor(index)))
    result = {}
    for index in wanted:
        info = report.tensors[index]
        parts = chunks[index]
        value = (np.concatenate(parts) if parts[0].ndim else parts[0]).astype(np.float64)
        integer = np.issubdtype(np.dtype(info.dtype), np.integer) and info.scale > 0
        if integer:
            value = (value - info.zero_point) * info.scale
        result[info.name] = {"value": value, "scale": info.scale if integer else None,
                             "integer": integer}
    return result


def _match(candidates: Sequence[str], tflite: Dict[str, Dict[str, Any]],
           graph_ops: set) -> Optional[str]:
    """The TFLite tensor named after the first candidate TF op that has one."""
    def parts(name):
        for part in name.split(";"):
            yield part
            stripped = part.rstrip("0123456789")  # TFLite's de-duplicating suffix.
            if stripped != part and part not in graph_ops:
                yield stripped
    for candidate in candidates:
        found = [n for n in tflite if candidate in set(parts(n))]
        found.sort(key=lambda n: not tflite[n]["integer"])  # Quantized tensors first.
        if found:
            return found[0]
    return None


def layer_numerics(frozen_graph_def: tf.compat.v1.GraphDef, input_name: str,
                   output_names: Sequence[str], samples: np.ndarray,
                   flavour: str = "uint8", model: Optional[bytes] = None,
                   input_range=None, batch_size: int = 64,
                   drift_steps: float = DRIFT_STEPS) -> NumericsReport:
    """Compares float, QAT and TFLite tensor by tensor on `samples`.

    Args:
      frozen_graph_def: the frozen eval graph (`qat.export.freeze_*`).
      input_name: the graph input (one).
      output_names: the outputs.
      samples: float inputs, examples first.
      flavour: "uint8" or "int8", when `model` is converted here.
      model: the .tflite bytes converted from this graph; None: convert.
      input_range: (min, max) of the input, if no FakeQuant reads it.
      batch_size: examples per run.
      drift_steps: how many steps of difference count as a drift.

    Returns:
      A NumericsReport.

    Raises:
      qat.export.ExportError: conversion failed or a name is unknown.
    """
    if model is None:
        model = convert_lib.convert_frozen_graph(frozen_graph_def, [input_name], output_names,
                                                 flavour, default_input_range=input_range)
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(frozen_graph_def, name="")
    outputs = [graph.get_operation_by_name(freeze.op_name(n)) for n in output_names]
    path = structure.data_path(graph, outputs)
    rows_spec = []  # (label, tensor name, candidate TFLite names)
    for op in structure.topological_order(path, graph):
        if op.type in structure.FAKE_QUANT_TYPES:
            layer = structure.layer_of(op.inputs[0])
            label = layer.name if layer is not None else op.name.rsplit("/", 1)[0]
            rows_spec.append((label, op.outputs[0].name, [op.name, op.inputs[0].op.name]))
    for op in outputs:
        rows_spec.append((op.name, op.outputs[0].name, [op.name]))
    names = [tensor for _, tensor, _ in rows_spec]
    samples = np.asarray(samples, np.float32)
    qat_values = _run(frozen_graph_def, input_name, names, samples, batch_size)
    float_values = _run(bypass_fake_quants(frozen_graph_def), input_name, names, samples,
                        batch_size)
    tflite = run_tflite_tensors(model, samples, batch_size)
    graph_ops = {op.name for op in graph.get_operations()}
    rows = []
    for (label, tensor, candidates), qat, flt in zip(rows_spec, qat_values, float_values):
        match = _match(candidates, tflite, graph_ops)
        lite = tflite[match] if match is not None else None
        scale = lite["scale"] if lite is not None else None
        if lite is not None and lite["value"].shape == qat.shape:
            diff = np.abs(lite["value"] - qat)
            sqnr_lite = sqnr_db(qat, lite["value"])
        else:
            diff, sqnr_lite, match = None, math.nan, None
        step = scale or math.nan
        rows.append(TensorNumerics(
            label, tensor, match, scale, sqnr_db(flt, qat), sqnr_lite,
            float(diff.max() / step) if diff is not None and diff.size else math.nan,
            float(diff.mean() / step) if diff is not None and diff.size else math.nan,
            float(np.abs(qat - flt).max() / step) if qat.size else math.nan))
    return NumericsReport(flavour, len(samples), rows, drift_steps)


def layer_numerics_from_session(sess: tf.compat.v1.Session, input_name: str,
                                output_names: Sequence[str], samples: np.ndarray,
                                **kwargs) -> NumericsReport:
    """`layer_numerics` of a live eval-graph session (frozen here, not edited)."""
    frozen = freeze.freeze_session(sess, output_names)
    return layer_numerics(frozen, input_name, output_names, samples, **kwargs)


def layer_numerics_from_files(graph_path: str, checkpoint: Optional[str], input_name: str,
                              output_names: Sequence[str], samples: np.ndarray,
                              **kwargs) -> NumericsReport:
    """`layer_numerics` of a saved eval graph (.meta/.pb/.pbtxt) and checkpoint."""
    frozen = freeze.freeze_graph_file(graph_path, checkpoint, output_names)
    return layer_numerics(frozen, input_name, output_names, samples, **kwargs)
