"""Random small networks for the property-based checks.

A `Network` is a plain description (input rank, variable kind, 1 to 6
`Block`s, a classifier head); `networks()` is the hypothesis strategy that
draws valid ones, `shrink()` simplifies a failing one, and
`tools.property.network_graphs.build()` turns one into a `tf.compat.v1`
graph, in training or eval mode (what differs between the two: dropout,
batch-norm mode, the loss). Each block is

    [dropout (tf.nn.dropout with a rate placeholder, slim.dropout, keras
      Dropout)] -> layer (conv, depthwise, dense, atrous)
      [-> bias (tf.nn.bias_add or `+ bias`)] [-> batch norm]
      [-> residual add of the block input ("pre")] -> activation
      [-> residual add of the block input ("post")]
      [-> concat with the block input or the network input]

and the head, after the blocks, a layer with a bias and no activation read
by a Squeeze, a Reshape or an Identity (a TF-Slim logits head: global mean
and a 1x1 conv for 4-D inputs), inside or outside the model's name scope.

Activations: ReLU, ReLU6, leaky ReLU, hard-swish, swish, sigmoid, tanh,
GELU or none. An offset (0, -3, -8 or +8: the mean of the batch norm's beta
or of the bias, or else a constant added to the layer output, which the
converter folds into its bias) pushes the activation's input to one side:
nearly dead, dead or one-sided, the ranges where TFLite's kernel
preconditions bite (`qat.quantize.plan.kernels.kernel_preconditions`).

A dense layer after 4-D blocks flattens its input first; later blocks are
dense too. Batch norms come from `tf.compat.v1.layers.batch_normalization`
(fused or unfused) with random moving statistics, gamma and beta, so an eval
fold has something to fold. Used by tests/property_test.py and
tools/property/check.py.
"""
import dataclasses
import os
from typing import Dict, List, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
from hypothesis import strategies as st  # pylint: disable=g-import-not-at-top
from tools.property import shrinking  # pylint: disable=g-import-not-at-top

LAYERS_4D = ("conv", "depthwise", "atrous", "dense")
ACTIVATIONS = ("relu", "relu6", "leaky_relu", "hard_swish", "swish", "sigmoid", "tanh", "gelu",
               "none")
OFFSETS = (0.0, -3.0, -8.0, 8.0)
BIASES = ("none", "bias_add", "plus")
DROPOUTS = ("none", "nn", "slim", "keras")
HEADS = ("none", "squeeze", "reshape", "identity")
BATCH_NORMS = ("none", "fused", "unfused")
RESIDUALS = ("none", "pre", "post")
CONCATS = ("none", "block_input", "net_input")
# How the training graph gets its batch (eval graphs alike; the export graph
# always has a placeholder): issue #33's feeds.
FEEDS = ("placeholder", "tf.data", "queue")
# What runs between the feed and the first block: preprocessing with
# constants and same-scale ops (a pad of a smaller input, a reshape of a
# flat one, a transpose from channels first).
PIPELINES = ("none", "scale", "pad", "scale_pad", "reshape", "transpose")
# The loss the training graph (and the eval graph) computes from the output:
# mean square, mean square against a constant, cross-entropy of the logits
# at temperature 2, label smoothing, hinge `1 - y * logits` (labels fed).
LOSSES = ("mse", "mse_const", "temperature", "label_smoothing", "hinge")
BATCH = 4
SPATIAL = 5
INPUT_CHANNELS = 3
INPUT_FEATURES = 6


@dataclasses.dataclass(frozen=True)
class Block:
    """One layer with its optional bias, batch norm, activation, add, concat."""
    layer: str
    channels: int
    bias: str
    batch_norm: str
    activation: str
    residual: str
    concat: str
    dropout: str = "none"
    offset: float = 0.0


@dataclasses.dataclass(frozen=True)
class Network:
    """input_rank 4 ([BATCH, SPATIAL, SPATIAL, 3]) or 2 ([BATCH, 6])."""
    input_rank: int
    resource: bool
    blocks: Tuple[Block, ...]
    head: str = "none"
    head_in_scope: bool = True
    head_dropout: str = "none"
    feed: str = "placeholder"
    pipeline: str = "none"
    loss: str = "mse"

    def size(self) -> int:
        """A measure to pick the smallest of several failing networks."""
        return (sum(10 + (b.bias != "none") + (b.batch_norm != "none") +
                    (b.activation != "none") + (b.residual != "none") +
                    (b.concat != "none") + (b.layer != "conv") +
                    (b.dropout != "none") + (b.offset != 0.0)
                    for b in self.blocks)
                + (self.head != "none") * 5 + (not self.head_in_scope)
                + (self.head_dropout != "none") + (self.feed != "placeholder")
                + (self.pipeline != "none") + (self.loss != "mse"))

    def describe(self) -> str:
        """One line per block, for reports."""
        lines = [f"input rank {self.input_rank}, "
                 f"{'resource' if self.resource else 'ref'} variables, head "
                 f"{self.head} ({'inside' if self.head_in_scope else 'outside'} "
                 f"the model scope, dropout={self.head_dropout}), feed {self.feed}, "
                 f"pipeline {self.pipeline}, loss {self.loss}"]
        for i, b in enumerate(self.blocks):
            lines.append(
                f"  block{i}: dropout={b.dropout} {b.layer}({b.channels}) "
                f"bias={b.bias} bn={b.batch_norm} act={b.activation} "
                f"residual={b.residual} concat={b.concat}"
                + (f" offset={b.offset:g}" if b.offset else ""))
        return "\n".join(lines)


