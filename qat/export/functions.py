"""Concrete functions (TF 2 code): frozen for the checks, converted by TF 2.

A quantized TF 2 model (`qat.quantize_model`) hands its eval rewrite over as a
`tf.types.experimental.ConcreteFunction` (`inference_function()`). The checks
of `qat.export` and `qat.report` read graphs: `freeze_function` freezes the
function's variables into constants (what TF 2's converter does first) and
gives the GraphDef with the names of its inputs and outputs, which those
checks take like a frozen eval graph. `convert_function` converts the
function itself with `tf.lite.TFLiteConverter.from_concrete_functions`, the
converter TF 2 documents: `optimizations=[tf.lite.Optimize.DEFAULT]`, int8 or
float input and output (integer inputs such as token ids stay integer).

No trackable object is passed to the converter: with one, variables a model
reads through a gather (a Keras 3 `Embedding`) stay `READ_VARIABLE` ops that
fail at invoke; without it every captured variable is frozen.
"""
import contextlib
import dataclasses
import logging
import warnings
from typing import List

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import convert_to_constants

from qat.export import convert
from qat.export.errors import ConversionError
from qat.export.errors import ExportError


@dataclasses.dataclass
class FrozenFunction:
    """A concrete function frozen into a GraphDef.

    Attributes:
      graph_def: the function's graph, variables as constants, functions
        inlined.
      input_names: its input tensors (`name:0`), in argument order.
      output_names: its output tensors, in output order.
    """
    graph_def: tf.compat.v1.GraphDef
    input_names: List[str]
    output_names: List[str]


def concrete_function_of(model) -> tf.types.experimental.ConcreteFunction:
    """`model.inference_function()`, or `model` if it is a concrete function.

    Raises:
      ExportError: for anything else.
    """
    if isinstance(model, tf.types.experimental.ConcreteFunction):
        return model
    inference = getattr(model, "inference_function", None)
    if callable(inference):
        return inference()
    raise ExportError(
        f"cannot export a {type(model).__name__}: give a quantized TF 2 model (from "
        "qat.quantize_model, which has inference_function()) or a concrete function.")


def freeze_function(function: tf.types.experimental.ConcreteFunction) -> FrozenFunction:
    """Freezes `function`'s variables into constants.

    Returns:
      The frozen GraphDef with its input and output tensor names.
    """
    with context.eager_mode():
        frozen = convert_to_constants.convert_variables_to_constants_v2(function)
    graph_def = frozen.graph.as_graph_def()
    return FrozenFunction(graph_def, [t.name for t in frozen.inputs],
                          [t.name for t in frozen.outputs])


def convert_function(function: tf.types.experimental.ConcreteFunction,
                     int8_io: bool = False) -> bytes:
    """Converts `function` with TF 2's converter to a fully integer int8 model.

    Args:
      function: a concrete function whose layers read FakeQuant'ed weights
        and activations (e.g. `qm.inference_function()`).
      int8_io: int8 instead of float input (float inputs only) and output.

    Returns:
      The .tflite model bytes.

    Raises:
      ConversionError: the converter failed (its message is included).
    """
    with context.eager_mode(), _expected_converter_warnings_silenced():
        try:  # Eager: else TF's converter falls back to TF1's.
            converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            convert.keep_per_tensor_weights(converter, function.graph.as_graph_def())
            float_inputs = [t for t in function.inputs
                            if t.dtype != tf.resource and t.dtype.is_floating]
            if int8_io and float_inputs:
                converter.inference_input_type = tf.int8
            if int8_io:
                converter.inference_output_type = tf.int8
            return converter.convert()
        except Exception as e:  # The converter raises several unrelated types.
            raise ConversionError(
                f"TF 2 converter (from_concrete_functions) failed on {function.name}: "
                f"{type(e).__name__}: {str(e)[:2000]}") from e


@contextlib.contextmanager
def _expected_converter_warnings_silenced():
    """Silences two converter warnings about what this module does on purpose.

    "Please consider providing the trackable_obj argument" (no trackable
    object: see the module docstring) and "Statistics for quantized inputs
    were expected" (the inputs' ranges are the FakeQuant ops reading them).
    """
    tf_logger = logging.getLogger("tensorflow")
    absl_logger = logging.getLogger("absl")
    quiet = _DropMessages(("trackable_obj",))
    tf_logger.addFilter(quiet)
    absl_logger.addFilter(quiet)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
            yield
    finally:
        tf_logger.removeFilter(quiet)
        absl_logger.removeFilter(quiet)


class _DropMessages(logging.Filter):
    """Drops log records containing any of `needles`."""

    def __init__(self, needles):
        super().__init__()
        self._needles = needles

    def filter(self, record):
        message = record.getMessage()
        return not any(n in message for n in self._needles)
