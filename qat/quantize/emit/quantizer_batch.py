"""Quantizers: the FakeQuant ops and the range variables that feed them.

`QuantizerSpec` says what to build, `QuantizerBatch` builds many at once;
`qat.quantize.emit.quant_ops` has contrib's one-at-a-time functions on top of them.

Two quantizers, as in `tf.contrib.quantize`:

* last value (weights): the range is this run's min and max of the tensor,
  widened to include 0, narrow range by default;
* moving average (activations): an exponential moving average of the batch
  min and max, not narrow.

Shared ranges (`qat.quantize.plan.shared_ranges`): a spec with `range_of` reads an earlier
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

Speed: a rewrite adds ~30 ops per quantizer, and TensorFlow's Python op
constructors cost about a millisecond each, which made MobileNetV2 rewrites
take seconds. `QuantizerBatch` therefore writes the quantizers as NodeDefs and
adds them to the graph with one `import_graph_def` (done in C++), then wraps
the range variables in `tf.Variable` objects from their VariableDefs. The
variables are of the model's kind, ref or resource
(`qat.engine.range_variables`).
"""
from typing import Dict, List, Optional, Union

import numpy as np
import tensorflow as tf
from qat.engine import marks
from qat.engine import range_variables
from qat.engine import rewrite as rewrite_lib
from qat.quantize.emit import fake_quant_gradient
from qat.quantize.emit import range_scopes
from qat.quantize.emit import range_updates
from qat.quantize.emit import step_statistics

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


