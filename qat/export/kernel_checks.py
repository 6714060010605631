"""Before converting: the frozen graph's ranges against TFLite's kernel preconditions.

Some of TFLite's integer kernels refuse scales (HARD_SWISH fails to prepare),
abort the process (ADD, SQUARED_DIFFERENCE) or the converter saturates a
layer's int32 bias without a word, when the ranges they read and write are
too far apart (`qat.quantize.plan.kernels.kernel_preconditions`). qat's range updates
keep every learnt range clear of them (`qat.quantize.emit.range_floors`), but
an eval graph restored from a checkpoint written before those floors existed,
or holding ranges set by hand, may not be. `check_kernel_preconditions`
evaluates the same table on the frozen graph's FakeQuant constants, where the
planner finds each precondition (`kernel_requirements.find_requirements`),
and raises `KernelPreconditionError` naming the op, the ranges and the
condition, instead of a Prepare failure, an abort or a silently wrong model.

`RangeCheck(graph)` checks a live graph's ranges while the caller runs it
(tools/property/ train and evaluate their graphs themselves).

`tflite_violations` checks a converted model's own scales the same way
(HARD_SWISH, ADD, SQUARED_DIFFERENCE), before its kernels are prepared
(`qat.export.inspect.check_runnable`): the last guard against an abort.
"""
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from qat.export.errors import KernelPreconditionError
from qat.quantize.plan import planner as planner_lib
from qat.quantize.plan.kernels import kernel_preconditions as kp
from qat.quantize.plan.kernels import kernel_requirements


@dataclasses.dataclass
class Violation:
    """One precondition a range of the frozen graph does not meet."""
    precondition: kp.Precondition
    op: str                          # The TF op the kernel runs for.
    constrained: str                 # The FakeQuant of the constrained range.
    range: Tuple[float, float]
    scale: float                     # Its scale.
    required: float                  # The kernel needs a scale above this.
    relative_to: List[str]           # The FakeQuants (and bias) it depends on.

    def describe(self) -> str:
        """One line: the op, the range, what the kernel needs, and what happens."""
        p = self.precondition
        what = "input" if p.constrained == kp.LAYER_INPUT else "output"
        return (f"{p.name} of {self.op!r} ({', '.join(p.flavours)}; {p.check}: "
                f"{p.formula()}): {what} range {_name(self.constrained)} "
                f"[{self.range[0]:.6g}, {self.range[1]:.6g}] has scale {self.scale:.6g}, "
                f"the kernel needs more than {self.required:.6g}"
                + (f" (from {', '.join(self.relative_to)})" if self.relative_to else "")
                + f"; {p.failure}")


def _name(fake_quant: str) -> str:
    return repr(fake_quant.rsplit("/", 1)[0] if "/" in fake_quant else fake_quant)


