"""TFLite kernel preconditions enforced where ranges are learnt (a mixin of `RangeUpdates`).

A quantizer whose plan carries requirements
(`qat.quantize.plan.kernel_requirements`) gets `QuantizerSpec.floors`: lower
bounds on its range's width, computed in the graph from the ranges, weights
and bias they depend on (`WidthFloor`; the forms are those of
`qat.quantize.plan.kernel_preconditions`). After the moving-average step the
range [lo, hi] (lo <= 0 <= hi) is widened where it falls short of the
largest floor W (`WidthFloor`: RATIO, SQUARE, PRODUCT, BIAS or MINIMUM):

    hi' = max(hi, lo + W)

at the top, as an empty range is widened (`RangeUpdates._widen_empty`): 0
stays in the range, FakeQuant keeps it on the grid, and the scale is W / L
whichever side grows; an empty range becomes [0, W]; a range wide enough
is left exactly as it was. Symmetric ranges are scaled about 0 instead,
f = max(1, W / (hi - lo)): lo' = f lo, hi' = max(f hi, lo' + W), so they
stay symmetric. The widened values are what the variables are assigned, so
the training graph's FakeQuant, the checkpoint, the eval graph and the
converted model all meet the precondition. Two ops per range, besides the
bound itself.
"""
from typing import List, Optional

import tensorflow as tf

from qat.quantize.emit import quantizer_spec
from qat.quantize.plan.kernels import kernel_preconditions as kp

_FLOAT = tf.float32
_INT32 = tf.int32
# Where the width is 0 (only an empty range can be): the floor's factor stays finite.
_TINY_WIDTH = 1e-20