class QuantizerBatch(range_updates.RangeUpdates, step_statistics.StepStatistics):
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
        self._graph = self._rewrite.graph
        self._nodes = self._rewrite.nodes
        # Range variables of the model's kind (ref or resource).
        self._variables_emitter = range_variables.VariableEmitter.for_rewrite(self._rewrite)
        self._outputs: List[str] = []
        self._prefixes: List[str] = []
        self._shared: Dict[tuple, str] = {}
        self._shared_scope: Optional[str] = None
        self._training_fake_quants: List[tuple] = []
        # Per quantizer: (min variable, max variable) of the range it reads,
        # and the (min, max) nodes its FakeQuant reads.
        self._variables: List[tuple] = []
        # An earlier call's (min, max) reads before the update, or None.
        self._earlier: List[Optional[tuple]] = []
        # Whether quantizer i's range is a constant (a kernel's fixed grid).
        self._fixed: List[bool] = []
        # id(spec) -> (name scope, min, max variables) of quantizers declared early.
        self._declared: Dict[int, tuple] = {}
        self._scopes = range_scopes.RangeScopes(self._nodes.unique_name)
        self._ranges: List[tuple] = []
        self._device = ""           # Of the quantizer being added.
        self._variable_device = ""
        self._init_step_statistics()

    # --- NodeDef helpers (the batch mechanics are qat.engine.node_batch's) ----

    def _external(self, t: tf.Tensor) -> str:
        """A name the GraphDef uses for an existing tensor (input_map key)."""
        return self._nodes.external(t)

    def _node(self, name, op, inputs=(), control=(), device=None, **attrs) -> str:
        """A NodeDef on `device`, by default the current quantizer's."""
        device = self._device if device is None else device
        return self._nodes.node(name, op, inputs, device=device, control=control,
                                **attrs)

    def _const(self, name, value, dtype) -> str:
        return self._nodes.const(name, value, dtype, device=self._device)

    def _shared_const(self, kind: str, value, dtype) -> str:
        """A constant shared by every quantizer of the batch (fewer ops)."""
        array = np.asarray(value, dtype.as_numpy_dtype)
        key = ("const", kind, dtype, array.shape, array.tobytes())
        if key not in self._shared:
            name = "%s/%s_%d" % (self._shared_scope_name(), kind,
                                 len(self._shared))
            self._shared[key] = self._nodes.const(name, array, dtype)
        return self._shared[key]

    def _shared_scope_name(self) -> str:
        if self._shared_scope is None:
            # A NoOp named like the scope keeps the name taken for later batches.
            name = self._nodes.unique_name("quant_constants")
            self._nodes.node(name, "NoOp")
            self._shared_scope = name
        return self._shared_scope

    def _activation_condition(self, step: Union[tf.Tensor, str], delay: int) -> str:
        """`step >= delay`, one op per delay value in the batch."""
        key = ("active", int(delay))
        if key not in self._shared:
            delay_const = self._shared_const("delay", int(delay), tf.int64)
            step_ref = step if isinstance(step, str) else self._external(step)
            self._shared[key] = self._nodes.node(
                "%s/activate_quant_%d" % (self._shared_scope_name(),
                                          len(self._shared)),
                "GreaterEqual", [step_ref, delay_const], T=_INT64)
        return self._shared[key]

    def _variable(self, prefix, name, shape, init, collections, dtype=_FLOAT,
                  statistic=False) -> str:
        base = prefix + "/" + name
        shape = tf.TensorShape(shape)
        initial = np.full(shape.as_list(), init, dtype.as_numpy_dtype)
        init_value = self._shared_const("init", initial, dtype)
        self._rewrite.add_variable(self._variables_emitter.variable(
            base, dtype, shape, init_value, device=self._variable_device,
            initial_array=initial, statistic=statistic), collections)
        return base

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
        self._device, self._variable_device = spec.device, spec.variable_device
        collections = self._collections(spec)
        x = input_ref or self._external(spec.inputs)
        low_dtype = low_precision_dtype(spec.inputs)
        if low_dtype is not None:
            x = self._cast(p + "/ToFloat32", x, low_dtype, _FLOAT)
        if spec.channel_reshape:
            shape_const = self._const(p + "/Reshape/shape",
                                      list(spec.channel_reshape), tf.int32)
            x = self._node(p + "/Reshape", "Reshape", [x, shape_const],
                           T=_FLOAT, Tshape=_INT32)
            rank = len(spec.channel_reshape)
            channels = spec.channel_reshape[-1]
        else:
            rank = spec.inputs.shape.rank
            channels = spec.inputs.shape[-1] if spec.per_channel else None
        if spec.fixed_range is not None:
            # A kernel's fixed grid: constants `<prefix>/min|max`.
            min_var = self._const(p + "/min", float(spec.fixed_range[0]), _FLOAT)
            max_var = self._const(p + "/max", float(spec.fixed_range[1]), _FLOAT)
            lo, hi = min_var, max_var
            self._earlier.append(None)
        elif spec.earlier_range is not None:
            # An earlier call's range: its variables are what its reads read.
            min_var, max_var = [t.op.inputs[0].op.name for t in spec.earlier_range[2:4]]
            if spec.combined and spec.is_training:
                # Learnt from this replica's batch; its statistics join the earlier call's.
                for var, t in zip((min_var, max_var), spec.earlier_range[2:4]):
                    self._reads[var] = t
                lo, hi = self._updates(spec, p, x, rank, min_var, max_var, step)
            else:
                lo, hi = [self._external(t) for t in spec.earlier_range[:2]]
            self._earlier.append(tuple(spec.earlier_range[2:4]))
        elif spec.range_of is not None:
            min_var, max_var = self._variables[spec.range_of]
            earlier = self._earlier[spec.range_of]
            if self._fixed[spec.range_of]:
                # A fixed grid's constants (a sigmoid's, read by the rounding
                # of a mean over 1x1): no variables to read, in any graph.
                lo, hi = self._ranges[spec.range_of]
            elif spec.is_training and not spec.range_before_update:
                lo, hi = self._ranges[spec.range_of]
            elif earlier is not None:
                lo, hi = [self._external(t) for t in earlier]
            elif spec.is_training:
                lo = self._variables_emitter.before_update(min_var, self._variable_device)
                hi = self._variables_emitter.before_update(max_var, self._variable_device)
            else:
                lo = self._variables_emitter.snapshot(min_var)
                hi = self._variables_emitter.snapshot(max_var)
            self._earlier.append(earlier)
        elif spec.replica_of is not None:
            # Another replica's range: this replica's batch moves it in its forward.
            min_var, max_var = self._variables[spec.replica_of]
            self._earlier.append(None)
            if spec.is_training:
                lo, hi = self._updates(spec, p, x, rank, min_var, max_var, step)
            else:
                lo, hi = self._ranges[spec.replica_of]
        else:
            scope = self._scopes.variables_scope(spec, len(self._outputs), p, declared)
            if declared:
                min_var, max_var = declared[1:]
            else:
                var_shape = [int(channels)] if spec.per_channel else []
                min_var = self._variable(scope, "min", var_shape, spec.init_min, collections)
                max_var = self._variable(scope, "max", var_shape, spec.init_max, collections)
            self._earlier.append(None)
            if spec.is_training:
                lo, hi = self._updates(spec, p, x, rank, min_var, max_var, step)
            else:
                lo = self._variables_emitter.snapshot(min_var)
                hi = self._variables_emitter.snapshot(max_var)
        self._variables.append((min_var, max_var))
        self._ranges.append((lo, hi))
        self._fixed.append(spec.fixed_range is not None
                           or (spec.range_of is not None and self._fixed[spec.range_of]))
        fq_type = ("FakeQuantWithMinMaxVarsPerChannel" if spec.per_channel
                   else "FakeQuantWithMinMaxVars")
        gated = spec.gated and spec.is_training
        last = not (spec.channel_reshape or spec.quant_delay or low_dtype or gated)
        out = self._node(p + "/" + FAKE_QUANT_NAME, fq_type, [x, lo, hi],
                         num_bits=spec.num_bits,
                         narrow_range=bool(spec.narrow_range),
                         **_output_mark(last),
                         **_gradient_attr(
                             spec, fake_quant_gradient.FIXED_GRID_GRADIENT_OP_TYPE
                             if spec.fixed_range is not None
                             else fake_quant_gradient.GRADIENT_OP_TYPE))
        if spec.is_training and not spec.per_channel and spec.fixed_range is None:
            self._training_fake_quants.append(
                (out, lo, hi, spec.num_bits, bool(spec.narrow_range)))
            if input_ref is None and low_dtype is None and not spec.channel_reshape:
                fake_quant_gradient.fuse_relu_gradient(self._rewrite, spec.inputs.op)
        if spec.channel_reshape:
            back = self._const(p + "/Reshape_1/shape",
                               spec.inputs.shape.as_list(), tf.int32)
            out = self._node(p + "/Reshape_1", "Reshape", [out, back],
                             T=_FLOAT, Tshape=_INT32,
                             **_output_mark(not (spec.quant_delay or low_dtype or gated)))
        if low_dtype is not None:
            out = self._cast(p + "/FromFloat32", out, _FLOAT, low_dtype,
                             **_output_mark(not (spec.quant_delay or gated)))
        if spec.quant_delay:
            if step is None:
                raise ValueError("quant_delay needs the quantization step.")
            active = self._activation_condition(step, spec.quant_delay)
            gradient = _gradient_attr(
                spec, fake_quant_gradient.DELAYED_GRADIENT_OP_TYPE)
            # TF1's Select: for a scalar condition its kernel forwards the
            # chosen input; SelectV2 broadcasts and copies it.
            out = self._node(p + "/delayed_quant", "Select",
                             [active, out, input_ref or self._external(spec.inputs)],
                             T=spec.inputs.dtype.base_dtype, **_output_mark(not gated),
                             **gradient)
        if gated:
            # Replicas: the value waits for this step's combined range updates
            # (no range's statistics read it: `statistics_packs.gated_plans`).
            out = self._node(p + "/after_range_update", "Identity", [out],
                             control=[self.update_group()],
                             T=spec.inputs.dtype.base_dtype, **_output_mark(True))
        self._outputs.append(out + ":0")
        return len(self._outputs) - 1

    def declare(self, spec: QuantizerSpec) -> tuple:
        """Reserves the name scope and adds the range variables of a quantizer
        `add` builds later (a per-tensor range of its own); returns the names of
        its (min, max) variables.

        A range a kernel floor reads as it was before this step's update
        (`RangeInput.variables`) needs only its variables: declared first, it
        can be read by a quantizer built before it.
        """
        if id(spec) not in self._declared:
            p = self._nodes.unique_name(spec.variables_prefix or spec.prefix)
            device, variable_device = self._device, self._variable_device
            self._device, self._variable_device = spec.device, spec.variable_device
            collections = self._collections(spec)
            self._declared[id(spec)] = (
                p, self._variable(p, "min", [], spec.init_min, collections),
                self._variable(p, "max", [], spec.init_max, collections))
            self._device, self._variable_device = device, variable_device
        return self._declared[id(spec)][1:]

    @staticmethod
    def _collections(spec: QuantizerSpec) -> List[str]:
        collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
        if spec.vars_collection:
            collections.append(spec.vars_collection)
        return collections

    def _cast(self, name: str, x: str, src: tf.DType, dst: tf.DType, **attrs) -> str:
        """Mixed precision: FakeQuant runs in float32 between two casts."""
        return self._node(name, "Cast", [x], SrcT=src, DstT=dst, Truncate=False, **attrs)

    def output(self, index: int) -> str:
        """The rewrite's node consumers of quantizer `index` read."""
        return self._outputs[index]

    def prefix(self, index: int) -> str:
        """The name scope quantizer `index` got (its variables' prefix)."""
        return self._prefixes[index]

    def range_prefix(self, index: int) -> str:
        """The name scope of the variables quantizer `index` reads."""
        return self._variables[index][0].rsplit("/", 1)[0]

    def finish(self) -> None:
        """Adds what the quantizers share: the replicas' combined range updates
        (`step_statistics`), the moving averages' rates, the nudged ranges of
        training quantizers."""
        self._combine_step_statistics()  # Before the rates: it asks for some.
        self._emit_rates()
        if self._training_fake_quants:
            fake_quant_gradient.add_nudged_ranges(
                self._rewrite, self._training_fake_quants,
                self._shared_scope_name() + "/nudged_ranges")
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


def _output_mark(is_output: bool) -> dict:
    return {marks.ATTR: marks.QUANTIZER_OUTPUT} if is_output else {}


def _gradient_attr(spec: QuantizerSpec, gradient_op_type: str) -> dict:
    """The registered-gradient attribute of a training quantizer's op."""
    return {"_gradient_op_type": gradient_op_type} if spec.is_training else {}
