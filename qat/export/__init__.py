"""Export of qat eval graphs to fully integer TFLite models.

  freeze   -> variables to constants (live session, or graph file + checkpoint)
  convert  -> uint8 (legacy) and int8 TFLite flatbuffers
  inspect  -> operators and tensor types; float ops named back to TF ops
  kernel_checks -> the frozen graph's ranges against TFLite's kernel
              preconditions, before converting
  parity   -> TFLite vs eval graph: top-1 agreement, difference in output steps
  range_survival -> every activation range of the eval graph is a TFLite tensor
  range_sources -> where a FakeQuant's range comes from (ranges equal by
              construction)
  errors   -> the errors the pipeline raises
  edge_quantizer, edge_quantizer_graphs -> int8 and int16 activations in one
              LiteRT model by ai-edge-quantizer, fed qat's ranges and bits
  float_layers -> a mixed model (a recipe's float layers) held to its recipe:
              float only there; 16-bit activations beside 8-bit ones (the
              ai-edge-quantizer export) or refused
  pipeline -> export_tflite: all of the above in one call
  saved_model -> the frozen eval graph as a TF 2 SavedModel (serving
              signature), converted with TF 2's from_saved_model
  functions -> a quantized TF 2 model's eval function: frozen for the
              checks, converted with TF 2's from_concrete_functions
              (pipeline.export_model)
"""
from qat.export.convert import FLAVOURS
from qat.export.convert import check_flavour
from qat.export.convert import convert_frozen_graph
from qat.export.convert import input_range_from_fake_quant
from qat.export.convert import is_float_input
from qat.export.convert import per_channel_fake_quants
from qat.export.convert import quantized_input_stats
from qat.export.convert import write_model
from qat.export.errors import CheckpointError
from qat.export.errors import ConversionError
from qat.export.errors import ExportError
from qat.export.errors import FloatOpError
from qat.export.errors import GraphLoadError
from qat.export.errors import KernelPreconditionError
from qat.export.errors import NonFiniteError
from qat.export.errors import ParityError
from qat.export.errors import RangeLostError
from qat.export.errors import TensorNameError
from qat.export.float_layers import check_activation_bits
from qat.export.float_layers import check_float_layers
from qat.export.freeze import check_finite
from qat.export.freeze import check_tensor_names
from qat.export.freeze import checkpoint_prefix
from qat.export.freeze import freeze_graph_file
from qat.export.freeze import freeze_session
from qat.export.freeze import load_graph_file
from qat.export.inspect import FloatOp
from qat.export.inspect import ModelReport
from qat.export.inspect import check_fully_integer
from qat.export.inspect import check_runnable
from qat.export.inspect import describe_model
from qat.export.inspect import find_float_ops
from qat.export.kernel_checks import check_kernel_preconditions
from qat.export.parity import ParityReport
from qat.export.parity import check_parity
from qat.export.parity import compare_outputs
from qat.export.parity import load_inputs
from qat.export.parity import parity_failures
from qat.export.parity import run_graph
from qat.export.parity import run_tflite
from qat.export.range_survival import LostRange
from qat.export.range_survival import SurvivalReport
from qat.export.range_survival import check_range_survival
from qat.export.range_survival import check_ranges
from qat.export.functions import FrozenFunction
from qat.export.functions import convert_function
from qat.export.functions import freeze_function
from qat.export.pipeline import ExportedModel
from qat.export.pipeline import export_model
from qat.export.pipeline import export_tflite
from qat.export.saved_model import convert_saved_model
from qat.export.saved_model import write_saved_model

__all__ = [
    "FLAVOURS", "CheckpointError", "ConversionError", "ExportError", "ExportedModel",
    "FloatOp", "FloatOpError", "FrozenFunction", "GraphLoadError", "KernelPreconditionError",
    "ModelReport", "NonFiniteError",
    "LostRange", "ParityError", "ParityReport", "RangeLostError", "SurvivalReport",
    "TensorNameError", "check_activation_bits", "check_finite", "check_flavour", "check_float_layers", "check_fully_integer", "check_kernel_preconditions", "check_parity", "check_range_survival", "check_ranges",
    "check_runnable", "check_tensor_names", "checkpoint_prefix", "compare_outputs",
    "convert_frozen_graph", "convert_function", "convert_saved_model", "describe_model", "export_model", "export_tflite", "find_float_ops",
    "freeze_function", "freeze_graph_file", "freeze_session", "input_range_from_fake_quant", "is_float_input",
    "load_graph_file", "load_inputs",
    "parity_failures", "per_channel_fake_quants", "quantized_input_stats", "run_graph", "run_tflite", "write_model",
    "write_saved_model",
]
