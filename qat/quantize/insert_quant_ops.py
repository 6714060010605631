"""The insert_quant_ops pass: FakeQuant ops on weights and activations.

The pass first plans every quantizer on the unchanged graph
(`qat.quantize.plan`, so a bad input leaves the graph untouched), then builds
them all with one GraphDef import (`quantizer_batch.QuantizerBatch`) and reroutes
the consumers with `qat.graph_editor.reroute_ts`.

What gets a range (names as in `tf.contrib.quantize`; ctx is the scope of the
layer op, `net/conv1` for `net/conv1/Conv2D`):

* the weights of every Conv2D, MatMul, DepthwiseConv2dNative and transposed
  conv (Conv2DBackpropInput), once even if several layers share them (one
  variable read by several ops counts as one): `<ctx>/weights_quant` (last
  value, narrow range);
* the layer output after its activation (Relu, Relu6, Identity, LeakyRelu):
  `<ctx>/act_quant`; without activation, the layer output itself (final
  layers, the depthwise half of a separable conv): `<ctx>/act_quant`;
* a layer output feeding a residual add: `<ctx>/conv_quant`; the add output:
  `<add ctx>/add_quant`, or `<add ctx>/act_quant` after its activation, or
  `<add ctx>/post_activation_bypass_quant` when the add follows the
  activation;
* batch norms that follow no layer (input normalisation, after a concat or
  an add): `<bn ctx>/bn_quant` on the output, or `<bn ctx>/act_quant` after
  its activation, and a range on the input; in eval graphs the batch norm is
  replaced by the equal 1x1 depthwise conv TFLite runs in integer
  (`qat.quantize.standalone_batch_norm`);
* what contrib missed and TFLite needs for a fully integer model: concat
  outputs (`concat_quant`), global average pooling Mean outputs
  (`mean_quant`), residual adds of plain activations (`add_quant`) - each only
  when its inputs have ranges, so loss arithmetic is left alone - and the
  graph input that feeds a layer (`input_quant`; `output_quant` for another
  unquantized producer, e.g. outside `scope`), each under the scope of the op
  producing the tensor.

A layer output nothing consumes yet (a fetched final layer) still gets its
`act_quant`, reading it and feeding nothing (a warning names it): export that
FakeQuant's output. A final layer ending in an Identity nothing reads
(`tf.identity(logits, name="output")`) gets its `act_quant` before the
Identity, which then outputs the quantized value under the user's name.

Layers are found with `qat.matching.layer_patterns`; the pass then walks forward from
each layer op through its "tail" (bias add, batch norm, the fold pass's
training tail of divide-by-scale, batch norm and Select) to the activation or
residual add. An op joins a layer's tail only if all its data inputs come from
that tail, which is what tells a bias add (parameter operand) from a residual
add (data operand). Gradient ops - those `tf.gradients` built (they record
their forward op), gradient kernels, and everything downstream of them - never
get FakeQuant ops and keep reading float tensors.
"""
from typing import List, Optional

from absl import logging
import tensorflow as tf

from qat.quantize import quantizer_batch
from qat.quantize import patterns as qp
from qat.quantize import standalone_batch_norm
from qat.engine import placement as placement_lib
from qat.engine import step_counter
from qat.graph_editor import reroute
from qat.quantize.plan import Plan
from qat.quantize.plan import Planner
from qat.quantize.plan import existing_quantizer  # pylint: disable=unused-import
from qat.quantize.plan import is_quantized_output  # pylint: disable=unused-import


def _reroute(new: tf.Tensor, old: tf.Tensor, consumers) -> None:
    if consumers:
        reroute.reroute_ts(new, old, can_modify=consumers)


def _spec(plan: Plan, is_training: bool, weight_bits: int,
          activation_bits: int, symmetric: bool, ema_decay: float,
          quant_delay: Optional[int], vars_collection: Optional[str],
          symmetric_weights: bool = False,
          placement: Optional[placement_lib.Placement] = None,
          ) -> quantizer_batch.QuantizerSpec:
    t = plan.tensor
    layers = plan.consumers + plan.weight_sharers
    placement = placement or placement_lib.Placement(t.graph)
    reshape = None
    if (plan.is_weight and plan.per_channel and t.shape.rank == 4
            and any(c.type == "DepthwiseConv2dNative" for c in plan.consumers)):
        # Depthwise filters [h, w, in, mult]: one range per output channel
        # (in * mult), the last axis of TFLite's layout.
        h, w, cin, mult = t.shape.as_list()
        reshape = [h, w, cin * mult]
    return quantizer_batch.QuantizerSpec(
        inputs=t, prefix=plan.prefix, moving_average=not plan.is_weight,
        is_training=is_training,
        num_bits=weight_bits if plan.is_weight else activation_bits,
        narrow_range=plan.is_weight,
        # Narrow and symmetric weights: [-a, a] on [-127, 127], zero point 0
        # in int8, as the int8 TFLite kernels require.
        symmetric=symmetric or (plan.is_weight and symmetric_weights),
        per_channel=plan.per_channel, ema_decay=ema_decay,
        init_min=plan.init_min, init_max=6.0, quant_delay=quant_delay,
        vars_collection=vars_collection, channel_reshape=reshape,
        nonnegative=t.op.type in ("Relu", "Relu6"),
        device=placement.compute_device(t, layers if plan.is_weight else ()),
        variable_device=placement.variable_device(t, layers))


