"""Values known when a graph is built, computed by running its ops on them.

The constant evaluator of the passes: it runs stateless ops of known inputs
in scratch graphs and Sessions, never in the graph being rewritten.

* `StaticValues`: the values of tensors known when the graph is built
  (constants, static shapes, stateless ops of known inputs), or None;
* `evaluate(op, inputs)`: one stateless op run on given inputs;
* `static_ops(graph, known)`: the ops computed from constants and known
  placeholders only;
* `find_counters(loop, values)` and `trip_count(loop, values)`: a loop's
  variables whose values are known at every step and its number of steps,
  found by running its condition and the counters' updates on those values
  (`loop` is a `qat.matching.loops.Loop`: any object with the attributes
  `LoopFunctions` names).
"""
from typing import Dict, List, Optional, Protocol, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from qat.engine import function_library
from qat.engine import node_attrs

# Dtypes no counter has (tensor lists, variable handles).
HANDLE_DTYPES = (tf.variant, tf.resource)
# How many steps a loop may have (a loop of more is refused).
MAX_STEPS = 10000


class LoopFunctions(Protocol):
    """What `find_counters` and `trip_count` read of a loop (`qat.matching.loops.Loop`)."""
    inputs: List[tf.Tensor]
    body: tf.Graph
    body_inputs: List[tf.Tensor]
    body_outputs: List[tf.Tensor]
    cond: tf.Graph
    cond_inputs: List[tf.Tensor]
    cond_output: tf.Tensor
    counters: Set[int]


class StaticValues(object):
    """Values of tensors known when the graph is built (`value(t)`, or None).

    Constants, shapes (a static dimension of a partly known shape too) and
    stateless ops of known inputs, evaluated once in a scratch graph.
    """

    def __init__(self):
        self._memo: Dict[tf.Tensor, Optional[np.ndarray]] = {}

    def value(self, t: tf.Tensor) -> Optional[np.ndarray]:
        stack = [t]
        while stack:
            top = stack[-1]
            if top in self._memo:
                stack.pop()
                continue
            missing = [i for i in self._needs(top) if i not in self._memo]
            if missing:
                stack.extend(missing)
                continue
            self._memo[top] = self._compute(top)
            stack.pop()
        return self._memo[t]

    @staticmethod
    def _needs(t: tf.Tensor) -> List[tf.Tensor]:
        op = t.op
        if op.type in ("Const", "Shape", "Placeholder") or _stateful(op) or (
                op.type == "StridedSlice" and op.inputs[0].op.type == "Shape"):
            return list(op.inputs[1:]) if op.type == "StridedSlice" else []
        return list(op.inputs)

    def _compute(self, t: tf.Tensor) -> Optional[np.ndarray]:
        op = t.op
        try:
            value = tensor_util.constant_value(t)
        except (TypeError, ValueError):
            value = None
        if value is not None:
            return np.asarray(value)
        if op.type == "StridedSlice" and op.inputs[0].op.type == "Shape":
            return self._shape_slice(op)
        if (op.type in ("Placeholder", "Shape") or _stateful(op)
                or op.type in function_library.CALL_TYPES or any(o.dtype in HANDLE_DTYPES for o in op.outputs)):
            return None
        inputs = [self._memo.get(i) for i in op.inputs]
        if any(v is None for v in inputs):
            return None
        return evaluate(op, inputs)[t.value_index]

    def _shape_slice(self, op: tf.Operation) -> Optional[np.ndarray]:
        """`tf.shape(x)[k]` where dimension k of x is static."""
        dims = op.inputs[0].op.inputs[0].shape
        begin, end, strides = (self._memo.get(i) for i in op.inputs[1:])
        if (dims.rank is None or begin is None or end is None or strides is None
                or op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask")):
            return None
        marker = np.arange(dims.rank).astype(op.inputs[0].dtype.as_numpy_dtype)
        picked = evaluate(op, [marker, begin, end, strides])[0]
        values = [dims[int(k)] for k in np.ravel(picked)]
        if any(v is None for v in values):
            return None
        return np.asarray(values, op.outputs[0].dtype.as_numpy_dtype).reshape(np.shape(picked))


def _stateful(op: tf.Operation) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):
        return True


