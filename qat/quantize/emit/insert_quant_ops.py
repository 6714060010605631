"""The quantize pass's emission: the quantizers a plan asks for, as one checked rewrite.

The planner plans every quantizer on the unchanged graph (`qat.quantize.plan`);
`emit_quantizers` describes all of them (`quantizer_batch.QuantizerBatch`),
the consumers they take over and, in eval graphs, the standalone batch-norm
replacements as one `qat.engine.rewrite.Rewrite`, which is checked before it
is applied: a bad input leaves the graph untouched. `qat.api` wires the pass
(`qat.insert_quant_ops`): layer calls inlined, plan, emission, with replicas
(`qat.distribute`) through the `Replication` hook.

What gets a range, and under which name, is the planner's business: see
`qat.quantize.plan.planner` (tensor-centric rules from TFLite's integer op
requirements, `qat.quantize.plan.ops.op_table`) and docs/what_gets_a_range.md. This
module turns each `Plan` into a `QuantizerSpec` (bit width, symmetry,
per-channel, devices), builds them, and reports the result.

A tensor nothing consumes yet (a fetched final layer) still gets its
quantizer, reading it and feeding nothing (a warning names it): export that
quantizer's output. Layers inside functional control flow, which the pass
cannot edit, are named in `QuantizeResult.left_float` with the workaround.
"""
import dataclasses
from typing import List, Optional

from absl import logging
import tensorflow as tf

from qat.engine import config as config_lib
from qat.engine import function_graphs
from qat.engine import marks
from qat.engine import placement as placement_lib
from qat.engine import preconditions
from qat.engine import recipes
from qat.engine import rewrite as rewrite_lib
from qat.engine import step_counter
from qat.quantize.emit import quantizer_batch
from qat.matching import standalone_batch_norms
from qat.quantize.emit import standalone_batch_norm
from qat.quantize.emit import statistics_packs
from qat.quantize.plan.ranges import fixed_ranges
from qat.quantize.plan.kernels import kernel_preconditions
from qat.quantize.plan import replication as replication_lib
from qat.quantize.plan.planner import Plan
from qat.quantize.plan.planner import PlannedGraph


@dataclasses.dataclass
class Quantizer:
    """One quantizer the pass built.

    Attributes:
      tensor: the float tensor it quantizes.
      output: what the tensor's consumers now read.
      name: its name scope (`<prefix>`: variables `<prefix>/min|max`).
      kind: `weights_quant`, `act_quant`, `conv_quant`, `add_quant`, ...
      bits: its bit width.
      per_channel: one range per output channel.
      symmetric: a symmetric range.
      range_name: the name scope of the variables it reads: `name`, or
        the quantizer whose range it shares (`qat.quantize.plan.ranges.shared_ranges`).
    """
    tensor: tf.Tensor
    output: tf.Tensor
    name: str
    kind: str
    bits: int
    per_channel: bool
    symmetric: bool
    range_name: str = ""


@dataclasses.dataclass
class LeftFloat:
    """A tensor or layer the pass left float, and why."""
    name: str
    reason: str


@dataclasses.dataclass
class QuantizeResult:
    """What `insert_quant_ops` did.

    Attributes:
      quantizers: every quantizer built, in planning order.
      left_float: tensors and layers deliberately left float, with reasons.
      layers: with a recipe, each layer and its precision
        (`qat.quantize.plan.ranges.precisions.Layer`); empty without one.
    """
    quantizers: List[Quantizer]
    left_float: List[LeftFloat]
    layers: List = dataclasses.field(default_factory=list)

    @property
    def names(self) -> List[str]:
        """The quantizers' name scopes."""
        return [q.name for q in self.quantizers]


def _kind(prefix: str) -> str:
    kind = prefix.rsplit("/", 1)[-1]
    base, _, suffix = kind.rpartition("_")
    return base if suffix.isdigit() and base.endswith("quant") else kind


