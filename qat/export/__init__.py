"""Export of qat eval graphs to fully integer TFLite models.

  freeze   -> variables to constants (live session, or graph file + checkpoint)
  convert  -> uint8 (legacy) and int8 TFLite flatbuffers
  inspect  -> operators and tensor types; float ops named back to TF ops
  parity   -> TFLite vs eval graph: top-1 agreement, difference in output steps
  pipeline -> export_tflite: all of the above in one call
"""
from qat.export.convert import (FLAVOURS, convert_frozen_graph, input_range_from_fake_quant,
                                quantized_input_stats, write_model)
from qat.export.errors import (CheckpointError, ConversionError, ExportError, FloatOpError,
                               GraphLoadError, ParityError, TensorNameError)
from qat.export.freeze import (check_tensor_names, checkpoint_prefix, freeze_graph_file,
                               freeze_session, load_graph_file)
from qat.export.inspect import (FloatOp, ModelReport, check_fully_integer, check_runnable,
                                describe_model, find_float_ops)
from qat.export.parity import (ParityReport, check_parity, compare_outputs, parity_failures,
                               run_graph,
                               run_tflite)
from qat.export.pipeline import ExportedModel, export_tflite

__all__ = [
    "FLAVOURS", "CheckpointError", "ConversionError", "ExportError", "ExportedModel",
    "FloatOp", "FloatOpError", "GraphLoadError", "ModelReport", "ParityError", "ParityReport",
    "TensorNameError", "check_fully_integer", "check_parity", "check_runnable", "check_tensor_names",
    "checkpoint_prefix", "compare_outputs", "convert_frozen_graph", "describe_model",
    "export_tflite", "find_float_ops", "freeze_graph_file", "freeze_session",
    "input_range_from_fake_quant", "load_graph_file", "parity_failures", "quantized_input_stats", "run_graph",
    "run_tflite", "write_model",
]