def find_violations(graph_def: tf.compat.v1.GraphDef) -> List[Violation]:
    """Every kernel precondition the ranges of a frozen eval graph violate.

    Args:
      graph_def: a frozen eval graph (its FakeQuant ranges are constants).

    Returns:
      The violations, for any flavour (`Violation.precondition.flavours`).
      Empty also where the graph cannot be read (logged).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
        requirements = graph_requirements(graph)
        with tf.compat.v1.Session(graph=graph) as sess:
            values = evaluate(sess, fetches(requirements))
    return violations(requirements, values)


def graph_requirements(graph: tf.Graph) -> List["kernel_requirements.Requirement"]:
    """The kernel preconditions on the FakeQuant ranges of a rewritten graph.

    Works on training, eval and frozen graphs alike: the planner finds each
    precondition where it applies, between FakeQuants already in the graph.
    Empty where the graph cannot be read (logged).
    """
    try:
        planner = planner_lib.Planner(graph, False, None, False)
        planner.run()
        found = kernel_requirements.find_requirements(planner)
    except Exception as e:  # pylint: disable=broad-except
        logging.warning("qat: kernel preconditions not checked: %s", e)
        return []
    return [r for r in found if isinstance(r.constrained, tf.Operation)
            and all(isinstance(s, tf.Operation) for s in r.sources())]


def fetches(requirements) -> Dict[str, tf.Tensor]:
    """{name: tensor} of every range and bias value `requirements` read."""
    found = {}
    for req in requirements:
        for fq in [req.constrained] + req.sources():
            if fq.type != "FakeQuantWithMinMaxArgs":
                found[fq.inputs[1].name] = fq.inputs[1]
                found[fq.inputs[2].name] = fq.inputs[2]
        if req.bias is not None:
            for t in req.bias.tensors():
                if t.dtype != tf.resource:  # A variable handle: no value to fetch.
                    found[t.name] = t
    return found


def violations(requirements, values: Dict[str, np.ndarray]) -> List[Violation]:
    """The requirements the `values` (`fetches`' tensors by name) violate."""
    found = []
    for req in requirements:
        violation = _check(req, values)
        if violation is not None:
            found.append(violation)
    return found


def evaluate(sess: tf.compat.v1.Session, tensors: Dict[str, tf.Tensor]) -> Dict[str, np.ndarray]:
    """The values of `tensors` that need no feed (one run each where a batch run fails)."""
    names = sorted(tensors)
    try:
        return dict(zip(names, sess.run([tensors[n] for n in names])))
    except (tf.errors.OpError, ValueError, TypeError):
        values = {}
        for n in names:
            try:
                values[n] = sess.run(tensors[n])
            except (tf.errors.OpError, ValueError, TypeError):
                pass
        return values


class RangeCheck(object):
    """The kernel preconditions of a live graph's ranges, checked while it runs.

    The interface for tools and tests that train or evaluate a rewritten
    graph themselves (tools/property/): the preconditions are found once
    (`graph_requirements`), `fetches` is run with the caller's own fetches
    (a training step's), and `violations` names the ranges that miss one;
    `in_session` does both where nothing needs a feed (an eval graph).

    Args:
      graph: a rewritten training, eval or frozen graph (not modified).
    """

    def __init__(self, graph: tf.Graph):
        self._requirements = graph_requirements(graph)
        self.fetches: Dict[str, tf.Tensor] = fetches(self._requirements)

    def violations(self, values: Dict[str, np.ndarray]) -> List[Violation]:
        """The preconditions `values` (the fetched `fetches`, by name) violate.

        Args:
          values: {name: value} of a run of `fetches`.

        Returns:
          One `Violation` per precondition a range misses, in graph order.
        """
        return violations(self._requirements, values)

    def in_session(self, sess: tf.compat.v1.Session) -> List[Violation]:
        """The violations of the ranges as `sess` holds them now.

        Args:
          sess: a session on the graph, its variables initialised or restored.

        Returns:
          As `violations`, from a run of `fetches` without a feed.
        """
        return self.violations(evaluate(sess, self.fetches))


# The converter gives an activation range narrower than this (an empty range
# of an old checkpoint, a live range of 1e-13) this width: measured, a GELU's
# range [-7.6e-13, 0] became scale 3.92157e-09 = 1e-6 / 255 in both flavours
# (tests/converter_property_test.py's dead_hard_swish, before the floors).
CONVERTER_MIN_WIDTH = 1e-6


def _range(fq: tf.Operation, values) -> Optional[Tuple[np.ndarray, np.ndarray, float]]:
    """(min, max, steps) of a FakeQuant as the converter reads it, or None when not constant."""
    bits, narrow = int(fq.get_attr("num_bits")), bool(fq.get_attr("narrow_range"))
    levels = float(kp.levels(bits, narrow))
    if fq.type == "FakeQuantWithMinMaxArgs":
        lo, hi = np.float64(fq.get_attr("min")), np.float64(fq.get_attr("max"))
    else:
        lo, hi = values.get(fq.inputs[1].name), values.get(fq.inputs[2].name)
        if lo is None or hi is None:
            return None
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    if not narrow and np.size(hi) == 1:  # An activation range: widened by the converter.
        hi = np.maximum(hi, lo + CONVERTER_MIN_WIDTH)
    return lo, hi, levels


def _bias(bias, values) -> Optional[np.ndarray]:
    def value(t):
        v = values.get(t.name)
        return None if v is None else np.asarray(v, np.float64).ravel()

    def total(terms):
        parts = [value(t) for t, _ in terms]
        if any(p is None for p in parts):
            return None
        return sum((sign * p for p, (_, sign) in zip(parts, terms)), np.zeros(1))

    before, after = total(bias.before), total(bias.after)
    if before is None or after is None:
        return None
    bn = bias.batch_norm
    if bn is None:
        return before + after
    mean, variance = value(bn.mean), value(bn.variance)
    eps = bn.epsilon if not isinstance(bn.epsilon, tf.Tensor) else value(bn.epsilon)
    gamma = value(bn.gamma) if bn.gamma is not None else 1.0
    beta = value(bn.beta) if bn.beta is not None else 0.0
    if any(v is None for v in (mean, variance, eps, gamma, beta)):
        return None
    return beta - (mean - before) * gamma / np.sqrt(variance + eps) + after


def _check(req, values) -> Optional[Violation]:
    p = req.precondition
    out = _range(req.constrained, values)
    if out is None:
        return None
    lo, hi, levels = out
    scale = float(np.max(hi - lo)) / levels
    sources = [_range(s, values) for s in req.sources()]
    if any(s is None for s in sources):
        return None
    names = [_name(s.name) for s in req.sources()]
    if p.form == kp.MINIMUM:
        x = 1.0
    elif p.form == kp.BIAS:
        w_lo, w_hi, w_levels = sources[-1]
        bias = _bias(req.bias, values)
        if bias is None:
            return None
        s_w = np.ravel((w_hi - w_lo) / w_levels)
        magnitude = np.abs(bias)
        if s_w.size > 1 and magnitude.size not in (1, s_w.size):
            magnitude = np.max(magnitude, keepdims=True)  # Channels not known to line up.
        s_w = np.broadcast_to(s_w, np.broadcast(magnitude, s_w).shape)
        magnitude = np.broadcast_to(magnitude, s_w.shape)
        ratio = np.divide(magnitude, s_w, out=np.zeros(s_w.shape), where=s_w > 0)
        x = float(np.max(ratio)) if ratio.size else 0.0
        names.append("its bias (largest |bias| %.6g)" % float(np.max(np.abs(bias))))
    elif p.form == kp.PRODUCT:
        (i_lo, i_hi, i_levels), (w_lo, w_hi, w_levels) = sources
        x = (float(np.max(i_hi - i_lo)) / i_levels) * (float(np.max(w_hi - w_lo)) / w_levels)
    else:
        x = max(float(np.max(h - l)) / n for l, h, n in sources)
        if p.form == kp.SQUARE:
            x = x * x
    required = p.constant * x
    if scale > required or not np.isfinite(required) or not np.isfinite(scale):
        return None  # Non-finite ranges or biases: NonFiniteError names them.
    return Violation(p, req.op.name, req.constrained.name,
                     (float(np.min(lo)), float(np.max(hi))), scale, required, names)


def check_kernel_preconditions(graph_def: tf.compat.v1.GraphDef, flavours: Sequence[str],
                               label: str = "model") -> None:
    """Refuses a frozen graph whose ranges TFLite's kernels of `flavours` would refuse.

    Raises:
      KernelPreconditionError: naming each op, range and condition.
    """
    violations = [v for v in find_violations(graph_def)
                  if any(f in v.precondition.flavours for f in flavours)]
    if not violations:
        return
    lines = "\n".join("  " + v.describe() for v in violations)
    raise KernelPreconditionError(
        f"{label}: {len(violations)} range(s) of the eval graph violate a precondition of "
        f"TFLite's integer kernels, checked before converting:\n{lines}\n"
        "qat's range updates keep learnt ranges clear of these conditions; these were learnt "
        "without them (a checkpoint written by an older qat, or ranges set by hand). Train or "
        "fine-tune at least one more step with this qat, whose range updates widen them "
        "(docs/what_gets_a_range.md, 'Kernel preconditions'), then export again.",
        violations)


# --- The converted model's own scales ---------------------------------------


def tflite_violations(report) -> List[str]:
    """Ops of a converted model whose scales its kernels refuse (or abort on).

    Args:
      report: `qat.export.inspect.describe_model`'s report (not allocated).

    Returns:
      One line per op: HARD_SWISH, ADD and SQUARED_DIFFERENCE with their
      tensors' scales and the condition.
    """
    forms = {"HARD_SWISH": kp.HARD_SWISH, "ADD": kp.ADD,
             "SQUARED_DIFFERENCE": kp.SQUARED_DIFFERENCE}
    lines = []
    for op in report.ops:
        if op.name in _BIAS_SCALE_OPS:
            line = _bias_scale_violation(op, report)
            if line:
                lines.append(line)
            continue
        p = forms.get(op.name)
        if p is None or not op.outputs:
            continue
        out = report.tensors[op.outputs[0]]
        ins = [report.tensors[i] for i in op.inputs if i >= 0]
        if (not out.scale or np.dtype(out.dtype) not in (np.int8, np.uint8)
                or not all(t.scale for t in ins)):
            continue
        x = max(t.scale for t in ins)
        required = p.constant * (x * x if p.form == kp.SQUARE else x)
        if out.scale <= required:
            lines.append(f"{op.name} #{op.index} ({p.check}: {p.formula()}): output "
                         f"{out.name!r} scale {out.scale:.6g}, inputs "
                         + ", ".join(f"{t.name!r} scale {t.scale:.6g}" for t in ins)
                         + f"; the kernel needs more than {required:.6g}: {p.failure}")
    return lines


_BIAS_SCALE_OPS = frozenset(["CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED"])


def _bias_scale_violation(op, report) -> Optional[str]:
    """TFLite's own check of a per-tensor layer's bias scale (kernel_util.cc:319-322)."""
    # TRANSPOSE_CONV's inputs are (output shape, weights, data[, bias]).
    data, weights = (2, 1) if op.name == "TRANSPOSE_CONV" else (0, 1)
    bias = 3 if op.name == "TRANSPOSE_CONV" else 2
    if len(op.inputs) <= bias or op.inputs[bias] < 0 or not op.outputs:
        return None
    t_in, t_w, t_b = (report.tensors[op.inputs[k]] for k in (data, weights, bias))
    out = report.tensors[op.outputs[0]]
    per_tensor_check = (np.dtype(t_in.dtype) == np.uint8
                        or (op.name == "FULLY_CONNECTED" and np.dtype(t_in.dtype) == np.int8))
    if not per_tensor_check or not (t_in.scale and t_w.scale and t_b.scale and out.scale):
        return None
    # A per-channel layer's report shows its first channel's scale: the
    # kernel checks per-channel int8 convolutions differently (no check).
    product = float(t_in.scale) * float(t_w.scale)
    ratio = abs(product - float(np.float32(t_b.scale))) / float(out.scale)
    if ratio <= 0.02:
        return None
    p = kp.BIAS_SCALE
    return (f"{op.name} #{op.index} ({p.check}): input {t_in.name!r} scale {t_in.scale:.6g} x "
            f"weights scale {t_w.scale:.6g} against bias scale {t_b.scale:.6g}, output scale "
            f"{out.scale:.6g}: scale_diff / output_scale = {ratio:.3g} > 0.02; {p.failure}")