def insert_quant_ops(graph: Optional[tf.Graph] = None,
                     is_training: bool = True,
                     weight_bits: int = 8,
                     activation_bits: int = 8,
                     symmetric: bool = False,
                     per_channel: bool = False,
                     ema_decay: float = 0.999,
                     quant_delay: Optional[int] = None,
                     scope: Optional[str] = None,
                     vars_collection: Optional[str] = (
                         tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES),
                     symmetric_weights: bool = False,
                     ) -> List[str]:
    """Inserts FakeQuant ops into `graph` in place (see the module docstring).

    Run after `fold_batch_norms` and before the optimizer's `minimize()`.
    Running it again on a rewritten graph changes nothing.

    Args:
      graph: the graph to rewrite; the default graph when None.
      is_training: True for a training graph (range variables are updated),
        False for an eval graph (FakeQuant ops read the variables).
      weight_bits: bit width of weights, 2..16.
      activation_bits: bit width of activations, 2..16.
      symmetric: symmetric ranges for weights and activations.
      per_channel: one weight range per output channel.
      ema_decay: decay of the activation range moving averages.
      quant_delay: FakeQuant outputs are used once the quantization step
        reaches this many steps; None or 0: from the start.
      scope: only quantize layers (and other ops) whose name starts with it.
      vars_collection: extra collection for the range variables.
      symmetric_weights: symmetric (narrow-range) weight ranges even when
        `symmetric` is False: int8 weights get a zero point of 0, which the
        int8 TFLite kernels require; activation ranges stay as `symmetric`
        says (asymmetric by default, no bit wasted after a ReLU).

    Returns:
      The name prefixes of the quantizers created.

    Raises:
      ValueError: on bad arguments, or if the graph already has optimizer
        update ops. The graph is left unchanged.
      RuntimeError: if the graph is finalized.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    quantizer_batch.validate_num_bits(weight_bits, "weight_bits")
    quantizer_batch.validate_num_bits(activation_bits, "activation_bits")
    if not isinstance(symmetric_weights, bool):
        raise ValueError("symmetric_weights must be a bool, got "
                         f"{symmetric_weights!r}.")
    if not 0.0 <= float(ema_decay) <= 1.0:
        raise ValueError(f"ema_decay must be in [0, 1], got {ema_decay!r}.")
    if quant_delay is not None and (isinstance(quant_delay, bool) or
                                    not isinstance(quant_delay, int) or
                                    quant_delay < 0):
        raise ValueError(
            f"quant_delay must be None or a non-negative int, got {quant_delay!r}.")
    if scope is not None and not isinstance(scope, str):
        raise ValueError(f"scope must be a string or None, got {scope!r}.")
    if graph.finalized:
        raise RuntimeError(
            "The graph is finalized (a Session or MonitoredSession finalized "
            "it): insert quant ops before creating the session.")
    check_no_optimizer_ops(graph)
    planner = Planner(graph, is_training, scope, per_channel)
    plans = planner.run()
    if not plans:
        return []
    batch = quantizer_batch.QuantizerBatch(graph)
    placement = placement_lib.Placement(graph)
    specs = [_spec(plan, is_training, weight_bits, activation_bits, symmetric,
                   ema_decay, quant_delay, vars_collection, symmetric_weights,
                   placement)
             for plan in plans]
    for spec in specs:
        spec.validate()
    step = None
    if quant_delay:
        step = step_counter.get_or_create_quantization_step(graph)
    for spec in specs:
        batch.add(spec, step)
    outputs = batch.build()
    for plan, out in zip(plans, outputs):
        _reroute(out, plan.tensor, plan.consumers)
        for layer in plan.weight_sharers:
            _reroute(out, layer.inputs[1], [layer])
        if not plan.consumers and not plan.weight_sharers:
            _warn_unconsumed(plan.tensor, out)
    if not is_training:
        for bn in planner.standalone_bns:
            standalone_batch_norm.replace_with_depthwise(bn, per_channel)
    return [plan.prefix for plan in plans]


def _warn_unconsumed(tensor: tf.Tensor, quantized: tf.Tensor) -> None:
    logging.warning(
        "qat: nothing reads '%s' yet, so its quantized value '%s' feeds "
        "nothing. In a training graph, call the rewrite after building the "
        "loss (and before the optimizer), so the loss reads the quantized "
        "value and its range is trained. If '%s' is a model output you fetch "
        "or export, fetch or export '%s' instead (or end the model with "
        "tf.identity(..., name=...) and fetch that: the rewrite feeds it the "
        "quantized value).", tensor.name, quantized.name, tensor.name,
        quantized.name)


def check_no_optimizer_ops(graph: tf.Graph) -> None:
    """Raises ValueError if `graph` has optimizer update ops.

    Raises:
      ValueError: naming the first optimizer op found.
    """
    for op in graph.get_operations():
        if qp.is_optimizer_op(op):
            raise ValueError(
                f"The graph already has optimizer update ops (e.g. '{op.name}', "
                f"{op.type}): the quantization rewrite must come before "
                "`optimizer.minimize()` / `apply_gradients()`. Build the model, "
                "call qat's create_*_graph, then add the optimizer.")
