"""Range survival: every activation range of an eval graph is a TFLite tensor.

The eval graph computes what the integer model computes only where each
activation FakeQuant's range becomes a tensor of the converted model with
exactly that scale and zero point. TensorFlow's converter decides from
shapes, constants and its own fusions which tensors exist and which scale
each gets: it removes ops (a reduction over axes of size 1), folds constant
arithmetic into the next layer, gives an op the scale of a concatenation it
feeds. A range that has no such tensor is "lost": the next op reads values
on another grid than the eval graph's.

A range's tensors are found by TFLite's names (`qat.tflite.names`):
a tensor named after the FakeQuant, the op it quantizes (back through
Identity) or a pass-through op reading it (Identity, Reshape, Squeeze,
ExpandDims, Transpose: the converter merges a model input's QUANTIZE into the
TRANSPOSE of a channels-first input), with its shape; where there is none because the
converter removed the ops after it (a reduction over size-1 axes), the
tensor of the first op after them. The range survives when one of them
has its scale and zero point (FakeQuant's nudged zero point; int8 models
store it minus 128), or when the converter removed its op and it reads the
very range (the same min and max tensors) of a quantizer before that op,
whose tensor then holds its value with its scale. Weight ranges (FakeQuants
of constants) are not checked here: `qat.export.inspect` checks the weights.
"""
import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import tensorflow as tf

from qat.export import freeze
from qat.export import inspect
from qat.export import range_sources
from qat.export.errors import ExportError, RangeLostError
from qat.tflite import graph_structure as structure
from qat.tflite import names as tflite_names

# Differs: the tensor holding the value has another scale or zero point (the
# integer model disagrees). Merged: the converter removed the op and the
# tensor holding its value has the same quantization (the models agree for
# these range values only, not by construction).
DIFFERS = "differs"
MERGED = "merged"
# Two scales this close (and one zero point) put every value of the range
# within a quarter step of each other's grid: the models agree to the one step
# the per-layer checks allow (two ranges learned apart on identical values,
# such as tf_keras Normalization's x - 0 and x / 1 after a Rescaling).
_SCALE_RTOL = 1e-3
_EMPTY_RANGE_WIDTH = 1e-5
_ALIAS_FORWARD = frozenset(["Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims",
                            "Transpose"])
_ALIAS_BACKWARD = frozenset(["Identity"])
_INPUT_TYPES = frozenset(["Placeholder", "PlaceholderWithDefault"])


@dataclasses.dataclass
class LostRange:
    """One activation range with no TFLite tensor of its scale and zero point."""
    quantizer: str                  # The FakeQuant op.
    tensor: str                     # The eval-graph tensor it quantizes.
    min: float
    max: float
    scale: float                    # Expected scale and zero point (model's flavour).
    zero_point: int
    kind: str                       # DIFFERS or MERGED.
    nearest: Optional[str] = None   # The TFLite tensor holding (or nearest to) the value.
    nearest_scale: Optional[float] = None
    nearest_zero_point: Optional[int] = None

    def describe(self) -> str:
        """One line: the range, what TFLite has instead, and what that means."""
        where = (f"TFLite has {self.nearest!r} with scale {self.nearest_scale:.6g}, zero point "
                 f"{self.nearest_zero_point}" if self.nearest is not None
                 else "TFLite has no tensor of this value")
        meaning = ("the converter removed the op; the tensor holding its value has the same "
                   "quantization for these range values only" if self.kind == MERGED
                   else "the integer model computes on another grid here")
        return (f"{self.quantizer} ({self.tensor}, range [{self.min:.6g}, {self.max:.6g}]: "
                f"scale {self.scale:.6g}, zero point {self.zero_point}): {where}; {meaning}")