def _spec(plan: Plan, config: config_lib.RewriteConfig,
          placement: placement_lib.Placement) -> quantizer_batch.QuantizerSpec:
    t = plan.tensor
    layers = plan.consumers + plan.weight_sharers
    reshape = None
    if plan.is_weight and plan.per_channel and plan.depthwise and t.shape.rank == 4:
        # Depthwise filters [h, w, in, mult]: one range per output channel
        # (in * mult), the last axis of TFLite's layout.
        h, w, cin, mult = t.shape.as_list()
        reshape = [h, w, cin * mult]
    bits = plan.bits if plan.bits is not None else (  # A recipe's, else the options'.
        config.weight_bits if plan.is_weight else config.activation_bits)
    return quantizer_batch.QuantizerSpec(
        inputs=t, prefix=plan.prefix, moving_average=not plan.is_weight,
        is_training=config.is_training,
        num_bits=bits,
        narrow_range=plan.is_weight,
        # Narrow and symmetric weights: [-a, a] on [-127, 127], zero point 0
        # in int8, as the int8 TFLite kernels require.
        # 16-bit activations on LiteRT's int16 grid [-32768 s, 32767 s], zero point 0.
        symmetric=config.weights_symmetric() if plan.is_weight else config.symmetric or bits == 16,
        per_channel=plan.per_channel, ema_decay=config.ema_decay,
        init_min=plan.init_min, init_max=6.0, quant_delay=config.quant_delay,
        vars_collection=config.vars_collection, channel_reshape=reshape,
        nonnegative=t.op.type in ("Relu", "Relu6"),
        init_from_first_batch=config.is_training,
        device=placement.compute_device(t, layers if plan.is_weight else ()),
        variable_device=placement.variable_device(t, layers),
        # TFLite fixes 8-bit grids only; at other widths the range is learnt.
        fixed_range=plan.fixed if bits == fixed_ranges.FIXED_BITS else None,
        variables_prefix=plan.variables_prefix)


def quantize_record(config: config_lib.RewriteConfig) -> str:
    # The fold's setting is not the quantize pass's business.
    return dataclasses.replace(config, freeze_bn_delay=None).describe()


