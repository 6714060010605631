"""What a training graph has besides the model: training-only branches and observers (issue #37).

A `Branches` is a plain description of what research/slim's training
script and users build around a model, drawn by `branches()`:

* an auxiliary head (Inception's, NASNet-A's, PNASNet-5's): a small head
  (a 2x2 average pool on maps, a 1x1 conv or a dense layer with a ReLU, a
  logits layer) whose loss, times 0.4, is added to the training loss. It
  reads a block's output (`block_output`: a cell's concatenation or add) or
  a block's layer output before its activation (`layer_output`), through a
  reader op (`READERS`: a ReLU, a ReLU6 or none) built *before* the model's
  own: the next block starts with the same op of the block output (a
  pre-activation, as NASNet-A's cells), and a layer output's reader is
  identical to the block's activation where both are ReLUs (PNASNet's
  head, whose ReLU TensorFlow builds before the next cell's identical one).
  The reader lives in a scope of its own or in the model's (`AUX_SCOPES`:
  one scope's range numbering shared with the model's). Training graphs
  build the head; eval graphs too where `aux_in_eval` (Inception's, which
  exports its aux logits unused); export graphs never.
* a drop path on a block's activation (NASNet-A's, tf_keras ConvNeXt's
  StochasticDepth): `x / keep * floor(keep + uniform([batch, 1, ...]))` and
  its other spellings (`DROP_PATHS`), `keep` a constant or NASNet-A's keep
  probability computed from the global step; training graphs only.
* observers of random model tensors (`OBSERVERS`): histogram and
  `tf.nn.zero_fraction` summaries, `tf.print` and `tf.Print`, asserts,
  `tf.debugging.assert_all_finite`, `check_numerics`, and the metrics
  accuracy, AUC, mean_tensor and precision_at_k; built in training and eval
  graphs (never export graphs), under TF 1's control flow (`Switch` / `Merge`:
  slim's scripts run with v2 behaviour off) or v2's.

`BranchHooks` builds them into a graph through the generators' build hooks
(`tools.property.networks.BuildHooks`), records the ops it made
(`branch_ops`, `observer_ops`) and the model tensors it read. Used by
tools/property/training_runs.py and converter_training_runs.py.
"""
import contextlib
import dataclasses
from typing import Dict, List, Optional, Sequence, Set, Tuple

import tensorflow as tf
from hypothesis import strategies as st
from tensorflow.python.ops import control_flow_util

from tools.property import networks

AUX_SOURCES = ("none", "block_output", "layer_output")
READERS = ("none", "relu", "relu6")
AUX_SCOPES = ("own", "shared")
DROP_PATHS = ("none", "div_mask", "mask_div", "scaled_mask", "step_keep")
OBSERVERS = ("histogram", "zero_fraction", "print", "print_v1", "assert", "assert_all_finite",
             "check_numerics", "accuracy", "auc", "mean_tensor", "precision_at_k")
CONTROL_FLOWS = ("v1", "v2")
AUX_LOSS_WEIGHT = 0.4
DROP_PATH_KEEP = 0.8
# The modes a graph is built in: what each builds of a `Branches`.
TRAINING, EVAL, EXPORT = "training", "eval", "export"
# A graph collection of what the training loop fetches to run the observers
# (merged summaries, metric updates), as slim's summary thread does.
OBSERVER_FETCHES = "property_observer_fetches"


@dataclasses.dataclass(frozen=True)
class Branches:
    """What a training (and eval) graph adds to the model; see the module docstring."""
    reader: str = "none"
    reader_block: int = 0
    reader_twice: bool = False
    aux: str = "none"
    aux_block: int = 0
    aux_reader: str = "none"
    aux_scope: str = "own"
    aux_in_eval: bool = False
    drop_path: str = "none"
    drop_block: int = 0
    observers: Tuple[str, ...] = ()
    control_flow: str = "v2"

    def size(self) -> int:
        """A measure to pick the smallest of several failing networks."""
        return ((self.reader != "none") * 2 + self.reader_twice
                + (self.aux != "none") * 4 + (self.aux_reader != "none") + self.aux_in_eval
                + (self.aux_scope != "own") + (self.drop_path != "none") * 2
                + len(self.observers) + (self.control_flow != "v2"))

    def describe(self) -> str:
        """One line, for reports."""
        parts = []
        if self.reader != "none":
            parts.append(f"block{self.reader_block + 1} reads block{self.reader_block}'s output "
                         f"through {self.reader}{' twice' if self.reader_twice else ''}")
        if self.aux != "none":
            parts.append(f"aux head on block{self.aux_block}'s {self.aux} through "
                         f"{self.aux_reader} ({self.aux_scope} scope"
                         f"{', in eval too' if self.aux_in_eval else ''})")
        if self.drop_path != "none":
            parts.append(f"drop path {self.drop_path} on block{self.drop_block}")
        if self.observers:
            parts.append(f"observers {', '.join(self.observers)} (control flow "
                         f"{self.control_flow})")
        return "; ".join(parts) or "no branches, no observers"


def _layer_blocks(depth: int, activations: Optional[Sequence[Optional[str]]]) -> List[int]:
    if activations is None:
        return list(range(depth))
    return [i for i, a in enumerate(activations) if a is not None]


def _model_reader(b: Branches, activations) -> str:
    """The op through which the model reads the head's source ("none": directly)."""
    if b.aux == "block_output":
        return b.reader if b.reader_block == b.aux_block else "none"
    return activations[b.aux_block] if activations is not None else "relu"


