"""Rewriting the graph of a `tf.function` while it is traced.

The passes were written for `tf.compat.v1` graphs. A `tf.function`'s graph
(a `FuncGraph`) can be edited the same way while its Python function runs
(new ops imported, consumer inputs moved), with two differences this module
bridges:

* Variables. A variable op made inside a function would be a new resource at
  every call, never initialised. qat's variables (ranges, the step counter)
  are instead made once, eagerly, by a `VariableStore` the caller owns (the
  quantized model), and the function reads and updates them through their
  captured handles, as it does the model's own variables. Each is watched by
  the graph, so TF 2's converter freezes it and `tf.GradientTape` sees it.
* Replicas. Under a `tf.distribute` strategy the store's variables are
  mirrored (one component per replica device). The store says which
  component a trace reads and updates (`VariableStore.handles`: in replica
  context its replica's own, in cross-replica context the primary, with the
  updates written to every component); how a training trace combines the
  replicas' range statistics, so every replica computes the same new range
  and the mirrors stay equal, is the quantize pass's replication hook
  (`qat.tf2.replicas.TraceReplication`).
* Tensor identity. TF 2 makes graph tensors of a function unhashable and
  `==` an op; the passes key dicts and sets by tensor. `editing(graph)` gives
  tensors graph-mode identity semantics for the duration of a rewrite.

Example::

    store = MyStore()                        # makes tf.Variables, once
    @tf.function(autograph=False)
    def f(x):
        y = model(x)
        with function_graphs.editing(tf.compat.v1.get_default_graph(), store):
            ...  # run a pass on the graph
        return y
"""
import contextlib
import threading
from typing import Iterator, Optional, Sequence, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor as tensor_lib


class VariableStore(object):
    """Makes and keeps the variables qat's passes ask for in function graphs.

    Subclasses decide what a variable is (a `tf.Variable`, a Keras weight)
    and who tracks it; `variable` is called during tracing, outside the
    function (in eager context), and must return the same variable for the
    same name on every later trace.
    """

    def variable(self, name: str, dtype: tf.DType, shape: Sequence[int],
                 initial_value: np.ndarray) -> tf.Variable:
        """The variable called `name`, created with `initial_value` if new.

        Args:
          name: qat's name for it (`<prefix>/min`, `fake_quantization_step`).
          dtype: its dtype.
          shape: its shape.
          initial_value: its value when new (of `shape`).

        Returns:
          A resource `tf.Variable` (not trainable).
        """
        raise NotImplementedError

    def statistic(self, name: str, dtype: tf.DType, shape: Sequence[int],
                  initial_value: np.ndarray) -> tf.Variable:
        """A count qat keeps about training (`<prefix>/skipped_batches`), made
        like `variable`; owners may keep it out of the model's weights. By
        default one of the `variable`s."""
        return self.variable(name, dtype, shape, initial_value)

    def handles(self, variable: tf.Variable) -> Tuple[tf.Tensor, Sequence[tf.Tensor]]:
        """The handle this trace reads `variable` through, and further handles
        each of its updates is also written to (none for a plain variable)."""
        return variable.handle, ()


_ACTIVE = threading.local()


def active_store() -> Optional[VariableStore]:
    """The store of the rewrite running in this thread, or None."""
    return getattr(_ACTIVE, "store", None)


def is_function_graph(graph: tf.Graph) -> bool:
    """Whether `graph` is the graph of a `tf.function` (a FuncGraph)."""
    return bool(getattr(graph, "building_function", False))


@contextlib.contextmanager
def editing(graph: tf.Graph, store: VariableStore,
            outputs: Sequence[tf.Tensor] = ()) -> Iterator[None]:
    """Lets the passes rewrite `graph`, a function graph being traced.

    Within the block, tensors hash and compare by identity (as in graph
    mode) and qat's variables come from `store`.

    Args:
      graph: the FuncGraph being traced.
      store: where qat's variables are made and kept.
      outputs: the tensors the function will return (`traced_outputs`).

    Raises:
      ValueError: if `graph` is not a function graph.
    """
    if not is_function_graph(graph):
        raise ValueError(f"{graph} is not the graph of a tf.function.")
    previous = active_store(), getattr(_ACTIVE, "outputs", None)
    previous_equality = tensor_lib.Tensor._USE_EQUALITY  # pylint: disable=protected-access
    _ACTIVE.store = store
    _ACTIVE.outputs = (graph, {t.op for t in outputs}) if outputs else None
    tensor_lib.Tensor._USE_EQUALITY = False  # pylint: disable=protected-access
    try:
        with graph.as_default():
            yield
    finally:
        tensor_lib.Tensor._USE_EQUALITY = previous_equality  # pylint: disable=protected-access
        _ACTIVE.store, _ACTIVE.outputs = previous


