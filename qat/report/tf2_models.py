"""Reports on a quantized TF 2 model (`qat.quantize_model`).

The graph reports read a rewritten graph; a quantized TF 2 model's eval
rewrite is a function (`inference_function()`). Frozen
(`qat.export.freeze_function`: variables as constants, as TF 2's converter
sees it), it is an eval graph like any other: coverage reads its layers and
quantizers, numerics compares it with the int8 model TF 2's converter makes
of the same function (`qat.export.convert_function`).
"""
from typing import Optional

import tensorflow as tf

from qat.export import float_layers
from qat.export import functions
from qat.report import coverage as coverage_lib
from qat.report import numerics as numerics_lib


def coverage_report_of_model(model) -> coverage_lib.CoverageReport:
    """`coverage_report` of a quantized TF 2 model's eval rewrite.

    Args:
      model: a model from `qat.quantize_model`, or a concrete function of an
        eval rewrite.

    Returns:
      A CoverageReport (ranges read from the frozen constants; for a model,
      each range's skipped batches from its counters, warned about once).
    """
    frozen = functions.freeze_function(functions.concrete_function_of(model))
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(frozen.graph_def, name="")
    report = coverage_lib.coverage_report(graph, outputs=frozen.output_names)
    skipped = getattr(model, "skipped_batches", None)
    if callable(skipped):
        counts = skipped()
        for q in report.quantizers:
            q.skipped_batches = counts.get(q.name, q.skipped_batches)
    return report


def layer_numerics_of_model(model, samples, tflite: Optional[bytes] = None,
                            **kwargs) -> numerics_lib.NumericsReport:
    """`layer_numerics` of a quantized TF 2 model against its int8 TFLite model.

    Args:
      model: a model from `qat.quantize_model`, or a concrete function of an
        eval rewrite.
      samples: examples first: an array for the first input, or {input name:
        array} with the function's input names (`<argument>:0`).
      tflite: the .tflite bytes converted from it (`qat.export.export_model`'s
        `.model`); None: converted here with TF 2's converter, float input.
      **kwargs: further `layer_numerics` arguments (batch_size, drift_steps).

    Returns:
      A NumericsReport (flavour int8).
    """
    function = functions.concrete_function_of(model)
    frozen = functions.freeze_function(function)
    if tflite is None:
        tflite = functions.convert_function(function)
    kwargs.setdefault("float_layers", float_layers.float_scopes_of(
        getattr(model, "layer_precisions", ())))
    return numerics_lib.layer_numerics(frozen.graph_def, frozen.input_names,
                                       frozen.output_names, samples, flavour="int8",
                                       model=tflite, **kwargs)