class RangeFloors(object):
    """Mixin of `qat.quantize.emit.range_updates.RangeUpdates` (uses `QuantizerBatch`'s helpers)."""

    def _floor_need(self, spec, p) -> Optional[str]:
        """The node of the largest width the floors of `spec` ask for, or None."""
        levels = kp.levels(spec.num_bits, spec.narrow_range)
        need = None
        for k, floor in enumerate(spec.floors):
            width = self._floor_width("%s/KernelFloor_%d" % (p, k), floor, levels)
            if width is None:
                continue
            need = width if need is None else self._node(
                "%s/KernelFloor_%d/Maximum" % (p, k), "Maximum", [need, width], T=_FLOAT)
        return need

    def _widen_top(self, q: str, lo: str, hi: str, need: str) -> str:
        """hi' = max(hi, lo + W): the top moves up, as an empty range's does."""
        top = self._node(q + "/top", "AddV2", [lo, need], T=_FLOAT)
        return self._node(q + "/max", "Maximum", [hi, top], T=_FLOAT)

    def _widen_about_zero(self, q: str, lo: str, hi: str, need: str):
        """(f lo, max(f hi, f lo + W)), f = max(1, W / (hi - lo)): a symmetric
        range stays symmetric."""
        width = self._node(q + "/width", "Sub", [hi, lo], T=_FLOAT)
        tiny = self._shared_const("tiny_width", _TINY_WIDTH, tf.float32)
        one = self._shared_const("one", 1.0, tf.float32)
        ratio = self._node(q + "/ratio", "RealDiv",
                           [need, self._node(q + "/positive_width", "Maximum", [width, tiny],
                                             T=_FLOAT)], T=_FLOAT)
        factor = self._node(q + "/factor", "Maximum", [ratio, one], T=_FLOAT)
        new_lo = self._node(q + "/min", "Mul", [lo, factor], T=_FLOAT)
        top = self._node(q + "/top", "AddV2", [new_lo, need], T=_FLOAT)
        new_hi = self._node(q + "/max", "Maximum",
                            [self._node(q + "/scaled_max", "Mul", [hi, factor], T=_FLOAT), top],
                            T=_FLOAT)
        return new_lo, new_hi

    def _floor_width(self, q: str, floor: "quantizer_spec.WidthFloor", levels: int
                     ) -> Optional[str]:
        """The node of the width `floor` asks of a range of `levels` steps.

        Scales are widths over steps (s = W / L); the steps are folded into
        one constant per floor, so each range read costs one Sub.
        """
        factor = floor.bound * levels
        if floor.form == kp.MINIMUM:
            return self._shared_const("floor_width", factor, tf.float32)
        if floor.form == kp.BIAS:
            x = self._bias_ratio(q, floor)  # max_c |b_c| / W_w,c = max_c |b_c| / s_w,c / L_w
            factor *= floor.weights.levels
        elif floor.form == kp.PRODUCT:
            if not floor.ranges or floor.weights is None:
                return None
            (x_in, l_in), (x_w, l_w) = (self._width(q + "/input", floor.ranges[0]),
                                        self._width(q + "/weights", floor.weights))
            x = self._node(q + "/width_product", "Mul", [x_in, x_w], T=_FLOAT)
            factor /= float(l_in) * l_w
        else:
            widths = [self._width(q + "/input_%d" % k, r) for k, r in enumerate(floor.ranges)]
            if not widths:
                return None
            steps = {l for _, l in widths}
            if len(steps) > 1:  # Ranges of different bit widths: compare scales.
                widths = [(self._node(q + "/scale_%d" % k, "Mul",
                                      [w, self._shared_const("inverse_levels", 1.0 / l,
                                                             tf.float32)], T=_FLOAT), 1)
                          for k, (w, l) in enumerate(widths)]
            x, l_in = widths[0]
            for k, (w, _) in enumerate(widths[1:]):
                x = self._node(q + "/max_width_%d" % k, "Maximum", [x, w], T=_FLOAT)
            factor /= float(l_in)
            if floor.form == kp.SQUARE:
                x = self._node(q + "/square", "Mul", [x, x], T=_FLOAT)
                factor /= float(l_in)
        return self._node(q + "/width", "Mul",
                          [x, self._shared_const("floor_factor", factor, tf.float32)], T=_FLOAT)

    def _range_nodes(self, r: "quantizer_spec.RangeInput"):
        if r.variables is not None:
            return tuple(self._before_update(v) for v in r.variables)
        if r.index is not None:
            if r.before_update and not self._fixed[r.index]:
                return tuple(self._before_update(v) for v in self._variables[r.index])
            return self._range_view[r.index]
        if r.tensors is not None:
            return tuple(self._external(t) for t in r.tensors)
        return tuple(self._shared_const("floor_range", float(v), tf.float32) for v in r.constant)

    def _width(self, q: str, r: "quantizer_spec.RangeInput", reduce: bool = True):
        """(the width of range `r`, its steps); the widest channel's if `reduce`.

        Computed once per range and batch (several floors read one range).
        """
        key = ("floor_width", r.index, r.tensors, r.variables, r.constant, r.before_update,
               reduce and r.per_channel,
               # Replicas' combined step: a range of the batch as combined, not as read.
               r.index is not None and self._range_view is not self._ranges)
        if key not in self._shared:
            if reduce and r.per_channel:
                node = self._node(q + "/max_width", "Max",
                                  [self._width(q, r, reduce=False)[0],
                                   self._shared_const("reduction_indices", [0], tf.int32)],
                                  T=_FLOAT, Tidx=_INT32)
            else:
                lo, hi = self._range_nodes(r)
                node = self._node(q + "/width", "Sub", [hi, lo], T=_FLOAT)
            self._shared[key] = node
        return self._shared[key], r.levels

    def _bias_ratio(self, q: str, floor: "quantizer_spec.WidthFloor") -> str:
        """max_c |bias_c| / W_w,c (0 for a channel of zero weights)."""
        weights = floor.weights
        axis = self._shared_const("reduction_indices", [0], tf.int32)
        key = ("bias_magnitude", id(floor))  # The same for a replicas' combined update.
        if key not in self._shared:
            bias = self._bias_value(q + "/bias", floor.bias)
            if not _is_vector(floor.bias):  # Scalar terms only: a vector to reduce.
                bias = self._node(q + "/bias/flat", "Reshape",
                                  [bias, self._shared_const("flat_shape", [-1], tf.int32)],
                                  T=_FLOAT, Tshape=_INT32)
            magnitude = self._node(q + "/abs_bias", "Abs", [bias], T=_FLOAT)
            if weights.per_channel and not _lines_up(floor.bias, weights.channels):
                # Bias and weight channels not known to line up: the largest bias
                # against every channel's scale (never less than the per-channel bound).
                magnitude = self._node(q + "/max_abs_bias", "Max", [magnitude, axis],
                                       T=_FLOAT, Tidx=_INT32)
            self._shared[key] = magnitude
        magnitude = self._shared[key]
        width, _ = self._width(q + "/weights", weights, reduce=False)
        ratio = self._node(q + "/ratio", "DivNoNan", [magnitude, width], T=_FLOAT)
        return self._node(q + "/max_ratio", "Max", [ratio, axis], T=_FLOAT, Tidx=_INT32)

    def _bias_value(self, q: str, bias) -> str:
        """The layer's bias as the converter computes it, flat float32."""
        total = self._sum_terms(q + "/before", bias.before)
        bn = bias.batch_norm
        if bn is not None:
            mean = self._flat(q + "/mean", bn.mean, read=bn.mean_is_variable, dtype=bn.dtype)
            if bn.scale is not None:  # The training fold's gamma / sqrt(var + eps).
                s = self._flat(q + "/scale", bn.scale)
            else:
                s = self._batch_norm_scale(q, bn)
            centred = mean if total is None else self._node(
                q + "/centred", "Sub", [mean, total], T=_FLOAT)
            centred = self._node(q + "/scaled_mean", "Mul", [centred, s], T=_FLOAT)
            if bn.beta is not None:
                total = self._node(q + "/offset", "Sub", [self._flat(q + "/beta", bn.beta),
                                                          centred], T=_FLOAT)
            else:
                total = self._node(q + "/offset", "Neg", [centred], T=_FLOAT)
        after = self._sum_terms(q + "/after", bias.after)
        if after is not None:
            total = after if total is None else self._node(q + "/sum", "AddV2", [total, after],
                                                           T=_FLOAT)
        return total

    def _batch_norm_scale(self, q: str, bn) -> str:
        """gamma / sqrt(moving variance + epsilon)."""
        variance = self._flat(q + "/variance", bn.variance, read=bn.variance_is_variable,
                              dtype=bn.dtype)
        if isinstance(bn.epsilon, tf.Tensor):
            epsilon = self._flat(q + "/epsilon", bn.epsilon)
        else:
            epsilon = self._shared_const("bn_epsilon", float(bn.epsilon), tf.float32)
        s = self._node(q + "/rsqrt", "Rsqrt",
                       [self._node(q + "/add_epsilon", "AddV2", [variance, epsilon], T=_FLOAT)],
                       T=_FLOAT)
        if bn.gamma is not None:
            s = self._node(q + "/scale", "Mul", [s, self._flat(q + "/gamma", bn.gamma)],
                           T=_FLOAT)
        return s

    def _sum_terms(self, q: str, terms: List) -> Optional[str]:
        total = None
        for k, (t, sign) in enumerate(terms):
            x = self._flat("%s/term_%d" % (q, k), t)
            if sign < 0:
                x = self._node("%s/term_%d/Neg" % (q, k), "Neg", [x], T=_FLOAT)
            total = x if total is None else self._node(
                "%s/add_%d" % (q, k), "AddV2", [total, x], T=_FLOAT)
        return total

    def _flat(self, q: str, t: tf.Tensor, read: bool = False, dtype=None) -> str:
        """`t` as a float32 scalar or vector (`read`: `t` is a variable, read it)."""
        x = self._external(t)
        dtype = (dtype or t.dtype).base_dtype
        if read:
            if t.dtype == tf.resource:
                x = self._node(q + "/ReadVariableOp", "ReadVariableOp", [x], dtype=dtype)
            else:
                x = self._node(q + "/read", "Identity", [x], T=dtype)
        if dtype != _FLOAT:
            x = self._node(q + "/ToFloat32", "Cast", [x], SrcT=dtype, DstT=_FLOAT,
                           Truncate=False)
        if not read and t.shape.rank in (0, 1):
            return x  # Already a scalar (broadcast) or one value per channel.
        return self._node(q + "/flat", "Reshape",
                          [x, self._shared_const("flat_shape", [-1], tf.int32)],
                          T=_FLOAT, Tshape=_INT32)


def _is_vector(bias) -> bool:
    """Whether `RangeFloors._bias_value` of `bias` is a vector (a term of rank 1, or read)."""
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
