"""Gradient checkpointing in the style of openai/gradient-checkpointing (TF 1.x).

Condensed from memory_saving_gradients.py: `gradients(ys, xs, checkpoints)`
recomputes the forward pass between checkpoints with the contrib graph
editor. Run as a script it checks the gradients against tf.gradients.
The one line after the docstring is the only one added for TF 2: it also
gives TF 2's Operation TF 1's private `op._outputs`, which the upstream file
reads.
"""
import qat.compat; qat.compat.install()
import sys

import numpy as np
import tensorflow as tf
import tensorflow.contrib.graph_editor as ge

tf_gradients = tf.gradients


def fast_backward_ops(within_ops, seed_ops, stop_at_ts):
    bwd_ops = set(ge.get_backward_walk_ops(seed_ops, stop_at_ts=stop_at_ts))
    ops = bwd_ops.intersection(within_ops).difference([t.op for t in stop_at_ts])
    return list(ops)


def tf_toposort(ts, within_ops=None):
    all_ops = ge.get_forward_walk_ops([x.op for x in ts], within_ops=within_ops)
    deps = {}
    for op in all_ops:
        for o in op.outputs:
            deps[o] = set(op.inputs)
    sorted_ts = []
    while deps:
        ready = [t for t, d in deps.items() if not d.intersection(deps)]
        sorted_ts.append(set(ready))
        for t in ready:
            del deps[t]
    # only keep the tensors from our original list
    ts_sorted_lists = []
    for l in sorted_ts:
        keep = list(set(l).intersection(ts))
        if keep:
            ts_sorted_lists.append(keep)
    return ts_sorted_lists


def gradients(ys, xs, grad_ys=None, checkpoints="collection", **kwargs):
    if not isinstance(ys, list):
        ys = [ys]
    if not isinstance(xs, list):
        xs = [xs]

    bwd_ops = ge.get_backward_walk_ops([y.op for y in ys], inclusive=True)
    fwd_ops = ge.get_forward_walk_ops([x.op for x in xs], inclusive=True,
                                      within_ops=bwd_ops)
    xs_ops = [x.op for x in xs]
    fwd_ops = [op for op in fwd_ops if op not in xs_ops]
    fwd_ops = [op for op in fwd_ops if "/assign" not in op.name]
    fwd_ops = [op for op in fwd_ops if "/Assign" not in op.name]
    fwd_ops = [op for op in fwd_ops if "/read" not in op.name]
    ts_all = ge.filter_ts(fwd_ops, True)
    ts_all = [t for t in ts_all if "/read" not in t.name]
    ts_all = set(ts_all) - set(xs) - set(ys)

    if checkpoints == "collection":
        checkpoints = tf.compat.v1.get_collection("checkpoints")
    checkpoints = list(set(checkpoints).intersection(ts_all))
    checkpoints = list(set(checkpoints) - set(ys) - set(xs))
    if not checkpoints:
        raise Exception("no checkpoints nodes found or given as input! ")

    checkpoints_disconnected = {}
    for x in checkpoints:
        checkpoints_disconnected[x] = tf.stop_gradient(x, name=x.op.name + "_sg")

    # partial derivatives to the checkpointed tensors and xs
    ops_to_copy = fast_backward_ops(seed_ops=[y.op for y in ys],
                                    stop_at_ts=checkpoints, within_ops=fwd_ops)
    copied_sgv, info = ge.copy_with_input_replacements(ge.sgv(ops_to_copy), {})
    for origin_op, op in info._transformed_ops.items():
        op._set_device(origin_op.node_def.device)
    copied_ops = info._transformed_ops.values()
    ge.reroute_ts(list(checkpoints_disconnected.values()),
                  list(checkpoints_disconnected.keys()), can_modify=copied_ops)

    copied_ys = [info._transformed_ops[y.op]._outputs[0] for y in ys]
    boundary = list(checkpoints_disconnected.values())
    dv = tf_gradients(ys=copied_ys, xs=boundary + xs, grad_ys=grad_ys, **kwargs)
    d_checkpoints = {r: dr for r, dr in zip(checkpoints_disconnected.keys(),
                                            dv[:len(checkpoints_disconnected)])}
    d_xs = dv[len(checkpoints_disconnected):]

    # walk backwards through the checkpoints, recomputing each segment
    checkpoints_sorted_lists = tf_toposort(checkpoints, within_ops=fwd_ops)
    for ts in checkpoints_sorted_lists[::-1]:
        checkpoints_other = [r for r in checkpoints if r not in ts]
        checkpoints_disconnected_other = [checkpoints_disconnected[r]
                                          for r in checkpoints_other]
        ops_to_copy = fast_backward_ops(within_ops=fwd_ops,
                                        seed_ops=[r.op for r in ts],
                                        stop_at_ts=checkpoints_other)
        if not ops_to_copy:
            break
        copied_sgv, info = ge.copy_with_input_replacements(ge.sgv(ops_to_copy), {})
        copied_ops = info._transformed_ops.values()
        ge.reroute_ts(checkpoints_disconnected_other, checkpoints_other,
                      can_modify=copied_ops)
        boundary = [info._transformed_ops[r.op]._outputs[0] for r in ts]
        substitute_backprops = [d_checkpoints[r] for r in ts]
        dv = tf_gradients(boundary, checkpoints_disconnected_other + xs,
                          grad_ys=substitute_backprops, **kwargs)
        for r, dr in zip(checkpoints_other, dv[:len(checkpoints_other)]):
            if dr is not None:
                if d_checkpoints[r] is None:
                    d_checkpoints[r] = dr
                else:
                    d_checkpoints[r] += dr
        for j in range(len(xs)):
            dx = dv[len(checkpoints_other) + j]
            if dx is not None:
                d_xs[j] = dx if d_xs[j] is None else d_xs[j] + dx
    return d_xs


def main():
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(0)
    x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
    h = x
    params = []
    for i in range(6):
        w = tf.compat.v1.get_variable("w%d" % i, [16, 16])
        b = tf.compat.v1.get_variable("b%d" % i, [16],
                                      initializer=tf.compat.v1.zeros_initializer())
        params += [w, b]
        h = tf.nn.relu(tf.matmul(h, w) + b)
        if i % 2 == 1:
            tf.compat.v1.add_to_collection("checkpoints", h)
    loss = tf.reduce_sum(tf.square(h))
    expected = tf.gradients(loss, params)
    actual = gradients(loss, params, checkpoints="collection")
    feed = {x: np.random.RandomState(0).randn(8, 16).astype(np.float32)}
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        want, got = sess.run([expected, actual], feed)
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(want, got))
    print("max |checkpointed - tf.gradients| = %g" % worst)
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
