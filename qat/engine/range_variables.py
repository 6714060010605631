"""The variables qat creates, of the model's kind: ref or resource.

TF1 built ref variables (`VariableV2`, read through an `Identity`, updated by
`Assign` / `AssignSub` / `AssignAdd`); TF 2 builds resource variables
(`VarHandleOp`, `ReadVariableOp`, `AssignVariableOp` ...). Tools written for
TF1 graphs handle only the first kind: TF's `freeze_graph` restoring from a
GraphDef and a checkpoint wraps every checkpointed variable of the graph in a
saveable and fails on a resource handle (`IndexError` in
`ResourceVariableSaveable`). So qat's range variables and its
`fake_quantization_step` take the kind of the model's variables:

* ref variables when every variable of the model (the graph's variable ops
  qat did not create) is a ref variable;
* resource variables when the model has a resource variable (a graph that
  mixes both kinds cannot go through TF1-only tools anyway, and resource
  variables are TF 2's kind);
* a graph without variables of its own follows the process's setting:
  ref variables after `tf.compat.v1.disable_resource_variables()`, resource
  variables otherwise.

Checkpoints name variables, not their kind: ranges saved from one kind
restore into the other.

`VariableEmitter` writes the NodeDefs of either kind into a
`qat.engine.node_batch.NodeBatch` and returns `VariableDef`s, which
`qat.engine.rewrite.Rewrite.add_variable` wraps in the matching `tf.Variable`
class after the import.

The graph of a `tf.function` gets neither: its variables are made once,
eagerly, by the rewrite's `qat.engine.function_graphs.VariableStore`
(`CAPTURED`), and the graph reads and updates their captured handles. A
mirrored variable (under a `tf.distribute` strategy) is read and updated
through the component the store names: its replica's in replica context; in
cross-replica context the primary, each update written to every component.
"""
import sys
from typing import Dict, List, Optional, Sequence

import tensorflow as tf
from tensorflow.core.framework import variable_pb2

from qat.engine import function_graphs
from qat.engine import marks
from qat.engine import op_index

REF = "ref"
RESOURCE = "resource"
CAPTURED = "captured"

REF_VARIABLE_TYPES = frozenset(["VariableV2", "Variable", "AutoReloadVariable"])
RESOURCE_VARIABLE_TYPES = frozenset(["VarHandleOp"])

_MEMO_KEY = "range_variables"


def variable_kind(graph: tf.Graph) -> str:
    """The kind of variable qat creates in `graph`: `REF` or `RESOURCE`.

    Args:
      graph: the model's graph.

    Returns:
      `CAPTURED` for the graph of a tf.function; `REF` when the graph's own
      variables are all ref variables, or it has none and resource variables
      are disabled in this process; `RESOURCE` otherwise.
    """
    if function_graphs.is_function_graph(graph):
        return CAPTURED
    has_ref = False
    for op in op_index.ops_of_types(graph, RESOURCE_VARIABLE_TYPES | REF_VARIABLE_TYPES):
        if op.type in RESOURCE_VARIABLE_TYPES and not marks.made_by_qat(op):
            return RESOURCE
        if op.type in REF_VARIABLE_TYPES and not marks.made_by_qat(op):
            has_ref = True
    if has_ref:
        return REF
    return RESOURCE if tf.compat.v1.resource_variables_enabled() else REF


def wrap(variable_def: variable_pb2.VariableDef) -> tf.Variable:
    """The `tf.Variable` of an imported variable, of its kind, known to Keras.

    Call it with the variable's graph as the default graph.
    """
    # pylint: disable=import-outside-toplevel
    from tensorflow.python.ops import ref_variable
    from tensorflow.python.ops import resource_variable_ops
    if variable_def.is_resource:
        variable = resource_variable_ops.ResourceVariable(variable_def=variable_def)
    else:
        variable = ref_variable.RefVariable(variable_def=variable_def)
    track_for_keras(variable)
    return variable


def track_for_keras(variable: tf.Variable) -> None:
    """Has tf_keras's graph-mode session initialise `variable` (when loaded).

    In graph mode tf_keras initialises, when it hands out its session (`fit`,
    `predict`, `get_session`), the variables it tracks and no others; qat's
    variables join them, so `model.fit` after a rewrite needs no
    `global_variables_initializer()`. Keras only initialises variables that
    are not initialised yet: a restored range keeps its value. tf_keras is not
    imported here; a process without it has nothing to tell.
    """
    backend = sys.modules.get("tf_keras.src.backend")
    track = getattr(backend, "track_variable", None)
    if track is not None:
        track(variable)


