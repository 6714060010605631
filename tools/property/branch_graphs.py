"""Training-only branches and observers built into a graph (`BranchHooks`).

`tools.property.training_branches` describes and draws them (`Branches`);
this module builds one into a graph through the generators' build hooks
(`tools.property.network_graphs.BuildHooks`): the auxiliary head
(`aux_head`), the drop path (`drop_path`) and the observers (`observe`),
under TF 1's or v2's control flow (`control_flow`). `BranchHooks` records
the ops it made (`branch_ops`, `observer_ops`) and the model tensors it
read. Used by tools/property/training_runs.py, converter_training_runs.py
and training_loop.py.
"""
import contextlib
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from tools.property import network_graphs
from tools.property.training_branches import AUX_LOSS_WEIGHT
from tools.property.training_branches import Branches
from tools.property.training_branches import DROP_PATH_KEEP
from tools.property.training_branches import EVAL
from tools.property.training_branches import EXPORT
from tools.property.training_branches import TRAINING


# A graph collection of what the training loop fetches to run the observers
# (merged summaries, metric updates), as slim's summary thread does.
OBSERVER_FETCHES = "property_observer_fetches"


@contextlib.contextmanager
def control_flow(version: str):
    """Builds TF 1's `cond` (Switch / Merge) inside for "v1", v2's for "v2"."""
    before = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = version == "v2"
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = before


def _new_ops(graph: tf.Graph, start: int) -> Set[tf.Operation]:
    return set(graph.get_operations()[start:])


def aux_head(x: tf.Tensor, reader: str, own_scope: bool, classes: int = 3) -> tf.Tensor:
    """An auxiliary head's logits: `reader` of x, a pool, a 1x1 conv / dense + ReLU, logits."""
    def body(h):
        init = tf.compat.v1.glorot_uniform_initializer()
        if h.shape.rank == 4:
            if h.shape[1] is not None and h.shape[1] >= 2 and h.shape[2] >= 2:
                h = tf.nn.avg_pool2d(h, 2, 2, "VALID")
            w = tf.compat.v1.get_variable("conv/kernel", [1, 1, int(h.shape[-1]), 2],
                                          initializer=init)
            h = tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME"))
            h = tf.reduce_mean(h, [1, 2])
        else:
            w = tf.compat.v1.get_variable("hidden/kernel", [int(h.shape[-1]), 2],
                                          initializer=init)
            h = tf.nn.relu(tf.matmul(h, w))
        w = tf.compat.v1.get_variable("logits/kernel", [2, classes], initializer=init)
        b = tf.compat.v1.get_variable("logits/bias", [classes],
                                      initializer=tf.compat.v1.zeros_initializer())
        return tf.matmul(h, w) + b

    if own_scope:
        with tf.compat.v1.variable_scope("aux_head"):
            return body(network_graphs.activation(x, reader))
    h = network_graphs.activation(x, reader)  # In the model's scope: its range numbering.
    with tf.compat.v1.variable_scope("aux_head"):
        return body(h)


def drop_path(x: tf.Tensor, kind: str) -> tf.Tensor:
    """x with whole examples dropped at random (`DROP_PATHS`), training only."""
    keep = tf.constant(DROP_PATH_KEEP)
    if kind == "step_keep":  # NASNet-A's: less kept as training goes on.
        step = tf.cast(tf.compat.v1.train.get_or_create_global_step(), tf.float32)
        ratio = tf.minimum(step / 100.0, 1.0)
        keep = 1.0 - ratio * (1.0 - DROP_PATH_KEEP)
    shape = tf.concat([tf.shape(x)[:1], tf.ones([x.shape.rank - 1], tf.int32)], 0)
    mask = tf.floor(keep + tf.random.uniform(shape, dtype=x.dtype))
    if kind == "mask_div":
        return x * mask / keep
    if kind == "scaled_mask":
        return x * (mask / keep)
    return x / keep * mask  # div_mask, step_keep: NASNet-A's.


