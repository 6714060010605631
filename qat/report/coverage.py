"""What qat quantized, and what it left float and why.

`coverage_report` reads a rewritten graph (training or eval) and lists:
  * every layer op with its batch norm (folded, how, or why not), its weight
    quantizer and its activation quantizer;
  * every quantizer: role, bits, per-channel, narrow range, symmetric, and
    its range values (from a live session or a checkpoint), with the
    training batches its range skipped because their values were not finite
    (`qat.report.skipped_batches`: also warned about, once per range,
    `qat.quantize.emit.finite_ranges.warn`);
  * every float tensor left on the data path, with the reason
    (`qat.report.float_tensors`).
`coverage_report_from_files` does the same for a saved eval graph (.meta,
.pb, .pbtxt) and a checkpoint.
"""
import dataclasses
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from qat.engine import function_library
from qat.export import freeze
from qat.export.errors import GraphLoadError
from qat.quantize.emit import finite_ranges
from qat.report import float_tensors as float_lib
from qat.report import skipped_batches as skipped_lib
from qat.tflite import graph_structure as structure


@dataclasses.dataclass
class QuantizerInfo:
    """One FakeQuant: what it quantizes and its learnt range."""
    name: str
    role: str                 # "weights" or "activation".
    tensor: str               # The float tensor it reads.
    bits: int
    narrow_range: bool
    per_channel: bool
    min_variable: Optional[str]
    max_variable: Optional[str]
    min: Optional[float] = None       # Per-channel: the smallest channel minimum.
    max: Optional[float] = None       # Per-channel: the largest channel maximum.
    channels: Optional[int] = None
    symmetric: Optional[bool] = None  # min == -max, from the values.
    # Training batches its range skipped (NaN or infinite values); None: unknown
    # (no counter: an eval graph's session, a range it shares).
    skipped_batches: Optional[int] = None


@dataclasses.dataclass
class LayerInfo:
    """One layer op and how it was rewritten."""
    name: str
    type: str
    weights: Optional[str]
    batch_norm: Optional[str]         # The batch norm op it had, if any.
    batch_norm_status: str            # "folded (eval)", "folded (training)", "not folded", "-"
    batch_norm_reason: Optional[str]
    weight_quantizer: Optional[str]
    activation_quantizer: Optional[str]
    reason: Optional[str] = None      # Why weights/output are not quantized.


