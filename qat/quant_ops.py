"""Quantizers: the FakeQuant ops and the range variables that feed them.

Two quantizers, as in `tf.contrib.quantize`:

* last value (weights): the range is this run's min and max of the tensor,
  widened to include 0, narrow range by default;
* moving average (activations): an exponential moving average of the batch
  min and max, not narrow.

Each quantizer owns two non-trainable variables `<prefix>/min` and
`<prefix>/max` (scalars, or vectors of the last dimension when per-channel) in
GLOBAL_VARIABLES and MOVING_AVERAGE_VARIABLES. In a training graph assign ops
update them and their results feed the FakeQuant; in an eval graph the same
FakeQuant op reads the variables and nothing updates them.

The moving average is a plain one, `v -= (1 - decay) * (v - x)`, not the
zero-debiased one contrib used: zero-debiasing added hidden `.../biased` and
`.../local_step` variables that made float checkpoints fail to restore
(tensorflow#26664, #20867). With the ranges initialised to sensible values
([0, 6] or [-6, 6]) debiasing is not needed.
"""
from typing import Optional, Sequence

import tensorflow as tf

from qat import step_counter

# Name of the FakeQuant op inside each quantizer's scope (contrib's names).
FAKE_QUANT_NAME = "FakeQuantWithMinMaxVars"
FAKE_QUANT_TYPES = frozenset(
    ["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel"])
MIN_NUM_BITS = 2
MAX_NUM_BITS = 16


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


def _range_variable(graph: tf.Graph, name: str, shape: Sequence[int],
                    init: float, collections: Sequence[str]) -> tf.Variable:
    """Creates one non-trainable float range variable named `name`."""
    # Created with tf.Variable in an absolute name scope rather than
    # get_variable, so the user's current variable scope cannot change names.
    return tf.compat.v1.Variable(
        initial_value=lambda: tf.fill(shape, tf.constant(init, tf.float32)),
        name=name,
        trainable=False,
        dtype=tf.float32,
        collections=list(collections),
        use_resource=True)


def _variables(graph, prefix, shape, init_min, init_max, vars_collection):
    collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
    if vars_collection:
        collections.append(vars_collection)
    with graph.name_scope(prefix + "/"):
        min_var = _range_variable(graph, "min", shape, init_min, collections)
        max_var = _range_variable(graph, "max", shape, init_max, collections)
    return min_var, max_var


def _channel_shape(inputs: tf.Tensor, per_channel: bool, name: str):
    """Returns (variable shape, reduction axes) for a quantized tensor."""
    rank = inputs.shape.rank
    if not per_channel:
        return [], None
    if rank not in (1, 2, 3, 4) or inputs.shape[-1] is None:
        raise ValueError(
            f"Per-channel quantization of '{name}' needs a tensor of rank 1 to 4 "
            f"with a known last dimension, got shape {inputs.shape}.")
    return [int(inputs.shape[-1])], list(range(rank - 1))


def _symmetric_range(range_min, range_max, num_bits, narrow_range):
    """Makes a range symmetric: max = -min * (2^b - 2) / 2^b (-min if narrow)."""
    if narrow_range:
        ratio = -1.0
    else:
        # Two's complement: the negative side is one step longer.
        ratio = -float((1 << num_bits) - 2) / float(1 << num_bits)
    new_min = tf.minimum(range_min, range_max / ratio)
    new_max = tf.maximum(range_max, range_min * ratio)
    return new_min, new_max


def _fake_quant(inputs, min_value, max_value, per_channel, num_bits,
                narrow_range):
    if per_channel:
        return tf.quantization.fake_quant_with_min_max_vars_per_channel(
            inputs, min_value, max_value, num_bits=num_bits,
            narrow_range=narrow_range, name=FAKE_QUANT_NAME)
    return tf.quantization.fake_quant_with_min_max_vars(
        inputs, min_value, max_value, num_bits=num_bits,
        narrow_range=narrow_range, name=FAKE_QUANT_NAME)


def _batch_range(inputs, axes):
    if axes is not None and not axes:
        # Rank 1 per-channel: every element is its own channel.
        return inputs, inputs
    batch_min = tf.reduce_min(inputs, axis=axes, name="BatchMin")
    batch_max = tf.reduce_max(inputs, axis=axes, name="BatchMax")
    return batch_min, batch_max