def emit_quantizers(graph: tf.Graph, config: config_lib.RewriteConfig, planned: PlannedGraph,
                    replication: replication_lib.Replication = replication_lib.SINGLE_MODEL
                    ) -> QuantizeResult:
    """Builds the quantizers `planned` asks for (see the module docstring).

    Args:
      graph: the resolved graph the plan was made on, unchanged since.
      config: the pass's validated configuration.
      planned: `qat.quantize.plan.plan_quantizers(graph, config, replication)`.
      replication: how replicas share ranges (the planner's, again).

    Raises:
      ValueError: an earlier quantize rewrite with other settings;
        qat.engine.rewrite.RewriteError if the new ops fail their checks. The
        graph is then unchanged.
    """
    record = quantize_record(config)
    done = preconditions.check_previous_rewrite(graph, "quantize", record)
    plans = planned.plans
    left_float = [LeftFloat(name, reason) for name, reason in planned.left_float]
    rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
    batch = quantizer_batch.QuantizerBatch(rewrite)
    # Training graphs count steps: delays, and ranges that start from the
    # first batch's.
    step = step_counter.step_for(rewrite) if config.is_training or config.quant_delay else None
    placement = placement_lib.Placement(graph)
    specs = [_spec(plan, config, placement) for plan in plans]
    if config.is_training:
        _combine_replicas(graph, plans, specs, replication)
    indices = {}   # plan position -> quantizer index
    quantized = {}  # tensor -> node its consumers read instead

    position = {id(plan): k for k, plan in enumerate(plans)}

    def depends(k):
        """Plans whose quantizers quantizer `k` reads (shared ranges, a replica's variables)."""
        return [position[id(other)] for other in (plans[k].shared, plans[k].replica_of)
                if other is not None]

    adding = set()  # Quantizers being added (their floors' ranges first).

    def add(k, input_ref=None):
        if k in indices:
            return
        plan = plans[k]
        spec = specs[k]
        adding.add(k)
        for j in depends(k):  # The plan whose range (variables) this one reads.
            add(j)
        if plan.shared is not None:
            spec.range_of = indices[position[id(plan.shared)]]
            spec.range_before_update = plan.before_update
        if plan.replica_of is not None:
            spec.replica_of = indices[position[id(plan.replica_of)]]
        if config.is_training and plan.requirements:
            # The ranges its kernel floors read are built first; those read as
            # before the update (`lagged`) only need their variables.
            for j in _floor_plans(plan, position):
                if j not in adding:
                    add(j)
            spec.floors = tuple(_floors(plan, position, specs, indices, batch))
        adding.discard(k)
        spec.statistics_of = tuple(plan.members)
        spec.earlier_range = plan.earlier  # A replica's range from an earlier call.
        indices[k] = batch.add(spec, step, input_ref=input_ref)
        out = batch.output(indices[k])
        quantized[plan.tensor] = out
        guarded = [c for c in plan.consumers if c.type in _GUARDED_TYPES] if config.is_training else []
        rewrite.reroute_consumers(plan.tensor, out, [c for c in plan.consumers if c not in guarded])
        if guarded:
            guard = _zero_guard(rewrite.nodes, plan.tensor, out, batch.prefix(indices[k]))
            rewrite.reroute_consumers(plan.tensor, guard, guarded)
        for layer in plan.weight_sharers:
            rewrite.reroute(layer, 1, out)

    # In eval graphs a standalone batch norm becomes a 1x1 depthwise conv
    # reading its (quantized) input; the quantizer of its output and its
    # other consumers read the conv.
    standalone = [] if config.is_training else list(planned.standalone_bns)
    bn_outputs = {bn.outputs[0] for bn in standalone}

    def reads_bn_output(k):
        return plans[k].tensor in bn_outputs or any(
            reads_bn_output(j) for j in depends(k))

    for k, plan in enumerate(plans):
        if not reads_bn_output(k):
            add(k)
    for bn in standalone:
        out = bn.outputs[0]
        x = standalone_batch_norms.normalised_input(bn)
        x_ref = (quantized[x], x.dtype, x.shape) if x in quantized else None
        new = standalone_batch_norm.add_depthwise(
            rewrite, bn, config.conv_weights_per_channel(), x_ref)
        if new is None:
            continue
        rerouted = set()
        for k, plan in enumerate(plans):
            if plan.tensor is out:
                add(k, input_ref=new)
                rerouted.update(plan.consumers)
        rewrite.reroute_consumers(out, new, [c for c in out.consumers() if c not in rerouted])
    for k, plan in enumerate(plans):
        if k not in indices:
            add(k)  # A standalone batch norm that keeps its float form.
    if config.is_training:
        replication.join_statistics(rewrite, plans)
    batch.finish()
    if not done:
        rewrite.add_to_collection(preconditions.REWRITES_COLLECTION,
                                  preconditions.record_rewrite("quantize", record))
        for layer in planned.layers:  # What `qat.export` holds the model to.
            if layer.precision.keep_float:
                rewrite.add_to_collection(recipes.FLOAT_LAYERS_COLLECTION, layer.info.name)
    ops = rewrite_lib.apply(rewrite)
    quantizers = []
    for k, (plan, spec) in enumerate(zip(plans, specs)):
        out = rewrite.nodes.tensor(ops, batch.output(indices[k]))
        quantizers.append(Quantizer(
            tensor=plan.tensor, output=out, name=batch.prefix(indices[k]),
            kind=_kind(plan.prefix), bits=spec.num_bits,
            per_channel=spec.per_channel, symmetric=spec.symmetric,
            range_name=batch.range_prefix(indices[k])))
        if not plan.consumers and not plan.weight_sharers:
            _warn_unconsumed(plan.tensor, out)
    for item in left_float:
        logging.warning("qat: left float: %s (%s)", item.name, item.reason)
    return QuantizeResult(quantizers=quantizers, left_float=left_float,
                          layers=list(planned.layers))


def _combine_replicas(graph: tf.Graph, plans: List[Plan], specs, replication) -> None:
    """Marks the training ranges replicas share as combined once per step.

    Shared with the replicas in this graph (`Plan.replica_of`), with later
    calls' replicas (`Replication.joins_later_replicas`), with an earlier
    call's replica (`Plan.earlier_join`), or across processes
    (`Replication.all_reduce`): see `qat.quantize.emit.step_statistics`.
    """
    all_reduce = replication.all_reduce()
    joinable = replication.joins_later_replicas()
    replicated = {id(plan.replica_of) for plan in plans if plan.replica_of is not None}
    combined = []
    for plan, spec in zip(plans, specs):
        learns = plan.shared is None and plan.fixed is None and (
            plan.earlier is None or plan.earlier_join is not None)
        spec.all_reduce = all_reduce  # Ranges equal on every worker / replica.
        spec.combined = learns and (all_reduce is not None or joinable or id(plan) in replicated
                                    or plan.replica_of is not None or plan.earlier is not None)
        spec.earlier_join = plan.earlier_join
        combined.append(spec.combined)
    owned = any(c and plan.earlier is None for plan, c in zip(plans, combined))
    # A tf.function runs every update; a graph runs what a fetch needs.
    if owned and not function_graphs.is_function_graph(graph):
        for k in statistics_packs.gated_plans(plans, combined):
            specs[k].gated = True


