"""TFLite kernel preconditions enforced where ranges are learnt (`RangeFloors`).

A quantizer whose plan carries requirements
(`qat.quantize.plan.kernels.kernel_requirements`) gets `QuantizerSpec.floors`: lower
bounds on its range's width, computed in the graph from the ranges, weights
and bias they depend on (`WidthFloor`; the forms are those of
`qat.quantize.plan.kernels.kernel_preconditions`). After the moving-average step the
range [lo, hi] (lo <= 0 <= hi) is widened where it falls short of the
largest floor W (`WidthFloor`: RATIO, SQUARE, PRODUCT, BIAS or MINIMUM):

    hi' = max(hi, lo + W)

at the top, as an empty range is widened (`qat.quantize.emit.range_updates`): 0
stays in the range, FakeQuant keeps it on the grid, and the scale is W / L
whichever side grows; an empty range becomes [0, W]; a range wide enough
is left exactly as it was. Symmetric ranges are scaled about 0 instead,
f = max(1, W / (hi - lo)): lo' = f lo, hi' = max(f hi, lo' + W), so they
stay symmetric. The widened values are what the variables are assigned, so
the training graph's FakeQuant, the checkpoint, the eval graph and the
converted model all meet the precondition. Two ops per range, besides the
bound itself.

A floor reads other quantizers' ranges (`RangeInput.index`) through a
`RangeView` of the batch: as their FakeQuants read them, or, in the replicas'
combined update (`qat.quantize.emit.step_statistics`), as combined.
"""
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from qat.quantize.emit import quantizer_spec
from qat.quantize.emit.node_writer import NodeWriter
from qat.quantize.emit.node_writer import PlacedWriter
from qat.quantize.plan.kernels import kernel_preconditions as kp

_FLOAT = tf.float32
_INT32 = tf.int32
# Where the width is 0 (only an empty range can be): the floor's factor stays finite.
_TINY_WIDTH = 1e-20


class QuantizerRange(NamedTuple):
    """The range a quantizer of a batch reads."""
    variables: Tuple[str, str]  # Its (min, max) variables (a fixed grid's constants).
    read: Tuple[str, str]       # The (min, max) nodes its FakeQuant reads.
    # An earlier call's (min, max) reads before the update (a replica's range), or None.
    earlier: Optional[Tuple[tf.Tensor, tf.Tensor]]
    fixed: bool                 # A constant range (a kernel's fixed grid).


class RangeView(NamedTuple):
    """The batch's ranges as kernel floors read them."""
    quantizers: Sequence[QuantizerRange]  # By quantizer index.
    # In the replicas' combined update: the combined (min, max) of quantizers
    # whose range has its combined step already; None before (the forward).
    combined: Optional[Dict[int, Tuple[str, str]]] = None

    def read(self, index: int) -> Tuple[str, str]:
        """Quantizer `index`'s (min, max): as combined where it is, else as read."""
        if self.combined is not None and index in self.combined:
            return self.combined[index]
        return self.quantizers[index].read