@dataclasses.dataclass
class CoverageReport:
    """The coverage of one graph."""
    layers: List[LayerInfo]
    quantizers: List[QuantizerInfo]
    float_tensors: List[float_lib.FloatTensor]
    outputs: List[str]
    scope: Optional[str] = None

    def summary_lines(self) -> List[str]:
        """A few lines: counts of layers, folds, quantizers, float tensors."""
        quantized = sum(1 for l in self.layers if l.weight_quantizer)
        folded = sum(1 for l in self.layers if l.batch_norm_status.startswith("folded"))
        with_bn = sum(1 for l in self.layers if l.batch_norm)
        roles = [q.role for q in self.quantizers]
        lines = [f"layers: {len(self.layers)}, weights quantized: {quantized}, "
                 f"batch norms folded: {folded} of {with_bn}",
                 f"quantizers: {roles.count('weights')} weights, "
                 f"{roles.count('activation')} activations",
                 f"tensors left float: {len(self.float_tensors)}"]
        if self.float_tensors:
            codes: Dict[str, int] = {}
            for f in self.float_tensors:
                codes[f.code] = codes.get(f.code, 0) + 1
            lines[-1] += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())) + ")"
        skipped = [q for q in self.quantizers if q.skipped_batches]
        if skipped:
            lines.append("batches skipped by ranges (NaN or infinite values): "
                         + ", ".join(f"{q.name}: {q.skipped_batches}" for q in skipped))
        return lines

    def format(self) -> str:
        """The report as readable tables."""
        lines = ["== coverage", *self.summary_lines(), "", "layers:"]
        lines.append(f"  {'layer':<36} {'type':<22} {'batch norm':<18} "
                     f"{'weights quantizer':<36} activation quantizer")
        for l in self.layers:
            lines.append(f"  {l.name:<36} {l.type:<22} {l.batch_norm_status:<18} "
                         f"{l.weight_quantizer or '-':<36} {l.activation_quantizer or '-'}")
            if l.batch_norm:
                lines.append(f"      batch norm {l.batch_norm}"
                             + (f": {l.batch_norm_reason}" if l.batch_norm_reason else ""))
            if l.reason:
                lines.append(f"      {l.reason}")
        lines += ["", "quantizers:"]
        lines.append(f"  {'quantizer':<36} {'role':<10} {'bits':>4} {'per-ch':>6} "
                     f"{'narrow':>6} {'sym':>4} {'min':>10} {'max':>10}")
        for q in self.quantizers:
            sym = "-" if q.symmetric is None else ("yes" if q.symmetric else "no")
            lo = "-" if q.min is None else f"{q.min:.4g}"
            hi = "-" if q.max is None else f"{q.max:.4g}"
            per_channel = f"{q.channels}" if q.per_channel else "no"
            lines.append(f"  {q.name:<36} {q.role:<10} {q.bits:>4} {per_channel:>6} "
                         f"{'yes' if q.narrow_range else 'no':>6} {sym:>4} {lo:>10} {hi:>10}")
        lines += ["", "tensors left float:"]
        if not self.float_tensors:
            lines.append("  none")
        for f in self.float_tensors:
            lines.append(f"  {f.tensor:<44} {f.op_type:<16} {f.code}: {f.reason}")
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict."""
        return {"outputs": self.outputs, "scope": self.scope,
                "summary": self.summary_lines(),
                "layers": [dataclasses.asdict(l) for l in self.layers],
                "quantizers": [dataclasses.asdict(q) for q in self.quantizers],
                "float_tensors": [dataclasses.asdict(f) for f in self.float_tensors]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _quantizer_info(q: structure.QuantizerOp, role: str, values: Dict[str, Any]
                    ) -> QuantizerInfo:
    info = QuantizerInfo(q.name, role, q.op.inputs[0].name, q.num_bits, q.narrow_range,
                         q.per_channel, q.min_variable, q.max_variable)
    lo = values.get(q.min_variable or q.op.inputs[1].name)
    hi = values.get(q.max_variable or q.op.inputs[2].name)
    if lo is not None and hi is not None:
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        info.min, info.max = float(lo.min()), float(hi.max())
        info.channels = int(lo.size) if q.per_channel else None
        scale = max(float(np.abs(lo).max()), float(np.abs(hi).max()), 1e-12)
        info.symmetric = bool(np.all(np.abs(lo + hi) <= 1e-6 * scale))
    return info


def _batch_norm(layer: tf.Operation, tail: float_lib.LayerTail, path, bn_by_variable,
                fold_result) -> Tuple[Optional[str], str, Optional[str]]:
    """(batch norm name, status, reason) of a layer."""
    if fold_result is not None:
        for folded in fold_result.folded:
            if folded.layer_op is layer:
                mode = "training" if folded.training else "eval"
                return folded.batch_norm, f"folded ({mode})", None
    weights = structure.weight_tensor(layer)
    quantizer = structure.quantizer_reading(weights)
    base = quantizer.inputs[0] if quantizer is not None else weights
    if base.op.type == "Mul":
        own = structure.weight_variable(layer)
        for variable in sorted(structure.variable_ancestors(base) - {own}):
            bn = bn_by_variable.get(variable)
            if bn is not None:
                mode = "training" if bn in path else "eval"
                return bn.name, f"folded ({mode})", None
    skipped = {s.name: s.reason for s in fold_result.skipped} if fold_result else {}
    for op in tail.ops:
        if structure.is_batch_norm(op):
            reason = skipped.get(op.name, "not folded: run qat.fold_batch_norms "
                                          "(create_*_graph does)")
            return op.name, "not folded", reason
        if op.type in function_library.CALL_TYPES:
            inside = [(name, why) for name, why in skipped.items()
                      if name.startswith(op.name + "/")]
            if inside:  # The fold pass's own record of the batch norm in the body.
                return inside[0][0], "not folded", inside[0][1]
            return op.name, "not folded", (
                f"the layer output goes into a functional {op.type} op {op.name!r} (a "
                "batch norm built without a fixed learning phase): it cannot be folded")
    return None, "-", None


def coverage_report(graph: tf.Graph,
                    outputs: Optional[Sequence[str]] = None,
                    scope: Optional[str] = None,
                    sess: Optional[tf.compat.v1.Session] = None,
                    checkpoint: Optional[str] = None,
                    fold_result=None) -> CoverageReport:
    """Reports the layers, quantizers and float tensors of a rewritten graph.

    Args:
      graph: a graph after qat's rewrite (training or eval).
      outputs: names of the inference outputs (ops or tensors); default: the
        graph's sinks (`structure.default_outputs`). Give them for training
        graphs, whose loss would otherwise count as an output.
      scope: the scope the rewrite was given, to explain unquantized layers.
      sess: a session on `graph` to read the range values from, or None.
      checkpoint: a checkpoint prefix to read them from when there is no
        session.
      fold_result: the `FoldResult` of `qat.fold_batch_norms`, to give the
        fold pass's own reasons for skipped batch norms.

    Returns:
      A CoverageReport.

    Raises:
      ValueError: an output name is not in the graph.
    """
    output_ops = None
    if outputs is not None:
        output_ops = []
        for name in outputs:
            try:
                output_ops.append(graph.get_operation_by_name(name.split(":")[0]))
            except KeyError as e:
                raise ValueError(f"output {name!r} is not an op of the graph") from e
    path = structure.data_path(graph, output_ops)
    layers = [op for op in structure.topological_order(path, graph)
              if structure.is_layer(op)]
    tails = [float_lib.layer_tail(layer, path) for layer in layers]
    layer_weight_quantizers = [structure.quantizer_reading(structure.weight_tensor(layer))
                               for layer in layers]
    quantizer_ops = [structure.quantizer_op(op) for op in structure.fake_quant_ops(graph)
                     if op in path or op in layer_weight_quantizers
                     or any(c in path for c in op.outputs[0].consumers())]
    reader = tf.train.load_checkpoint(checkpoint) if checkpoint and sess is None else None
    values = structure.quantizer_values(quantizer_ops, sess=sess, reader=reader)
    range_names = {q.name: q.min_variable.rsplit("/", 1)[0]
                   for q in quantizer_ops if q.min_variable and "/" in q.min_variable}
    skipped = skipped_lib.counts_in_graph(graph, sess=sess, reader=reader,
                                          ranges=set(range_names.values()))
    weight_quantizers = {}
    layer_infos = []
    bn_by_variable = structure.batch_norms_by_variable(graph)
    for layer, tail, weight_q in zip(layers, tails, layer_weight_quantizers):
        if weight_q is not None:
            weight_quantizers[weight_q] = layer
        bn_name, bn_status, bn_reason = _batch_norm(layer, tail, path, bn_by_variable,
                                                    fold_result)
        reason = None
        if weight_q is None or tail.quantizer is None:
            what = ("weights and output" if weight_q is None and tail.quantizer is None
                    else "weights" if weight_q is None else "output")
            record = float_lib.explain(tail.end, scope, set(), path)
            reason = f"{what} not quantized: {record.reason}"
        layer_infos.append(LayerInfo(
            layer.name, layer.type, structure.weight_variable(layer), bn_name, bn_status,
            bn_reason, structure.quantizer_op(weight_q).name if weight_q is not None else None,
            structure.quantizer_op(tail.quantizer).name if tail.quantizer is not None else None,
            reason))
    quantizers = [_quantizer_info(q, "weights" if q.op in weight_quantizers else "activation",
                                  values) for q in quantizer_ops]
    tensors = {}
    for info in quantizers:
        # Counted by the quantizer owning the range (the others read it).
        name = range_names.get(info.name)
        if name == info.name and name in skipped:
            info.skipped_batches = skipped[name]
            tensors[name] = info.tensor
    finite_ranges.warn({q.name: q.skipped_batches for q in quantizers if q.skipped_batches},
                     tensors)
    floats = float_lib.find_float_tensors(graph, path, tails, scope)
    for layer in layers:  # Float weights: TFLite needs a range for them too.
        if structure.quantizer_reading(structure.weight_tensor(layer)) is None:
            record = float_lib.explain(layer, scope, set(), path)
            floats.append(float_lib.FloatTensor(
                structure.weight_tensor(layer).name, layer.type, record.code,
                f"weights of {layer.name}: {record.reason}"))
    names = [op.name for op in (output_ops or structure.default_outputs(graph))]
    return CoverageReport(layer_infos, quantizers, floats, names, scope)


def load_graph(graph_path: str) -> tf.Graph:
    """Imports a .meta / .pb / .pbtxt eval graph into a new tf.Graph.

    Raises:
      qat.export.GraphLoadError: the file is missing or not a graph.
    """
    graph_def, meta_graph_def = freeze.load_graph_file(graph_path)
    graph = tf.Graph()
    with graph.as_default():
        try:
            if meta_graph_def is not None:
                tf.compat.v1.train.import_meta_graph(meta_graph_def, clear_devices=True)
            else:
                tf.import_graph_def(graph_def, name="")
        except (ValueError, KeyError, tf.errors.OpError) as e:
            raise GraphLoadError(f"cannot import {graph_path!r}: {e}") from e
    return graph


def coverage_report_from_files(graph_path: str, checkpoint: Optional[str],
                               outputs: Optional[Sequence[str]] = None,
                               scope: Optional[str] = None) -> CoverageReport:
    """`coverage_report` of a saved eval graph; range values from `checkpoint`.

    Args:
      graph_path: .meta, .pb or .pbtxt file of the rewritten graph.
      checkpoint: checkpoint prefix or directory (None: no range values).
      outputs, scope: as for `coverage_report`.

    Raises:
      qat.export.GraphLoadError, qat.export.CheckpointError: bad files.
      ValueError: an output name is not in the graph.
    """
    graph = load_graph(graph_path)
    prefix = freeze.checkpoint_prefix(checkpoint) if checkpoint else None
    return coverage_report(graph, outputs=outputs, scope=scope, checkpoint=prefix)