@st.composite
def networks(draw, max_depth: int = 6) -> Network:
    """Hypothesis strategy: valid random networks of depth 1..max_depth."""
    input_rank = draw(st.sampled_from((4, 2)))
    resource = draw(st.booleans())
    depth = draw(st.integers(1, max_depth))
    rank = input_rank
    channels = INPUT_CHANNELS if rank == 4 else INPUT_FEATURES
    blocks = []
    for _ in range(depth):
        layer = draw(st.sampled_from(LAYERS_4D if rank == 4 else ("dense",)))
        flattens = layer == "dense" and rank == 4
        in_channels = channels * SPATIAL * SPATIAL if flattens else channels
        residual = draw(st.sampled_from(RESIDUALS))
        if layer == "depthwise":
            out = in_channels
        elif residual != "none" and not flattens:
            out = in_channels
        else:
            out = draw(st.integers(2, 4))
        if flattens or out != in_channels:
            residual = "none"
        new_rank = 2 if layer == "dense" else 4
        concats = ["none", "block_input"] if not flattens else ["none"]
        if new_rank == input_rank:
            concats.append("net_input")
        blocks.append(Block(
            layer=layer, channels=out, bias=draw(st.sampled_from(BIASES)),
            batch_norm=draw(st.sampled_from(BATCH_NORMS)),
            activation=draw(st.sampled_from(ACTIVATIONS)),
            residual=residual,
            concat=draw(st.sampled_from(concats)),
            dropout=draw(st.sampled_from(DROPOUTS)),
            offset=draw(st.sampled_from(OFFSETS))))
        rank = new_rank
        channels = out
        if blocks[-1].concat == "block_input":
            channels += in_channels
        elif blocks[-1].concat == "net_input":
            channels += INPUT_CHANNELS if input_rank == 4 else INPUT_FEATURES
    head = draw(st.sampled_from(HEADS))
    pipeline = dict(feed=draw(st.sampled_from(FEEDS)), pipeline=draw(st.sampled_from(PIPELINES)),
                    loss=draw(st.sampled_from(LOSSES)))
    if head == "none":
        return Network(input_rank, resource, tuple(blocks), **pipeline)
    return Network(input_rank, resource, tuple(blocks), head=head,
                   head_in_scope=draw(st.booleans()),
                   head_dropout=draw(st.sampled_from(DROPOUTS)), **pipeline)


def is_valid(net: Network) -> bool:
    """True if `net` is one `networks()` can draw (ranks, channels, adds)."""
    if net.input_rank not in (2, 4) or not 1 <= len(net.blocks):
        return False
    if net.head not in HEADS or net.head_dropout not in DROPOUTS:
        return False
    if net.head == "none" and (net.head_dropout != "none" or not net.head_in_scope):
        return False
    if net.feed not in FEEDS or net.pipeline not in PIPELINES or net.loss not in LOSSES:
        return False
    rank = net.input_rank
    channels = INPUT_CHANNELS if rank == 4 else INPUT_FEATURES
    for b in net.blocks:
        if rank == 2 and b.layer != "dense" or b.offset not in OFFSETS:
            return False
        flattens = b.layer == "dense" and rank == 4
        in_channels = channels * SPATIAL * SPATIAL if flattens else channels
        if b.layer == "depthwise" and b.channels != in_channels:
            return False
        if b.residual != "none" and (flattens or b.channels != in_channels):
            return False
        new_rank = 2 if b.layer == "dense" else 4
        if b.concat == "block_input" and flattens:
            return False
        if b.concat == "net_input" and new_rank != net.input_rank:
            return False
        rank, channels = new_rank, b.channels
        if b.concat == "block_input":
            channels += in_channels
        elif b.concat == "net_input":
            channels += INPUT_CHANNELS if net.input_rank == 4 else INPUT_FEATURES
    return True


