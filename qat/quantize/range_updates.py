"""The ops that update a quantizer's range while training (a mixin of `QuantizerBatch`).

Last value (weights): the batch's min and max, widened to include 0.
Moving average (activations): `v -= (1 - decay) * (v - batch value)`, from the
first batch's range on the first step when the quantization step is given.
Symmetric ranges widen one side; a concatenation's group (`statistics_of`)
takes the min and max over every member. Each method writes NodeDefs through
`QuantizerBatch`'s helpers and returns the names of the range's (min, max).
"""
import dataclasses

import tensorflow as tf

from qat.quantize.quantizer_spec import low_precision_dtype

_FLOAT = tf.float32
_INT32 = tf.int32
_INT64 = tf.int64


class RangeUpdates(object):
    """Mixin of `qat.quantize.quantizer_batch.QuantizerBatch` (uses its NodeDef helpers)."""

    def _updates(self, spec, p, x, rank, min_var, max_var, step):
        zero = self._shared_const("zero", 0.0, tf.float32)
        nonnegative = spec.nonnegative and not spec.per_channel
        batch_min, batch_max = self._batch_range(spec, p, x, rank, nonnegative)
        for k, t in enumerate(spec.statistics_of):
            # A concatenation's group: the range covers every member.
            q = "%s/member_%d" % (p, k)
            # Reduced where the member is (another replica's device).
            self._device = t.op.device or spec.device
            y = self._external(t)
            low = low_precision_dtype(t)
            if low is not None:
                y = self._cast(q + "/ToFloat32", y, low, _FLOAT)
            y_min, y_max = self._batch_range(
                dataclasses.replace(spec, per_channel=False), q, y, t.shape.rank,
                t.op.type in ("Relu", "Relu6"))
            self._device = spec.device
            if y_min is not None:
                batch_min = y_min if batch_min is None else self._node(
                    q + "/GroupMin", "Minimum", [batch_min, y_min], T=_FLOAT)
            batch_max = self._node(q + "/GroupMax", "Maximum", [batch_max, y_max],
                                   T=_FLOAT)
        if spec.all_reduce is not None:  # The same range on every worker.
            if batch_min is not None:
                batch_min = spec.all_reduce.emit(self._nodes, p + "/all_reduce_min", batch_min, "Min")
            batch_max = spec.all_reduce.emit(self._nodes, p + "/all_reduce_max", batch_max, "Max")
        nonnegative = batch_min is None
        if nonnegative:
            # min(batch) >= 0, so min(batch_min, 0) = 0 and max(batch_max, 0)
            # = batch_max: no reduction for the min.
            lo, hi = zero, batch_max
        else:
            # TFLite requires 0 inside every range.
            lo = self._node(p + "/Minimum", "Minimum", [batch_min, zero],
                            T=_FLOAT)
            hi = self._node(p + "/Maximum", "Maximum", [batch_max, zero],
                            T=_FLOAT)
        if spec.symmetric:
            lo, hi = self._symmetric(p, lo, hi, spec.num_bits, spec.narrow_range)
        if spec.moving_average:
            rate = self._ema_rate(float(spec.ema_decay), step if spec.init_from_first_batch
                                  else None)
            lo = self._ema(p + "/AssignMinEma", min_var, lo, rate)
            hi = self._ema(p + "/AssignMaxEma", max_var, hi, rate)
        else:
            lo = self._assign(p + "/AssignMinLast", min_var, lo)
            hi = self._assign(p + "/AssignMaxLast", max_var, hi)
        return lo, hi

    def _batch_range(self, spec, p, x, rank, nonnegative):
        """(batch min or None when `nonnegative`, batch max) of `x`."""
        batch_min = None
        if spec.per_channel and rank == 1:
            batch_min = batch_max = x  # Every element is its own channel.
        elif rank is None:  # Unknown rank (per-tensor only): reduce it flat.
            flat = self._node(p + "/Flatten", "Reshape",
                              [x, self._shared_const("flat_shape", [-1], tf.int32)],
                              T=_FLOAT, Tshape=_INT32)
            axis = self._shared_const("reduction_indices", [0], tf.int32)
            if not nonnegative:
                batch_min = self._node(p + "/BatchMin", "Min", [flat, axis],
                                       T=_FLOAT, Tidx=_INT32)
            batch_max = self._node(p + "/BatchMax", "Max", [flat, axis],
                                   T=_FLOAT, Tidx=_INT32)
        else:
            axes = list(range(rank - 1)) if spec.per_channel else list(range(rank))
            axes_const = self._shared_const("reduction_indices", axes,
                                            tf.int32)
            if not nonnegative:
                batch_min = self._node(p + "/BatchMin", "Min", [x, axes_const],
                                       T=_FLOAT, Tidx=_INT32)
            batch_max = self._node(p + "/BatchMax", "Max", [x, axes_const],
                                   T=_FLOAT, Tidx=_INT32)
        return batch_min, batch_max

    def _ema_rate(self, decay: float, step) -> str:
        """1 - decay; with the step, 1 on its first run (the batch's range)."""
        rate = self._shared_const("ema_rate", 1.0 - decay, tf.float32)
        if step is None:
            return rate
        key = ("first_batch_rate", decay)
        if key not in self._shared:
            scope = self._shared_scope_name()
            step_ref = step if isinstance(step, str) else self._external(step)
            first = self._nodes.node(
                "%s/first_batch_%d" % (scope, len(self._shared)), "Equal",
                [step_ref, self._shared_const("one_step", 1, tf.int64)], T=_INT64)
            self._shared[key] = self._nodes.node(
                "%s/ema_rate_%d" % (scope, len(self._shared)), "Select",
                [first, self._shared_const("full_rate", 1.0, tf.float32), rate], T=_FLOAT)
        return self._shared[key]

    def _symmetric(self, p, lo, hi, num_bits, narrow_range):
        """max = -min * (2^b - 2) / 2^b (-min if narrow), widening one side."""
        if narrow_range:
            ratio = -1.0
        else:
            # Two's complement: the negative side is one step longer.
            ratio = -float((1 << num_bits) - 2) / float(1 << num_bits)
        r = self._shared_const("symmetric_ratio", ratio, tf.float32)
        div = self._node(p + "/symmetric_div", "RealDiv", [hi, r], T=_FLOAT)
        mul = self._node(p + "/symmetric_mul", "Mul", [lo, r], T=_FLOAT)
        new_lo = self._node(p + "/SymmetricMin", "Minimum", [lo, div], T=_FLOAT)
        new_hi = self._node(p + "/SymmetricMax", "Maximum", [hi, mul], T=_FLOAT)
        return new_lo, new_hi

    def _ema(self, scope, var, value, rate):
        # The variable's snapshot read is the value before the update: the
        # update's data dependency on it orders the two.
        read = var + "/Read/ReadVariableOp"
        sub = self._node(scope + "/sub", "Sub", [read, value], T=_FLOAT)
        delta = self._node(scope + "/mul", "Mul", [sub, rate], T=_FLOAT)
        assign = self._var_node(scope + "/AssignSubVariableOp",
                                "AssignSubVariableOp", [var, delta], dtype=_FLOAT)
        return self._var_node(scope + "/ReadVariableOp_1", "ReadVariableOp",
                              [var], control=[assign], dtype=_FLOAT)

    def _assign(self, scope, var, value):
        assign = self._var_node(scope, "AssignVariableOp", [var, value],
                                dtype=_FLOAT)
        return self._var_node(scope + "/ReadVariableOp", "ReadVariableOp",
                              [var], control=[assign], dtype=_FLOAT)
