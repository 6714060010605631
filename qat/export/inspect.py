"""Reading a .tflite model back: its operators, tensor types, float leftovers.

A model meant to be fully integer that still holds a float compute op means
some TF tensor had no FakeQuant range ("lacking min/max data"): the converter
of TF 2.21 silently keeps such ops in float. `check_fully_integer` finds them
and names the TF ops they came from.
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from qat.export import kernel_checks
from qat.export.errors import ConversionError, FloatOpError

_FLOAT_TYPES = (np.float16, np.float32, np.float64)


@dataclasses.dataclass
class TensorInfo:
    """One tensor of the model: index, name, numpy dtype, shape, quantization."""
    index: int
    name: str
    dtype: type
    shape: Tuple[int, ...]
    scale: float
    zero_point: int


@dataclasses.dataclass
class OpInfo:
    """One operator: builtin name, input and output tensor indices and types."""
    index: int
    name: str
    inputs: List[int]
    outputs: List[int]
    input_types: List[type]
    output_types: List[type]


@dataclasses.dataclass
class ModelReport:
    """Everything `describe_model` read from a flatbuffer."""
    ops: List[OpInfo]
    tensors: Dict[int, TensorInfo]
    inputs: List[int]
    outputs: List[int]
    size_bytes: int

    def op_counts(self) -> Dict[str, int]:
        """Returns {builtin op name: count}, in order of first appearance."""
        return dict(collections.Counter(op.name for op in self.ops))

    def format(self) -> str:
        """Returns a readable listing: one line per op with its tensor types."""
        lines = [f"{len(self.ops)} ops, {len(self.tensors)} tensors, {self.size_bytes} bytes"]
        for op in self.ops:
            ins = ", ".join(f"{self.tensors[i].name}:{np.dtype(t).name}"
                            for i, t in zip(op.inputs, op.input_types))
            outs = ", ".join(f"{self.tensors[i].name}:{np.dtype(t).name}"
                             for i, t in zip(op.outputs, op.output_types))
            lines.append(f"  #{op.index:<3} {op.name:<18} ({ins}) -> ({outs})")
        return "\n".join(lines)


@dataclasses.dataclass
class FloatOp:
    """A TFLite op computing in float, with the TF ops it was converted from."""
    tflite_index: int
    tflite_op: str
    float_tensors: List[str]
    tf_ops: List[Tuple[str, str]]  # (name, type) in the frozen graph, when known.

    def describe(self) -> str:
        """Returns a one-line description naming the TF op(s)."""
        if self.tf_ops:
            tf_part = ", ".join(f"{name!r} ({kind})" for name, kind in self.tf_ops)
        else:
            tf_part = ", ".join(repr(n) for n in self.float_tensors)
        return (f"TFLite {self.tflite_op} (op #{self.tflite_index}) computes in float; "
                f"TF op(s) without a range: {tf_part}")


def make_interpreter(model: bytes, num_threads: Optional[int] = None):
    """Returns an ai_edge_litert Interpreter on `model` with the builtin kernels only.

    No XNNPACK delegate, so op listings show the model's own operators and the
    integer kernels are the reference ones a device would run.

    Raises:
      ImportError: if the `ai-edge-litert` package (qat's `export` extra) is
        not installed.
    """
    # Imported here: the TFLite runtime is an extra (`pip install qat[export]`),
    # not needed by the rewrite passes.
    try:
        from ai_edge_litert import interpreter as litert  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(
            "qat.export runs TFLite models with the ai_edge_litert interpreter: "
            "pip install ai-edge-litert (or qat[export])") from e
    return litert.Interpreter(
        model_content=model, num_threads=num_threads,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)


def describe_model(model: bytes) -> ModelReport:
    """Lists the operators and tensors of a .tflite flatbuffer.

    Args:
      model: the model bytes.

    Returns:
      A ModelReport.
    """
    interp = make_interpreter(model)  # Not allocated: a model kernels refuse still reads.
    tensors = {}
    for t in interp.get_tensor_details():
        scale, zero_point = t["quantization"]
        zero_points = t["quantization_parameters"]["zero_points"]
        if zero_points.size > 1:  # Per-channel: report the first nonzero one, if any.
            nonzero = np.flatnonzero(zero_points)
            zero_point = int(zero_points[nonzero[0]]) if nonzero.size else 0
        tensors[t["index"]] = TensorInfo(t["index"], t["name"], t["dtype"],
                                         tuple(int(d) for d in t["shape"]),
                                         float(scale), int(zero_point))
    ops = []
    for op in interp._get_ops_details():  # pylint: disable=protected-access
        inputs = [int(i) for i in op["inputs"] if i >= 0]
        outputs = [int(i) for i in op["outputs"] if i >= 0]
        ops.append(OpInfo(int(op["index"]), op["op_name"], inputs, outputs,
                          [tensors[i].dtype for i in inputs],
                          [tensors[i].dtype for i in outputs]))
    return ModelReport(ops, tensors,
                       [d["index"] for d in interp.get_input_details()],
                       [d["index"] for d in interp.get_output_details()],
                       len(model))


def _is_float(dtype) -> bool:
    return any(dtype == t for t in _FLOAT_TYPES)


_PASS_THROUGH = frozenset(["Identity", "IdentityN", "Reshape", "Squeeze"])
# Builtins that read only the shape of their input (a dynamic batch size gives
# SHAPE of the float model input): not float compute, whatever the input type.
SHAPE_ONLY_OPS = frozenset(["SHAPE", "RANK"])


def _tf_ops_for(tensor_name: str, nodes: Dict[str, str],
                inputs: Optional[Dict[str, str]] = None) -> List[Tuple[str, str]]:
    """Maps a TFLite tensor name ("Relu;Conv2D", "res/add") to frozen-graph ops.

    A pass-through op (Identity, Reshape) is followed to the op computing its
    input, which is the one that needed the range.
    """
    found = []
    for part in tensor_name.split(";"):
        part = part.split(":")[0]
        while part in nodes and (part, nodes[part]) not in found:
            found.append((part, nodes[part]))
            if nodes[part] not in _PASS_THROUGH or not inputs or part not in inputs:
                break
            part = inputs[part]
    return found


def find_float_ops(report: ModelReport,
                   graph_def: Optional[tf.compat.v1.GraphDef] = None) -> List[FloatOp]:
    """Returns the ops of `report` that compute in float.

    QUANTIZE ops reading a model input and DEQUANTIZE ops writing a model output
    are the model's float interface, not compute, and are not reported; nor
    are shape-only ops (SHAPE, RANK) with integer outputs.

    Args:
      report: from describe_model.
      graph_def: the frozen graph the model came from, to name the TF ops.

    Returns:
      One FloatOp per float compute op, in execution order.
    """
    nodes = {n.name: n.op for n in graph_def.node} if graph_def is not None else {}
    inputs = ({n.name: n.input[0].split(":")[0] for n in graph_def.node if n.input}
              if graph_def is not None else {})
    model_inputs, model_outputs = set(report.inputs), set(report.outputs)
    found = []
    for op in report.ops:
        if op.name == "QUANTIZE" and set(op.inputs) <= model_inputs:
            continue
        if op.name == "DEQUANTIZE" and set(op.outputs) <= model_outputs:
            continue
        if op.name == "DEQUANTIZE":
            continue  # Not compute itself; the float op reading its output is reported.
        float_inputs = [i for i, t in zip(op.inputs, op.input_types) if _is_float(t)]
        float_outputs = [i for i, t in zip(op.outputs, op.output_types) if _is_float(t)]
        if op.name in SHAPE_ONLY_OPS and not float_outputs:
            continue
        if not float_inputs and not float_outputs:
            continue
        names = [report.tensors[i].name for i in (float_outputs or float_inputs)]
        tf_ops = []
        for name in names:
            tf_ops.extend(x for x in _tf_ops_for(name, nodes, inputs) if x not in tf_ops)
        found.append(FloatOp(op.index, op.name, names, tf_ops))
    return found


def _dangling_fake_quant_hints(float_ops: Sequence[FloatOp],
                               source_graph_def: tf.compat.v1.GraphDef) -> List[str]:
    """Finds FakeQuant ops that read a float op's tensor but feed nothing.

    That is contrib's behaviour for a last layer without consumers: the range
    exists, but the exported output is the tensor before it.
    """
    readers: Dict[str, List[str]] = collections.defaultdict(list)
    consumed = set()
    for node in source_graph_def.node:
        for inp in node.input:
            consumed.add(inp.lstrip("^").split(":")[0])
            if node.op.startswith("FakeQuant") and not inp.startswith("^"):
                readers[inp.split(":")[0]].append(node.name)
    hints = []
    for float_op in float_ops:
        for name, _ in float_op.tf_ops:
            for fake_quant in readers.get(name, []):
                if fake_quant not in consumed:
                    hints.append(f"{name!r} is read by {fake_quant!r}, which feeds nothing: "
                                 f"export {fake_quant!r} as the output, or an op reading "
                                 f"{name!r} (e.g. a softmax) so the quantize pass routes it "
                                 "through the FakeQuant")
    return hints


def check_fully_integer(model: bytes,
                        graph_def: Optional[tf.compat.v1.GraphDef] = None,
                        label: str = "model",
                        source_graph_def: Optional[tf.compat.v1.GraphDef] = None
                        ) -> ModelReport:
    """Raises FloatOpError unless every compute op of `model` is integer.

    Args:
      model: .tflite bytes meant to be fully integer.
      graph_def: the frozen graph it came from, to name the TF ops.
      label: how to call the model in the message (e.g. its file name).
      source_graph_def: the unpruned eval graph, to spot a FakeQuant the
        frozen outputs do not reach.

    Returns:
      The ModelReport, when the model is fully integer.

    Raises:
      FloatOpError: listing every float op and the TF op(s) lacking a range.
    """
    report = describe_model(model)
    float_ops = find_float_ops(report, graph_def)
    if float_ops:
        lines = "\n  ".join(f.describe() for f in float_ops)
        if source_graph_def is not None:
            lines += "".join("\n  hint: " + h
                             for h in _dangling_fake_quant_hints(float_ops, source_graph_def))
        raise FloatOpError(
            f"{label} is not fully integer: {len(float_ops)} op(s) still compute in float "
            f"because their TF tensors had no min/max range (no FakeQuant after them):\n  "
            f"{lines}\nQuantize those ops in the eval graph (a FakeQuant on each output; with "
            "qat, report the op pattern the quantize pass missed) and convert again.",
            float_ops)
    return report


_WEIGHT_OPS = frozenset(["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV"])


def check_runnable(model: bytes, graph_def: Optional[tf.compat.v1.GraphDef] = None,
                   label: str = "model") -> None:
    """Raises ConversionError if the TFLite kernels refuse to prepare or run `model`.

    The model is prepared and run once on zeros: with a dynamic batch size
    some kernels (BATCH_MATMUL) are prepared only when the model first runs.
    The usual cause with qat graphs: int8 kernels need symmetric weights (zero
    point 0), which asymmetric (contrib default) weight ranges do not give;
    `symmetric_weights=True` in qat.experimental_create_*_graph does. Another:
    a kernel TFLite has in int8 only (uint8 RSQRT, BATCH_MATMUL).

    Scales that would abort the process in a kernel's Prepare (ADD,
    SQUARED_DIFFERENCE) or fail it (HARD_SWISH) are checked first, on the
    model's own tensors (`qat.export.kernel_checks.tflite_violations`).

    Raises:
      ConversionError: with the kernel's message and the weights at fault.
    """
    refused = kernel_checks.tflite_violations(describe_model(model))
    if refused:
        raise ConversionError(
            f"{label}: TFLite's kernels refuse the scales of {len(refused)} op(s) (not "
            "prepared: ADD and SQUARED_DIFFERENCE would abort the process):\n  "
            + "\n  ".join(refused) + "\nqat's range updates keep learnt ranges clear of "
            "these conditions; train at least one more step with this qat and export again "
            "(docs/what_gets_a_range.md, 'Kernel preconditions').")
    interp = make_interpreter(model)
    try:
        interp.allocate_tensors()
        for detail in interp.get_input_details():
            interp.set_tensor(detail["index"],
                              np.zeros(detail["shape"], detail["dtype"]))
        interp.invoke()
    except (RuntimeError, ValueError) as e:
        report = describe_model(model)
        nodes = {n.name: n.op for n in graph_def.node} if graph_def is not None else {}
        bad = []
        for op in report.ops:
            if op.name in _WEIGHT_OPS and len(op.inputs) > 1:
                weights = report.tensors[op.inputs[1]]
                if np.dtype(weights.dtype) == np.int8 and weights.zero_point != 0:
                    names = [n for n, _ in _tf_ops_for(weights.name, nodes)] or [weights.name]
                    bad.append(f"{op.name} #{op.index} weights {names} zero point "
                               f"{weights.zero_point}")
        hint = ""
        if bad:
            hint = ("\nint8 kernels need symmetric weights (zero point 0); asymmetric weight "
                    "ranges: " + "; ".join(bad) + ". Build the training and eval graphs with "
                    "qat.experimental_create_training_graph(..., symmetric_weights=True) and "
                    "qat.experimental_create_eval_graph(..., symmetric_weights=True), train "
                    "(or fine-tune) so the weight ranges are learnt symmetric, then export "
                    "again; activation ranges stay asymmetric (symmetric=True would make "
                    "them symmetric too, wasting a bit after ReLU). Or export uint8 only.")
        raise ConversionError(f"{label}: the TFLite runtime refuses the model: "
                              f"{str(e).strip()}{hint}") from e


def tensor_types(report: ModelReport, indices: Sequence[int]) -> List[str]:
    """Returns the numpy dtype names of the given tensors."""
    return [np.dtype(report.tensors[i].dtype).name for i in indices]
