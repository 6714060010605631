"""One rewrite: planned on the unchanged graph, checked, then applied at once.

A pass describes everything it changes as a `Rewrite`: the new ops (a
`NodeBatch`), the consumer inputs to move onto new tensors, the control
inputs and internal attributes (`_gradient_op_type`) to add, the variables
to register in collections, and the collection entries that record what was
done. `apply` checks all of it before it edits anything:

1. the new ops are imported into an empty scratch graph, with stand-ins for
   the graph's tensors: TensorFlow checks op types, attributes, dtypes and
   shapes there;
2. every reroute is checked: the consumer is an op of the graph that reads
   the old tensor at that input, and the new tensor has the same dtype and a
   compatible shape (taken from the scratch graph); control inputs name ops
   of the graph or of the batch; the new edges make no cycle
   (`qat.engine.rewrite_cycles`);
3. only then are the ops imported into the graph (TensorFlow adds all or
   none), the inputs moved, control inputs, variables and collection entries
   added.

Nothing in step 3 can fail on checked input. Should it fail all the same,
the inputs moved so far are moved back before the error propagates (the new
ops, which TensorFlow cannot delete, are then left unconnected).

Example::

    rewrite = Rewrite(graph, marks.FOLD)
    nodes = rewrite.nodes
    scaled = nodes.node(nodes.unique_name("net/conv/mul_fold"), "Mul",
                        [nodes.external(w), nodes.external(s)], T=tf.float32)
    rewrite.reroute(conv_op, 1, scaled)      # conv reads w * s
    ops = apply(rewrite)                      # checks, then edits
"""
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import variable_pb2

from qat.engine import marks
from qat.engine import node_attrs
from qat.engine import node_batch
from qat.engine import range_variables
from qat.engine import rewrite_cycles

# A new tensor: a node of the batch (`name` or `name:<i>`), or an existing one.
TensorRef = Union[str, tf.Tensor]


class RewriteError(ValueError):
    """A rewrite failed its checks; the graph was not changed."""


@dataclasses.dataclass
class _Reroute:
    consumer: tf.Operation
    index: int
    old: tf.Tensor
    new: TensorRef


