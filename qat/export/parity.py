"""Parity between a TFLite model and the eval graph it was exported from.

Both run on the same inputs (float, or integer ids and masks fed as they
are; several inputs as a mapping {input name: array}); the report gives top-1 agreement (argmax
of the last axis) and the largest output difference, in float and in output
quantization steps (the TFLite output's scale), so "off by one step" reads
as 1.0 whatever the output range.
"""
import dataclasses
import math
import os
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from qat.export.errors import ParityError
from qat.export.freeze import check_tensor_names, op_name, tensor_name
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


#: One input's examples, or {input name: examples} for several inputs.
Inputs = Union[np.ndarray, Mapping[str, np.ndarray]]


def input_feeds(input_names: Union[str, Sequence[str]], inputs: Inputs
                ) -> Dict[str, np.ndarray]:
    """{input op name: examples} of `inputs` for the graph inputs `input_names`.

    Args:
      input_names: one input tensor name, or several.
      inputs: an array (the examples of the only, or first, input), or a
        mapping {input name: array} with an entry for each of `input_names`
        (keys matched by op name: "ids" and "ids:0" are the same input).

    Returns:
      {op name: array}, every array with the same number of examples.

    Raises:
      ParityError: an input has no array, or the arrays' example counts differ.
    """
    names = [input_names] if isinstance(input_names, str) else list(input_names)
    if not isinstance(inputs, Mapping):
        return {op_name(names[0]): np.asarray(inputs)}
    given = {op_name(k): np.asarray(v) for k, v in inputs.items()}
    missing = [n for n in names if op_name(n) not in given]
    if missing:
        raise ParityError(f"no examples for input(s) {missing}: give an array for each of "
                          f"{names} (got {sorted(given)})")
    feeds = {op_name(n): given[op_name(n)] for n in names}
    counts = {n: len(v) for n, v in feeds.items()}
    if len(set(counts.values())) > 1:
        raise ParityError(f"inputs differ in their number of examples: {counts}")
    return feeds


def load_inputs(path: str, input_names: Sequence[str],
                max_examples: Optional[int] = None) -> Inputs:
    """Reads examples from a file: `.npy` (one input) or `.npz` (one array per input).

    Args:
      path: a .npy file of the first input's examples, or a .npz file whose
        arrays are named after the inputs ("ids", "mask", "x").
      input_names: the model's input tensor names.
      max_examples: keep at most this many examples.

    Returns:
      An array (.npy; float inputs as float32), or {input op name: array}.

    Raises:
      ValueError: the file is missing or unreadable, or a .npz lacks an input.
    """
    if not os.path.exists(path):
        raise ValueError(f"{path!r}: no such file (give a .npy file, or a .npz file with an "
                         f"array per input {list(input_names)})")
    try:
        data = np.load(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path!r} is not a readable .npy/.npz file: {e}") from e
    if isinstance(data, np.ndarray):
        if np.issubdtype(data.dtype, np.floating):
            data = data.astype(np.float32)
        return data[:max_examples]
    with data:
        missing = [n for n in input_names if op_name(n) not in data.files]
        if missing:
            raise ValueError(f"{path!r} has no array for input(s) {missing} "
                             f"(it has {data.files}): name each array after its input")
        return {op_name(n): data[op_name(n)][:max_examples] for n in input_names}


def run_graph(graph: Union[tf.compat.v1.Session, tf.compat.v1.GraphDef],
              input_name: Union[str, Sequence[str]], output_name: str, inputs: Inputs,
              batch_size: int = 256) -> np.ndarray:
    """Runs an eval graph (live Session or frozen GraphDef) on `inputs`.

    Args:
      graph: a Session (its graph is only read) or a frozen GraphDef.
      input_name: the input tensor name, or several (see `input_feeds`).
      output_name: the output tensor name.
      inputs: examples first: an array, or {input name: array} (`input_feeds`).
        Each is fed in its input's type (integer ids and masks as they are).
      batch_size: examples per Session.run.

    Returns:
      The outputs, stacked along the first axis.
    """
    feeds = input_feeds(input_name, inputs)
    if isinstance(graph, tf.compat.v1.Session):
        sess, own = graph, False
    else:
        imported = tf.Graph()
        with imported.as_default():
            tf.import_graph_def(graph, name="")
        sess, own = tf.compat.v1.Session(graph=imported), True
    try:
        check_tensor_names(sess.graph, list(feeds), "input")
        check_tensor_names(sess.graph, [output_name], "output")
        xs = {sess.graph.get_tensor_by_name(tensor_name(n)): v for n, v in feeds.items()}
        y = sess.graph.get_tensor_by_name(tensor_name(output_name))
        count = len(next(iter(feeds.values())))
        chunks = [sess.run(y, {x: v[i:i + batch_size].astype(x.dtype.as_numpy_dtype)
                               for x, v in xs.items()})
                  for i in range(0, count, batch_size)]
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