def observe(kinds: Tuple[str, ...], targets: List[tf.Tensor]) -> None:
    """Builds the observers `kinds`, the j-th reading `targets[j % len]`.

    Summaries and metric updates are added to `OBSERVER_FETCHES` (what the
    training loop runs with its observer runs); asserts, checks and prints are
    built, not run (a check of a diverged value would stop the run).
    """
    checks = []
    graph = tf.compat.v1.get_default_graph()
    for j, kind in enumerate(kinds):
        t = targets[j % len(targets)]
        name = f"observed_{j}"
        if kind == "histogram":
            tf.compat.v1.summary.histogram("activations/" + name, t)
        elif kind == "zero_fraction":
            tf.compat.v1.summary.scalar("sparsity/" + name, tf.nn.zero_fraction(t))
        elif kind == "print":
            checks.append(tf.print(name, t, tf.reduce_max(t)))
        elif kind == "print_v1":
            tf.compat.v1.Print(t, [t, tf.reduce_mean(t)], name)
        elif kind == "assert":
            checks.append(tf.debugging.assert_greater_equal(t, tf.reduce_min(t)))
        elif kind == "assert_all_finite":
            tf.debugging.assert_all_finite(t, name)
        elif kind == "check_numerics":
            tf.debugging.check_numerics(t, name)
        elif kind == "mean_tensor":
            # A mean of per-example means: mean_tensor needs a static shape.
            _, update = tf.compat.v1.metrics.mean_tensor(tf.reduce_mean(t, 0) * 0.5)
            graph.add_to_collection(OBSERVER_FETCHES, update)
        else:  # A metric of the examples (the reshape only here: an unread one is a model output).
            flat = tf.reshape(t, [tf.shape(t)[0], -1])
            labels = tf.compat.v1.placeholder_with_default(
                tf.zeros(tf.shape(flat)[:1], tf.int32), [t.shape[0]], name=name + "_labels")
            classes = int(flat.shape[-1]) if flat.shape[-1] is not None else 1
            if kind == "accuracy":
                _, update = tf.compat.v1.metrics.accuracy(labels, tf.argmax(flat, 1))
            elif kind == "auc":
                _, update = tf.compat.v1.metrics.auc(tf.one_hot(labels, classes),
                                                     tf.sigmoid(flat))
            else:  # precision_at_k
                _, update = tf.compat.v1.metrics.precision_at_k(
                    tf.cast(labels, tf.int64), flat, min(2, classes))
            graph.add_to_collection(OBSERVER_FETCHES, update)
    if checks:
        tf.group(*checks, name="observer_checks")
    summaries = tf.compat.v1.summary.merge_all()
    if summaries is not None:
        graph.add_to_collection(OBSERVER_FETCHES, summaries)


class BranchHooks(network_graphs.BuildHooks):
    """Builds a `Branches` into a graph built in `mode` (TRAINING, EVAL, EXPORT).

    `branches_on=False` / `observers_on=False` leave out the training-only
    branches / the observers (the graph to compare with), but never the
    model's own reader op (a pre-activation), which every graph has.
    """

    def __init__(self, spec: Branches, mode: str, branches_on: bool = True,
                 observers_on: bool = True):
        self.spec = spec
        self.mode = mode
        self.head_on = branches_on and spec.aux != "none" and (
            mode == TRAINING or (mode == EVAL and spec.aux_in_eval))
        self.drop_on = branches_on and spec.drop_path != "none" and mode == TRAINING
        self.observers_on = observers_on and bool(spec.observers) and mode != EXPORT
        self.branch_ops: Set[tf.Operation] = set()    # the head's and the drop path's ops
        self.observer_ops: Set[tf.Operation] = set()
        self.targets: List[tf.Tensor] = []            # model tensors observers read
        # {op name of a branch's output the model reads: the op name of the
        # model tensor it stands for} (a drop path's result, its input).
        self.stand_ins: Dict[str, str] = {}
        self.aux_logits: Optional[tf.Tensor] = None

    def _head(self, x: tf.Tensor) -> None:
        graph = x.graph
        start = len(graph.get_operations())
        self.aux_logits = aux_head(x, self.spec.aux_reader, self.spec.aux_scope == "own")
        self.branch_ops |= _new_ops(graph, start)

    def block_input(self, index: int, x: tf.Tensor) -> tf.Tensor:
        if index > 0:
            self.targets.append(x)
        spec = self.spec
        if self.head_on and spec.aux == "block_output" and index == spec.aux_block + 1:
            self._head(x)  # Before the model's reader: PNASNet's order.
        if spec.reader == "none" or index != spec.reader_block + 1:
            return x
        if spec.reader_twice:  # NASNet-A's: two cell operations read one input.
            with tf.name_scope("twin"):
                twin = network_graphs.activation(x, spec.reader)
            return twin + network_graphs.activation(x, spec.reader)
        return network_graphs.activation(x, spec.reader)

    def before_activation(self, index: int, y: tf.Tensor, block) -> None:
        if self.head_on and self.spec.aux == "layer_output" and index == self.spec.aux_block:
            self._head(y)

    def after_activation(self, index: int, y: tf.Tensor) -> tf.Tensor:
        self.targets.append(y)
        if not self.drop_on or index != self.spec.drop_block:
            return y
        start = len(y.graph.get_operations())
        dropped = drop_path(y, self.spec.drop_path)
        self.branch_ops |= _new_ops(y.graph, start)
        self.stand_ins[dropped.op.name] = y.op.name
        return dropped

    def finish(self, output: tf.Tensor, loss: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
        graph = output.graph
        if loss is not None and self.aux_logits is not None:
            start = len(graph.get_operations())
            with tf.name_scope("aux_loss"):
                loss = loss + AUX_LOSS_WEIGHT * tf.reduce_mean(tf.square(self.aux_logits))
            self.branch_ops |= _new_ops(graph, start)
        if self.observers_on:
            start = len(graph.get_operations())
            with control_flow(self.spec.control_flow), tf.name_scope("observers"):
                observe(self.spec.observers, self.targets + [output])
            self.observer_ops |= _new_ops(graph, start)
        return loss
