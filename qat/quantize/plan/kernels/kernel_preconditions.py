"""TFLite's integer kernels' preconditions on scales, declared as data.

Some of TFLite's 8-bit kernels refuse scales at Prepare time, or abort the
process, or the converter silently saturates a value, when the ranges they
read and write are too far apart. Training can produce such ranges (an
h-swish whose inputs are mostly below -3 learns a tiny output range next to a
wide input range). Each entry of `PRECONDITIONS` declares one condition: the
TFLite op, qat's op kinds it applies to, the flavours, the range it
constrains (an op's output, or a layer's input for the int32 bias), what
that range is relative to, the formula in scales, the margin qat keeps, and
the check in TFLite's source (LiteRT `tflite/kernels/*.cc`, read at
ai-edge-litert 2.3.0; HEAD's line numbers, the wheel reports HARD_SWISH's at
activations.cc:289).

With s a scale (s = W / (2^b - 1) for a b-bit activation range of width W;
W / (2^b - 2) for narrow-range weights) the forms are:

  RATIO    s_out > constant * max(s_in)
  SQUARE   s_out > constant * max(s_in)^2
  PRODUCT  s_out > constant * s_in * max_c(s_w,c)     (a layer's output)
  BIAS     s_in  > constant * max_c(|b_c| / s_w,c)   (a layer's int32 bias)
  MINIMUM  s_out > constant

The planner attaches to each plan the preconditions that constrain it
(`qat.quantize.plan.kernels.kernel_requirements`), the emitter enforces them where
the range is learnt (`qat.quantize.emit.range_updates`: after the moving
average, the range is widened to `margin` times the bound), and
`qat.export.kernel_checks` checks a frozen graph against the same table
before converting it (for checkpoints written before the floors existed).

`NO_PRECONDITION` lists the integer kernels of the ops qat ranges that put no
condition on scales at Prepare time, with what was read, so that the table
is complete for every op kind qat gives a range.
"""
import dataclasses
from typing import Optional, Tuple

RATIO = "ratio"
SQUARE = "square"
PRODUCT = "product"
BIAS = "bias"
MINIMUM = "minimum"
FORMS = (RATIO, SQUARE, PRODUCT, BIAS, MINIMUM)

# The constrained range.
OUTPUT = "output"
LAYER_INPUT = "layer input"

BOTH_FLAVOURS = ("uint8", "int8")


@dataclasses.dataclass(frozen=True)
class Precondition:
    """One kernel's condition on the scales it reads and writes.

    Attributes:
      name: what the condition is about (messages, node names).
      tflite_ops: the TFLite kernels checking it.
      applies_to: qat's op kinds: TF op types, or a multi-op activation's
        TFLite name (`qat.quantize.plan.ops.activation_patterns`).
      flavours: the flavours whose kernels check it.
      constrained: OUTPUT (the op's output range) or LAYER_INPUT (the range
        of a layer's data input).
      relative_to: what the bound is computed from, in words.
      form: RATIO, SQUARE, BIAS or MINIMUM (module docstring).
      constant: the formula's constant (the kernel's strict bound).
      margin: qat keeps the scale at least `margin` times the bound.
      check: TFLite's check (file:line and condition).
      failure: what happens when it does not hold.
    """
    name: str
    tflite_ops: Tuple[str, ...]
    applies_to: Tuple[str, ...]
    flavours: Tuple[str, ...]
    constrained: str
    relative_to: str
    form: str
    constant: float
    margin: float
    check: str
    failure: str

    @property
    def bound(self) -> float:
        """The constant times the margin: what qat's range update keeps."""
        return self.constant * self.margin

    def formula(self) -> str:
        """The condition in scales, as text."""
        if self.form == RATIO:
            return f"s_out > {_number(self.constant)} * max(s_in)"
        if self.form == SQUARE:
            return f"s_out > {_number(self.constant)} * max(s_in)^2"
        if self.form == PRODUCT:
            return f"s_out > {_number(self.constant)} * s_in * max_c(s_weights_c)"
        if self.form == BIAS:
            return f"s_in > {_number(self.constant)} * max_c(|bias_c| / s_weights_c)"
        return f"s_out > {_number(self.constant)}"