class RangeFloors:
    """Widens learnt ranges to the floors their kernels ask for.

    Args:
      writer: the batch's node writer (floor widths are computed once per batch).
    """

    def __init__(self, writer: NodeWriter):
        self._writer = writer

    def widen(self, out: PlacedWriter, spec: "quantizer_spec.QuantizerSpec", p: str, lo: str,
              hi: str, view: RangeView) -> Tuple[str, str]:
        """The range [lo, hi] widened to the floors of `spec` (as it is without any)."""
        need = self._need(out, spec, p, view)
        if need is None:
            return lo, hi
        if not spec.symmetric:
            # The min as every range's; the max at least the min + the floor.
            return lo, self._widen_top(out, p + "/KernelFloor", lo, hi, need)
        return self._widen_about_zero(out, p + "/KernelFloor", lo, hi, need)

    def _need(self, out: PlacedWriter, spec: "quantizer_spec.QuantizerSpec", p: str,
              view: RangeView) -> Optional[str]:
        """The node of the largest width the floors of `spec` ask for, or None."""
        levels = kp.levels(spec.num_bits, spec.narrow_range)
        need = None
        for k, floor in enumerate(spec.floors):
            width = self._floor_width(out, "%s/KernelFloor_%d" % (p, k), floor, levels, view)
            if width is None:
                continue
            need = width if need is None else out.node(
                "%s/KernelFloor_%d/Maximum" % (p, k), "Maximum", [need, width], T=_FLOAT)
        return need

    @staticmethod
    def _widen_top(out: PlacedWriter, q: str, lo: str, hi: str, need: str) -> str:
        """hi' = max(hi, lo + W): the top moves up, as an empty range's does."""
        top = out.node(q + "/top", "AddV2", [lo, need], T=_FLOAT)
        return out.node(q + "/max", "Maximum", [hi, top], T=_FLOAT)

    @staticmethod
    def _widen_about_zero(out: PlacedWriter, q: str, lo: str, hi: str, need: str):
        """(f lo, max(f hi, f lo + W)), f = max(1, W / (hi - lo)): a symmetric
        range stays symmetric."""
        width = out.node(q + "/width", "Sub", [hi, lo], T=_FLOAT)
        tiny = out.shared_const("tiny_width", _TINY_WIDTH, tf.float32)
        one = out.shared_const("one", 1.0, tf.float32)
        ratio = out.node(q + "/ratio", "RealDiv",
                         [need, out.node(q + "/positive_width", "Maximum", [width, tiny],
                                         T=_FLOAT)], T=_FLOAT)
        factor = out.node(q + "/factor", "Maximum", [ratio, one], T=_FLOAT)
        new_lo = out.node(q + "/min", "Mul", [lo, factor], T=_FLOAT)
        top = out.node(q + "/top", "AddV2", [new_lo, need], T=_FLOAT)
        new_hi = out.node(q + "/max", "Maximum",
                          [out.node(q + "/scaled_max", "Mul", [hi, factor], T=_FLOAT), top],
                          T=_FLOAT)
        return new_lo, new_hi

    def _floor_width(self, out: PlacedWriter, q: str, floor: "quantizer_spec.WidthFloor",
                     levels: int, view: RangeView) -> Optional[str]:
        """The node of the width `floor` asks of a range of `levels` steps.

        Scales are widths over steps (s = W / L); the steps are folded into
        one constant per floor, so each range read costs one Sub.
        """
        factor = floor.bound * levels
        if floor.form == kp.MINIMUM:
            return out.shared_const("floor_width", factor, tf.float32)
        if floor.form == kp.BIAS:
            # max_c |b_c| / W_w,c = max_c |b_c| / s_w,c / L_w
            x = self._bias_ratio(out, q, floor, view)
            factor *= floor.weights.levels
        elif floor.form == kp.PRODUCT:
            if not floor.ranges or floor.weights is None:
                return None
            (x_in, l_in), (x_w, l_w) = (
                self._width(out, q + "/input", floor.ranges[0], view),
                self._width(out, q + "/weights", floor.weights, view))
            x = out.node(q + "/width_product", "Mul", [x_in, x_w], T=_FLOAT)
            factor /= float(l_in) * l_w
        else:
            widths = [self._width(out, q + "/input_%d" % k, r, view)
                      for k, r in enumerate(floor.ranges)]
            if not widths:
                return None
            steps = {l for _, l in widths}
            if len(steps) > 1:  # Ranges of different bit widths: compare scales.
                widths = [(out.node(q + "/scale_%d" % k, "Mul",
                                    [w, out.shared_const("inverse_levels", 1.0 / l,
                                                         tf.float32)], T=_FLOAT), 1)
                          for k, (w, l) in enumerate(widths)]
            x, l_in = widths[0]
            for k, (w, _) in enumerate(widths[1:]):
                x = out.node(q + "/max_width_%d" % k, "Maximum", [x, w], T=_FLOAT)
            factor /= float(l_in)
            if floor.form == kp.SQUARE:
                x = out.node(q + "/square", "Mul", [x, x], T=_FLOAT)
                factor /= float(l_in)
        return out.node(q + "/width", "Mul",
                        [x, out.shared_const("floor_factor", factor, tf.float32)], T=_FLOAT)

    @staticmethod
    def _range_nodes(out: PlacedWriter, r: "quantizer_spec.RangeInput", view: RangeView):
        if r.variables is not None:
            return tuple(out.before_update(v) for v in r.variables)
        if r.index is not None:
            if r.before_update and not view.quantizers[r.index].fixed:
                return tuple(out.before_update(v) for v in view.quantizers[r.index].variables)
            return view.read(r.index)
        if r.tensors is not None:
            return tuple(out.external(t) for t in r.tensors)
        return tuple(out.shared_const("floor_range", float(v), tf.float32) for v in r.constant)

    def _width(self, out: PlacedWriter, q: str, r: "quantizer_spec.RangeInput",
               view: RangeView, reduce: bool = True):
        """(the width of range `r`, its steps); the widest channel's if `reduce`.

        Computed once per range and batch (several floors read one range).
        """
        key = ("floor_width", r.index, r.tensors, r.variables, r.constant, r.before_update,
               reduce and r.per_channel,
               # Replicas' combined step: a range of the batch as combined, not as read.
               r.index is not None and view.combined is not None)

        def make() -> str:
            if reduce and r.per_channel:
                return out.node(q + "/max_width", "Max",
                                [self._width(out, q, r, view, reduce=False)[0],
                                 out.shared_const("reduction_indices", [0], tf.int32)],
                                T=_FLOAT, Tidx=_INT32)
            lo, hi = self._range_nodes(out, r, view)
            return out.node(q + "/width", "Sub", [hi, lo], T=_FLOAT)
        return self._writer.shared(key, make), r.levels

    def _bias_ratio(self, out: PlacedWriter, q: str, floor: "quantizer_spec.WidthFloor",
                    view: RangeView) -> str:
        """max_c |bias_c| / W_w,c (0 for a channel of zero weights)."""
        weights = floor.weights
        axis = out.shared_const("reduction_indices", [0], tf.int32)

        def magnitude() -> str:
            bias = _bias_value(out, q + "/bias", floor.bias)
            if not _is_vector(floor.bias):  # Scalar terms only: a vector to reduce.
                bias = out.node(q + "/bias/flat", "Reshape",
                                [bias, out.shared_const("flat_shape", [-1], tf.int32)],
                                T=_FLOAT, Tshape=_INT32)
            found = out.node(q + "/abs_bias", "Abs", [bias], T=_FLOAT)
            if weights.per_channel and not _lines_up(floor.bias, weights.channels):
                # Bias and weight channels not known to line up: the largest bias
                # against every channel's scale (never less than the per-channel bound).
                found = out.node(q + "/max_abs_bias", "Max", [found, axis], T=_FLOAT,
                                 Tidx=_INT32)
            return found
        # The same for a replicas' combined update.
        shared = self._writer.shared(("bias_magnitude", id(floor)), magnitude)
        width, _ = self._width(out, q + "/weights", weights, view, reduce=False)
        ratio = out.node(q + "/ratio", "DivNoNan", [shared, width], T=_FLOAT)
        return out.node(q + "/max_ratio", "Max", [ratio, axis], T=_FLOAT, Tidx=_INT32)