def evaluate(op: tf.Operation, inputs: List[np.ndarray]) -> List[np.ndarray]:
    """Runs the stateless `op` on `inputs` in a scratch graph."""
    node = tf.compat.v1.NodeDef()
    node.CopyFrom(op.node_def)
    node.name = "op"
    del node.input[:]
    node.ClearField("device")
    node_attrs.drop_internal_attrs(node)  # Colocation with other nodes.
    graph = tf.Graph()
    with graph.as_default():
        graph_def = graph.as_graph_def()
        for k, (t, v) in enumerate(zip(op.inputs, inputs)):
            const = graph_def.node.add()
            const.name = "input_%d" % k
            const.op = "Const"
            const.attr["dtype"].type = t.dtype.as_datatype_enum
            const.attr["value"].tensor.CopyFrom(
                tf.make_tensor_proto(np.asarray(v, t.dtype.as_numpy_dtype)))
            node.input.append(const.name)
        graph_def.node.add().CopyFrom(node)
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as sess:
            return sess.run([graph.get_tensor_by_name("op:%d" % k)
                             for k in range(len(op.outputs))])


def static_ops(graph: tf.Graph, known: Set[tf.Tensor]) -> Set[tf.Operation]:
    """The ops of `graph` computed from constants and `known` placeholders only."""
    found: Set[tf.Operation] = set()
    for op in graph.get_operations():  # Imported: in topological order.
        if op.type == "Placeholder":
            if op.outputs[0] in known:
                found.add(op)
            continue
        if (_stateful(op) or op.type in function_library.CALL_TYPES
                or any(o.dtype in HANDLE_DTYPES for o in op.outputs)):
            continue
        if all(i.op in found for i in op.inputs):
            found.add(op)
    return found


def _read_placeholders(t: tf.Tensor) -> Set[tf.Operation]:
    """The Placeholder ops `t` is computed from."""
    stack, seen, found = [t.op], set(), set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type == "Placeholder":
            found.add(op)
        stack.extend(i.op for i in op.inputs)
    return found


def find_counters(loop: LoopFunctions, values: StaticValues) -> None:
    """Sets `loop.counters` (see the module docstring)."""
    counters = {k for k, t in enumerate(loop.inputs)
                if t.dtype not in HANDLE_DTYPES and values.value(t) is not None}
    while True:
        known = {loop.body_inputs[k] for k in counters}
        static = static_ops(loop.body, known)
        kept = {k for k in counters if loop.body_outputs[k].op in static}
        if kept == counters:
            break
        counters = kept
    loop.counters = counters


def trip_count(loop: LoopFunctions, values: StaticValues
               ) -> Tuple[Optional[int], str, List[Dict[tf.Tensor, np.ndarray]]]:
    """The loop's number of steps and the counters' values at each step.

    Returns:
      (steps, "", [{body tensor: value} per step, for every body tensor
      computed from counters and constants]) or (None, why, []).
    """
    find_counters(loop, values)
    known_cond = {loop.cond_inputs[k] for k in loop.counters}
    if loop.cond_output.op not in static_ops(loop.cond, known_cond):
        read = _read_placeholders(loop.cond_output)
        unknown = sorted({loop.inputs[k].name for k, t in enumerate(loop.cond_inputs)
                          if k not in loop.counters and t.op in read})
        return None, ("its condition reads a value that is only known when the model runs "
                      f"({', '.join(unknown)}: a sequence length that is not static)"), []
    known_body = {loop.body_inputs[k] for k in loop.counters}
    static = [op for op in loop.body.get_operations()
              if op in static_ops(loop.body, known_body) and op.type != "Placeholder"]
    fetches = [t for op in static for t in op.outputs]
    state = {k: values.value(loop.inputs[k]) for k in loop.counters}
    steps: List[Dict[tf.Tensor, np.ndarray]] = []
    with tf.compat.v1.Session(graph=loop.cond) as cond_sess, \
            tf.compat.v1.Session(graph=loop.body) as body_sess:
        for _ in range(MAX_STEPS + 1):
            go = cond_sess.run(loop.cond_output,
                               {loop.cond_inputs[k]: v for k, v in state.items()})
            if not bool(go):
                return len(steps), "", steps
            if len(steps) == MAX_STEPS:
                break
            feed = {loop.body_inputs[k]: v for k, v in state.items()}
            fetched = body_sess.run(fetches, feed) if fetches else []
            step = dict(zip(fetches, fetched))
            step.update({loop.body_inputs[k]: v for k, v in state.items()})
            steps.append(step)
            state = {k: step[loop.body_outputs[k]] for k in loop.counters}
    return None, f"it runs more than {MAX_STEPS} steps", []