def _floor_plans(plan: Plan, position) -> List[int]:
    """Positions of the plans whose updated ranges `plan`'s kernel floors read."""
    return [position[id(s)] for req in plan.requirements if not req.lagged
            for s in req.sources() if not isinstance(s, tf.Operation)]


def _range_input(source, position, specs, indices, lagged: bool, batch
                 ) -> Optional[quantizer_batch.RangeInput]:
    """A floor's `RangeInput` for a plan (built already) or a FakeQuant op."""
    if isinstance(source, tf.Operation):
        bits, narrow = int(source.get_attr("num_bits")), bool(source.get_attr("narrow_range"))
        levels = kernel_preconditions.levels(bits, narrow)
        per_channel = source.type.endswith("PerChannel")
        if source.type == "FakeQuantWithMinMaxArgs":
            return quantizer_batch.RangeInput(
                constant=(source.get_attr("min"), source.get_attr("max")), levels=levels)
        channels = source.inputs[1].shape.num_elements() if per_channel else None
        return quantizer_batch.RangeInput(tensors=(source.inputs[1], source.inputs[2]),
                                          levels=levels, per_channel=per_channel,
                                          channels=channels)
    j = position[id(source)]
    spec = specs[j]
    if j not in indices:
        if not lagged or spec.fixed_range is not None or spec.per_channel or (
                spec.earlier_range is not None or source.replica_of is not None):
            return None  # A cycle of floors: never built before this one.
        return quantizer_batch.RangeInput(  # Its variables, before this step's update.
            variables=batch.declare(spec),
            levels=kernel_preconditions.levels(spec.num_bits, spec.narrow_range))
    channels = None
    if spec.per_channel:
        shape = spec.channel_reshape or spec.inputs.shape.as_list()
        channels = shape[-1]
    return quantizer_batch.RangeInput(
        index=indices[j], levels=kernel_preconditions.levels(spec.num_bits, spec.narrow_range),
        per_channel=spec.per_channel, channels=channels,
        before_update=lagged and spec.fixed_range is None)


def _floors(plan: Plan, position, specs, indices, batch) -> List[quantizer_batch.WidthFloor]:
    """The width floors of `plan`'s requirements, for its quantizer spec."""
    floors = []
    for req in plan.requirements:
        pre = req.precondition
        ranges = [_range_input(s, position, specs, indices, req.lagged, batch)
                  for s in req.ranges]
        weights = (_range_input(req.weights, position, specs, indices, req.lagged, batch)
                   if req.weights is not None else None)
        if any(r is None for r in ranges) or (
                pre.form in (kernel_preconditions.BIAS, kernel_preconditions.PRODUCT)
                and weights is None):
            logging.warning("qat: %s precondition of '%s' not enforced: its ranges form a "
                            "cycle", pre.name, plan.prefix)
            continue
        floors.append(quantizer_batch.WidthFloor(pre.name, pre.form, pre.bound, tuple(ranges),
                                                 weights, req.bias))
    return floors


# Ops infinite at 0. TFLite's integer RSQRT gives its output range's top for
# an input that rounds to 0, which the eval graph's range after it models
# (rsqrt(0) = inf clamps to its max); a training graph's range would learn inf.
_GUARDED_TYPES = frozenset(["Rsqrt"])


def _zero_guard(nodes, raw: tf.Tensor, quantized: str, prefix: str) -> str:
    """Training graphs: `quantized` where nonzero, else the float value.

    A layer norm's variance under half a step rounds to 0; its Rsqrt would
    be infinite and the next range (and every gradient) NaN.

    Args:
      nodes: the rewrite's NodeBatch.
      raw: the tensor the quantizer reads (positive where it feeds a Rsqrt).
      quantized: the quantizer's output.
      prefix: the quantizer's name scope.

    Returns:
      The node the guarded ops read.
    """
    dtype = raw.dtype.base_dtype
    scope = nodes.unique_name(prefix + "/zero_guard")
    zero = nodes.const(scope + "/zero", 0.0, dtype)
    nonzero = nodes.node(scope + "/Greater", "Greater", [quantized, zero], T=dtype,
                         **{marks.ATTR: marks.ZERO_GUARD})
    return nodes.node(scope + "/Select", "SelectV2", [nonzero, quantized, nodes.external(raw)],
                      T=dtype, **{marks.ATTR: marks.ZERO_GUARD})


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