def _reads_validly(b: Branches, activations) -> bool:
    """Where the model reads the head's source through a ReLU or ReLU6 (which
    TFLite fuses into the op before it), the head reads it through an
    identical op; and a head's reader in the model's scope is identical to an
    op the model has there. (docs/known_limits.md: a different reader unfuses the
    model's activation in the training graph, and an op of another kind in a
    model scope shifts the model's range numbers there, as TensorFlow's op
    names.)"""
    if b.aux == "none":
        return True
    model = _model_reader(b, activations)
    if b.aux == "layer_output" and model not in READERS[1:]:
        return False
    if model != "none" and b.aux_reader != model:
        return False
    # In the model's scope only where the model has the identical op: any
    # other op there renumbers the model's ranges (docs/known_limits.md).
    return b.aux_scope == "own" or (b.aux_reader != "none" and model == b.aux_reader)


def is_valid(b: Branches, depth: int,
             activations: Optional[Sequence[Optional[str]]] = None) -> bool:
    """True if `branches(depth, activations)` can draw `b`."""
    layer_blocks = _layer_blocks(depth, activations)
    if (b.reader not in READERS or b.aux not in AUX_SOURCES or b.aux_reader not in READERS
            or b.aux_scope not in AUX_SCOPES or b.drop_path not in DROP_PATHS
            or b.control_flow not in CONTROL_FLOWS
            or any(o not in OBSERVERS for o in b.observers)
            or len(set(b.observers)) != len(b.observers)):
        return False
    if b.reader == "none" and (b.reader_block or b.reader_twice) or (
            b.reader != "none" and not 0 <= b.reader_block < depth - 1):
        return False  # The next block reads through the reader.
    if b.aux == "block_output" and not 0 <= b.aux_block < depth - 1:
        return False  # Built at the next block's start.
    if b.aux == "layer_output" and b.aux_block not in layer_blocks:
        return False
    if b.aux == "none" and (b.aux_block or b.aux_reader != "none" or b.aux_scope != "own"
                            or b.aux_in_eval):
        return False
    if not _reads_validly(b, activations):
        return False
    if b.drop_path == "none" and b.drop_block or (
            b.drop_path != "none" and b.drop_block not in layer_blocks):
        return False
    return bool(b.observers) or b.control_flow == "v2"


@st.composite
def branches(draw, depth: int,
             activations: Optional[Sequence[Optional[str]]] = None) -> Branches:
    """Hypothesis strategy: `Branches` for a network of `depth` blocks.

    Args:
      depth: the network's blocks.
      activations: each block's activation kind, None for a block without a
        layer (all layers when None): where a head may read a layer output
        and a drop path may drop.
    """
    layer_blocks = _layer_blocks(depth, activations)
    fields = {}
    if depth > 1:
        reader = draw(st.sampled_from(READERS))
        if reader != "none":
            fields.update(reader=reader, reader_block=draw(st.integers(0, depth - 2)),
                          reader_twice=draw(st.booleans()))
    layer_sources = [i for i in layer_blocks if activations is None
                     or activations[i] in READERS[1:]]
    sources = ["none"] + (["block_output"] if depth > 1 else []) + (
        ["layer_output"] if layer_sources else [])
    aux = draw(st.sampled_from(sources))
    if aux != "none":
        block = draw(st.integers(0, depth - 2) if aux == "block_output"
                     else st.sampled_from(layer_sources))
        fields.update(aux=aux, aux_block=block, aux_in_eval=draw(st.booleans()))
        model = _model_reader(Branches(**fields), activations)
        fields["aux_reader"] = model if model != "none" else draw(st.sampled_from(READERS))
        shared = Branches(**fields, aux_scope="shared")
        if draw(st.booleans()) and _reads_validly(shared, activations):
            fields["aux_scope"] = "shared"
    drop_path = draw(st.sampled_from(DROP_PATHS if layer_blocks else ("none",)))
    if drop_path != "none":
        fields.update(drop_path=drop_path, drop_block=draw(st.sampled_from(layer_blocks)))
    observers = draw(st.lists(st.sampled_from(OBSERVERS), max_size=4, unique=True))
    if observers:
        fields.update(observers=tuple(observers),
                      control_flow=draw(st.sampled_from(CONTROL_FLOWS)))
    return Branches(**fields)


def simpler(b: Branches):
    """`Branches` one step simpler than `b` (for shrinking; maybe invalid)."""
    if b.aux != "none":
        yield dataclasses.replace(b, aux="none", aux_block=0, aux_reader="none",
                                  aux_scope="own", aux_in_eval=False)
        for field, value in (("aux_in_eval", False), ("aux_scope", "own"),
                             ("aux_reader", "none")):
            if getattr(b, field) != value:
                yield dataclasses.replace(b, **{field: value})
    if b.reader != "none":
        yield dataclasses.replace(b, reader="none", reader_block=0, reader_twice=False)
        if b.reader_twice:
            yield dataclasses.replace(b, reader_twice=False)
    if b.drop_path != "none":
        yield dataclasses.replace(b, drop_path="none", drop_block=0)
    for i in range(len(b.observers)):
        rest = b.observers[:i] + b.observers[i + 1:]
        yield dataclasses.replace(b, observers=rest,
                                  control_flow=b.control_flow if rest else "v2")
    if b.control_flow != "v2":
        yield dataclasses.replace(b, control_flow="v2")


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
            return body(networks.activation(x, reader))
    h = networks.activation(x, reader)  # In the model's scope: its range numbering.
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


class BranchHooks(networks.BuildHooks):
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
                twin = networks.activation(x, spec.reader)
            return twin + networks.activation(x, spec.reader)
        return networks.activation(x, spec.reader)

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
