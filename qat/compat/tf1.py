"""What TF1 gave scripts that TensorFlow 2.21 and NumPy 2 took away (qat.compat).

`qat.compat.install()` applies these; each can be applied alone:

- `enable_tf1_graph_mode()`: TF1's defaults for `tf.compat.v1` code. Eager
  execution off (ops outside a `with graph.as_default()` block go to the
  global default graph, as in TF1: `mobilenet_v1_train.py` adds its summaries
  there), `tf.compat.v1.get_variable` / `tf.compat.v1.Variable` make ref
  variables, and `tf.cond` / `tf.while_loop` build TF1's Switch/Merge control
  flow outside `tf.function`. TF 2 APIs keep their meaning: `tf.Variable` and
  tf_keras layers still make resource variables, `tf.function` bodies still
  use functional control flow. `restore_tf2_behavior(state)` undoes it.
- `add_numpy_aliases()`: the NumPy names TF1-era code uses that NumPy 1.24
  and 2.0 removed (`np.int`, `np.float`, `np.object`, `np.float_`, ...), each
  bound to what it meant then; names NumPy has are never replaced.
- `add_operation_outputs()`: `Operation._outputs`, TF1's private list of an
  operation's output tensors (openai/gradient-checkpointing reads it), as a
  read-only view of `Operation.outputs`.
"""
import builtins
from typing import Dict, NamedTuple

from absl import logging
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_util
from tensorflow.python.ops import resource_variables_toggle
from tensorflow.python.util import deprecation

__all__ = ["enable_tf1_graph_mode", "restore_tf2_behavior", "add_numpy_aliases",
           "remove_numpy_aliases", "add_operation_outputs", "remove_operation_outputs",
           "NUMPY_ALIASES"]


class Tf2State(NamedTuple):
    """The settings `enable_tf1_graph_mode` changes, as they were before."""
    eager: bool
    resource_variables: bool
    control_flow_v2: bool


def enable_tf1_graph_mode() -> Tf2State:
    """Sets TF1's graph-mode defaults (see the module docstring).

    Returns:
        The previous settings, for `restore_tf2_behavior`.
    """
    state = Tf2State(eager=context.default_execution_mode == context.EAGER_MODE,
                     resource_variables=resource_variables_toggle.resource_variables_enabled(),
                     control_flow_v2=control_flow_util.ENABLE_CONTROL_FLOW_V2)
    tf.compat.v1.disable_eager_execution()
    with deprecation.silence():  # "not supported in the long term": TF1 scripts use them.
        tf.compat.v1.disable_resource_variables()
    tf.compat.v1.disable_control_flow_v2()
    logging.vlog(1, "qat.compat: TF1 graph mode (was %s)", state)
    return state


def restore_tf2_behavior(state: Tf2State) -> None:
    """Puts back the settings `enable_tf1_graph_mode` returned.

    Eager execution comes back for the calling thread and threads started
    later (TensorFlow's own `enable_eager_execution` refuses once a graph
    exists).
    """
    if state.eager:
        context.default_execution_mode = context.EAGER_MODE
        current = context.context_safe()
        if current is not None:
            current._thread_local_data.is_eager = True  # pylint: disable=protected-access
    if state.resource_variables:
        tf.compat.v1.enable_resource_variables()
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = state.control_flow_v2


# name: what it meant when it was removed (NumPy 1.24: the builtin aliases
# deprecated in 1.20; NumPy 2.0: the rest).
NUMPY_ALIASES: Dict[str, object] = {
    "int": builtins.int, "float": builtins.float, "complex": builtins.complex,
    "object": builtins.object, "str": builtins.str, "bool": builtins.bool,
    "long": builtins.int, "unicode": builtins.str,
    "float_": np.float64, "complex_": np.complex128, "string_": np.bytes_,
    "unicode_": np.str_, "int0": np.intp, "uint0": np.uintp, "bool8": np.bool_,
    "object0": np.object_, "str0": np.str_, "bytes0": np.bytes_,
    "longfloat": np.longdouble, "singlecomplex": np.complex64,
    "cfloat": np.complex128, "longcomplex": np.clongdouble, "clongfloat": np.clongdouble,
    "NaN": np.nan, "NAN": np.nan, "Inf": np.inf, "Infinity": np.inf, "infty": np.inf,
    "PINF": np.inf, "NINF": -np.inf, "PZERO": 0.0, "NZERO": -0.0,
    "product": np.prod, "cumproduct": np.cumprod, "alltrue": np.all, "sometrue": np.any,
    "round_": np.round, "asfarray": lambda a, dtype=np.float64: np.asarray(
        a, dtype=dtype if np.issubdtype(dtype, np.inexact) else np.float64),
    "asscalar": lambda a: a.item(),
}
_added_numpy_names = []


def add_numpy_aliases() -> list:
    """Binds each of NUMPY_ALIASES that numpy lacks.

    Returns:
        The names added (those numpy already has are left as they are).
    """
    for name, value in NUMPY_ALIASES.items():
        if name not in vars(np):
            setattr(np, name, value)
            _added_numpy_names.append(name)
    return list(_added_numpy_names)


def remove_numpy_aliases() -> None:
    """Removes the names `add_numpy_aliases` added."""
    while _added_numpy_names:
        delattr(np, _added_numpy_names.pop())


def _outputs(self):
    return list(self.outputs)


def add_operation_outputs() -> bool:
    """Gives `tf.Operation` TF1's `_outputs` (read-only) where it has none.

    Returns:
        Whether it was added.
    """
    if hasattr(ops.Operation, "_outputs"):
        return False
    outputs = property(_outputs, doc="TF1's Operation._outputs: list(op.outputs).")
    ops.Operation._outputs = outputs  # pylint: disable=protected-access
    return True


def remove_operation_outputs() -> None:
    """Removes what `add_operation_outputs` added."""
    if isinstance(vars(ops.Operation).get("_outputs"), property) and \
            vars(ops.Operation)["_outputs"].fget is _outputs:
        del ops.Operation._outputs  # pylint: disable=protected-access
