"""Gradients with recomputation (sublinear-memory gradient checkpointing).

`gradients(ys, xs)` computes the same values as `tf.gradients(ys, xs)` but keeps
only a few forward tensors (the checkpoints) alive for the backward pass. The
forward ops between consecutive checkpoints are copied with the graph editor
and the gradients are taken through the copies, segment by segment, from the
last segment to the first. Each copy waits (control dependency) for the
gradient flowing into its segment, so the executor recomputes a segment only
when its backward pass is about to run and frees it afterwards. With about
sqrt(n) checkpoints on an n-layer chain, peak activation memory drops from
O(n) to O(sqrt(n)) for about one extra forward pass.

Built only on `qat.graph_editor` (walks, `copy_with_input_replacements`,
`reroute_ts` with `can_modify`, `add_control_inputs`). Written for
`tf.compat.v1` graphs.

Limitations: random ops that depend on xs (e.g. dropout whose noise shape is
computed from an activation) cannot be recomputed identically and are refused;
random ops outside the path (dropout with a static shape) are not copied, so
the copies share their values within a run. Control-flow-v1 ops
(Switch/Merge/Enter/Exit) between xs and ys are refused; v2 functional
`If`/`While` ops are single ops and are fine.
"""
import math
from typing import Dict, List, Optional, Sequence, Union

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from qat import graph_editor as ge

__all__ = ["gradients", "CHECKPOINTS_COLLECTION", "find_bottleneck_tensors"]

# Tensors a user marks as checkpoints for checkpoints="collection".
CHECKPOINTS_COLLECTION = "checkpoints"

