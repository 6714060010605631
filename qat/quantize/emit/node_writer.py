"""What a quantizer batch writes through: NodeDefs, shared constants, range variables.

`NodeWriter` is shared by `qat.quantize.emit.quantizer_batch.QuantizerBatch` and
its collaborators (`qat.quantize.emit.range_updates.RangeUpdates`,
`qat.quantize.emit.range_floors.RangeFloors`,
`qat.quantize.emit.finite_ranges.FiniteGuard`,
`qat.quantize.emit.step_statistics.StepStatistics`): the NodeDefs of the
batch's `qat.engine.rewrite.Rewrite` (`qat.engine.node_batch`), the values the
batch builds once and shares (constants, step conditions, moving-average
rates, floor widths), the range variables (`qat.engine.range_variables`) and
which node holds a variable's value before this step's update.

Devices are arguments, never state: `writer.at(device, variable_device)` is
a `PlacedWriter` whose nodes go on `device` and whose variable reads and
updates go on `variable_device` (a quantizer's `QuantizerSpec.device` and
`variable_device`, or another replica's).
"""
from typing import Any, Callable, Dict, Hashable, Optional, Sequence, TypeVar, Union

import numpy as np
import tensorflow as tf

from qat.engine import range_variables
from qat.engine import rewrite as rewrite_lib

_FLOAT = tf.float32
_V = TypeVar("_V")


class NodeWriter:
    """Writes the NodeDefs of one quantizer batch into its rewrite.

    Args:
      rewrite: the rewrite the nodes and variables go into.
    """

    def __init__(self, rewrite: rewrite_lib.Rewrite):
        self.rewrite = rewrite
        self.nodes = rewrite.nodes
        # Range variables of the model's kind (ref or resource).
        self.variables = range_variables.VariableEmitter.for_rewrite(rewrite)
        self._shared: Dict[Hashable, Any] = {}
        self._shared_scope: Optional[str] = None
        # Variables whose value before this step's update is not their own
        # read: {variable: an earlier call's tensor, or a node of the batch}.
        self._stand_ins: Dict[str, Union[tf.Tensor, str]] = {}

    def at(self, device: str, variable_device: str = "") -> "PlacedWriter":
        """A writer whose nodes go on `device`, its variables' ops on `variable_device`."""
        return PlacedWriter(self, device, variable_device)

    def external(self, t: tf.Tensor) -> str:
        """A name the GraphDef uses for an existing tensor (input_map key)."""
        return self.nodes.external(t)

    def node(self, name: str, op: str, inputs: Sequence[str] = (), device: str = "",
             control: Sequence[str] = (), **attrs) -> str:
        """A NodeDef (`qat.engine.node_batch.NodeBatch.node`); returns its name."""
        return self.nodes.node(name, op, inputs, device=device, control=control, **attrs)

    def shared(self, key: Hashable, make: Callable[[], _V]) -> _V:
        """The value the batch keeps under `key`, made by `make` the first time.

        Names of shared nodes carry `serial` (`<scope>/<kind>_<serial>`), the
        count of every value shared before, whatever its kind.

        Args:
          key: what the value is (hashable).
          make: builds the value (its nodes) when the batch has none yet.

        Returns:
          The value kept under `key`.
        """
        if key not in self._shared:
            value = make()
            self._shared[key] = value
        return self._shared[key]

    @property
    def serial(self) -> int:
        """How many values the batch shares so far (numbers shared nodes' names)."""
        return len(self._shared)

    def shared_scope(self) -> str:
        """The name scope of the nodes every quantizer of the batch shares."""
        if self._shared_scope is None:
            # A NoOp named like the scope keeps the name taken for later batches.
            name = self.nodes.unique_name("quant_constants")
            self.nodes.node(name, "NoOp")
            self._shared_scope = name
        return self._shared_scope

    def shared_const(self, kind: str, value, dtype: tf.DType) -> str:
        """A constant shared by every quantizer of the batch (fewer ops)."""
        array = np.asarray(value, dtype.as_numpy_dtype)
        return self.shared(
            ("const", kind, dtype, array.shape, array.tobytes()),
            lambda: self.nodes.const("%s/%s_%d" % (self.shared_scope(), kind, self.serial),
                                     array, dtype))

    def variable(self, prefix: str, name: str, shape, init, collections: Sequence[str],
                 device: str, dtype: tf.DType = _FLOAT, statistic: bool = False) -> str:
        """Adds the variable `<prefix>/<name>` filled with `init`; returns its name.

        Args:
          prefix: its name scope.
          name: its name in the scope.
          shape: its shape.
          init: its initial value (every element).
          collections: the graph collections it joins.
          device: the device of its ops.
          dtype: its dtype.
          statistic: a count qat keeps about training
            (`qat.engine.range_variables.VariableEmitter.variable`).
        """
        base = prefix + "/" + name
        shape = tf.TensorShape(shape)
        initial = np.full(shape.as_list(), init, dtype.as_numpy_dtype)
        init_value = self.shared_const("init", initial, dtype)
        self.rewrite.add_variable(self.variables.variable(
            base, dtype, shape, init_value, device=device, initial_array=initial,
            statistic=statistic), collections)
        return base

    def stand_in(self, variable: str, read: Union[tf.Tensor, str]) -> None:
        """Makes `read` what `before_update(variable)` gives (an earlier call's
        read of its variable, or a node of the batch holding the value)."""
        self._stand_ins[variable] = read

    def before_update(self, variable: str, device: str) -> str:
        """The node holding `variable`'s value before this step's update."""
        found = self._stand_ins.get(variable)
        if isinstance(found, tf.Tensor):
            return self.external(found)
        if found is not None:
            return found
        return self.variables.before_update(variable, device)


class PlacedWriter:
    """A `NodeWriter` writing on given devices.

    Args:
      writer: the batch's writer.
      device: the device of the nodes.
      variable_device: the device of variable reads and updates.
    """
    __slots__ = ("writer", "device", "variable_device")

    def __init__(self, writer: NodeWriter, device: str, variable_device: str):
        self.writer = writer
        self.device = device
        self.variable_device = variable_device

    def node(self, name: str, op: str, inputs: Sequence[str] = (),
             control: Sequence[str] = (), **attrs) -> str:
        """A NodeDef on this writer's device; returns its name."""
        return self.writer.nodes.node(name, op, inputs, device=self.device, control=control,
                                      **attrs)

    def const(self, name: str, value, dtype: tf.DType) -> str:
        """A Const node of this quantizer (not shared) on this writer's device."""
        return self.writer.nodes.const(name, value, dtype, device=self.device)

    def cast(self, name: str, x: str, src: tf.DType, dst: tf.DType, **attrs) -> str:
        """Mixed precision: FakeQuant runs in float32 between two casts."""
        return self.node(name, "Cast", [x], SrcT=src, DstT=dst, Truncate=False, **attrs)

    def shared_const(self, kind: str, value, dtype: tf.DType) -> str:
        """`NodeWriter.shared_const` (on no device: shared by every quantizer)."""
        return self.writer.shared_const(kind, value, dtype)

    def external(self, t: tf.Tensor) -> str:
        """`NodeWriter.external`."""
        return self.writer.nodes.external(t)

    def before_update(self, variable: str) -> str:
        """`NodeWriter.before_update`, a read on this writer's variable device."""
        return self.writer.before_update(variable, self.variable_device)
