"""PNG pictures of the reports: per-layer SQNR, ranges over training steps.

matplotlib is an optional dependency (`pip install qat[report]` or
`pip install matplotlib`); it is imported when a plot is drawn, with the
Agg backend (no display needed). Each function returns a `Plot`: the file
and the series drawn, which are also written into the PNG's metadata
(text chunk "qat:series", JSON) so a picture can be checked by program.
"""
import dataclasses
import json
import math
import os
from typing import Dict, List, Mapping, Sequence, Tuple

from qat.report.numerics import NumericsReport

SERIES_KEY = "qat:series"
AXIS_TOP_DB = 80.0  # Higher SQNRs (float rounding only) are drawn at the top, labelled.


@dataclasses.dataclass
class Plot:
    """A written PNG and the series it shows: {label: [(x, y), ...]}."""
    path: str
    series: Dict[str, List[Tuple[float, float]]]


def _pyplot():
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError("qat.report.plots draws with matplotlib: pip install matplotlib "
                          "(or qat[report])") from e
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    return pyplot


def _save(figure, path: str, series) -> Plot:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    figure.savefig(path, format="png", dpi=100,
                   metadata={SERIES_KEY: json.dumps({k: [list(p) for p in v]
                                                     for k, v in series.items()})})
    return Plot(path, series)


def plot_sqnr(report: NumericsReport, path: str) -> Plot:
    """Bar chart of the per-layer SQNR: QAT vs float and TFLite vs eval graph.

    SQNRs above the axis (`AXIS_TOP_DB`, or infinite: identical tensors)
    are drawn at its top and labelled with their value ("=" for infinite).

    Args:
      report: from `qat.report.layer_numerics`.
      path: the PNG to write.

    Returns:
      The Plot; series "QAT vs float" and "TFLite vs eval graph", x the row
      index, y the SQNR in dB (inf kept as inf).
    """
    pyplot = _pyplot()
    labels = [r.name for r in report.rows]
    values = {"QAT vs float": [r.sqnr_qat_db for r in report.rows],
              f"TFLite {report.flavour} vs eval graph": [r.sqnr_tflite_db for r in report.rows]}
    finite = [v for vs in values.values() for v in vs if math.isfinite(v)]
    top = min(max(finite, default=60.0), AXIS_TOP_DB - 10.0) + 10.0
    figure, axis = pyplot.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.5))
    width = 0.4
    for k, (label, ys) in enumerate(values.items()):
        xs = [i + (k - 0.5) * width for i in range(len(ys))]
        drawn = [top if y > top else (0.0 if math.isnan(y) else y) for y in ys]
        axis.bar(xs, drawn, width, label=label)
        for x, y in zip(xs, ys):
            if y > top:  # Off the axis (inf: identical tensors): drawn at the top, labelled.
                axis.text(x, top, "=" if math.isinf(y) else f"{y:.0f}", ha="center",
                          va="bottom", fontsize=7)
    axis.set_xticks(range(len(labels)))
    axis.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel("SQNR (dB)")
    axis.set_title(f"Per-layer SQNR ({report.num_examples} examples; higher is closer)")
    axis.set_ylim(0, top * 1.3)
    axis.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    series = {label: [(float(i), y) for i, y in enumerate(ys)] for label, ys in values.items()}
    plot = _save(figure, path, series)
    pyplot.close(figure)
    return plot


def plot_range_history(history: Mapping[str, Mapping[str, Sequence[Tuple[int, float]]]],
                       path: str, columns: int = 3) -> Plot:
    """One panel per quantizer: its min and max over training steps.

    Args:
      history: {quantizer: {"min": [(step, value)], "max": [...]}}, as
        `qat.report.range_history(read_scalars(logdir))` returns.
      path: the PNG to write.
      columns: panels per row.

    Returns:
      The Plot; series "<quantizer>/min" and "<quantizer>/max".

    Raises:
      ValueError: `history` is empty.
    """
    if not history:
        raise ValueError("no range history to plot (no /min or /max scalars)")
    pyplot = _pyplot()
    names = sorted(history)
    columns = max(1, min(columns, len(names)))
    rows = (len(names) + columns - 1) // columns
    figure, axes = pyplot.subplots(rows, columns, figsize=(4.0 * columns, 2.6 * rows),
                                   squeeze=False)
    series = {}
    for k, name in enumerate(names):
        axis = axes[k // columns][k % columns]
        for end in ("min", "max"):
            points = list(history[name].get(end, ()))
            if points:
                axis.plot([p[0] for p in points], [p[1] for p in points], label=end)
                series[f"{name}/{end}"] = [(float(s), float(v)) for s, v in points]
        axis.set_title(name, fontsize=8)
        axis.tick_params(labelsize=7)
        axis.legend(fontsize=7)
    for k in range(len(names), rows * columns):
        axes[k // columns][k % columns].axis("off")
    figure.suptitle("Quantization ranges over training steps")
    figure.tight_layout()
    plot = _save(figure, path, series)
    pyplot.close(figure)
    return plot