def _number(value: float) -> str:
    for name, exact in (("1/128", 1 / 128), ("2^-19", 2.0 ** -19), ("1/4096", 1 / 4096),
                        ("2^-31", 2.0 ** -31), ("2^-24 / 0.02", 2.0 ** -24 / 0.02)):
        if value == exact:
            return name
    return f"{value:g}"


HARD_SWISH = Precondition(
    name="HARD_SWISH", tflite_ops=("HARD_SWISH",), applies_to=("HARD_SWISH",),
    flavours=BOTH_FLAVOURS, constrained=OUTPUT, relative_to="its input's range",
    form=RATIO, constant=1 / 128, margin=1.01,
    # activations.cc:273-285 HardSwishPrepare: hires_input_scale = (1/128) *
    # input_scale; output_multiplier = hires_input_scale / output_scale;
    # QuantizeMultiplier(output_multiplier, ..., &output_multiplier_exponent);
    # TF_LITE_ENSURE(context, params->output_multiplier_exponent <= 0).
    check="activations.cc:285 (2.3.0 wheel: :289) TF_LITE_ENSURE(params->"
          "output_multiplier_exponent <= 0) on (input_scale / 128) / output_scale",
    failure="Prepare fails: HARD_SWISH failed to prepare")

ADD = Precondition(
    name="ADD", tflite_ops=("ADD",), applies_to=("Add", "AddV2", "BiasAdd"),
    flavours=BOTH_FLAVOURS, constrained=OUTPUT, relative_to="its inputs' ranges",
    form=RATIO, constant=2.0 ** -19, margin=2.0,
    # add.cc:181-199 (8-bit): left_shift = 20; real_output_multiplier =
    # 2 * max(s1, s2) / ((1 << 20) * output_scale);
    # QuantizeMultiplierSmallerThanOneExp -> quantization_util.cc:117.
    check="add.cc:181-199 -> quantization_util.cc:117 TFLITE_CHECK_LT(2 * max(s1, s2) / "
          "(2^20 * s_out), 1.)",
    failure="abort(): the process dies in allocate_tensors()")

SQUARED_DIFFERENCE = Precondition(
    name="SQUARED_DIFFERENCE", tflite_ops=("SQUARED_DIFFERENCE",),
    applies_to=("SquaredDifference",), flavours=("int8",), constrained=OUTPUT,
    relative_to="its inputs' ranges", form=SQUARE, constant=1 / 4096, margin=2.0,
    # squared_difference.cc:107-125: left_shift = 7; real_output_multiplier =
    # (2 * max(s1, s2))^2 / ((1 << 14) * output_scale);
    # QuantizeMultiplierSmallerThanOneExp -> TFLITE_CHECK_LT(., 1.).
    check="squared_difference.cc:114-125 -> quantization_util.cc:117 TFLITE_CHECK_LT("
          "(2 * max(s1, s2))^2 / (2^14 * s_out), 1.)",
    failure="abort(): the process dies in allocate_tensors()")

LAYER_BIAS = Precondition(
    name="int32 bias", tflite_ops=("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED",
                                   "TRANSPOSE_CONV"),
    applies_to=("Conv2D", "DepthwiseConv2dNative", "MatMul", "Conv2DBackpropInput"),
    flavours=BOTH_FLAVOURS, constrained=LAYER_INPUT,
    relative_to="the layer's bias (folded batch norm included) and weight scales",
    form=BIAS, constant=2.0 ** -31, margin=2.0,
    # Not a kernel check: TF 2.21's converter quantizes the bias to int32 at
    # scale s_in * s_w,c and saturates at 2^31 - 1 without a word. The margin
    # is its post-training quantizer's own headroom (kBiasMax = 2^30,
    # tfl_quantization_driver.cc:653-700).
    check="converter: bias_c / (s_in * s_w,c) must fit int32 (saturated silently at "
          "2^31 - 1)",
    failure="wrong outputs, no error")

