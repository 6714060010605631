"""Random small recurrent networks for both property suites (issue #38).

A `SeqNet` reads a sequence [batch, 3 steps, 4 features] with 1 or 2
`SeqBlock`s: a TF1 cell (LSTMCell, BasicLSTMCell, GRUCell, BasicRNNCell, or a
MultiRNNCell of an LSTMCell over a GRUCell) of 2 to 4 units, unrolled by
`static_rnn`, or a loop of `dynamic_rnn` (a While op; "dynamic_v1": Enter /
Exit ops, with `disable_control_flow_v2()` while it is built), one direction
or both (`static_bidirectional_rnn`, `bidirectional_dynamic_rnn`), returning
the last output or every step's (`return_sequences`: a stack of the steps,
or the loop's stacked list; a stacked block reads them). A dropout may come
before the first block; the head is none, logits of the last step, or a
dense layer at every step. Fed by a placeholder, a `tf.data` iterator or a
FIFO queue, trained with the rewrite suite's losses.

`sequence_networks()` is the hypothesis strategy, `build()` makes the
graph; both suites take a `SeqNet` where they take their own networks
(`tools/property/invariants.py`, `tools/property/converter_invariants.py`).
"""
import dataclasses
import os
from typing import Dict, List, Optional, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from hypothesis import strategies as st  # pylint: disable=g-import-not-at-top

from tools.property import networks as rewrite_networks  # pylint: disable=g-import-not-at-top
from tools.property import network_graphs  # pylint: disable=g-import-not-at-top
from tools.property import shrinking  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
CELLS = ("lstm", "basic_lstm", "gru", "rnn", "multi")
LOOPS = ("static", "dynamic", "dynamic_v1")
HEADS = ("none", "logits", "per_step")
DROPOUTS = ("none", "nn")
FEEDS = rewrite_networks.FEEDS
LOSSES = rewrite_networks.LOSSES
STEPS, FEATURES, BATCH, CLASSES = 3, 4, 4, 3
MAX_DEPTH = 2  # Recurrent layers stacked, at most (each is a whole sequence).


@dataclasses.dataclass(frozen=True)
class SeqBlock:
    """One recurrent layer (see the module docstring)."""
    cell: str
    units: int = 3
    loop: str = "static"
    bidirectional: bool = False
    sequences: bool = False


@dataclasses.dataclass(frozen=True)
class SeqNet:
    """A sequence [batch, STEPS, FEATURES] through recurrent blocks and a head."""
    blocks: Tuple[SeqBlock, ...]
    head: str = "none"
    dropout: str = "none"
    feed: str = "placeholder"
    loss: str = "mse"

    def size(self) -> int:
        """A measure to pick the smallest of several failing networks."""
        return (sum(10 + b.units + (b.loop != "static") + b.bidirectional + b.sequences
                    + (b.cell != "rnn") for b in self.blocks)
                + (self.head != "none") * 3 + (self.dropout != "none")
                + (self.feed != "placeholder") + (self.loss != "mse"))

    def describe(self) -> str:
        """One line per block, for reports."""
        lines = [f"sequence [batch, {STEPS}, {FEATURES}], dropout {self.dropout}, head "
                 f"{self.head}; training: feed {self.feed}, loss {self.loss}"]
        for i, b in enumerate(self.blocks):
            lines.append(f"  block{i}: {b.cell}({b.units}) {b.loop}"
                         f"{' bidirectional' if b.bidirectional else ''}"
                         f"{' sequences' if b.sequences else ''}")
        return "\n".join(lines)


def is_valid(net: SeqNet) -> bool:
    """True if `net` is one `sequence_networks()` can draw."""
    if (not 1 <= len(net.blocks) <= 2 or net.head not in HEADS or net.dropout not in DROPOUTS
            or net.feed not in FEEDS or net.loss not in LOSSES):
        return False
    for k, b in enumerate(net.blocks):
        if b.cell not in CELLS or b.loop not in LOOPS or not 2 <= b.units <= 4:
            return False
        if k < len(net.blocks) - 1 and not b.sequences:
            return False  # A stacked block reads every step.
    return net.head != "per_step" or net.blocks[-1].sequences


