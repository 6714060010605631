"""Writing a report to a directory: text, JSON and the plots."""
import json
import os
from typing import Dict, Mapping, Optional

from absl import logging

from qat.report.coverage import CoverageReport
from qat.report.numerics import NumericsReport


def write_reports(output_dir: str, coverage: CoverageReport,
                  numerics: Optional[NumericsReport] = None,
                  ranges: Optional[Mapping] = None, plots: bool = True) -> Dict[str, str]:
    """Writes report.txt, report.json and, with matplotlib, sqnr.png / ranges.png.

    Args:
      output_dir: the directory (created).
      coverage: from `coverage_report`.
      numerics: from `layer_numerics`, or None.
      ranges: `range_history(read_scalars(logdir))`, or None.
      plots: draw the PNGs (skipped with a warning when matplotlib is missing).

    Returns:
      {"text": path, "json": path, "sqnr_plot": path, "ranges_plot": path},
      the plots only when drawn.
    """
    os.makedirs(output_dir, exist_ok=True)
    paths = {"text": os.path.join(output_dir, "report.txt"),
             "json": os.path.join(output_dir, "report.json")}
    text = coverage.format() + ("\n\n" + numerics.format() if numerics else "") + "\n"
    with open(paths["text"], "w", encoding="utf-8") as f:
        f.write(text)
    data = {"coverage": coverage.to_dict(),
            "numerics": numerics.to_dict() if numerics else None}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    if not plots or (numerics is None and not ranges):
        return paths
    try:
        from qat.report import plots as plots_lib  # pylint: disable=import-outside-toplevel
        if numerics is not None:
            paths["sqnr_plot"] = plots_lib.plot_sqnr(
                numerics, os.path.join(output_dir, "sqnr.png")).path
        if ranges:
            paths["ranges_plot"] = plots_lib.plot_range_history(
                ranges, os.path.join(output_dir, "ranges.png")).path
    except ImportError as e:
        logging.warning("plots skipped: %s", e)
    return paths