def set_input(interp, inputs: Inputs) -> None:
    """Resizes an interpreter's batch to the examples' and feeds `inputs`.

    Args:
      interp: a TFLite interpreter.
      inputs: an array for the first input, or {input name: array} with an
        entry for every model input (matched by name). A quantized input
        (integer with a scale) is fed float values quantized with its scale
        and zero point; any other input (float, or integer ids and masks,
        which TFLite keeps as they are) gets the values as they are.

    Raises:
      ParityError: a model input has no array.
    """
    details = interp.get_input_details()
    if isinstance(inputs, Mapping):
        given = {op_name(k): v for k, v in inputs.items()}
        missing = [d["name"] for d in details if op_name(d["name"]) not in given]
        if missing:
            raise ParityError(f"no examples for TFLite input(s) {missing} "
                              f"(got {sorted(given)})")
        arrays = [np.asarray(given[op_name(d["name"])]) for d in details]
    else:
        arrays = [np.asarray(inputs)]
    for detail, data in zip(details, arrays):
        interp.resize_tensor_input(detail["index"], [len(data)] + list(detail["shape"][1:]))
    interp.allocate_tensors()
    for detail, data in zip(interp.get_input_details(), arrays):
        dtype = detail["dtype"]
        scale, zero_point = detail["quantization"]
        if np.issubdtype(dtype, np.integer) and scale > 0:
            info = np.iinfo(dtype)
            data = np.clip(np.round(np.asarray(data, np.float32) / scale + zero_point),
                           info.min, info.max)
        interp.set_tensor(detail["index"], np.asarray(data).astype(dtype))


def run_tflite(model: bytes, inputs: Inputs) -> np.ndarray:
    """Runs a TFLite model on `inputs`, returning float outputs.

    `inputs` as for `set_input`: quantized inputs are fed float values
    quantized with the input tensor's scale and zero point, integer ids and
    masks as they are; integer outputs are dequantized with the output's
    scale. The batch dimension is resized to the number of examples.
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
                 input_name: Union[str, Sequence[str]], output_name: str, inputs: Inputs,
                 min_top1_agreement: Optional[float] = None,
                 max_diff_steps: Optional[float] = None) -> ParityReport:
    """Runs the TFLite model and the eval graph on `inputs` and compares them.

    Args:
      model: .tflite bytes (its first output is compared).
      graph: the eval graph, as a live Session or frozen GraphDef.
      input_name: the input tensor name in the graph, or several.
      output_name: the output tensor name in the graph.
      inputs: examples first: an array for one input, or {input name: array}
        for several (integer ids and masks are fed as they are).
      min_top1_agreement: if set, a fraction in [0, 1] the agreement must reach.
      max_diff_steps: if set, the largest allowed difference in output steps.

    Returns:
      The ParityReport.

    Raises:
      ParityError: a threshold is set and not met (the report is attached).
    """
    feeds = input_feeds(input_name, inputs)
    reference = run_graph(graph, list(feeds), output_name, feeds)
    lite_inputs = feeds if len(feeds) > 1 else next(iter(feeds.values()))
    report = compare_outputs(reference, run_tflite(model, lite_inputs), _output_scale(model))
    failures = parity_failures(report, min_top1_agreement, max_diff_steps)
    if failures:
        raise ParityError("TFLite model and eval graph disagree: " + "; ".join(failures)
                          + f" ({report.format()})", report)
    return report