class Rewrite(object):
    """Everything one pass changes in `graph`, not applied yet.

    Args:
      graph: the graph to rewrite.
      mark: the `qat.engine.marks` role of the new ops.
    """

    def __init__(self, graph: tf.Graph, mark: str):
        self.graph = graph
        self.nodes = node_batch.NodeBatch(graph, mark)
        self._reroutes: List[_Reroute] = []
        self._control: List[Tuple[tf.Operation, List[str]]] = []
        self._attrs: List[Tuple[tf.Operation, str, attr_value_pb2.AttrValue]] = []
        self._variables: List[Tuple[variable_pb2.VariableDef, List[str]]] = []
        self._collections: List[Tuple[str, object]] = []
        self._after: List[Callable[[Dict[str, tf.Operation]], None]] = []
        # What the builders of one rewrite share (e.g. the new step counter).
        self.memo: Dict[str, object] = {}

    def reroute(self, consumer: tf.Operation, index: int, new: TensorRef) -> None:
        """`consumer` will read `new` at input `index`."""
        self._reroutes.append(_Reroute(consumer, index, consumer.inputs[index], new))

    def reroute_consumers(self, old: tf.Tensor, new: TensorRef,
                          consumers: Sequence[tf.Operation]) -> None:
        """Every input of `consumers` that reads `old` will read `new`.

        An op reading `old` at several inputs (`tf.compat.v1.Print(x, [x])`,
        `x * x`) is listed once per input by `old.consumers()`: each of its
        inputs is rerouted once.
        """
        for op in dict.fromkeys(consumers):
            for i, t in enumerate(op.inputs):
                if t is old:
                    self.reroute(op, i, new)

    def add_control_inputs(self, op: tf.Operation, nodes: Sequence[str]) -> None:
        """`op` will run after the batch nodes `nodes`."""
        self._control.append((op, list(nodes)))

    def set_attr(self, op: tf.Operation, name: str,
                 value: attr_value_pb2.AttrValue) -> None:
        """`op`, an op of the graph, will carry attribute `name` (a `_` one)."""
        self._attrs.append((op, name, value))

    def add_variable(self, variable_def: Optional[variable_pb2.VariableDef],
                     collections: Sequence[str]) -> None:
        """A variable of the batch (ref or resource), registered in `collections`.

        None (a function graph's variable, made outside the graph by its
        store, `qat.engine.function_graphs`) registers nothing.
        """
        if variable_def is not None:
            self._variables.append((variable_def, list(collections)))

    def add_to_collection(self, name: str, value) -> None:
        """A collection entry added with the rewrite."""
        self._collections.append((name, value))

    def after_import(self, fn: Callable[[Dict[str, tf.Operation]], None]) -> None:
        """Runs `fn(ops)` once the ops are in the graph (bookkeeping only)."""
        self._after.append(fn)

    def is_empty(self) -> bool:
        return not (len(self.nodes) or self._reroutes or self._control
                    or self._attrs or self._collections)

    # --- Checking ---------------------------------------------------------------

    def _check(self) -> None:
        wanted = sorted({r.new for r in self._reroutes if isinstance(r.new, str)})
        try:
            scratch = self.nodes.check(wanted)
        except (ValueError, TypeError, tf.errors.OpError) as e:
            raise RewriteError(f"qat could not build its new ops: {e}") from e
        seen = set()
        for r in self._reroutes:
            where = f"input {r.index} of '{r.consumer.name}' ({r.consumer.type})"
            if r.consumer.graph is not self.graph:
                raise RewriteError(f"{where} is not in the graph being rewritten.")
            if (r.consumer, r.index) in seen:
                raise RewriteError(f"{where} is rerouted twice in one rewrite.")
            seen.add((r.consumer, r.index))
            if r.consumer.inputs[r.index] is not r.old:
                raise RewriteError(f"{where} no longer reads '{r.old.name}'.")
            if isinstance(r.new, tf.Tensor):
                dtype, shape = r.new.dtype, r.new.shape
            else:
                dtype, shape = scratch[r.new].dtype, scratch[r.new].shape
            if dtype.base_dtype != r.old.dtype.base_dtype:
                raise RewriteError(
                    f"{where} reads {r.old.dtype.name} '{r.old.name}'; its new "
                    f"input would be {dtype.name}.")
            if not shape.is_compatible_with(r.old.shape):
                raise RewriteError(
                    f"{where} reads '{r.old.name}' of shape {r.old.shape}; its "
                    f"new input would have shape {shape}.")
        for op, _ in self._control:
            if op.graph is not self.graph:
                raise RewriteError(f"Control inputs of '{op.name}': not an op of the graph.")
        for op, name, _ in self._attrs:
            if op.graph is not self.graph or not node_attrs.is_internal(name):
                raise RewriteError(f"Attribute {name} of '{op.name}': only internal "
                                   "attributes of ops of the graph are set.")
        cycle = rewrite_cycles.find_cycle(
            self.nodes._gdef.node, self.nodes._ext,  # pylint: disable=protected-access
            [(r.consumer, r.index, r.old, r.new) for r in self._reroutes], self._control)
        if cycle:
            shown = cycle if len(cycle) <= 8 else cycle[:6] + ["..."] + cycle[-2:]
            raise RewriteError(
                f"qat's rewrite would make a cycle of {len(cycle) - 1} ops, which TensorFlow "
                f"refuses to run: {' -> '.join(shown)}. A new op reads a tensor computed "
                "from the op it feeds: a bug in qat; please report it with this graph.")


def apply(rewrite: Rewrite) -> Dict[str, tf.Operation]:
    """Checks `rewrite`, then applies it to its graph.

    Args:
      rewrite: the changes of one pass.

    Returns:
      The new ops by node name.

    Raises:
      RewriteError: if a check fails; the graph is unchanged.
    """
    if rewrite.is_empty():
        return {}
    rewrite._check()  # pylint: disable=protected-access
    graph = rewrite.graph
    with graph.as_default():  # Also when called in eager mode with a graph.
        return _apply_checked(rewrite)


def _apply_checked(rewrite: Rewrite) -> Dict[str, tf.Operation]:
    graph = rewrite.graph
    ops = rewrite.nodes.build()
    moved: List[_Reroute] = []
    try:
        for r in rewrite._reroutes:  # pylint: disable=protected-access
            new = r.new if isinstance(r.new, tf.Tensor) else rewrite.nodes.tensor(ops, r.new)
            r.consumer._update_input(r.index, new)  # pylint: disable=protected-access
            moved.append(r)
    except Exception:
        for r in reversed(moved):
            r.consumer._update_input(r.index, r.old)  # pylint: disable=protected-access
        raise
    for op, names in rewrite._control:  # pylint: disable=protected-access
        op._add_control_inputs([ops[n] for n in names])  # pylint: disable=protected-access
    for op, name, value in rewrite._attrs:  # pylint: disable=protected-access
        op._set_attr(name, value)  # pylint: disable=protected-access
        marks.attribute_set(op, name)
    with graph.control_dependencies(None):
        for variable_def, collections in rewrite._variables:  # pylint: disable=protected-access
            variable = range_variables.wrap(variable_def)
            for name in collections:
                graph.add_to_collection(name, variable)
    for name, value in rewrite._collections:  # pylint: disable=protected-access
        graph.add_to_collection(name, value)
    for fn in rewrite._after:  # pylint: disable=protected-access
        fn(ops)
    return ops