def known_limit(net: SeqNet) -> Optional[str]:
    """The documented limit (docs/known_limits.md) `net` runs into, if any.

    The property runs count every violation; the bounded test leaves these
    networks out and checks apart that the suite finds the limit.
    """
    for k, block in enumerate(net.blocks[:-1]):
        if block.cell == "gru":
            return (f"block{k}: a GRU whose outputs another recurrent layer reads: uint8 exports "
                    "put its candidate MatMul of a later step 2 steps off the eval graph")
    return None


@st.composite
def sequence_networks(draw, max_depth: int = MAX_DEPTH) -> SeqNet:
    """Hypothesis strategy: valid random recurrent networks of 1..max_depth blocks."""
    depth = draw(st.integers(1, max_depth))
    blocks = []
    for k in range(depth):
        blocks.append(SeqBlock(draw(st.sampled_from(CELLS)), draw(st.integers(2, 4)),
                               draw(st.sampled_from(LOOPS)), draw(st.booleans()),
                               True if k < depth - 1 else draw(st.booleans())))
    heads = HEADS if blocks[-1].sequences else ("none", "logits")
    return SeqNet(tuple(blocks), draw(st.sampled_from(heads)), draw(st.sampled_from(DROPOUTS)),
                  draw(st.sampled_from(FEEDS)), draw(st.sampled_from(LOSSES)))


def simpler(net: SeqNet):
    """Yields networks one step simpler than `net` (for shrinking; maybe invalid)."""
    blocks = list(net.blocks)
    if len(blocks) > 1:
        yield dataclasses.replace(net, blocks=tuple(blocks[1:]))
        yield dataclasses.replace(net, blocks=tuple(blocks[:-1]))
    for field, value in (("head", "none"), ("dropout", "none"), ("feed", "placeholder"),
                         ("loss", "mse")):
        if getattr(net, field) != value:
            yield dataclasses.replace(net, **{field: value})
    for k, b in enumerate(blocks):
        for change in ({"loop": "static"}, {"bidirectional": False}, {"sequences": False},
                       {"cell": "rnn"}, {"units": 2}):
            new = dataclasses.replace(b, **change)
            if new != b:
                yield dataclasses.replace(net, blocks=tuple(blocks[:k] + [new] + blocks[k + 1:]))


def shrink(net: SeqNet, still_fails, budget: int = 40) -> SeqNet:
    """Greedily simplifies `net` while `still_fails(candidate)` holds."""
    return shrinking.greedy(net, simpler, is_valid, still_fails, budget)


@dataclasses.dataclass
class Built:
    """A built network (the fields both suites read)."""
    graph: tf.Graph
    input: tf.Tensor
    output: tf.Tensor
    kernels: List[tf.Operation]
    loss: Optional[tf.Tensor] = None


def _cell(kind: str, units: int):
    cells = tf1.nn.rnn_cell
    if kind == "multi":
        return cells.MultiRNNCell([cells.LSTMCell(units), cells.GRUCell(units)])
    return {"lstm": cells.LSTMCell, "basic_lstm": cells.BasicLSTMCell, "gru": cells.GRUCell,
            "rnn": cells.BasicRNNCell}[kind](units)


def _recurrent(x: tf.Tensor, b: SeqBlock) -> tf.Tensor:
    """The block's layer: the last output [batch, units] or every step's."""
    make = lambda: _cell(b.cell, b.units)  # pylint: disable=unnecessary-lambda-assignment
    if b.loop == "static":
        steps = tf.unstack(x, axis=1)
        if b.bidirectional:
            outputs, _, _ = tf1.nn.static_bidirectional_rnn(make(), make(), steps,
                                                            dtype=tf.float32)
        else:
            outputs, _ = tf1.nn.static_rnn(make(), steps, dtype=tf.float32)
        return tf.stack(outputs, axis=1) if b.sequences else outputs[-1]
    if b.loop == "dynamic_v1":
        tf1.disable_control_flow_v2()
    try:
        if b.bidirectional:
            (forward, backward), _ = tf1.nn.bidirectional_dynamic_rnn(make(), make(), x,
                                                                      dtype=tf.float32)
            outputs = tf.concat([forward, backward], axis=-1)
        else:
            outputs, _ = tf1.nn.dynamic_rnn(make(), x, dtype=tf.float32)
    finally:
        if b.loop == "dynamic_v1":
            tf1.enable_control_flow_v2()
    return outputs if b.sequences else outputs[:, -1]