def _bias_value(out: PlacedWriter, q: str, bias) -> str:
    """The layer's bias as the converter computes it, flat float32."""
    total = _sum_terms(out, q + "/before", bias.before)
    bn = bias.batch_norm
    if bn is not None:
        mean = _flat(out, q + "/mean", bn.mean, read=bn.mean_is_variable, dtype=bn.dtype)
        if bn.scale is not None:  # The training fold's gamma / sqrt(var + eps).
            s = _flat(out, q + "/scale", bn.scale)
        else:
            s = _batch_norm_scale(out, q, bn)
        centred = mean if total is None else out.node(
            q + "/centred", "Sub", [mean, total], T=_FLOAT)
        centred = out.node(q + "/scaled_mean", "Mul", [centred, s], T=_FLOAT)
        if bn.beta is not None:
            total = out.node(q + "/offset", "Sub", [_flat(out, q + "/beta", bn.beta), centred],
                             T=_FLOAT)
        else:
            total = out.node(q + "/offset", "Neg", [centred], T=_FLOAT)
    after = _sum_terms(out, q + "/after", bias.after)
    if after is not None:
        total = after if total is None else out.node(q + "/sum", "AddV2", [total, after],
                                                     T=_FLOAT)
    return total


def _batch_norm_scale(out: PlacedWriter, q: str, bn) -> str:
    """gamma / sqrt(moving variance + epsilon)."""
    variance = _flat(out, q + "/variance", bn.variance, read=bn.variance_is_variable,
                     dtype=bn.dtype)
    if isinstance(bn.epsilon, tf.Tensor):
        epsilon = _flat(out, q + "/epsilon", bn.epsilon)
    else:
        epsilon = out.shared_const("bn_epsilon", float(bn.epsilon), tf.float32)
    s = out.node(q + "/rsqrt", "Rsqrt",
                 [out.node(q + "/add_epsilon", "AddV2", [variance, epsilon], T=_FLOAT)],
                 T=_FLOAT)
    if bn.gamma is not None:
        s = out.node(q + "/scale", "Mul", [s, _flat(out, q + "/gamma", bn.gamma)], T=_FLOAT)
    return s


