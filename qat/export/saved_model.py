"""Eval graphs as TF 2 SavedModels: TensorFlow 2's converter and TF Serving.

`write_saved_model` wraps a frozen eval graph in a `tf.function` (the GraphDef
imported by `tf.compat.v1.wrap_function`, pruned to the inputs and outputs)
and saves it with `tf.saved_model.save` under the signature
`serving_default`, inputs and outputs keyed by their op names. The model has
no variables: the trained values are constants of the function, as in the
frozen graph. TF Serving and `tf.saved_model.load` load it;
`convert_saved_model` converts it with `tf.lite.TFLiteConverter.from_saved_model`
and `optimizations=[tf.lite.Optimize.DEFAULT]`, the converter TF 2 documents,
fully integer with float or int8 input/output.

Why the TF 2 converter needs an eager process: with eager execution disabled
(TF1 scripts, `qat.compat.install()`), `tf.lite.TFLiteConverter.from_saved_model`
returns TF1's `tf.compat.v1.lite.TFLiteConverter` instead (it logs "Invoking
the TF1 implementation of TFLiteConverter because eager is disabled"), whatever
the SavedModel's format. With `optimizations=[DEFAULT]` and no
`inference_type=tf.int8` that converter keeps every kernel float between
QUANTIZE / DEQUANTIZE ops, and with int8 input/output it raises "Initial model
input is not quantized". Both functions here therefore run TensorFlow's
SavedModel and converter code in eager mode, also when the calling process
disabled it.

An input no FakeQuant reads has no range in the graph, and TF 2's converter
takes no `quantized_input_stats`: give its range (`input_ranges`) and the
signature quantizes it with a FakeQuant of that range, which is what TFLite's
input quantization does.
"""
import os
import re
from typing import Dict, Mapping, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.eager import context

from qat.export.convert import input_range_from_fake_quant
from qat.export.convert import keep_per_tensor_weights
from qat.export.errors import ConversionError
from qat.export.errors import ExportError
from qat.export.freeze import check_finite
from qat.export.freeze import check_tensor_names
from qat.export.freeze import op_name
from qat.export.freeze import tensor_name

SIGNATURE_KEY = "serving_default"


def signature_key_of(name: str) -> str:
    """The signature's key for tensor `name`: its op name, `/` and `:` as `_`."""
    return re.sub(r"[^A-Za-z0-9_]", "_", op_name(name))


def _input_quantization(graph_def: tf.compat.v1.GraphDef, input_names: Sequence[str],
                        input_ranges: Optional[Mapping[str, Tuple[float, float]]],
                        default_input_range: Optional[Tuple[float, float]]
                        ) -> Dict[str, Optional[Tuple[float, float]]]:
    """{input: range the signature quantizes it with, None where a FakeQuant reads it}."""
    ranges = {op_name(k): v for k, v in (input_ranges or {}).items()}
    result = {}
    for name in input_names:
        if input_range_from_fake_quant(graph_def, name):
            result[name] = None
            continue
        rng = ranges.get(op_name(name)) or default_input_range
        if rng is None:
            raise ExportError(
                f"input {name!r} has no range: it feeds no FakeQuant op and TF 2's converter "
                "takes no quantized_input_stats, so give the real values its quantized form "
                f"spans, e.g. input_ranges={{{op_name(name)!r}: (0.0, 1.0)}} "
                "(CLI: --input_range=0,1)")
        lo, hi = float(rng[0]), float(rng[1])
        if not hi > lo:
            raise ExportError(f"input range ({lo}, {hi}) of {name!r} is empty: "
                              "pass (min, max) with min < max")
        result[name] = (lo, hi)
    return result