@dataclasses.dataclass
class SurvivalReport:
    """The activation ranges of an eval graph checked against one TFLite model."""
    flavour: str
    checked: int
    lost: List[LostRange]
    # FakeQuant -> the TFLite tensor holding its value under another op's name
    # (the converter kept one of two identical ops; qat gave both one range).
    held_by: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def differing(self) -> List[LostRange]:
        """Lost ranges the integer model computes on another grid."""
        return [r for r in self.lost if r.kind == DIFFERS]

    def format(self) -> str:
        """A readable summary: one line, then one per lost range."""
        lines = [f"range survival ({self.flavour}): {self.checked - len(self.lost)} of "
                 f"{self.checked} activation ranges are TFLite tensors"]
        lines += [f"  lost: {r.describe()}" for r in self.lost]
        return "\n".join(lines)


def expected_quantization(lo: float, hi: float, num_bits: int = 8,
                          narrow_range: bool = False, flavour: str = "uint8"
                          ) -> Tuple[float, int]:
    """The (scale, zero point) TFLite gives a FakeQuant range.

    FakeQuant's own arithmetic: scale (max - min) / (quant_max - quant_min),
    the zero point nudged to the nearest integer in the quantized range;
    int8 models store it minus 128.

    Args:
      lo, hi: the FakeQuant's min and max.
      num_bits, narrow_range: the FakeQuant's attributes.
      flavour: "uint8" or "int8".

    Returns:
      (scale, zero point).
    """
    quant_min = 1 if narrow_range else 0
    quant_max = (1 << num_bits) - 1
    scale = (float(hi) - float(lo)) / (quant_max - quant_min)
    if scale <= 0:
        return 0.0, 0
    # FakeQuant nudges with std::round: halves away from zero.
    zero_point = int(min(max(math.floor(quant_min - float(lo) / scale + 0.5), quant_min),
                         quant_max))
    return scale, zero_point - (128 if flavour == "int8" else 0)


def _same(scale: float, zero_point: int, other_scale: float, other_zero_point: int) -> bool:
    if scale == 0.0:
        # An empty range (min == max: a ReLU that never fired); the converter
        # widens it to 1e-6 around the value, which it still holds.
        return other_scale * 255.0 <= _EMPTY_RANGE_WIDTH
    return (zero_point == other_zero_point
            and math.isclose(scale, other_scale, rel_tol=_SCALE_RTOL, abs_tol=0.0))


def _model_flavour(report: "inspect.ModelReport") -> str:
    for info in report.tensors.values():
        if np.dtype(info.dtype) == np.int8 and info.scale > 0:
            return "int8"
    return "uint8"


def _aliases(fake_quant: tf.Operation) -> List[tf.Operation]:
    """Ops holding the FakeQuant's value in TFLite's naming (see module doc)."""
    found = [fake_quant]
    op = fake_quant.inputs[0].op
    while True:
        found.append(op)
        if op.type not in _ALIAS_BACKWARD or not op.inputs:
            break
        op = op.inputs[0].op
    frontier = [fake_quant]
    while frontier:
        for consumer in frontier.pop().outputs[0].consumers():
            if consumer.type in _ALIAS_FORWARD and consumer not in found:
                found.append(consumer)
                frontier.append(consumer)
    return found


def _activation_fake_quants(graph: tf.Graph) -> List[tf.Operation]:
    """FakeQuants whose data input is computed from a graph input, in graph order."""
    data = structure.forward_closure(op for op in graph.get_operations()
                                     if op.type in _INPUT_TYPES)
    return [op for op in graph.get_operations()
            if op.type in range_sources.ACTIVATION_FAKE_QUANT_TYPES and op.inputs[0].op in data]