def _head(x: tf.Tensor, kind: str, kernels: list) -> tf.Tensor:
    if kind == "none":
        return x
    if kind == "logits" and x.shape.rank == 3:
        x = x[:, -1]
    units = int(x.shape[-1])
    w = tf1.get_variable("kernel", [units, CLASSES],
                         initializer=tf1.glorot_uniform_initializer())
    b = tf1.get_variable("bias", [CLASSES], initializer=tf1.random_normal_initializer(stddev=0.3))
    kernels.append(w.op)
    if x.shape.rank == 3:  # A dense layer at every step.
        y = tf.reshape(tf.matmul(tf.reshape(x, [-1, units]), w) + b, [-1, STEPS, CLASSES])
        return y
    return tf.nn.bias_add(tf.matmul(x, w), b)


def _feed(kind: str, batch: Optional[int]) -> tf.Tensor:
    shape = [batch, STEPS, FEATURES]
    if kind == "placeholder":
        return tf1.placeholder(tf.float32, shape, name="input")
    element = (np.zeros(shape[1:], np.float32), np.int32(0))
    if kind == "tf.data":
        ds = tf.data.Dataset.from_tensors(element).repeat().batch(batch or BATCH,
                                                                  drop_remainder=True)
        return tf1.data.make_one_shot_iterator(ds).get_next()[0]
    queue = tf1.FIFOQueue(8, [tf.float32, tf.int32], [shape[1:], []])
    return queue.dequeue_many(batch or BATCH)[0]


def build(net: SeqNet, training: bool, seed: int = 0, export: bool = False,
          batch: Optional[int] = BATCH) -> Built:
    """Builds `net` in a new graph (resource variables).

    The output is `tf.identity(..., name="output")`, the input the fed batch
    (`net.feed`, `batch` examples; the export graph and `batch=None` a
    placeholder `input`). Training graphs (and eval graphs but the export
    graph) compute `net.loss` from the output (`loss/`).
    """
    graph = tf.Graph()
    kernels: List[tf.Operation] = []
    with graph.as_default():
        tf1.set_random_seed(seed)
        fed = _feed("placeholder" if export else net.feed, batch)
        with tf1.variable_scope("net", use_resource=True):
            x = fed
            if net.dropout == "nn" and not export:  # An export graph has none.
                rate = tf1.placeholder_with_default(0.5 if training else 0.0, [],
                                                    name="dropout_rate")
                x = tf.nn.dropout(x, rate=rate)
            for k, block in enumerate(net.blocks):
                # Seeded: TF1 cells draw their weights without the graph's seed.
                with tf1.variable_scope(f"block{k}", initializer=tf1.glorot_uniform_initializer(
                        seed=seed * 10 + k)):
                    x = _recurrent(x, block)
            kernels += [v.op for v in tf1.global_variables() if "kernel" in v.op.name]
            with tf1.variable_scope("head"):
                x = _head(x, net.head, kernels)
        out = tf.identity(x, name="output")
        loss = None if export else network_graphs.training_loss(out, net.loss, batch=batch)
    return Built(graph, fed, out, kernels, loss)


def inputs(net: SeqNet, n: int = BATCH, seed: int = 0) -> np.ndarray:
    """n deterministic sequences in [0, 1]."""
    del net
    rng = np.random.RandomState(seed)
    return rng.uniform(0.0, 1.0, (n, STEPS, FEATURES)).astype(np.float32)


def input_range(net: SeqNet) -> Tuple[float, float]:
    """The range of the raw network input."""
    del net
    return 0.0, 1.0


def example_networks() -> Dict[str, SeqNet]:
    """Fixed networks: every cell and loop once (regression seeds)."""
    return {
        "static_lstm": SeqNet((SeqBlock("lstm", 3),), head="logits"),
        "dynamic_gru_sequences": SeqNet((SeqBlock("gru", 3, "dynamic", sequences=True),),
                                        head="per_step", feed="tf.data"),
        "stacked_bidirectional": SeqNet((
            SeqBlock("basic_lstm", 2, "dynamic", bidirectional=True, sequences=True),
            SeqBlock("rnn", 3, "static", bidirectional=True)), head="logits", loss="hinge"),
        "v1_multi": SeqNet((SeqBlock("multi", 2, "dynamic_v1"),), dropout="nn", feed="queue"),
    }