def simpler(net: Network):
    """Yields valid networks one step simpler than `net` (for shrinking)."""
    blocks = list(net.blocks)
    for i in range(len(blocks)):
        if len(blocks) > 1:
            yield dataclasses.replace(net, blocks=tuple(blocks[:i] + blocks[i + 1:]))
    if net.head != "none":
        yield dataclasses.replace(net, head="none", head_in_scope=True,
                                  head_dropout="none")
    if not net.head_in_scope:
        yield dataclasses.replace(net, head_in_scope=True)
    if net.head_dropout != "none":
        yield dataclasses.replace(net, head_dropout="none")
    defaults = {"bias": "none", "batch_norm": "none", "activation": "none",
                "residual": "none", "concat": "none", "dropout": "none", "offset": 0.0}
    for i, b in enumerate(blocks):
        for field, value in defaults.items():
            if getattr(b, field) != value:
                new = blocks[:i] + [dataclasses.replace(b, **{field: value})] + blocks[i + 1:]
                yield dataclasses.replace(net, blocks=tuple(new))
        if b.layer in ("depthwise", "atrous"):
            new = blocks[:i] + [dataclasses.replace(b, layer="conv")] + blocks[i + 1:]
            yield dataclasses.replace(net, blocks=tuple(new))
    if not net.resource:
        yield dataclasses.replace(net, resource=True)
    for field, value in (("feed", "placeholder"), ("pipeline", "none"), ("loss", "mse")):
        if getattr(net, field) != value:
            yield dataclasses.replace(net, **{field: value})


def shrink(net: Network, still_fails, budget: int = 60) -> Network:
    """Greedily simplifies `net` while `still_fails(candidate)` holds.

    Args:
      net: a failing network.
      still_fails: predicate on a candidate network.
      budget: the most candidates tried.

    Returns:
      The simplest failing network found.
    """
    return shrinking.greedy(net, simpler, is_valid, still_fails, budget)


def model_shape(net: Network) -> List[int]:
    """The shape of the first block's input."""
    if net.input_rank == 4:
        return [BATCH, SPATIAL, SPATIAL, INPUT_CHANNELS]
    return [BATCH, INPUT_FEATURES]


def feed_shape(net: Network) -> List[int]:
    """The shape of the fed batch (before the pipeline)."""
    shape = model_shape(net)
    if net.pipeline in ("pad", "scale_pad"):
        return [BATCH] + [d - 2 for d in shape[1:-1]] + shape[-1:] if net.input_rank == 4 \
            else [BATCH, shape[1] - 2]
    if net.pipeline == "reshape":
        return [BATCH, int(np.prod(shape[1:]))] if net.input_rank == 4 else [BATCH, 2, 3]
    if net.pipeline == "transpose":
        return [BATCH, shape[3], shape[1], shape[2]] if net.input_rank == 4 \
            else [shape[1], BATCH]
    return shape


def inputs(net: Network, seed: int = 0) -> np.ndarray:
    """A deterministic input batch for `net`."""
    rng = np.random.RandomState(seed)
    return rng.uniform(-1.0, 1.0, feed_shape(net)).astype(np.float32)


def example_networks() -> Dict[str, Network]:
    """A few fixed networks (regression seeds for the bounded test)."""
    conv = Block("conv", 3, "bias_add", "fused", "relu", "none", "none")
    return {
        "conv_bn_relu": Network(4, True, (conv,)),
        "concat_input": Network(4, True, (dataclasses.replace(conv, concat="net_input"),)),
        "dense_unfused": Network(2, False, (Block("dense", 3, "none", "unfused",
                                                  "relu6", "none", "none"),)),
        # TF-Slim's classifier: dropout before a 1x1-conv logits head that
        # a Squeeze reads (the range once, after the bias, in both graphs).
        "slim_head": Network(4, True, (
            dataclasses.replace(conv, activation="relu6"),
            Block("conv", 3, "plus", "none", "none", "none", "none", dropout="nn")),
            head="squeeze", head_in_scope=False, head_dropout="slim"),
        # Issue #33: an h-swish of inputs below -3 learns an output range
        # TFLite's HARD_SWISH refuses, before a residual add (ADD) and a
        # layer whose int32 bias the tiny range would saturate.
        "dead_hard_swish": Network(4, True, (
            dataclasses.replace(conv, activation="hard_swish", offset=-8.0),
            Block("conv", 3, "bias_add", "none", "gelu", "post", "none", offset=-8.0)),
            head="identity"),
        # Issue #33: a queue feeding preprocessing and a pad (slim ResNet's
        # conv2d_same), an MSE loss against a constant; a tf.data feed
        # reshaped, a hinge loss; logits at a temperature.
        "queue_pad_mse_const": Network(4, True, (conv,), feed="queue",
                                       pipeline="scale_pad", loss="mse_const"),
        "tf_data_hinge": Network(2, True, (Block("dense", 3, "plus", "none", "none", "none",
                                                 "none"),),
                                 feed="tf.data", pipeline="reshape", loss="hinge"),
        "temperature_head": Network(4, False, (conv,), head="identity", feed="queue",
                                    pipeline="transpose", loss="temperature"),
    }