class VariableEmitter(object):
    """Writes variables of one kind, with their reads and updates, as NodeDefs.

    Names follow TensorFlow's: `<name>`, `<name>/Assign` (initializer) and the
    snapshot read `<name>/Read/ReadVariableOp` (resource) or `<name>/read`
    (ref). Update methods return the node holding the updated value.

    Args:
      nodes: the `NodeBatch` the nodes go into.
      kind: `REF`, `RESOURCE` or `CAPTURED`.
    """

    def __init__(self, nodes, kind: str):
        if kind not in (REF, RESOURCE, CAPTURED):
            raise ValueError("Unknown variable kind %r: use %r, %r or %r."
                             % (kind, REF, RESOURCE, CAPTURED))
        self._nodes = nodes
        self.kind = kind
        self._dtypes: Dict[str, tf.DType] = {}
        self._before: Dict[str, str] = {}
        # CAPTURED: variable name -> the batch's name for its captured handle,
        # the further handles its updates are written to (the other
        # components of a mirrored variable in cross-replica context), and
        # the variables themselves.
        self._handles: Dict[str, str] = {}
        self._mirrors: Dict[str, List[str]] = {}
        self.captured: Dict[str, tf.Variable] = {}

    @classmethod
    def for_rewrite(cls, rewrite) -> "VariableEmitter":
        """The emitter of `rewrite` (one per rewrite, kind from its graph)."""
        if _MEMO_KEY not in rewrite.memo:
            rewrite.memo[_MEMO_KEY] = cls(rewrite.nodes, variable_kind(rewrite.graph))
        return rewrite.memo[_MEMO_KEY]

    @property
    def is_resource(self) -> bool:
        return self.kind in (RESOURCE, CAPTURED)

    def variable(self, name: str, dtype: tf.DType, shape, initial_value: str,
                 device: str = "", trainable: bool = False,
                 initial_array=None, statistic: bool = False,
                 **attrs) -> Optional[variable_pb2.VariableDef]:
        """Adds variable `name` (a unique name) initialised from `initial_value`.

        Args:
          name: the variable op's name (reserved with `unique_name`).
          dtype: its dtype.
          shape: its shape.
          initial_value: the node (`name` or `name:<i>`) of its initial value.
          device: the device of its ops.
          trainable: the VariableDef's `trainable`.
          initial_array: the initial value as an array (broadcast to
            `shape`); what a `CAPTURED` variable is made with.
          statistic: a count qat keeps about training, not a value the model
            computes with (`CAPTURED`: made by the store's `statistic`).
          **attrs: further attributes of every op (e.g. the `_qat` mark).

        Returns:
          Its VariableDef, for `Rewrite.add_variable`; None for a `CAPTURED`
          variable (made already, `captured[name]`).
        """
        shape = tf.TensorShape(shape)
        node = self._nodes.node
        self._dtypes[name] = dtype
        if self.kind == CAPTURED:
            graph = self._nodes.graph
            variable = function_graphs.store_variable(graph, name, dtype, shape,
                                                      initial_array, statistic=statistic)
            self.captured[name] = variable
            read, mirrors = function_graphs.captured_handles(graph, variable)
            self._handles[name] = self._nodes.external(read)
            self._mirrors[name] = [self._nodes.external(h) for h in mirrors]
            self._read(self.snapshot(name), name, device, (), attrs)
            return None
        if self.is_resource:
            node(name, "VarHandleOp", device=device, dtype=dtype, shape=shape,
                 shared_name=name.encode(), container=b"", **attrs)
            node(name + "/Assign", "AssignVariableOp", [name, initial_value],
                 device=device, dtype=dtype, **attrs)
        else:
            node(name, "VariableV2", device=device, dtype=dtype, shape=shape,
                 shared_name=b"", container=b"", **attrs)
            node(name + "/Assign", "Assign", [name, initial_value], device=device,
                 T=dtype, validate_shape=True, use_locking=True, **attrs)
        snapshot = self._read(self.snapshot(name), name, device, (), attrs)
        initial = initial_value if ":" in initial_value else initial_value + ":0"
        return variable_pb2.VariableDef(
            variable_name=name + ":0", initializer_name=name + "/Assign",
            snapshot_name=snapshot + ":0", initial_value_name=initial,
            trainable=trainable, is_resource=self.is_resource)

    def snapshot(self, variable: str) -> str:
        """The variable's snapshot read (what eval graphs and the Saver read)."""
        return variable + ("/Read/ReadVariableOp" if self.is_resource else "/read")

    def before_update(self, variable: str, device: str = "", **attrs) -> str:
        """The value before this run's update, for the update and other readers.

        Resource variables: the snapshot read (an update copies a buffer that
        is still read). Ref variables update in place, so readers get a copy
        (`Snapshot`) that every update of the variable waits for.
        """
        if self.is_resource:
            return self.snapshot(variable)
        if variable not in self._before:
            self._before[variable] = self._nodes.node(
                variable + "/before_update", "Snapshot", [variable], device=device,
                T=self._dtypes[variable], **attrs)
        return self._before[variable]

    def assign(self, scope: str, variable: str, value: str, device: str = "",
               control: Sequence[str] = (), return_read: bool = True, **attrs) -> str:
        """`variable = value`; returns the node of the updated value, or
        without `return_read` the update op (for control dependencies).

        `control`: nodes the update runs after (their ops run with it).
        """
        return self._update(scope, "Assign", variable, value, device, attrs, control,
                            return_read=return_read)

    def assign_sub(self, scope: str, variable: str, delta: str, device: str = "",
                   control: Sequence[str] = (), **attrs) -> str:
        """`variable -= delta`; returns the node of the updated value."""
        return self._update(scope, "AssignSub", variable, delta, device, attrs, control)

    def assign_add(self, scope: str, variable: str, delta: str, device: str = "",
                   return_read: bool = True, **attrs) -> str:
        """`variable += delta`; returns the node of the updated value, or
        without `return_read` the update op (for control dependencies)."""
        return self._update(scope, "AssignAdd", variable, delta, device, attrs,
                            return_read=return_read)

    def _update(self, scope: str, op: str, variable: str, value: str, device: str,
                attrs: dict, control: Sequence[str] = (), return_read: bool = True) -> str:
        dtype = self._dtypes[variable]
        node = self._nodes.node
        if self.is_resource:
            # Names as tf.compat.v1's resource-variable methods give them.
            name = scope if op == "Assign" else scope + "/" + op + "VariableOp"
            update = node(name, op + "VariableOp", [self._handle(variable), value],
                          device=device, control=list(control), dtype=dtype, **attrs)
            # The same update of every further component (equal before it).
            updates = [update] + [
                node(self._nodes.unique_name("%s_mirror_%d" % (name, k)), op + "VariableOp",
                     [handle, value], device="", dtype=dtype, **attrs)
                for k, handle in enumerate(self._mirrors.get(variable, ()), 1)]
            if not return_read:
                return update
            read = scope + ("/ReadVariableOp" if op == "Assign" else "/ReadVariableOp_1")
            return self._read(read, variable, device, updates, attrs)
        control = [self.before_update(variable, device, **attrs)] + list(control)
        extra = {"validate_shape": True} if op == "Assign" else {}
        name = scope if op == "Assign" else scope + "/" + op
        update = node(name, op, [variable, value], device=device, control=control,
                      T=dtype, use_locking=False, **extra, **attrs)
        if not return_read:
            return update
        # Read after the update, from the variable itself (as the resource
        # read is), so readers of the value find the variable behind it.
        return self._read(name + "/read", variable, device, [update], attrs)

    def _handle(self, variable: str) -> str:
        """The input naming `variable`'s handle (its op, or its capture)."""
        return self._handles.get(variable, variable)

    def _read(self, name: str, variable: str, device: str, control: Sequence[str],
              attrs: dict) -> str:
        dtype = self._dtypes[variable]
        if self.is_resource:
            return self._nodes.node(name, "ReadVariableOp", [self._handle(variable)],
                                    device=device, control=control, dtype=dtype, **attrs)
        return self._nodes.node(name, "Identity", [variable], device=device,
                                control=control, T=dtype, **attrs)

