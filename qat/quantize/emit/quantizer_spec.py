"""What one quantizer is: `QuantizerSpec`, validated before anything is built.

`qat.quantize.emit.quantizer_batch` builds quantizers from these specs.
"""
import dataclasses
from typing import Optional, Sequence, Tuple

import tensorflow as tf

from qat.engine import config as config_lib
from qat.matching import tensors
from qat.quantize.plan.kernels import layer_bias as layer_bias_lib

# Name of the FakeQuant op inside each quantizer's scope (contrib's names).
FAKE_QUANT_NAME = "FakeQuantWithMinMaxVars"
FAKE_QUANT_TYPES = tensors.FAKE_QUANT_TYPES
MIN_NUM_BITS = config_lib.MIN_BITS
MAX_NUM_BITS = config_lib.MAX_BITS
# FakeQuant's own limit: a recipe's 16-bit activations (`qat.engine.recipes`).
FAKE_QUANT_MAX_BITS = 16
DEFAULT_VARS_COLLECTION = tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES
# Mixed precision (`qat.matching.tensors`): float16 and bfloat16 tensors are
# cast to float32 for their FakeQuant and back.
LOW_PRECISION_DTYPES = tensors.LOW_PRECISION_DTYPES
QUANTIZABLE_DTYPES = tensors.QUANTIZABLE_DTYPES


def validate_num_bits(num_bits: int, what: str = "num_bits",
                      low: int = MIN_NUM_BITS,
                      high: int = MAX_NUM_BITS) -> None:
    """Checks a bit width.

    Args:
      num_bits: the bit width to check.
      what: the argument's name, used in the error message.
      low: smallest allowed value.
      high: largest allowed value.

    Raises:
      ValueError: when `num_bits` is not an int in [low, high].
    """
    if (isinstance(num_bits, bool) or not isinstance(num_bits, int)
            or not low <= num_bits <= high):
        raise ValueError(
            f"{what} must be an integer between {low} and {high} "
            f"(FakeQuant supports that range), got {num_bits!r}.")


@dataclasses.dataclass
class RangeInput:
    """A range a width floor reads: a quantizer of the batch, or a FakeQuant's.

    Attributes:
      index: a quantizer of the same batch (added earlier): the range its
        FakeQuant reads, updated this step (or, `before_update`, as the
        variables were before the update).
      tensors: the (min, max) tensors of a FakeQuant already in the graph.
      variables: the (min, max) variables of a quantizer declared but not yet
        built (`QuantizerBatch.declare`), read as before this step's update.
      constant: the (min, max) of a FakeQuantWithMinMaxArgs.
      levels: its quantization steps (2^b - 1; 2^b - 2 when narrow).
      per_channel: min and max are vectors (reduced to their widest scale,
        or per channel for a layer's weights).
      channels: with `per_channel`, their length when known.
      before_update: see `index`.
    """
    index: Optional[int] = None
    tensors: Optional[Tuple[tf.Tensor, tf.Tensor]] = None
    variables: Optional[Tuple[str, str]] = None
    constant: Optional[Tuple[float, float]] = None
    levels: int = 255
    per_channel: bool = False
    channels: Optional[int] = None
    before_update: bool = False


@dataclasses.dataclass
class WidthFloor:
    """A lower bound on a moving-average range's width: a TFLite kernel's precondition.

    `qat.quantize.plan.kernels.kernel_preconditions` declares the forms; with L the
    steps of the floored range, its width must reach `bound * L * X`, X being
    max(s_in) (RATIO), max(s_in)^2 (SQUARE), s_in * max_c(s_w,c) (PRODUCT),
    max_c(|bias_c| / s_w,c) (BIAS) or 1 (MINIMUM), where s = width / levels of
    each `RangeInput`.
    """
    name: str
    form: str
    bound: float
    ranges: Tuple[RangeInput, ...] = ()
    weights: Optional[RangeInput] = None
    bias: Optional["layer_bias_lib.LayerBias"] = None


