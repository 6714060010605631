"""Quantizers: the FakeQuant ops and the range variables that feed them.

`QuantizerSpec` says what to build, `QuantizerBatch` builds many at once;
`qat.quantize.emit.quant_ops` has contrib's one-at-a-time functions on top of them.

Two quantizers, as in `tf.contrib.quantize`:

* last value (weights): the range is this run's min and max of the tensor,
  widened to include 0, narrow range by default;
* moving average (activations): an exponential moving average of the batch
  min and max, not narrow.

Shared ranges (`qat.quantize.plan.ranges.shared_ranges`): a spec with `range_of` reads an earlier
quantizer's range instead of owning variables (as that quantizer's FakeQuant reads it, or, with
`range_before_update`, the variables as they were before this step's update); `statistics_of`
adds further tensors' batch min and max to a quantizer's update.

Each quantizer owns two non-trainable variables `<prefix>/min` and
`<prefix>/max` (scalars, or vectors of the last dimension when per-channel) in
GLOBAL_VARIABLES and MOVING_AVERAGE_VARIABLES. In a training graph assign ops
update them and their results feed the FakeQuant; in an eval graph the same
FakeQuant op reads the variables and nothing updates them. Training
FakeQuants carry the input-only gradient of `qat.quantize.emit.fake_quant_gradient`.

The moving average is `v -= rate * (v - x)`. contrib zero-debiased it with
hidden `.../biased` and `.../local_step` variables that made float
checkpoints fail to restore (tensorflow#26664, #20867); here no variable is
added: given the quantization step t (`init_from_first_batch`), the rate is
(1 - decay) / (1 - decay^t), the same debiased average with the shared step
counter (`qat.quantize.emit.range_updates`); without it, 1 - decay.

`QuantizerBatch` builds each quantizer's variables and FakeQuant and hands
the rest to collaborators that share its `qat.quantize.emit.node_writer.NodeWriter`:
`RangeUpdates` (the range step), `RangeFloors` (kernel floors), `FiniteGuard`
(non-finite batches kept out, counted) and `StepStatistics` (replicas' ranges
combined once per step).

Speed: a rewrite adds ~30 ops per quantizer, and TensorFlow's Python op
constructors cost about a millisecond each, which made MobileNetV2 rewrites
take seconds. `QuantizerBatch` therefore writes the quantizers as NodeDefs and
adds them to the graph with one `import_graph_def` (done in C++), then wraps
the range variables in `tf.Variable` objects from their VariableDefs. The
variables are of the model's kind, ref or resource
(`qat.engine.range_variables`).
"""
from typing import Dict, List, Optional, Tuple, Union

import tensorflow as tf
from qat.engine import marks
from qat.engine import rewrite as rewrite_lib
from qat.quantize.emit import fake_quant_gradient
from qat.quantize.emit import range_scopes
from qat.quantize.emit.finite_ranges import FiniteGuard
from qat.quantize.emit.node_writer import NodeWriter
from qat.quantize.emit.node_writer import PlacedWriter
from qat.quantize.emit.range_floors import QuantizerRange
from qat.quantize.emit.range_floors import RangeFloors
from qat.quantize.emit.range_floors import RangeView
from qat.quantize.emit.range_updates import RangeUpdates
from qat.quantize.emit.range_updates import Step
from qat.quantize.emit.step_statistics import StepStatistics

# pylint: disable=unused-import
from qat.quantize.emit.quantizer_spec import DEFAULT_VARS_COLLECTION
from qat.quantize.emit.quantizer_spec import FAKE_QUANT_NAME
from qat.quantize.emit.quantizer_spec import FAKE_QUANT_TYPES
from qat.quantize.emit.quantizer_spec import LOW_PRECISION_DTYPES
from qat.quantize.emit.quantizer_spec import MAX_NUM_BITS
from qat.quantize.emit.quantizer_spec import MIN_NUM_BITS
from qat.quantize.emit.quantizer_spec import QUANTIZABLE_DTYPES
from qat.quantize.emit.quantizer_spec import QuantizerSpec
from qat.quantize.emit.quantizer_spec import RangeInput
from qat.quantize.emit.quantizer_spec import WidthFloor
from qat.quantize.emit.quantizer_spec import low_precision_dtype
from qat.quantize.emit.quantizer_spec import validate_num_bits
# pylint: enable=unused-import

_FLOAT = tf.float32
_INT32 = tf.int32
_INT64 = tf.int64


