"""contrib's quant_ops: one quantizer at a time, and the quantization delay.

`last_value_quantize` (weights) and `moving_avg_quantize` (activations) build
a single quantizer with `qat.quantize.emit.quantizer_batch`, which describes the two
quantizers, their variables and the ops they add; the passes use its
`QuantizerBatch` directly to build all of a graph's quantizers at once.
"""
from typing import Optional

import tensorflow as tf

from qat.quantize.emit import fake_quant_gradient
from qat.quantize.emit import quantizer_batch
from qat.engine import step_counter

_DEFAULT_COLLECTION = quantizer_batch.DEFAULT_VARS_COLLECTION


def _single(spec: quantizer_batch.QuantizerSpec) -> tf.Tensor:
    batch = quantizer_batch.QuantizerBatch(spec.inputs.graph)
    step = None
    if spec.quant_delay:
        step = step_counter.get_or_create_quantization_step(spec.inputs.graph)
    batch.add(spec, step)
    return batch.build()[0]


def last_value_quantize(inputs: tf.Tensor,
                        prefix: str,
                        is_training: bool = True,
                        num_bits: int = 8,
                        per_channel: bool = False,
                        narrow_range: bool = True,
                        symmetric: bool = False,
                        init_min: float = -6.0,
                        init_max: float = 6.0,
                        vars_collection: Optional[str] = _DEFAULT_COLLECTION,
                        ) -> tf.Tensor:
    """Quantizes `inputs` with the range of its current value (weights).

    Args:
      inputs: float tensor to quantize.
      prefix: absolute name scope, e.g. `net/conv1/weights_quant`; the
        variables are `<prefix>/min` and `<prefix>/max`.
      is_training: when True the variables are assigned this run's range
        (widened to include 0) and the assigned values feed the FakeQuant;
        when False the FakeQuant reads the variables.
      num_bits: bit width, 2..16 (FakeQuant's range; TFLite's integer kernels run 4, 8 and 16).
      per_channel: one range per index of the last dimension.
      narrow_range: quantize to [1, 2^b - 1] instead of [0, 2^b - 1].
      symmetric: make the range symmetric around 0.
      init_min: initial value of the min variable.
      init_max: initial value of the max variable.
      vars_collection: extra collection for the variables (None: none).

    Returns:
      The FakeQuant output tensor.

    Raises:
      ValueError: on a bad bit width, a per-channel tensor of bad shape or a
        name already taken.
    """
    return _single(quantizer_batch.QuantizerSpec(
        inputs, prefix, moving_average=False, is_training=is_training,
        num_bits=num_bits, narrow_range=narrow_range, symmetric=symmetric,
        per_channel=per_channel, init_min=init_min, init_max=init_max,
        vars_collection=vars_collection))


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
                        vars_collection: Optional[str] = _DEFAULT_COLLECTION,
                        ) -> tf.Tensor:
    """Quantizes `inputs` with a moving average of its range (activations).

    The update is `v <- v - (1 - ema_decay) * (v - batch_value)` from
    `init_min` / `init_max`: the arguments keep their plain meaning and no
    step counter is needed. (The graph rewrites' quantizers correct this
    average's bias with the shared step counter instead; see
    `quantizer_spec.QuantizerSpec.init_from_first_batch`.)

    Args:
      inputs: float tensor to quantize.
      prefix: absolute name scope, e.g. `net/conv1/act_quant`.
      is_training: when True the moving averages are updated and their new
        values feed the FakeQuant; when False the FakeQuant reads them.
      num_bits: bit width, 2..16 (FakeQuant's range; TFLite's integer kernels run 4, 8 and 16).
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
      ValueError: on a bad bit width, decay, per-channel shape or a name
        already taken.
    """
    return _single(quantizer_batch.QuantizerSpec(
        inputs, prefix, moving_average=True, is_training=is_training,
        num_bits=num_bits, narrow_range=narrow_range, symmetric=symmetric,
        per_channel=per_channel, ema_decay=ema_decay, init_min=init_min,
        init_max=init_max, vars_collection=vars_collection))


def delay_quantization(quantized: tf.Tensor, inputs: tf.Tensor,
                       quant_delay: Optional[int], prefix: str) -> tf.Tensor:
    """Uses `quantized` only once the quantization step reaches the delay.

    Both branches are computed (a Select, not a cond), so the range variables
    keep learning during the delay. (`quantizer_batch.QuantizerBatch` builds the same ops
    itself from `quantizer_batch.QuantizerSpec.quant_delay`.)

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
    override = {}
    if fake_quant_gradient.has_input_only_gradient(quantized.op):
        override = {"Select": fake_quant_gradient.DELAYED_GRADIENT_OP_TYPE}
    with graph.as_default(), graph.control_dependencies(None), \
            graph.gradient_override_map(override):
        with graph.name_scope(prefix + "/"):
            active = tf.greater_equal(
                step, tf.constant(int(quant_delay), tf.int64),
                name="activate_quant")
            return tf.compat.v1.where(active, quantized, inputs,
                                      name="delayed_quant")