def last_value_quantize(inputs: tf.Tensor,
                        prefix: str,
                        is_training: bool = True,
                        num_bits: int = 8,
                        per_channel: bool = False,
                        narrow_range: bool = True,
                        symmetric: bool = False,
                        init_min: float = -6.0,
                        init_max: float = 6.0,
                        vars_collection: Optional[str] = (
                            tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES),
                        ) -> tf.Tensor:
    """Quantizes `inputs` with the range of its current value (weights).

    Args:
      inputs: float tensor to quantize.
      prefix: absolute name scope, e.g. `net/conv1/weights_quant`; the
        variables are `<prefix>/min` and `<prefix>/max`.
      is_training: when True the variables are assigned this run's range
        (widened to include 0) and the assigned values feed the FakeQuant;
        when False the FakeQuant reads the variables.
      num_bits: bit width, 2..16.
      per_channel: one range per index of the last dimension.
      narrow_range: quantize to [1, 2^b - 1] instead of [0, 2^b - 1].
      symmetric: make the range symmetric around 0.
      init_min: initial value of the min variable.
      init_max: initial value of the max variable.
      vars_collection: extra collection for the variables (None: none).

    Returns:
      The FakeQuant output tensor.

    Raises:
      ValueError: on a bad bit width or a per-channel tensor of bad shape.
    """
    validate_num_bits(num_bits)
    graph = inputs.graph
    shape, axes = _channel_shape(inputs, per_channel, inputs.name)
    with graph.as_default(), graph.control_dependencies(None):
        min_var, max_var = _variables(graph, prefix, shape, init_min,
                                      init_max, vars_collection)
        with graph.name_scope(prefix + "/"):
            if not is_training:
                return _fake_quant(inputs, min_var, max_var, per_channel,
                                   num_bits, narrow_range)
            batch_min, batch_max = _batch_range(inputs, axes)
            # TFLite requires 0 inside every range.
            batch_min = tf.minimum(batch_min, 0.0)
            batch_max = tf.maximum(batch_max, 0.0)
            if symmetric:
                batch_min, batch_max = _symmetric_range(
                    batch_min, batch_max, num_bits, narrow_range)
            assign_min = tf.compat.v1.assign(min_var, batch_min,
                                             name="AssignMinLast")
            assign_max = tf.compat.v1.assign(max_var, batch_max,
                                             name="AssignMaxLast")
            return _fake_quant(inputs, assign_min, assign_max, per_channel,
                               num_bits, narrow_range)


def moving_avg_quantize(inputs: tf.Tensor,
                        prefix: str,
                        is_training: bool = True,
                        num_bits: int = 8,
                        per_channel: bool = False,
                        narrow_range: bool = False,
                        symmetric: bool = False,
                        ema_decay: float = 0.999,
                        init_min: float = -6.0,
                        init_max: float = 6.0,
                        vars_collection: Optional[str] = (
                            tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES),
                        ) -> tf.Tensor:
    """Quantizes `inputs` with a moving average of its range (activations).

    The update is `v <- v - (1 - ema_decay) * (v - batch_value)`, without
    zero-debiasing (no hidden variables; see the module docstring).

    Args:
      inputs: float tensor to quantize.
      prefix: absolute name scope, e.g. `net/conv1/act_quant`.
      is_training: when True the moving averages are updated and their new
        values feed the FakeQuant; when False the FakeQuant reads them.
      num_bits: bit width, 2..16.
      per_channel: one range per index of the last dimension.
      narrow_range: quantize to [1, 2^b - 1] instead of [0, 2^b - 1].
      symmetric: make the batch range symmetric around 0 before averaging.
      ema_decay: decay of the moving average, in [0, 1].
      init_min: initial value of the min variable.
      init_max: initial value of the max variable.
      vars_collection: extra collection for the variables (None: none).

    Returns:
      The FakeQuant output tensor.

    Raises:
      ValueError: on a bad bit width, decay or per-channel shape.
    """
    validate_num_bits(num_bits)
    if not 0.0 <= float(ema_decay) <= 1.0:
        raise ValueError(f"ema_decay must be in [0, 1], got {ema_decay!r}.")
    graph = inputs.graph
    shape, axes = _channel_shape(inputs, per_channel, inputs.name)
    with graph.as_default(), graph.control_dependencies(None):
        min_var, max_var = _variables(graph, prefix, shape, init_min,
                                      init_max, vars_collection)
        with graph.name_scope(prefix + "/"):
            if not is_training:
                return _fake_quant(inputs, min_var, max_var, per_channel,
                                   num_bits, narrow_range)
            batch_min, batch_max = _batch_range(inputs, axes)
            batch_min = tf.minimum(batch_min, 0.0)
            batch_max = tf.maximum(batch_max, 0.0)
            if symmetric:
                batch_min, batch_max = _symmetric_range(
                    batch_min, batch_max, num_bits, narrow_range)
            rate = tf.constant(1.0 - float(ema_decay), tf.float32,
                               name="ema_rate")
            with graph.name_scope("AssignMinEma"):
                assign_min = tf.compat.v1.assign_sub(
                    min_var, (min_var.read_value() - batch_min) * rate)
            with graph.name_scope("AssignMaxEma"):
                assign_max = tf.compat.v1.assign_sub(
                    max_var, (max_var.read_value() - batch_max) * rate)
            return _fake_quant(inputs, assign_min, assign_max, per_channel,
                               num_bits, narrow_range)


def delay_quantization(quantized: tf.Tensor, inputs: tf.Tensor,
                       quant_delay: Optional[int], prefix: str) -> tf.Tensor:
    """Uses `quantized` only once the quantization step reaches the delay.

    Both branches are computed (a Select, not a cond), so the range variables
    keep learning during the delay.

    Args:
      quantized: the FakeQuant output.
      inputs: the float tensor it quantizes.
      quant_delay: steps before quantization takes effect; None or 0: no delay.
      prefix: absolute name scope of the quantizer.

    Returns:
      `quantized` itself when there is no delay, else the Select output.
    """
    if not quant_delay:
        return quantized
    graph = quantized.graph
    step = step_counter.get_or_create_quantization_step(graph)
    with graph.as_default(), graph.control_dependencies(None):
        with graph.name_scope(prefix + "/"):
            active = tf.greater_equal(
                step, tf.constant(int(quant_delay), tf.int64),
                name="activate_quant")
            return tf.where(active, quantized, inputs, name="delayed_quant")
