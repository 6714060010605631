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
outputs are rows too. Nothing is skipped silently: the report names every
row that has no TFLite tensor, and every activation range the converter did
not keep with its scale and zero point (`qat.export.range_survival`).

Differences add up along the network: a tensor one step off where a value
sat on a rounding boundary can be several steps off a layer later, where the
layer's gain is high. So each row is also measured on its own: the eval graph
computes the row's tensor from TFLite's own values of the rows before it
(`max_own_steps`). A kernel that disagrees with the eval graph shows there;
accumulation does not.
"""
import dataclasses
import json
import math
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from qat.export import convert as convert_lib
from qat.export import freeze
from qat.export import inspect
from qat.export import parity
from qat.export import range_survival
from qat.report import model_runs
from qat.report import steps as steps_lib
from qat.report.model_runs import bypass_fake_quants
from qat.report.model_runs import read_forced_inputs  # pylint: disable=unused-import
from qat.report.model_runs import run_tflite_tensors
from qat.tflite import graph_structure as structure
from qat.tflite import names as tflite_names

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
    # max |TFLite - QAT| / scale when the eval graph reads TFLite's values of
    # the rows before this one: this layer's own difference (nan: unmatched).
    max_own_steps: float = math.nan
    # The step of a recurrent layer the row's tensor is computed at (None:
    # not a recurrent layer's; `qat.report.steps`).
    step: Optional[int] = None


@dataclasses.dataclass
class NumericsReport:
    """The rows, in graph order, and the first TFLite drift."""
    flavour: str
    num_examples: int
    rows: List[TensorNumerics]
    drift_steps: float = DRIFT_STEPS
    # Activation ranges with no TFLite tensor of their scale and zero point.
    lost_ranges: List["range_survival.LostRange"] = dataclasses.field(default_factory=list)
    # The layers a recipe keeps float: computed in float, not compared as integer.
    float_layers: List[str] = dataclasses.field(default_factory=list)

    @property
    def unmatched(self) -> List[TensorNumerics]:
        """The rows that have no TFLite tensor (their columns are nan)."""
        return [r for r in self.rows if r.tflite_tensor is None]

    @property
    def first_drift(self) -> Optional[TensorNumerics]:
        """The first row where TFLite is off by more than `drift_steps`."""
        for row in self.rows:
            if row.max_diff_steps > self.drift_steps + _STEP_TOLERANCE:
                return row
        return None

    @property
    def worst_own(self) -> Optional[TensorNumerics]:
        """The row with the largest difference of its own (None: no row matched)."""
        rows = [r for r in self.rows if not math.isnan(r.max_own_steps)]
        return max(rows, key=lambda r: r.max_own_steps, default=None)

    def summary_lines(self) -> List[str]:
        """A few lines: worst SQNRs, the first drifting layer, the worst layer on its own."""
        qat = [r.sqnr_qat_db for r in self.rows if not math.isnan(r.sqnr_qat_db)]
        lite = [r.sqnr_tflite_db for r in self.rows if not math.isnan(r.sqnr_tflite_db)]
        steps = [r.max_diff_steps for r in self.rows if not math.isnan(r.max_diff_steps)]
        drift = self.first_drift
        own = self.worst_own
        return [
            f"numerics ({self.flavour}, {self.num_examples} examples, {len(self.rows)} "
            f"tensors): lowest SQNR QAT vs float {min(qat, default=math.nan):.1f} dB, "
            f"TFLite vs eval graph {min(lite, default=math.nan):.1f} dB; largest TFLite "
            f"difference {max(steps, default=math.nan):.2f} steps",
            "first layer where TFLite drifts by more than "
            f"{self.drift_steps:g} step: " + (f"{drift.name} ({drift.max_diff_steps:.2f} steps)"
                                              if drift else "none"),
            "largest difference of a layer given TFLite's own inputs: " + (
                f"{own.max_own_steps:.2f} steps ({own.name})" if own else "none matched"),
            "float layers (the recipe's; float, not compared as integer): "
            + (", ".join(self.float_layers) or "none"),
            "rows without a TFLite tensor (not compared): " + (
                ", ".join(r.name for r in self.unmatched) or "none"),
            "ranges lost in conversion (no TFLite tensor of their scale and zero point): "
            + (", ".join(r.quantizer for r in self.lost_ranges) or "none"),
            *(f"  {r.describe()}" for r in self.lost_ranges)]

    def format(self) -> str:
        """A readable table."""
        lines = ["== numerics", *self.summary_lines(), "",
                 f"  {'tensor':<36} {'SQNR QAT/float':>14} {'SQNR TFLite/QAT':>15} "
                 f"{'max steps':>9} {'mean steps':>10} {'own steps':>9} "
                 f"{'QAT-float steps':>15}"]
        for r in self.rows:
            name = r.name if r.step is None else f"{r.name} [step {r.step}]"
            lines.append(f"  {name:<36} {_db(r.sqnr_qat_db):>14} {_db(r.sqnr_tflite_db):>15} "
                         f"{r.max_diff_steps:>9.2f} {r.mean_diff_steps:>10.3f} "
                         f"{r.max_own_steps:>9.2f} {r.max_qat_float_steps:>15.2f}")
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (non-finite numbers as the strings "inf"/"nan")."""
        drift = self.first_drift
        return {"flavour": self.flavour, "num_examples": self.num_examples,
                "drift_steps": self.drift_steps, "summary": self.summary_lines(),
                "first_drift": drift.name if drift else None,
                "unmatched": [r.name for r in self.unmatched],
                "lost_ranges": [{k: _json_number(v) for k, v in dataclasses.asdict(r).items()}
                                for r in self.lost_ranges],
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


def layer_numerics(frozen_graph_def: tf.compat.v1.GraphDef,
                   input_name: Union[str, Sequence[str]],
                   output_names: Sequence[str], samples: "parity.Inputs",
                   flavour: str = "uint8", model: Optional[bytes] = None,
                   input_range=None, batch_size: int = 64,
                   drift_steps: float = DRIFT_STEPS,
                   float_layers: Sequence[str] = ()) -> NumericsReport:
    """Compares float, QAT and TFLite tensor by tensor on `samples`.

    Args:
      frozen_graph_def: the frozen eval graph (`qat.export.freeze_*`).
      input_name: the graph input, or several.
      output_names: the outputs.
      samples: examples first: an array for one input, or {input name:
        array} for several. Integer inputs (token ids, masks) are fed to the
        graph and to TFLite as they are.
      flavour: "uint8" or "int8", when `model` is converted here.
      model: the .tflite bytes converted from this graph; None: convert.
      input_range: (min, max) of the float inputs no FakeQuant reads.
      batch_size: examples per run.
      drift_steps: how many steps of difference count as a drift.
      float_layers: the name scopes of the layers a recipe keeps float
        (no range: no row), named in the report as float.

    Returns:
      A NumericsReport.

    Raises:
      qat.export.ExportError: conversion failed or a name is unknown.
    """
    feeds = parity.input_feeds(input_name, samples)
    if model is None:
        model = convert_lib.convert_frozen_graph(frozen_graph_def, list(feeds), output_names,
                                                 flavour, default_input_range=input_range)
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(frozen_graph_def, name="")
    outputs = [graph.get_operation_by_name(freeze.op_name(n)) for n in output_names]
    # From every input fed, integer ids and masks included (data_path starts
    # at float inputs only).
    path = structure.data_path(graph, outputs) | (
        structure.forward_closure([graph.get_operation_by_name(n) for n in feeds],
                                  structure.gradient_ops(graph))
        & structure.backward_closure(outputs))
    rows_spec = []  # (label, tensor name, candidate TFLite names)
    row_steps = []
    step_of = steps_lib.recurrent_steps(graph)
    for op in structure.topological_order(path, graph):
        if op.type in structure.FAKE_QUANT_TYPES:
            layer = structure.layer_of(op.inputs[0])
            if layer is not None and any(layer.name.startswith(f + "/") for f in float_layers):
                layer = None  # A float layer's value, quantized for the next: the range's row.
            label = layer.name if layer is not None else op.name.rsplit("/", 1)[0]
            rows_spec.append((label, op.outputs[0].name, [op.name, op.inputs[0].op.name]))
            row_steps.append(step_of.get(op.inputs[0].op.name))
    for op in outputs:
        rows_spec.append((op.name, op.outputs[0].name, [op.name]))
        row_steps.append(None)
    names = [tensor for _, tensor, _ in rows_spec]
    inputs = {freeze.tensor_name(n): v for n, v in feeds.items()}
    qat_values = model_runs.run_graph(frozen_graph_def, inputs, names, batch_size)
    float_values = model_runs.run_graph(bypass_fake_quants(frozen_graph_def), inputs, names, batch_size)
    tflite = run_tflite_tensors(model, feeds if len(feeds) > 1 else next(iter(feeds.values())),
                                batch_size)
    graph_ops = {op.name for op in graph.get_operations()}
    permuting = frozenset(op.name for op in graph.get_operations() if op.type == "Transpose")
    matches = tflite_names.match_rows(rows_spec, qat_values, tflite, graph_ops, permuting)
    survival = range_survival.check_ranges(frozen_graph_def, model)
    # A range the converter merged into another op's tensor (the same scale
    # and zero point): that tensor holds the row's value whatever its name.
    holders = {r.quantizer: r.nearest for r in survival.lost
               if r.kind == range_survival.MERGED and r.nearest in tflite}
    holders.update({q: t for q, t in survival.held_by.items() if t in tflite})
    matches = [match if match is not None or freeze.op_name(tensor) not in holders
               or tflite[holders[freeze.op_name(tensor)]]["value"].shape != qat.shape
               else holders[freeze.op_name(tensor)]
               for match, (_, tensor, _), qat in zip(matches, rows_spec, qat_values)]
    # A range before a float layer: TFLite's DEQUANTIZE output holds its value
    # in float; its input holds it on the range's own grid.
    described = inspect.describe_model(model)
    dequantized = {described.tensors[op.outputs[0]].name: described.tensors[op.inputs[0]].name
                   for op in described.ops
                   if op.name == "DEQUANTIZE" and op.outputs[0] not in described.outputs}
    matches = [dequantized[m] if m in dequantized and not tflite[m]["scale"]
               and dequantized[m] in tflite else m for m in matches]
    forced = {name: match for name, match, qat in zip(names, matches, qat_values)
              if match is not None and qat.dtype == np.float32}
    forced.update(tflite_names.unquantized_tensors_tflite_rounds(path, graph, forced, tflite))
    own_values = model_runs.run_given_tflite(frozen_graph_def, inputs, names, forced, tflite,
                                   batch_size)
    rows = []
    for (label, tensor, _), qat, flt, match, own, recurrent_step in zip(
            rows_spec, qat_values, float_values, matches, own_values, row_steps):
        lite = tflite[match] if match is not None else None
        scale = lite["scale"] if lite is not None else None
        step = scale or math.nan
        if lite is not None and qat.size:
            diff = np.abs(lite["value"] - qat)
            max_steps, mean_steps = float(diff.max() / step), float(diff.mean() / step)
            sqnr_lite = sqnr_db(qat, lite["value"])
            own_steps = float(np.abs(lite["value"] - own).max() / step)
        else:
            max_steps = mean_steps = sqnr_lite = own_steps = math.nan
        rows.append(TensorNumerics(
            label, tensor, match, scale, sqnr_db(flt, qat), sqnr_lite, max_steps, mean_steps,
            float(np.abs(qat - flt).max() / step) if qat.size else math.nan, own_steps,
            recurrent_step))
    return NumericsReport(flavour, len(next(iter(feeds.values()))), rows, drift_steps,
                          survival.lost, list(float_layers))


def layer_numerics_from_session(sess: tf.compat.v1.Session,
                                input_name: Union[str, Sequence[str]],
                                output_names: Sequence[str], samples: "parity.Inputs",
                                **kwargs) -> NumericsReport:
    """`layer_numerics` of a live eval-graph session (frozen here, not edited)."""
    frozen = freeze.freeze_session(sess, output_names)
    return layer_numerics(frozen, input_name, output_names, samples, **kwargs)


def layer_numerics_from_files(graph_path: str, checkpoint: Optional[str],
                              input_name: Union[str, Sequence[str]],
                              output_names: Sequence[str], samples: "parity.Inputs",
                              **kwargs) -> NumericsReport:
    """`layer_numerics` of a saved eval graph (.meta/.pb/.pbtxt) and checkpoint."""
    frozen = freeze.freeze_graph_file(graph_path, checkpoint, output_names)
    return layer_numerics(frozen, input_name, output_names, samples, **kwargs)