def _ranges(graph: tf.Graph, fake_quants: Sequence[tf.Operation]) -> List[Tuple[float, float]]:
    tensors = [t for op in fake_quants if op.type == "FakeQuantWithMinMaxVars"
               for t in op.inputs[1:3]]
    with tf.compat.v1.Session(graph=graph) as sess:
        try:
            values = iter(sess.run(tensors)) if tensors else iter(())
        except tf.errors.OpError as e:
            raise ExportError(
                "range survival needs a frozen eval graph (ranges as constants): "
                f"{e.message.splitlines()[0]}; freeze it with qat.export.freeze_session "
                "or pass a session") from e
    result = []
    for op in fake_quants:
        if op.type == "FakeQuantWithMinMaxVars":
            result.append((float(next(values)), float(next(values))))
        else:
            result.append((float(op.get_attr("min")), float(op.get_attr("max"))))
    return result


def _holds_activation(info: "inspect.TensorInfo", op: tf.Operation) -> bool:
    """A quantized 8-bit tensor (not an int32 bias) of `op`'s output shape."""
    return (info.scale > 0 and np.dtype(info.dtype) in (np.dtype(np.uint8), np.dtype(np.int8))
            and bool(op.outputs) and op.outputs[0].shape.is_compatible_with(info.shape))


def _downstream(fake_quant: tf.Operation, by_op: Dict[str, List[int]],
                report: "inspect.ModelReport") -> List[int]:
    """TFLite tensors holding a FakeQuant's value where the ops after it were removed.

    Walks down from the FakeQuant through ops of its shape that have no
    TFLite tensor (removed by the converter: a reduction over size-1 axes,
    their own FakeQuants) to the first ones that have one.
    """
    shape = fake_quant.outputs[0].shape
    frontier = list(fake_quant.outputs[0].consumers())
    seen, found = set(), []
    while frontier:
        op = frontier.pop(0)
        if op in seen or not op.outputs or not op.outputs[0].shape.is_compatible_with(shape):
            continue
        seen.add(op)
        mine = [i for i in by_op.get(op.name, ()) if _holds_activation(report.tensors[i], op)]
        if mine:
            found.extend(mine)
        else:
            frontier.extend(op.outputs[0].consumers())
    return found


def _holder(fake_quant: tf.Operation, first_part: Dict[str, List[int]],
            report: "inspect.ModelReport") -> Optional[int]:
    """The TFLite tensor holding the value of a FakeQuant whose op was removed.

    Walks up from the quantized op through ops with no TFLite tensor of their
    own (removed or folded by the converter) to the nearest one that has one.
    """
    frontier = [fake_quant.inputs[0].op]
    seen = set()
    while frontier:
        op = frontier.pop(0)
        if op in seen:
            continue
        seen.add(op)
        for index in first_part.get(op.name, ()):
            if _holds_activation(report.tensors[index], op):
                return index
        frontier.extend(t.op for t in op.inputs if t.dtype == tf.float32)
    return None


