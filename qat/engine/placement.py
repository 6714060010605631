"""Device placement of the ops and variables the passes create.

In a TF1 cluster (between-graph replication) the model is built under
`tf.device(tf.compat.v1.train.replica_device_setter(cluster))`: variables go
to the parameter servers (`/job:ps`), everything else to the worker. The
passes follow the same rule for what they add:

* compute ops sit on the device of the op they serve: a weights quantizer on
  its layer's device, an activation quantizer on the device of the op that
  produces the activation (the fold pass already uses the layer's device);
* variables (the range variables `<prefix>/min|max`, the shared
  `fake_quantization_step`) sit with the model's variables. If a device
  function is active on the graph when the rewrite runs (it is called inside
  the `replica_device_setter` scope), their NodeDefs get no device, and the
  function decides exactly as for a variable the user creates there
  (`import_graph_def` sets each imported node's device to its NodeDef's, then
  applies the graph's device function stack to it, innermost first, as for an
  op built by a Python constructor inside `tf.device(nodedef_device)`;
  replica_device_setter keeps a device the op has and gives the rest: a
  round-robin setter spreads the variables over the ps tasks, the compute
  ops keep their worker device). Otherwise (the rewrite is called after
  the scope was left) they copy the device of the nearest variable behind the
  tensor they quantize (the layer's weights, gamma, ...), else of the global
  step, else of the first global variable.

Ops reading or assigning a resource variable are placed with the resource by
TensorFlow's placer whatever device they request, as for the user's own
variable reads.
"""
import collections
from typing import Iterable, Optional

import tensorflow as tf

VARIABLE_OP_TYPES = frozenset(
    ["VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable"])
# How many ops the backward search for a variable visits at most.
_MAX_SEARCH = 64


def device_function_active(graph: tf.Graph) -> bool:
    """Whether a device scope or function (e.g. replica_device_setter) is active."""
    return bool(graph._device_functions_outer_to_inner)  # pylint: disable=protected-access


def variable_op(tensor: tf.Tensor,
                max_ops: int = _MAX_SEARCH) -> Optional[tf.Operation]:
    """The nearest variable op behind `tensor` (breadth-first, bounded).

    Args:
      tensor: where the search starts.
      max_ops: how many ops to visit at most.

    Returns:
      A VarHandleOp / VariableV2 op, or None if none is found.
    """
    queue = collections.deque([tensor.op])
    seen = set()
    while queue and len(seen) < max_ops:
        op = queue.popleft()
        if op in seen:
            continue
        seen.add(op)
        if op.type in VARIABLE_OP_TYPES:
            return op
        queue.extend(t.op for t in op.inputs)
    return None


def shared_variable_device(graph: tf.Graph) -> str:
    """The device for a variable that belongs to no layer (the step counter).

    Args:
      graph: the graph the variable is created in.

    Returns:
      "" when a device function is active (it decides), else the device of
      the global step, else of the first global variable that has one, else "".
    """
    if device_function_active(graph):
        return ""
    candidates = list(graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP))
    candidates += graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    for variable in candidates:
        device = _variable_op_device(variable)
        if device:
            return device
    return ""


def _variable_op_device(variable) -> str:
    """The device of `variable`'s op; a distributed variable's primary copy's.

    A `tf.distribute` variable (MirroredVariable, SyncOnReadVariable) in a
    collection has no op of its own (its `op` is a `DistributedVarOp` with no
    device): its first component, the one on the first replica's device,
    stands for it.
    """
    primary = getattr(variable, "_primary", None)
    if primary is not None:
        variable = primary
    op = getattr(variable, "op", None)
    return getattr(op, "device", "") or ""


class Placement(object):
    """Devices for the quantizers of one rewrite of `graph`.

    Args:
      graph: the graph being rewritten (read when the rewrite starts).
    """

    def __init__(self, graph: tf.Graph):
        self._graph = graph
        self._function_active = device_function_active(graph)
        self._shared = shared_variable_device(graph)

    def compute_device(self, tensor: tf.Tensor,
                       layers: Iterable[tf.Operation] = ()) -> str:
        """The device of a quantizer's compute ops.

        Args:
          tensor: the quantized tensor.
          layers: for weights, the layer ops reading them (the first one's
            device is used: a ref variable's read sits on the ps).

        Returns:
          A device string ("" when the ops it serves have none).
        """
        layers = list(layers)
        return layers[0].device if layers else tensor.op.device

    def variable_device(self, tensor: tf.Tensor,
                        layers: Iterable[tf.Operation] = ()) -> str:
        """The device of a quantizer's range variables.

        Args:
          tensor: the quantized tensor.
          layers: layer ops reading it, searched when no variable is found
            behind `tensor` (a graph input feeding a layer).

        Returns:
          "" under an active device function (it decides), else the device
          of the layer's variables (see the module docstring).
        """
        if self._function_active or not self._shared:
            # Under a device function, or no variable of the graph has a
            # device (single-process graphs): nothing to copy.
            return ""
        for start in [tensor] + [t for op in layers for t in op.inputs]:
            op = variable_op(start)
            if op is not None and op.device:
                return op.device
        return self._shared