@dataclasses.dataclass
class QuantizerSpec:
    """One quantizer to build.

    Attributes:
      inputs: the float tensor to quantize.
      prefix: absolute name scope; variables `<prefix>/min|max`.
      moving_average: True for the EMA quantizer (activations), False for the
        last-value one (weights).
      is_training: build the range updates (else read the variables).
      num_bits: bit width.
      narrow_range: quantize to [1, 2^b - 1].
      symmetric: symmetric ranges.
      per_channel: one range per index of the last dimension.
      ema_decay: moving-average decay.
      init_min: initial min.
      init_max: initial max.
      quant_delay: use the FakeQuant output only from this step on.
      vars_collection: extra collection for the variables.
      channel_reshape: reshape `inputs` to this static shape before a
        per-channel FakeQuant, and back after (depthwise filters).
      nonnegative: `inputs` is never negative (a Relu / Relu6 output): the
        batch min is 0 without computing it (one reduction less per step).
      device: device of the compute ops (`qat.engine.placement`).
      variable_device: device of the range variables and the ops reading or
        assigning them; "" lets an active device function decide.
      init_from_first_batch: a moving-average range is the bias-corrected
        average of the batch ranges, rate (1 - decay) / (1 - decay^t) at
        quantization step t: the first batch's min and max at t = 1 (no
        prior such as [-6, 6] squashes small activations), the mean of the
        batches so far early on (a fast-growing range is followed), rate
        1 - decay later. False: rate 1 - decay from `init_min` / `init_max`.
      range_of: shared ranges (`qat.quantize.plan.ranges.shared_ranges`): the index, in
        the same batch, of an earlier quantizer whose range this one reads;
        it then owns no variables and updates nothing.
      range_before_update: with `range_of`, in training: read that
        quantizer's variables as they were before this step's update (a
        member of a concatenation's group) instead of what its FakeQuant
        reads. Eval graphs read the variables either way.
      statistics_of: in training, further tensors whose batch min and max
        join this quantizer's in its range update (the other members of a
        concatenation's group).
      fixed_range: a constant (min, max) instead of variables
        (`qat.quantize.plan.ranges.fixed_ranges`): no variables, no updates.
      variables_prefix: the name scope of the range variables when it is not
        `prefix` (a recurrence's range is named after its first step, and
        that step's quantizer, which reads it, takes the same scope).
      floors: in training, lower bounds on the moving-average range's width
        (TFLite kernel preconditions, `qat.quantize.emit.range_floors`),
        applied after the moving average: the assigned range meets them.
      all_reduce: in training, what combines the statistics of this process
        with those of the other workers or replicas (`emit(nodes, scope,
        value, merge_op)`, `qat.quantize.plan.replication`): one call per
        batch, on every combined range's statistics at once.
      combined: in training, the range is shared with other replicas: the
        FakeQuant reads the range moved by this batch's statistics, and the
        variables are assigned once, after the forward, from every
        replica's statistics (`qat.quantize.emit.step_statistics`).
      replica_of: with `combined`, the index, in the same batch, of the
        quantizer owning the variables this replica's range moves.
      earlier_range: a replica's range an earlier call built
        (`qat.distribute.replica_stats.earlier_ranges`): (min, max as its
        FakeQuant reads them, min, max before this step's update).
      earlier_join: with `combined` and `earlier_range`, the earlier call's
        join (`step_statistics`) this quantizer's statistics join.
      gated: in training, the output waits for the batch's combined range
        updates (no combined range's statistics read it).
    """
    inputs: tf.Tensor
    prefix: str
    moving_average: bool
    is_training: bool = True
    num_bits: int = 8
    narrow_range: bool = False
    symmetric: bool = False
    per_channel: bool = False
    ema_decay: float = 0.999
    init_min: float = -6.0
    init_max: float = 6.0
    quant_delay: Optional[int] = None
    vars_collection: Optional[str] = DEFAULT_VARS_COLLECTION
    channel_reshape: Optional[Sequence[int]] = None
    nonnegative: bool = False
    device: str = ""
    variable_device: str = ""
    init_from_first_batch: bool = False
    range_of: Optional[int] = None
    range_before_update: bool = False
    statistics_of: Tuple[tf.Tensor, ...] = ()
    earlier_range: Optional[Tuple[tf.Tensor, ...]] = None
    all_reduce: Optional[object] = None
    fixed_range: Optional[Tuple[float, float]] = None
    floors: Tuple[WidthFloor, ...] = ()
    variables_prefix: Optional[str] = None
    combined: bool = False
    replica_of: Optional[int] = None
    earlier_join: Optional[tf.Operation] = None
    gated: bool = False

    def validate(self) -> None:
        """Raises ValueError for bad settings (before anything is built)."""
        validate_num_bits(self.num_bits, high=FAKE_QUANT_MAX_BITS)
        if not 0.0 <= float(self.ema_decay) <= 1.0:
            raise ValueError(f"ema_decay must be in [0, 1], got {self.ema_decay!r}.")
        if self.inputs.dtype.base_dtype not in QUANTIZABLE_DTYPES:
            raise ValueError(
                f"Cannot quantize '{self.inputs.name}': FakeQuant needs float32 "
                f"(float16 and bfloat16 are cast to float32 and back), got "
                f"{self.inputs.dtype.name}.")
        if self.range_of is not None and self.statistics_of:
            raise ValueError(
                f"'{self.prefix}' reads another quantizer's range: it cannot "
                "have statistics of its own.")
        if self.per_channel:
            shape = (tf.TensorShape(self.channel_reshape)
                     if self.channel_reshape else self.inputs.shape)
            if shape.rank not in (1, 2, 3, 4) or shape[-1] is None:
                raise ValueError(
                    f"Per-channel quantization of '{self.inputs.name}' needs a "
                    "tensor of rank 1 to 4 with a known last dimension, got "
                    f"shape {shape}.")


def low_precision_dtype(t: tf.Tensor) -> Optional[tf.DType]:
    """float16 / bfloat16 for a tensor quantized in float32, else None."""
    dtype = t.dtype.base_dtype
    return dtype if dtype in LOW_PRECISION_DTYPES else None