_SPEED_OP_TYPES = frozenset(["MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                             "Conv2D", "Conv3D", "DepthwiseConv2dNative"])


def _is_float(t: tf.Tensor) -> bool:
    return t.dtype.base_dtype.is_floating


def _is_random(op: tf.Operation) -> bool:
    return (op.type.startswith("Random") or op.type in (
        "TruncatedNormal", "Multinomial", "ParameterizedTruncatedNormal")) and \
        not op.type.startswith("Stateless")


def _as_tensor(x) -> tf.Tensor:
    if resource_variable_ops.is_resource_variable(x):
        return x.handle
    if isinstance(x, tf.Variable):
        return tf.convert_to_tensor(x)
    if not isinstance(x, tf.Tensor):
        raise TypeError("xs must be tensors or variables, got: {!r}".format(x))
    return x


def _region_ops(ys: List[tf.Tensor], xs: List[tf.Tensor]) -> List[tf.Operation]:
    """Ops that depend on an x and that a y depends on, in creation order."""
    bwd = ge.get_backward_walk_ops([y.op for y in ys], inclusive=True)
    # Tensor seeds: the walk starts at the consumers of the xs.
    region = ge.get_forward_walk_ops(list(xs), inclusive=True, within_ops=bwd)
    return sorted(region, key=lambda op: op._id)  # pylint: disable=protected-access


def find_bottleneck_tensors(ys: List[tf.Tensor], xs: List[tf.Tensor]) -> List[tf.Tensor]:
    """Returns the articulation tensors between xs and ys, in topological order.

    A tensor is a bottleneck when every data edge of the region between xs and
    ys that leaves an op created before it ends at its consumers or earlier,
    i.e. the forward pass can be cut there keeping only that tensor. Edges
    leaving source ops (ops with no input from the region, such as variable
    reads) are ignored: those ops are recomputed in any segment that needs
    them. One sweep in creation order (TF graphs are created topologically):
    linear in the region's size.

    Args:
      ys: the output tensors.
      xs: the tensors (or variables) the gradients are taken for.

    Returns:
      The list of floating-point bottleneck tensors (ys excluded).
    """
    xs = [_as_tensor(x) for x in xs]
    order = _region_ops(ys, xs)
    pos = {op: i for i, op in enumerate(order)}
    y_set = set(ys)
    max_reach = -1
    found = []
    for i, op in enumerate(order):
        inside_outs = [t for t in op.outputs if any(c in pos for c in t.consumers())]
        is_source = not any(t.op in pos for t in op.inputs)
        if (max_reach <= i and not is_source and len(inside_outs) == 1
                and _is_float(inside_outs[0]) and inside_outs[0] not in y_set):
            found.append(inside_outs[0])
        if not is_source:
            for t in inside_outs:
                for c in t.consumers():
                    if c in pos:
                        max_reach = max(max_reach, pos[c])
    return found


def _choose_checkpoints(ys, xs, checkpoints) -> List[tf.Tensor]:
    if isinstance(checkpoints, str):
        if checkpoints == "collection":
            chosen = list(ys[0].graph.get_collection(CHECKPOINTS_COLLECTION))
        elif checkpoints == "memory":
            candidates = find_bottleneck_tensors(ys, xs)
            n = len(candidates)
            k = int(round(math.sqrt(n)))
            chosen = [candidates[(j + 1) * n // (k + 1)] for j in range(k)] if k else []
        elif checkpoints == "speed":
            region = _region_ops(ys, xs)
            chosen = [op.outputs[0] for op in region if op.type in _SPEED_OP_TYPES]
        else:
            raise ValueError("Unknown checkpoints strategy {!r}: use a list of tensors, "
                             "'memory', 'speed' or 'collection'.".format(checkpoints))
    else:
        chosen = list(checkpoints)
        for c in chosen:
            if not isinstance(c, tf.Tensor):
                raise TypeError("checkpoints must be tensors, got: {!r}".format(c))
    return chosen


def _accumulate(grads: List) -> Optional[tf.Tensor]:
    grads = [g for g in grads if g is not None]
    if not grads:
        return None
    if len(grads) == 1:
        return grads[0]
    return tf.math.add_n([tf.convert_to_tensor(g) for g in grads])


def gradients(ys, xs, grad_ys=None,
              checkpoints: Union[str, Sequence[tf.Tensor]] = "memory",
              **kwargs) -> List[Optional[tf.Tensor]]:
    """Like `tf.gradients`, recomputing the forward pass between checkpoints.

    Args:
      ys: a tensor or list of tensors to differentiate.
      xs: a tensor, variable, or list of those.
      grad_ys: optional initial gradients, one per y (as in tf.gradients).
      checkpoints: the tensors kept from the forward pass: an explicit list,
        "memory" (about sqrt(n) of the n bottleneck tensors, evenly spaced),
        "speed" (outputs of matmuls and convolutions) or "collection" (the
        tensors in the graph collection `CHECKPOINTS_COLLECTION`).
      **kwargs: passed to each `tf.gradients` call (gate_gradients,
        aggregation_method, colocate_gradients_with_ops).

    Returns:
      One gradient tensor per x (None where y does not depend on x).

    Raises:
      TypeError: on bad arguments.
      ValueError: on an unknown strategy, a checkpoint outside the graph or
        a random op that would have to be recomputed.
    """
    ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
    xs_in = list(xs) if isinstance(xs, (list, tuple)) else [xs]
    xs = [_as_tensor(x) for x in xs_in]
    if grad_ys is not None:
        grad_ys = list(grad_ys) if isinstance(grad_ys, (list, tuple)) else [grad_ys]
    graph = ys[0].graph
    with graph.as_default():
        region = _region_ops(ys, xs)
        region_set = set(region)
        pos = {op: i for i, op in enumerate(region)}
        chosen = _choose_checkpoints(ys, xs, checkpoints)
        y_set = set(ys)
        checkpoints_ = []
        for c in chosen:
            if c.graph is not graph:
                raise ValueError("Checkpoint {} is not in the graph of ys.".format(c.name))
            if c.op in region_set and c not in y_set and c not in checkpoints_:
                checkpoints_.append(c)
        # An x computed from other xs is a checkpoint too: its gradient is
        # complete once the segments after it are done, and it flows on
        # into the segment that computes it.
        internal_xs = [x for x in xs if x.op in region_set and x not in y_set]
        for x in internal_xs:
            if x not in checkpoints_:
                checkpoints_.append(x)
        checkpoints_.sort(key=lambda c: pos[c.op])
        for op in region:
            if op._control_flow_context is not None:  # pylint: disable=protected-access
                raise ValueError(
                    "Op {!r} is in a control-flow-v1 loop or cond between xs and ys; "
                    "segments cannot cut through it. Build the model with control flow "
                    "v2 (the TF 2 default).".format(op.name))
            if _is_random(op):
                raise ValueError(
                    "Op {!r} ({}) draws random numbers between xs and ys: recomputing it "
                    "would give other values; use a stateless random op or take it out "
                    "of the differentiated path.".format(op.name, op.type))
        with tf.name_scope("gradients_with_recompute"):
            disconnected = {c: tf.stop_gradient(c, name="checkpoint") for c in checkpoints_}
        stop_at = list(checkpoints_)
        # Gradients received so far by each checkpoint, and by each x.
        d_checkpoints: Dict[tf.Tensor, List] = {c: [] for c in checkpoints_}
        d_xs: List[List] = [[] for _ in xs]
        x_index = {}
        for i, x in enumerate(xs):
            x_index.setdefault(x, i)

        def backprop_segment(outputs, grads_in, wait_for):
            seed_ops = [t.op for t in outputs if t.op in region_set]
            if not seed_ops:
                return
            # within_ops_fn: O(1) per visited op, no per-segment set rebuild.
            seg_ops = ge.get_backward_walk_ops(
                seed_ops, inclusive=True, within_ops_fn=region_set.__contains__,
                stop_at_ts=stop_at)
            _, info = ge.copy_with_input_replacements(ge.sgv(seg_ops), {})
            copied_ops = list(info._transformed_ops.values())  # pylint: disable=protected-access
            seg_set = set(seg_ops)
            boundary = [c for c in checkpoints_
                        if any(op in seg_set for op in c.consumers())]
            # The copies read the gradient-free stand-ins of the checkpoints.
            ge.reroute_ts([disconnected[c] for c in boundary], boundary,
                          can_modify=copied_ops)
            if wait_for:
                entry_ops = [info._transformed_ops[op] for op in seg_ops  # pylint: disable=protected-access
                             if not any(t.op in seg_set for t in op.inputs)]
                for op_ in entry_ops:
                    missing = [w for w in wait_for if w not in op_.control_inputs]
                    if missing:
                        ge.add_control_inputs(op_, missing)
            # The copies read the xs through per-segment identities, so that
            # tf.gradients, which walks everything downstream of its xs, only
            # walks this segment: building stays linear in the graph size.
            seg_xs = []
            for op in seg_ops:
                for t in op.inputs:
                    if (t in x_index and t.op not in seg_set and t not in disconnected
                            and t not in seg_xs):
                        seg_xs.append(t)
            with tf.name_scope("gradients_with_recompute/segment"):
                stand_ins = [tf.identity(x, name="x") for x in seg_xs]
            ge.reroute_ts(stand_ins, seg_xs, can_modify=copied_ops)
            copied_outputs = [info._transformed_ts.get(t, t) for t in outputs]  # pylint: disable=protected-access
            grads = tf.gradients(copied_outputs, [disconnected[c] for c in boundary] + stand_ins,
                                 grad_ys=grads_in, **kwargs)
            for c, g in zip(boundary, grads[:len(boundary)]):
                d_checkpoints[c].append(g)
            for x, g in zip(seg_xs, grads[len(boundary):]):
                d_xs[x_index[x]].append(g)

        backprop_segment(ys, grad_ys, None)
        for c in reversed(checkpoints_):
            d_c = _accumulate(d_checkpoints[c])
            if c in x_index:
                d_xs[x_index[c]] = [d_c]
            if d_c is None:
                continue
            backprop_segment([c], [d_c], [d_c.op])
        return [_accumulate(g) for g in d_xs]