class QuantizerBatch:
    """Builds many quantizers with one GraphDef import.

    Used in two ways: a pass hands it its `qat.engine.rewrite.Rewrite`, adds
    quantizers, reroutes their consumers to `output(i)`, calls `finish()` and
    applies the rewrite; or, standing alone, `QuantizerBatch(graph)` then
    `add` and `build`, which applies its own rewrite.

    Args:
      target: the graph to add the quantizers to, or the pass's rewrite.
    """

    def __init__(self, target: Union[tf.Graph, rewrite_lib.Rewrite]):
        if isinstance(target, rewrite_lib.Rewrite):
            self._rewrite, self._owns_rewrite = target, False
        else:
            self._rewrite = rewrite_lib.Rewrite(target, marks.QUANTIZER)
            self._owns_rewrite = True
        self._nodes = self._rewrite.nodes
        self._writer = writer = NodeWriter(self._rewrite)
        self._guard = FiniteGuard(writer)
        self._floors = RangeFloors(writer)
        self._updates = RangeUpdates(writer, self._floors, self._guard)
        self._statistics = StepStatistics(writer, self._updates, self._floors, self._guard)
        self._outputs: List[str] = []
        self._prefixes: List[str] = []
        self._training_fake_quants: List[tuple] = []
        self._quantizers: List[QuantizerRange] = []  # By quantizer index.
        # id(spec) -> (name scope, min, max variables) of quantizers declared early.
        self._declared: Dict[int, Tuple[str, str, str]] = {}
        self._scopes = range_scopes.RangeScopes(self._nodes.unique_name)

    def _activation_condition(self, step: Step, delay: int) -> str:
        """`step >= delay`, one op per delay value in the batch."""
        writer = self._writer

        def condition() -> str:
            delay_const = writer.shared_const("delay", int(delay), tf.int64)
            step_ref = step if isinstance(step, str) else writer.external(step)
            return writer.node("%s/activate_quant_%d" % (writer.shared_scope(), writer.serial),
                               "GreaterEqual", [step_ref, delay_const], T=_INT64)
        return writer.shared(("active", int(delay)), condition)

    # --- Quantizers -----------------------------------------------------------

    def add(self, spec: QuantizerSpec,
            step: Union[tf.Tensor, str, None] = None,
            input_ref: Optional[str] = None) -> int:
        """Adds a quantizer; returns its index (`output`, `build()`'s result).

        Args:
          spec: what to build (validated here). Its prefix is made unique: a
            name scope no op of the graph uses (`<prefix>_<i>` otherwise).
          step: the quantization step (a tensor or a node of the rewrite),
            needed when spec.quant_delay or spec.init_from_first_batch.
          input_ref: a node of the rewrite to quantize instead of
            `spec.inputs` (same dtype and shape), e.g. its replacement.

        Raises:
          ValueError: on bad settings.
        """
        spec.validate()
        if (spec.init_from_first_batch and spec.moving_average and spec.is_training
                and step is None):
            raise ValueError("init_from_first_batch needs the quantization step.")
        declared = self._declared.pop(id(spec), None)
        p = self._scopes.quantizer_scope(spec, declared)
        self._prefixes.append(p)
        out = self._writer.at(spec.device, spec.variable_device)
        emitter = self._writer.variables
        x = input_ref or out.external(spec.inputs)
        low_dtype = low_precision_dtype(spec.inputs)
        if low_dtype is not None:
            x = out.cast(p + "/ToFloat32", x, low_dtype, _FLOAT)
        if spec.channel_reshape:
            shape_const = out.const(p + "/Reshape/shape", list(spec.channel_reshape), tf.int32)
            x = out.node(p + "/Reshape", "Reshape", [x, shape_const], T=_FLOAT, Tshape=_INT32)
            rank = len(spec.channel_reshape)
            channels = spec.channel_reshape[-1]
        else:
            rank = spec.inputs.shape.rank
            channels = spec.inputs.shape[-1] if spec.per_channel else None
        earlier = None
        if spec.fixed_range is not None:
            # A kernel's fixed grid: constants `<prefix>/min|max`.
            min_var = out.const(p + "/min", float(spec.fixed_range[0]), _FLOAT)
            max_var = out.const(p + "/max", float(spec.fixed_range[1]), _FLOAT)
            lo, hi = min_var, max_var
        elif spec.earlier_range is not None:
            # An earlier call's range: its variables are what its reads read.
            min_var, max_var = [t.op.inputs[0].op.name for t in spec.earlier_range[2:4]]
            if spec.combined and spec.is_training:
                # Learnt from this replica's batch; its statistics join the earlier call's.
                for var, t in zip((min_var, max_var), spec.earlier_range[2:4]):
                    self._writer.stand_in(var, t)
                lo, hi = self._update(out, spec, p, x, rank, (min_var, max_var), step)
            else:
                lo, hi = [out.external(t) for t in spec.earlier_range[:2]]
            earlier = tuple(spec.earlier_range[2:4])
        elif spec.range_of is not None:
            owner = self._quantizers[spec.range_of]
            (min_var, max_var), earlier = owner.variables, owner.earlier
            if owner.fixed:
                # A fixed grid's constants (a sigmoid's, read by the rounding
                # of a mean over 1x1): no variables to read, in any graph.
                lo, hi = owner.read
            elif spec.is_training and not spec.range_before_update:
                lo, hi = owner.read
            elif earlier is not None:
                lo, hi = [out.external(t) for t in earlier]
            elif spec.is_training:
                lo = emitter.before_update(min_var, out.variable_device)
                hi = emitter.before_update(max_var, out.variable_device)
            else:
                lo, hi = emitter.snapshot(min_var), emitter.snapshot(max_var)
        elif spec.replica_of is not None:
            # Another replica's range: this replica's batch moves it in its forward.
            owner = self._quantizers[spec.replica_of]
            min_var, max_var = owner.variables
            if spec.is_training:
                lo, hi = self._update(out, spec, p, x, rank, (min_var, max_var), step)
            else:
                lo, hi = owner.read
        else:
            scope = self._scopes.variables_scope(spec, len(self._quantizers), p, declared)
            if declared:
                min_var, max_var = declared[1:]
            else:
                var_shape = [int(channels)] if spec.per_channel else []
                collections = _collections(spec)
                min_var = self._writer.variable(scope, "min", var_shape, spec.init_min,
                                                collections, out.variable_device)
                max_var = self._writer.variable(scope, "max", var_shape, spec.init_max,
                                                collections, out.variable_device)
            if spec.is_training:
                lo, hi = self._update(out, spec, p, x, rank, (min_var, max_var), step)
            else:
                lo, hi = emitter.snapshot(min_var), emitter.snapshot(max_var)
        self._quantizers.append(QuantizerRange(
            (min_var, max_var), (lo, hi), earlier,
            spec.fixed_range is not None
            or (spec.range_of is not None and self._quantizers[spec.range_of].fixed)))
        return self._fake_quant(out, spec, p, x, lo, hi, step, input_ref, low_dtype)

    def _update(self, out: PlacedWriter, spec: QuantizerSpec, p: str, x: str,
                rank: Optional[int], variables: Tuple[str, str],
                step: Optional[Step]) -> Tuple[str, str]:
        """The range of `variables` moved by this batch: assigned where it is
        finite (else kept, the batch counted), or, for replicas' combined
        ranges, kept and recorded for the combined update. Returns the
        (min, max) the FakeQuant reads."""
        batch_min, batch_max = self._updates.batch_range(out, spec, p, x, rank)
        index = len(self._quantizers)
        counter = self._guard.counter(out, spec, p, index)
        found = self._updates.step(out, spec, p, batch_min, batch_max, variables, step,
                                   counter, RangeView(self._quantizers))
        finite = self._guard.finite(out, p, found.width, spec.per_channel, *found.values)
        if spec.combined:  # Replicas: combined once per step, after the forward.
            self._statistics.contribute(spec, p, out.device, batch_min, batch_max, variables,
                                        step, counter, index)
            return self._guard.kept(out, found.scopes, variables, found.values, finite)
        return self._guard.assign(out, p, found.scopes, variables, found.values, finite,
                                  counter)

    def _fake_quant(self, out: PlacedWriter, spec: QuantizerSpec, p: str, x: str, lo: str,
                    hi: str, step: Optional[Step], input_ref: Optional[str],
                    low_dtype: Optional[tf.DType]) -> int:
        """The quantizer's FakeQuant of `x` on [lo, hi] and what follows it; its index."""
        fq_type = ("FakeQuantWithMinMaxVarsPerChannel" if spec.per_channel
                   else "FakeQuantWithMinMaxVars")
        gated = spec.gated and spec.is_training
        last = not (spec.channel_reshape or spec.quant_delay or low_dtype or gated)
        result = out.node(p + "/" + FAKE_QUANT_NAME, fq_type, [x, lo, hi],
                          num_bits=spec.num_bits,
                          narrow_range=bool(spec.narrow_range),
                          **_output_mark(last),
                          **_gradient_attr(
                              spec, fake_quant_gradient.FIXED_GRID_GRADIENT_OP_TYPE
                              if spec.fixed_range is not None
                              else fake_quant_gradient.GRADIENT_OP_TYPE))
        if spec.is_training and not spec.per_channel and spec.fixed_range is None:
            self._training_fake_quants.append(
                (result, lo, hi, spec.num_bits, bool(spec.narrow_range)))
            if input_ref is None and low_dtype is None and not spec.channel_reshape:
                fake_quant_gradient.fuse_relu_gradient(self._rewrite, spec.inputs.op)
        if spec.channel_reshape:
            back = out.const(p + "/Reshape_1/shape", spec.inputs.shape.as_list(), tf.int32)
            result = out.node(p + "/Reshape_1", "Reshape", [result, back],
                              T=_FLOAT, Tshape=_INT32,
                              **_output_mark(not (spec.quant_delay or low_dtype or gated)))
        if low_dtype is not None:
            result = out.cast(p + "/FromFloat32", result, _FLOAT, low_dtype,
                              **_output_mark(not (spec.quant_delay or gated)))
        if spec.quant_delay:
            if step is None:
                raise ValueError("quant_delay needs the quantization step.")
            active = self._activation_condition(step, spec.quant_delay)
            gradient = _gradient_attr(
                spec, fake_quant_gradient.DELAYED_GRADIENT_OP_TYPE)
            # TF1's Select: for a scalar condition its kernel forwards the
            # chosen input; SelectV2 broadcasts and copies it.
            result = out.node(p + "/delayed_quant", "Select",
                              [active, result, input_ref or out.external(spec.inputs)],
                              T=spec.inputs.dtype.base_dtype, **_output_mark(not gated),
                              **gradient)
        if gated:
            # Replicas: the value waits for this step's combined range updates
            # (no range's statistics read it: `statistics_packs.gated_plans`).
            result = out.node(p + "/after_range_update", "Identity", [result],
                              control=[self.update_group()],
                              T=spec.inputs.dtype.base_dtype, **_output_mark(True))
        self._outputs.append(result + ":0")
        return len(self._outputs) - 1

    def declare(self, spec: QuantizerSpec) -> Tuple[str, str]:
        """Reserves the name scope and adds the range variables of a quantizer
        `add` builds later (a per-tensor range of its own); returns the names of
        its (min, max) variables.

        A range a kernel floor reads as it was before this step's update
        (`RangeInput.variables`) needs only its variables: declared first, it
        can be read by a quantizer built before it.
        """
        if id(spec) not in self._declared:
            p = self._nodes.unique_name(spec.variables_prefix or spec.prefix)
            collections = _collections(spec)
            self._declared[id(spec)] = (
                p, self._writer.variable(p, "min", [], spec.init_min, collections,
                                         spec.variable_device),
                self._writer.variable(p, "max", [], spec.init_max, collections,
                                      spec.variable_device))
        return self._declared[id(spec)][1:]

    def update_group(self) -> str:
        """The NoOp that runs this batch's combined range updates (a name reserved now)."""
        return self._statistics.update_group()

    def output(self, index: int) -> str:
        """The rewrite's node consumers of quantizer `index` read."""
        return self._outputs[index]

    def prefix(self, index: int) -> str:
        """The name scope quantizer `index` got (its variables' prefix)."""
        return self._prefixes[index]

    def range_prefix(self, index: int) -> str:
        """The name scope of the variables quantizer `index` reads."""
        return self._quantizers[index].variables[0].rsplit("/", 1)[0]

    def finish(self) -> None:
        """Adds what the quantizers share: the replicas' combined range updates
        (`step_statistics`), the moving averages' rates, the nudged ranges of
        training quantizers."""
        self._statistics.combine(self._quantizers)  # Before the rates: it asks for some.
        self._updates.emit_rates()
        if self._training_fake_quants:
            fake_quant_gradient.add_nudged_ranges(
                self._rewrite, self._training_fake_quants,
                self._writer.shared_scope() + "/nudged_ranges")
            self._training_fake_quants = []

    def build(self) -> List[tf.Tensor]:
        """Adds every quantizer to the graph (a batch made with a graph).

        Returns:
          The output tensor of each quantizer, in `add` order (the delayed
          Select when there is a delay, else the FakeQuant output).

        Raises:
          qat.engine.rewrite.RewriteError: if the ops fail their checks; the
            graph is then unchanged.
        """
        if not self._owns_rewrite:
            raise ValueError("This batch belongs to a pass's rewrite: apply that.")
        if not self._outputs:
            return []
        self.finish()
        ops = rewrite_lib.apply(self._rewrite)
        return [self._nodes.tensor(ops, ref) for ref in self._outputs]


def _collections(spec: QuantizerSpec) -> List[str]:
    collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
    if spec.vars_collection:
        collections.append(spec.vars_collection)
    return collections


def _output_mark(is_output: bool) -> dict:
    return {marks.ATTR: marks.QUANTIZER_OUTPUT} if is_output else {}


def _gradient_attr(spec: QuantizerSpec, gradient_op_type: str) -> dict:
    """The registered-gradient attribute of a training quantizer's op."""
    return {"_gradient_op_type": gradient_op_type} if spec.is_training else {}
