"""Parity between a TFLite model and the eval graph it was exported from.

Both run on the same float inputs; the report gives top-1 agreement (argmax
of the last axis) and the largest output difference, in float and in output
quantization steps (the TFLite output's scale), so "off by one step" reads
as 1.0 whatever the output range.
"""
import dataclasses
import math
from typing import List, Optional, Union

import numpy as np
import tensorflow as tf

from qat.export.errors import ParityError
from qat.export.freeze import check_tensor_names, tensor_name
from qat.export.inspect import describe_model, make_interpreter


@dataclasses.dataclass
class ParityReport:
    """Result of comparing TFLite outputs with the eval graph's."""
    num_examples: int
    top1_agreement: float          # Fraction of examples with the same argmax.
    max_abs_diff: float            # Largest |tflite - graph| over all outputs.
    max_diff_steps: float          # The same in output quantization steps.
    mean_diff_steps: float
    output_scale: Optional[float]  # One output quantization step (None: float output).

    def format(self) -> str:
        """Returns a one-line summary."""
        return (f"top-1 agreement {100 * self.top1_agreement:.2f}% over {self.num_examples} "
                f"examples; max |diff| {self.max_abs_diff:.4g} = {self.max_diff_steps:.2f} "
                f"output steps (mean {self.mean_diff_steps:.3f})")


def run_graph(graph: Union[tf.compat.v1.Session, tf.compat.v1.GraphDef], input_name: str,
              output_name: str, inputs: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Runs an eval graph (live Session or frozen GraphDef) on `inputs`.

    Args:
      graph: a Session (its graph is only read) or a frozen GraphDef.
      input_name, output_name: tensor names.
      inputs: float array, first axis the examples.
      batch_size: examples per Session.run.

    Returns:
      The outputs, stacked along the first axis.
    """
    if isinstance(graph, tf.compat.v1.Session):
        sess, own = graph, False
    else:
        imported = tf.Graph()
        with imported.as_default():
            tf.import_graph_def(graph, name="")
        sess, own = tf.compat.v1.Session(graph=imported), True
    try:
        check_tensor_names(sess.graph, [input_name], "input")
        check_tensor_names(sess.graph, [output_name], "output")
        x = sess.graph.get_tensor_by_name(tensor_name(input_name))
        y = sess.graph.get_tensor_by_name(tensor_name(output_name))
        chunks = [sess.run(y, {x: inputs[i:i + batch_size]})
                  for i in range(0, len(inputs), batch_size)]
    finally:
        if own:
            sess.close()
    return np.concatenate(chunks, axis=0)


def _output_scale(model: bytes) -> Optional[float]:
    """Returns one quantization step of the model's (first) output."""
    report = describe_model(model)
    out = report.outputs[0]
    if report.tensors[out].scale > 0:
        return report.tensors[out].scale
    for op in report.ops:
        if op.name == "DEQUANTIZE" and out in op.outputs:
            return report.tensors[op.inputs[0]].scale or None
    return None


def set_input(interp, inputs: np.ndarray) -> None:
    """Resizes an interpreter's batch to len(inputs) and feeds float `inputs`.

    Integer inputs are quantized with the input tensor's scale and zero point.
    """
    inp = interp.get_input_details()[0]
    interp.resize_tensor_input(inp["index"], [len(inputs)] + list(inp["shape"][1:]))
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]
    data = np.asarray(inputs, np.float32)
    if np.issubdtype(inp["dtype"], np.integer):
        scale, zero_point = inp["quantization"]
        info = np.iinfo(inp["dtype"])
        data = np.clip(np.round(data / scale + zero_point), info.min, info.max)
    interp.set_tensor(inp["index"], data.astype(inp["dtype"]))


def run_tflite(model: bytes, inputs: np.ndarray) -> np.ndarray:
    """Runs a TFLite model on float `inputs`, returning float outputs.

    Integer inputs are quantized with the input tensor's scale and zero point,
    integer outputs dequantized with the output's. The batch dimension is
    resized to len(inputs).
    """
    interp = make_interpreter(model)
    set_input(interp, inputs)
    out = interp.get_output_details()[0]
    interp.invoke()
    result = interp.get_tensor(out["index"])
    if np.issubdtype(out["dtype"], np.integer):
        scale, zero_point = out["quantization"]
        result = (result.astype(np.float32) - zero_point) * scale
    return result.astype(np.float32)


def compare_outputs(reference: np.ndarray, tflite: np.ndarray,
                    output_scale: Optional[float]) -> ParityReport:
    """Compares two output arrays of the same shape (examples first)."""
    reference = np.asarray(reference, np.float32)
    tflite = np.asarray(tflite, np.float32)
    if reference.shape != tflite.shape:
        raise ParityError(f"output shapes differ: eval graph {reference.shape}, "
                          f"TFLite {tflite.shape}")
    n = reference.shape[0]
    flat_ref = reference.reshape(n, -1)
    flat_lite = tflite.reshape(n, -1)
    agreement = float(np.mean(np.argmax(flat_ref, 1) == np.argmax(flat_lite, 1))) if n else 1.0
    diff = np.abs(flat_ref - flat_lite)
    max_diff = float(diff.max()) if diff.size else 0.0
    mean_diff = float(diff.mean()) if diff.size else 0.0
    if output_scale:
        steps, mean_steps = max_diff / output_scale, mean_diff / output_scale
    else:
        steps = mean_steps = math.nan
    return ParityReport(n, agreement, max_diff, steps, mean_steps, output_scale)


def parity_failures(report: ParityReport, min_top1_agreement: Optional[float] = None,
                    max_diff_steps: Optional[float] = None) -> List[str]:
    """Returns a description of each threshold `report` misses (empty: all met)."""
    failures = []
    if min_top1_agreement is not None and report.top1_agreement < min_top1_agreement:
        failures.append(f"top-1 agreement {100 * report.top1_agreement:.2f}% < "
                        f"{100 * min_top1_agreement:.2f}%")
    if max_diff_steps is not None and not report.max_diff_steps <= max_diff_steps:
        failures.append(f"max difference {report.max_diff_steps:.2f} output steps > "
                        f"{max_diff_steps}")
    return failures


def check_parity(model: bytes,
                 graph: Union[tf.compat.v1.Session, tf.compat.v1.GraphDef],
                 input_name: str, output_name: str, inputs: np.ndarray,
                 min_top1_agreement: Optional[float] = None,
                 max_diff_steps: Optional[float] = None) -> ParityReport:
    """Runs the TFLite model and the eval graph on `inputs` and compares them.

    Args:
      model: .tflite bytes (one input, one output are compared).
      graph: the eval graph, as a live Session or frozen GraphDef.
      input_name, output_name: tensor names in the graph.
      inputs: float inputs, examples first.
      min_top1_agreement: if set, a fraction in [0, 1] the agreement must reach.
      max_diff_steps: if set, the largest allowed difference in output steps.

    Returns:
      The ParityReport.

    Raises:
      ParityError: a threshold is set and not met (the report is attached).
    """
    reference = run_graph(graph, input_name, output_name, inputs)
    report = compare_outputs(reference, run_tflite(model, inputs), _output_scale(model))
    failures = parity_failures(report, min_top1_agreement, max_diff_steps)
    if failures:
        raise ParityError("TFLite model and eval graph disagree: " + "; ".join(failures)
                          + f" ({report.format()})", report)
    return report