def traced_outputs(graph: tf.Graph) -> Optional[Set[tf.Operation]]:
    """The ops whose outputs the function being rewritten returns, or None
    where they are not known (a tf.Graph: a user may fetch any tensor).

    An op of such a function that nothing reads and that is not one of them
    is dead code (Keras 3 stacks a recurrent layer's outputs it does not
    return): the function never computes it.
    """
    known = getattr(_ACTIVE, "outputs", None)
    return known[1] if known is not None and known[0] is graph else None


class _Detached(object):
    """The control-flow context of an op a rewrite replaced in a function graph.

    `tf.function` makes every stateful op of a function a control output,
    which the runtime runs and TF's converter converts whatever reads it;
    TensorFlow skips ops inside a v1 loop context when it picks them
    (`auto_control_deps`), which this context says the op is. Nothing else
    reads an unconnected op's context.
    """
    outer_context = None

    def IsWhileContext(self) -> bool:  # pylint: disable=invalid-name
        return True

    def IsCondContext(self) -> bool:  # pylint: disable=invalid-name
        return False

    def IsXLAContext(self) -> bool:  # pylint: disable=invalid-name
        return False


_DETACHED = _Detached()


def detach(op: tf.Operation) -> None:
    """Leaves `op`, unconnected by a rewrite, out of its function's control outputs.

    An op the passes replaced cannot be deleted (TensorFlow deletes no op);
    in a tf.Graph nothing runs it once nothing reads it, but a tf.function
    being traced would make a stateful one (a replaced `While`) a control
    output: run at every call, and converted by TF's converter. Does nothing
    outside a function graph being traced.
    """
    if is_function_graph(op.graph) and getattr(op.graph, "experimental_acd_manager", None):
        op._set_control_flow_context(_DETACHED)  # pylint: disable=protected-access


def captured_handle(graph: tf.Graph, variable: tf.Variable) -> tf.Tensor:
    """The handle of `variable` inside `graph`, captured and watched.

    Watching makes it one of the function's variables: TF 2's converter
    freezes it to its value and savers find it.
    """
    return captured_handles(graph, variable)[0]


def captured_handles(graph: tf.Graph, variable: tf.Variable
                     ) -> Tuple[tf.Tensor, Sequence[tf.Tensor]]:
    """`variable`'s handles inside `graph`: (read, further ones to update).

    Which handles: the active store's `handles` (a mirrored variable's
    component), else the variable's own.
    """
    store = active_store()
    read, mirrors = (store.handles(variable) if store is not None
                     else (variable.handle, ()))
    graph.watch_variable(variable)
    return _capture(graph, read), [_capture(graph, h) for h in mirrors]


def _capture(graph: tf.Graph, handle: tf.Tensor) -> tf.Tensor:
    if isinstance(handle, tf.__internal__.EagerTensor) or handle.graph is not graph:
        return graph.capture(handle)
    return handle


def store_variable(graph: tf.Graph, name: str, dtype: tf.DType, shape,
                   initial_value, statistic: bool = False) -> tf.Variable:
    """The active store's variable `name`, made outside the function if new.

    `statistic`: made by the store's `statistic` (a count about training).

    Raises:
      RuntimeError: if no rewrite of a function graph is running.
    """
    store = active_store()
    if store is None:
        raise RuntimeError(
            f"qat cannot make the variable {name!r} in the graph of a tf.function "
            f"({graph.name}) outside qat.quantize_model: a variable made there "
            "would be a new one at every call.")
    value = np.broadcast_to(np.asarray(initial_value, dtype.as_numpy_dtype),
                            tf.TensorShape(shape).as_list())
    with tf.init_scope(), tf.variable_creator_scope(_qat_variable):
        make = store.statistic if statistic else store.variable
        return make(name, dtype, list(value.shape), np.array(value))


def _qat_variable(next_creator, **kwargs):
    """Makes a plain eager variable even while a tf.function is first traced.

    `tf.function` turns the variables its first trace makes into
    `UnliftedInitializerVariable`s, initialised by the function and owned by
    nobody; qat's belong to the quantized model.

    Under a `tf.distribute` strategy the variable is mirrored (the strategy's
    creator runs next) with aggregation ONLY_FIRST_REPLICA: qat's updates
    write each component with the value every replica computes alike, and an
    assignment through the variable's API in replica context (not qat's)
    takes the first replica's value instead of letting the mirrors drift.
    """
    kwargs["experimental_enable_variable_lifting"] = False
    kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return next_creator(**kwargs)
