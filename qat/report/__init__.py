"""Reports on what qat did to a graph, and how the integer model compares.

  coverage   -> layers, batch norms, quantizers and ranges, tensors left float
  numerics   -> per-layer SQNR of QAT vs float and TFLite vs the eval graph
  summaries  -> TensorBoard summaries of the ranges and weights while training
  skipped_batches -> the batches each range skipped (NaN or infinite values),
                warned about once
  float_tensors -> which tensors of the data path are left float, and why
  model_runs -> the three models `layer_numerics` compares, run on one sample
  steps      -> which step of a recurrent layer an eval graph's op computes
  files      -> a report written to a directory: text, JSON and the plots
  plots      -> PNG pictures of the above (matplotlib, imported when drawing:
                pip install qat[report])
  tf2_models -> coverage and numerics of a quantized TF 2 model
                (qat.quantize_model), through its frozen eval function
"""
from qat.report.coverage import CoverageReport
from qat.report.coverage import LayerInfo
from qat.report.coverage import QuantizerInfo
from qat.report.coverage import coverage_report
from qat.report.coverage import coverage_report_from_files
from qat.report.coverage import load_graph
from qat.report.files import write_reports
from qat.report.float_tensors import FloatTensor
from qat.report.numerics import NumericsReport
from qat.report.numerics import TensorNumerics
from qat.report.numerics import bypass_fake_quants
from qat.report.numerics import layer_numerics
from qat.report.numerics import layer_numerics_from_files
from qat.report.numerics import layer_numerics_from_session
from qat.report.numerics import sqnr_db
from qat.report.plots import Plot
from qat.report.plots import plot_range_history
from qat.report.plots import plot_sqnr
from qat.report.skipped_batches import read_skipped_batches
from qat.report.summaries import add_range_summaries
from qat.report.summaries import range_history
from qat.report.summaries import read_scalars
from qat.report.tf2_models import coverage_report_of_model
from qat.report.tf2_models import layer_numerics_of_model

__all__ = [
    "CoverageReport", "FloatTensor", "LayerInfo", "NumericsReport", "Plot", "QuantizerInfo",
    "TensorNumerics", "add_range_summaries", "bypass_fake_quants", "coverage_report",
    "coverage_report_from_files", "coverage_report_of_model", "layer_numerics", "layer_numerics_from_files",
    "layer_numerics_from_session", "layer_numerics_of_model", "load_graph", "plot_range_history", "plot_sqnr",
    "range_history", "read_scalars", "read_skipped_batches", "sqnr_db", "write_reports",
]