def write_saved_model(graph_def: tf.compat.v1.GraphDef,
                      input_names: Sequence[str],
                      output_names: Sequence[str],
                      export_dir: str,
                      input_ranges: Optional[Mapping[str, Tuple[float, float]]] = None,
                      default_input_range: Optional[Tuple[float, float]] = None) -> str:
    """Writes a frozen eval graph as a TF 2 SavedModel with a serving signature.

    Args:
      graph_def: the frozen eval graph (`freeze_session`, `freeze_graph_file`).
      input_names: input tensor names (placeholders with known dtype).
      output_names: output tensor names.
      export_dir: the SavedModel directory (must not hold a SavedModel yet).
      input_ranges: {input: (min, max)} of inputs no FakeQuant reads.
      default_input_range: the range of such inputs not in `input_ranges`.

    Returns:
      `export_dir`. Its `serving_default` signature takes the inputs and
      returns the outputs keyed by `signature_key_of(name)`.

    Raises:
      TensorNameError: a name is not in the graph.
      ExportError: an input has no range, or `export_dir` holds a SavedModel.
      NonFiniteError: a weight or range is NaN/Inf.
      ConversionError: TensorFlow could not wrap or save the graph.
    """
    check_tensor_names(graph_def, input_names, "input")
    check_tensor_names(graph_def, output_names, "output")
    check_finite(graph_def)
    quantize_inputs = _input_quantization(graph_def, input_names, input_ranges,
                                          default_input_range)
    if tf.io.gfile.exists(os.path.join(export_dir, "saved_model.pb")):
        raise ExportError(f"{export_dir!r} already holds a SavedModel: give a new directory")
    keys = [signature_key_of(n) for n in input_names]
    out_keys = [signature_key_of(n) for n in output_names]
    for role, names in (("input", keys), ("output", out_keys)):
        if len(set(names)) != len(names):
            raise ExportError(f"two {role} names give the same signature key: {names}")
    with context.eager_mode():
        try:
            wrapped = tf.compat.v1.wrap_function(
                lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
            graph = wrapped.graph
            feeds = [graph.get_tensor_by_name(tensor_name(n)) for n in input_names]
            fetches = [graph.get_tensor_by_name(tensor_name(n)) for n in output_names]
            pruned = wrapped.prune(feeds, fetches)
            specs = [tf.TensorSpec(t.shape, t.dtype, name=key) for t, key in zip(feeds, keys)]

            def serve(*args):
                args = list(args)
                for k, name in enumerate(input_names):
                    rng = quantize_inputs[name]
                    if rng is not None:
                        args[k] = tf.quantization.fake_quant_with_min_max_args(
                            args[k], min=rng[0], max=rng[1], num_bits=8)
                return dict(zip(out_keys, pruned(*args)))

            module = tf.Module()
            module.graph_function = pruned
            module.serve = tf.function(serve, input_signature=specs)
            tf.saved_model.save(module, export_dir,
                                signatures={SIGNATURE_KEY: module.serve.get_concrete_function()})
        except (ValueError, TypeError, tf.errors.OpError) as e:
            raise ConversionError(f"cannot write the SavedModel {export_dir!r}: {e}") from e
    return export_dir


def convert_saved_model(export_dir: str, int8_io: bool = False,
                        graph_def: Optional[tf.compat.v1.GraphDef] = None) -> bytes:
    """Converts a SavedModel with TF 2's converter (`from_saved_model`), int8.

    Args:
      export_dir: a SavedModel with a `serving_default` signature, e.g. from
        `write_saved_model`.
      int8_io: int8 instead of float input and output.
      graph_def: the frozen graph the SavedModel was written from: its dense
        layers keep their per-tensor weight ranges where it has no
        per-channel ones (`qat.export.convert.keep_per_tensor_weights`).

    Returns:
      The .tflite model bytes.

    Raises:
      ConversionError: the converter failed (its message is included).
    """
    with context.eager_mode():  # Else from_saved_model returns TF1's converter.
        try:
            converter = tf.lite.TFLiteConverter.from_saved_model(export_dir)
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if graph_def is not None:
                keep_per_tensor_weights(converter, graph_def)
            if int8_io:
                converter.inference_input_type = tf.int8
                converter.inference_output_type = tf.int8
            return converter.convert()
        except Exception as e:  # The converter raises several unrelated types.
            raise ConversionError(
                f"TF 2 converter (from_saved_model) failed on {export_dir!r}: "
                f"{type(e).__name__}: {str(e)[:2000]}") from e