def check_ranges(graph: Union[tf.compat.v1.GraphDef, tf.compat.v1.Session],
                 model: bytes, output_names: Optional[Sequence[str]] = None,
                 flavour: Optional[str] = None) -> SurvivalReport:
    """Maps every activation range of an eval graph to a TFLite tensor.

    Args:
      graph: the frozen eval graph the model was converted from, or a live
        session on the eval graph (frozen here with `output_names`).
      model: the .tflite bytes (uint8 or int8 flavour).
      output_names: the outputs (needed for a session).
      flavour: "uint8" or "int8"; None: read from the model's tensor types.

    Returns:
      A SurvivalReport listing the ranges without a tensor of their scale
      and zero point.

    Raises:
      ExportError: a session without `output_names`, or a graph whose ranges
        are not constants.
    """
    if isinstance(graph, tf.compat.v1.Session):
        if not output_names:
            raise ExportError("check_ranges of a session needs output_names to freeze it")
        graph_def = freeze.freeze_session(graph, output_names)
    else:
        graph_def = graph
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        tf.import_graph_def(graph_def, name="")
    report = inspect.describe_model(model)
    flavour = flavour or _model_flavour(report)
    graph_ops = {op.name for op in tf_graph.get_operations()}
    by_op: Dict[str, List[int]] = {}
    first_part: Dict[str, List[int]] = {}
    for index, info in report.tensors.items():
        for part in tflite_names.name_parts(info.name, graph_ops):
            by_op.setdefault(part, []).append(index)
        # The op whose output the tensor holds (with and without TFLite's digits).
        for part in tflite_names.name_parts(info.name.split(";")[0], graph_ops):
            first_part.setdefault(part, []).append(index)
    fake_quants = _activation_fake_quants(tf_graph)
    lost, held_by = [], {}
    twins = range_sources.twins(fake_quants)
    for op, (lo, hi) in zip(fake_quants, _ranges(tf_graph, fake_quants)):
        scale, zero_point = expected_quantization(
            lo, hi, int(op.get_attr("num_bits")), bool(op.get_attr("narrow_range")), flavour)
        named = []
        for alias in _aliases(op):
            for index in by_op.get(alias.name, ()):
                if index not in named and _holds_activation(report.tensors[index], alias):
                    named.append(index)
        for twin in twins[op] if not named else ():
            if range_sources.range_source(twin) != range_sources.range_source(op):
                continue
            named = [i for alias in _aliases(twin) for i in by_op.get(alias.name, ())
                     if _holds_activation(report.tensors[i], alias)][:1]
            held_by.update({op.name: report.tensors[i].name for i in named})
            if named:
                break
        held = named or _downstream(op, by_op, report)
        if any(_same(scale, zero_point, report.tensors[i].scale, report.tensors[i].zero_point)
               for i in held):
            continue
        if named:
            kind = DIFFERS
            nearest = min(named, key=lambda i: abs(math.log(report.tensors[i].scale / scale))
                          if scale > 0 else 0.0)
        else:
            nearest = _holder(op, first_part, report)
            kind = DIFFERS
            if nearest is not None and _same(scale, zero_point, report.tensors[nearest].scale,
                                             report.tensors[nearest].zero_point):
                # The very range of the quantizer before the removed op and
                # the same-scale ops between (qat shares it by construction)
                # survives in the tensor holding the value.
                source = range_sources.range_source(op)
                if source and any(range_sources.range_source(other) == source
                                  for other in range_sources.fake_quants_before(op)):
                    continue
                kind = MERGED
        info = report.tensors.get(nearest) if nearest is not None else None
        lost.append(LostRange(
            op.name, op.inputs[0].name, lo, hi, scale, zero_point, kind,
            info.name if info else None, info.scale if info else None,
            info.zero_point if info else None))
    return SurvivalReport(flavour, len(fake_quants), lost, held_by)


def check_range_survival(graph: Union[tf.compat.v1.GraphDef, tf.compat.v1.Session],
                         model: bytes, output_names: Optional[Sequence[str]] = None,
                         label: str = "model", allow_merged: bool = True
                         ) -> SurvivalReport:
    """`check_ranges`, raising when a range is lost.

    Args:
      graph, model, output_names: as for `check_ranges`.
      label: how to call the model in the message (e.g. its file name).
      allow_merged: accept ranges the converter removed whose value's tensor
        has the same quantization (MERGED); only DIFFERS raise then.

    Returns:
      The SurvivalReport, when no range (of the kinds refused) is lost.

    Raises:
      RangeLostError: naming every lost range and what TFLite has instead.
    """
    survival = check_ranges(graph, model, output_names)
    refused = survival.differing if allow_merged else survival.lost
    if refused:
        lines = "\n  ".join(r.describe() for r in refused)
        raise RangeLostError(
            f"{label}: {len(refused)} activation range(s) of the eval graph are not tensors of "
            f"the {survival.flavour} TFLite model, so the integer model does not compute what "
            f"the eval graph computes there:\n  {lines}\nThe converter removed, folded or "
            "requantized these ops (docs/known_limits.md); report the pattern to qat, or "
            "export anyway with allow_lost_ranges=True (CLI --allow_lost_ranges) and check "
            "the model's accuracy yourself.", refused)
    return survival