def _sum_terms(out: PlacedWriter, q: str, terms: List) -> Optional[str]:
    total = None
    for k, (t, sign) in enumerate(terms):
        x = _flat(out, "%s/term_%d" % (q, k), t)
        if sign < 0:
            x = out.node("%s/term_%d/Neg" % (q, k), "Neg", [x], T=_FLOAT)
        total = x if total is None else out.node(
            "%s/add_%d" % (q, k), "AddV2", [total, x], T=_FLOAT)
    return total


def _flat(out: PlacedWriter, q: str, t: tf.Tensor, read: bool = False, dtype=None) -> str:
    """`t` as a float32 scalar or vector (`read`: `t` is a variable, read it)."""
    x = out.external(t)
    dtype = (dtype or t.dtype).base_dtype
    if read:
        if t.dtype == tf.resource:
            x = out.node(q + "/ReadVariableOp", "ReadVariableOp", [x], dtype=dtype)
        else:
            x = out.node(q + "/read", "Identity", [x], T=dtype)
    if dtype != _FLOAT:
        x = out.node(q + "/ToFloat32", "Cast", [x], SrcT=dtype, DstT=_FLOAT, Truncate=False)
    if not read and t.shape.rank in (0, 1):
        return x  # Already a scalar (broadcast) or one value per channel.
    return out.node(q + "/flat", "Reshape", [x, out.shared_const("flat_shape", [-1], tf.int32)],
                    T=_FLOAT, Tshape=_INT32)


def _is_vector(bias) -> bool:
    """Whether `_bias_value` of `bias` is a vector (a term of rank 1, or read)."""
    bn = bias.batch_norm
    return (bn is not None and (bn.mean_is_variable or bn.variance_is_variable)) or any(
        t is not None and t.shape.rank == 1 for t in [t for t, _ in bias.before + bias.after]
        + ([bn.gamma, bn.beta, bn.mean, bn.variance] if bn is not None else []))


def _lines_up(bias, channels: Optional[int]) -> bool:
    """Whether every term of `bias` is one value, or one per each of `channels`.

    Only then is the bias divided by per-channel weight scales channel by
    channel (a constant added after the layer may be a scalar: broadcast).
    """
    terms = [t for t, _ in bias.before + bias.after]
    bn = bias.batch_norm
    if bn is not None:
        terms += [t for t in (bn.gamma, bn.beta) if t is not None]
        terms += [t for t, is_variable in ((bn.mean, bn.mean_is_variable),
                                           (bn.variance, bn.variance_is_variable))
                  if not is_variable]
    sizes = {t.shape.num_elements() for t in terms}
    return channels is not None and sizes <= {1, channels}