BIAS_SCALE = Precondition(
    name="bias scale", tflite_ops=("CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV",
                                   "FULLY_CONNECTED"),
    applies_to=("Conv2D", "DepthwiseConv2dNative", "MatMul", "Conv2DBackpropInput"),
    flavours=BOTH_FLAVOURS, constrained=OUTPUT,
    relative_to="the layer's input and weight ranges", form=PRODUCT,
    constant=2.0 ** -24 / 0.02, margin=2.0,
    # kernel_util.cc:271-274 (uint8 per-tensor convs; FULLY_CONNECTED per
    # tensor in both flavours, fully_connected.cc:566-572) -> :319-322:
    # scale_diff = |s_in * s_w - s_bias| (double); TF_LITE_ENSURE(context,
    # scale_diff / output_scale <= 0.02). The converter stores s_bias = s_in *
    # s_w rounded to float32 (relative error up to 2^-24), so the check holds
    # for every rounding when s_in * s_w / s_out <= 0.02 * 2^24 (3.4e5).
    check="kernel_util.cc:319-322 TF_LITE_ENSURE(scale_diff / output_scale <= 0.02), "
          "scale_diff = |s_in * s_w - float32(s_in * s_w)| (uint8 per-tensor layers, "
          "FULLY_CONNECTED with per-tensor weights in both flavours)",
    failure="Prepare fails: CONV_2D failed to prepare")

PRECONDITIONS: Tuple[Precondition, ...] = (
    HARD_SWISH, ADD, SQUARED_DIFFERENCE, LAYER_BIAS, BIAS_SCALE)

# The other integer kernels of ops qat ranges: no condition on scales at
# Prepare time (LiteRT kernels read at ai-edge-litert 2.3.0).
NO_PRECONDITION = {
    "MUL": "mul.cc:125-128 QuantizeMultiplier(s1 * s2 / s_out), no check",
    "SUB": "sub.cc:162-169 takes multipliers above 1 (QuantizeMultiplierGreaterThanOne)",
    "MEAN, SUM": "reduce.cc:470-478 QuantizeMultiplier(s_in / s_out), no check",
    "LEAKY_RELU": "activations.cc:313-320 QuantizeMultiplier only",
    "RELU, RELU6 (own op)": "activations.cc:232-237 QuantizeMultiplier(s_in / s_out)",
    "MAXIMUM, MINIMUM": "run in their input's scale (qat gives them no range of their own)",
    "CONCATENATION": "concatenation.cc:235-237 (int8) equal scales: qat's shared group range",
    "AVERAGE_POOL_2D, MAX_POOL_2D": "pooling.cc:101-103 equal scales, TFLITE_DCHECK only",
    "LOGISTIC, TANH, SOFTMAX, LOG_SOFTMAX": "fixed output grids qat uses as they are; "
                                            "inputs read through a lookup table",
    "GELU": "activations.cc:1626-1660 lookup table, no check",
    "BATCH_MATMUL": "kernel_util.cc:335 input_product_scale >= 0 (always true)",
    "RSQRT": "elementwise.cc:446 (Invoke) input >= its zero point: a nonnegative input",
    "QUANTIZE (requantize), PAD, RESHAPE & co": "no scale check",
    "a fused RELU6 / RELU_N1_TO_1": "kernel_util.cc:343-349 6 / s_out must fit int32 (W_out > "
                                    "7.2e-7): the converter widens every activation range to "
                                    "at least 1e-6",
}


def levels(num_bits: int, narrow_range: bool = False) -> int:
    """Quantization steps of a range: 2^b - 1 (2^b - 2 when narrow)."""
    return (1 << num_bits) - (2 if narrow_range else 1)


def by_name(name: str) -> Optional[Precondition]:
    """The precondition called `name` (`Precondition.name`), or None."""
    for p in PRECONDITIONS:
        if p.name == name:
            return p
    return None
