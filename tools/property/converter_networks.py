"""Random small convolutional networks for the converter-in-the-loop checks.

A `ConvNet` is a plain description: an input size (spatial sizes 1 to 8,
3 channels), an input pre-processing, 1 to 4 `ConvBlock`s and a head;
`conv_networks()` is the hypothesis strategy, `inputs()` the examples fed,
and `tools.property.converter_graphs.build()` makes a `tf.compat.v1` graph of
it in training or eval mode. The blocks are the
building blocks the converter rewrites:

  conv / depthwise / grouped   3x3 or 1x1 layer (stride 1 or 2), batch norm
                               or bias, an activation (ReLU, ReLU6, leaky
                               ReLU, hard-swish, swish, sigmoid, tanh, GELU
                               or none); "grouped" is a Conv2D whose kernel
                               has in_channels / groups input channels
                               (groups = channels included)
  pool                         2x2 average or max pool, stride 2
  global_pool                  mean or max over the spatial axes (keepdims):
                               over 1x1 maps too
  se                           squeeze-excite: mean -> 1x1 conv -> ReLU ->
                               1x1 conv -> sigmoid or hard sigmoid
                               (ReLU6(x + 3) / 6) -> multiply
  resize_concat                image pooling: mean -> 1x1 conv + ReLU ->
                               bilinear or nearest resize to the map ->
                               concatenation with the block input

A layer's `offset` (added to its bias or batch-norm beta: 0, -3, -8 or +8)
drives the activation's input to an extreme: -3 leaves it nearly dead, -8
dead or one-sided negative (an h-swish of inputs below -3 is 0), +8
one-sided positive (a ReLU6 saturated), as a short training on real data
can leave a layer; the ranges learnt there are where TFLite's kernel
preconditions bite (`qat.quantize.plan.kernels.kernel_preconditions`).

Pre-processing: none (input in [0, 1]), a constant scale and offset
(x / 127.5 - 1), tf_keras `Rescaling(1 / 255)` (a multiply and an add of 0)
or a per-channel mean and standard deviation (inputs in [0, 255]). Heads:
none, logits (spatial mean, then a dense layer with a bias) or softmax of
those logits. Batch norms use momentum 0, so after a training step their
moving statistics are the last batch's (what a long training gives).
"""
import dataclasses
import os
from typing import List, Optional, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
from hypothesis import strategies as st  # pylint: disable=g-import-not-at-top

from tools.property import networks as rewrite_networks  # pylint: disable=g-import-not-at-top
from tools.property import shrinking  # pylint: disable=g-import-not-at-top

SIZES = (1, 2, 3, 4, 6, 8)
PREPROCESSING = ("none", "scale_offset", "rescaling", "mean_std")
KINDS = ("conv", "depthwise", "pool", "global_pool", "se", "resize_concat")
GROUPED = "grouped"
ACTIVATIONS = ("relu", "relu6", "leaky_relu", "hard_swish", "swish", "sigmoid", "tanh", "gelu",
               "none")
# Added to a layer's bias (or beta): inputs of its activation pushed to one side.
OFFSETS = (0.0, -3.0, -8.0, 8.0)
VARIANTS = {"pool": ("avg", "max"), "global_pool": ("mean", "max"),
            "se": ("sigmoid", "hard_sigmoid"), "resize_concat": ("bilinear", "nearest")}
HEADS = ("none", "logits", "softmax")
# Issue #33: how the training graph gets its batch (the eval graph, which is
# converted, always has the placeholder `input`), a same-scale op on the
# way in (a pad after the pre-processing, of a smaller input: slim's
# `conv2d_same`; a reshape of a flat input or a transpose of a channels-first
# one, before it) and the
# training loss, under `loss/` (mean square; against a constant; a
# cross-entropy at temperature 2; label smoothing; hinge `1 - y * logits`).
FEEDS = ("placeholder", "tf.data", "queue")
PIPELINES = ("none", "pad", "reshape", "transpose")
LOSSES = rewrite_networks.LOSSES
WEIGHTED = ("conv", "depthwise", GROUPED, "se", "resize_concat")
INPUT_CHANNELS = 3
CLASSES = 3


@dataclasses.dataclass(frozen=True)
class ConvBlock:
    """One building block (see the module docstring)."""
    kind: str
    channels: int = 4
    stride: int = 1
    kernel: int = 3
    batch_norm: bool = False
    activation: str = "relu"
    variant: str = ""
    groups: int = 1
    offset: float = 0.0


@dataclasses.dataclass(frozen=True)
class ConvNet:
    """Input [batch, size, size, 3] pre-processed, then blocks, then a head."""
    spatial: int
    preprocessing: str
    blocks: Tuple[ConvBlock, ...]
    head: str = "none"
    feed: str = "placeholder"
    pipeline: str = "none"
    loss: str = "mse"

    def size(self) -> int:
        """A measure to pick the smallest of several failing networks."""
        return (sum(10 + b.batch_norm + (b.activation != "none") + (b.stride != 1)
                    + (b.kind != "conv") + (b.offset != 0.0) for b in self.blocks)
                + (self.preprocessing != "none") * 3 + (self.head != "none") * 3
                + self.spatial + (self.feed != "placeholder") + (self.pipeline != "none")
                + (self.loss != "mse"))

    def describe(self) -> str:
        """One line per block, for reports."""
        lines = [f"input {self.spatial}x{self.spatial}x{INPUT_CHANNELS}, pre-processing "
                 f"{self.preprocessing}, head {self.head}; training: feed {self.feed}, "
                 f"pipeline {self.pipeline}, loss {self.loss}"]
        for i, b in enumerate(self.blocks):
            extra = {"conv": "", "depthwise": "", "grouped": f" groups={b.groups}"}
            if b.kind in extra:
                lines.append(f"  block{i}: {b.kind}({b.channels}, {b.kernel}x{b.kernel}, "
                             f"stride {b.stride}){extra[b.kind]} "
                             f"{'bn' if b.batch_norm else 'bias'} act={b.activation}"
                             + (f" offset={b.offset:g}" if b.offset else ""))
            else:
                lines.append(f"  block{i}: {b.kind}({b.variant}"
                             f"{', %d channels' % b.channels if b.kind != 'pool' else ''})")
        return "\n".join(lines)


def walk(net: ConvNet) -> List[Tuple[int, int]]:
    """(channels, spatial size) entering each block, then after the last.

    Raises:
      ValueError: the network is not one `conv_networks()` can draw.
    """
    if net.spatial < 1 or net.preprocessing not in PREPROCESSING or net.head not in HEADS:
        raise ValueError("bad input size, pre-processing or head")
    if net.feed not in FEEDS or net.pipeline not in PIPELINES or net.loss not in LOSSES:
        raise ValueError("bad feed, pipeline or loss")
    if net.pipeline == "pad" and net.spatial < 3:
        raise ValueError("a pad needs a map of 3x3 or more")
    if not net.blocks:
        raise ValueError("no blocks")
    channels, size = INPUT_CHANNELS, net.spatial
    shapes = [(channels, size)]
    for b in net.blocks:
        if b.kind in ("conv", "depthwise", GROUPED):
            if (b.stride not in (1, 2) or b.kernel not in (1, 3) or b.activation not in ACTIVATIONS
                    or b.offset not in OFFSETS):
                raise ValueError("bad layer")
            if b.kind == "depthwise" and b.channels != channels:
                raise ValueError("depthwise changes channels")
            if b.kind == GROUPED and (b.groups < 2 or channels % b.groups
                                      or b.channels % b.groups):
                raise ValueError("groups must divide both channel counts")
            size = -(-size // b.stride)
            channels = b.channels
        elif b.kind in VARIANTS:
            if b.variant not in VARIANTS[b.kind]:
                raise ValueError("bad variant")
            if b.kind == "pool":
                size = -(-size // 2)
            elif b.kind == "global_pool":
                size = 1
            elif b.kind == "resize_concat":
                channels += b.channels
        else:
            raise ValueError(f"bad kind {b.kind}")
        shapes.append((channels, size))
    if not any(b.kind in WEIGHTED for b in net.blocks):
        raise ValueError("no layer: nothing to quantize")
    return shapes


def is_valid(net: ConvNet) -> bool:
    """True if `net` is one `conv_networks()` can draw."""
    try:
        walk(net)
    except ValueError:
        return False
    return True


@st.composite
def conv_networks(draw, max_depth: int = 4, grouped: bool = False) -> ConvNet:
    """Hypothesis strategy: valid random networks of depth 1..max_depth.

    Args:
      max_depth: the most blocks.
      grouped: draw grouped convolutions too.
    """
    size = draw(st.sampled_from(SIZES))
    preprocessing = draw(st.sampled_from(PREPROCESSING))
    kinds = KINDS + ((GROUPED,) if grouped else ())
    channels = INPUT_CHANNELS
    blocks = []
    for _ in range(draw(st.integers(1, max_depth))):
        kind = draw(st.sampled_from(kinds))
        if kind == GROUPED:
            divisors = [g for g in range(2, channels + 1) if channels % g == 0]
            if not divisors:
                kind = "conv"
        if kind in ("conv", "depthwise", GROUPED):
            groups = draw(st.sampled_from(divisors)) if kind == GROUPED else 1
            out = channels if kind == "depthwise" else groups * draw(
                st.integers(1, max(1, 6 // groups)))
            if kind != "depthwise" and out < 2:
                out = 2 * groups
            block = ConvBlock(kind, out, draw(st.sampled_from((1, 2))),
                              draw(st.sampled_from((1, 3))), draw(st.booleans()),
                              draw(st.sampled_from(ACTIVATIONS)), groups=groups,
                              offset=draw(st.sampled_from(OFFSETS)))
            channels = out
        else:
            block = ConvBlock(kind, draw(st.integers(2, 4)),
                              variant=draw(st.sampled_from(VARIANTS[kind])))
            if kind == "resize_concat":
                channels += block.channels
        blocks.append(block)
    if not any(b.kind in WEIGHTED for b in blocks):
        blocks.append(ConvBlock("conv", draw(st.integers(2, 4))))
    pipeline = draw(st.sampled_from(PIPELINES))
    if pipeline == "pad" and size < 3:
        pipeline = "none"
    return ConvNet(size, preprocessing, tuple(blocks), draw(st.sampled_from(HEADS)),
                   feed=draw(st.sampled_from(FEEDS)), pipeline=pipeline,
                   loss=draw(st.sampled_from(LOSSES)))


def known_limit(net: ConvNet) -> Optional[str]:
    """The documented limit (docs/known_limits.md) `net` runs into, if any.

    The property runs count every violation; the bounded test leaves these
    networks out and checks apart that the suite finds the limit.
    """
    del net  # None today: sigmoid outputs read by a multiply get their fixed range.
    return None


def simpler(net: ConvNet):
    """Yields networks one step simpler than `net` (for shrinking; maybe invalid)."""
    blocks = list(net.blocks)
    for i in range(len(blocks)):
        if len(blocks) > 1:
            yield dataclasses.replace(net, blocks=tuple(blocks[:i] + blocks[i + 1:]))
    if net.head != "none":
        yield dataclasses.replace(net, head="none")
    if net.preprocessing != "none":
        yield dataclasses.replace(net, preprocessing="none")
    for field, value in (("feed", "placeholder"), ("pipeline", "none"), ("loss", "mse")):
        if getattr(net, field) != value:
            yield dataclasses.replace(net, **{field: value})
    for size in SIZES:
        if size < net.spatial:
            yield dataclasses.replace(net, spatial=size)
    for i, b in enumerate(blocks):
        if b.kind not in ("conv", "depthwise", GROUPED):
            continue
        changes = [{"batch_norm": False}, {"activation": "none"}, {"offset": 0.0},
                   {"stride": 1}, {"kernel": 1}, {"kind": "conv", "groups": 1}]
        for change in changes:
            new = dataclasses.replace(b, **change)
            if new != b:
                yield dataclasses.replace(
                    net, blocks=tuple(blocks[:i] + [new] + blocks[i + 1:]))


def shrink(net: ConvNet, still_fails, budget: int = 40) -> ConvNet:
    """Greedily simplifies `net` while `still_fails(candidate)` holds."""
    return shrinking.greedy(net, simpler, is_valid, still_fails, budget)


def input_range(net: ConvNet) -> Tuple[float, float]:
    """The range of the raw network input."""
    return (0.0, 1.0) if net.preprocessing == "none" else (0.0, 255.0)


def feed_shape(net: ConvNet) -> List[Optional[int]]:
    """The shape of the fed batch (before the pipeline; batch free)."""
    s = net.spatial
    if net.pipeline == "pad":
        return [None, s - 2, s - 2, INPUT_CHANNELS]
    if net.pipeline == "reshape":
        return [None, s * s * INPUT_CHANNELS]
    if net.pipeline == "transpose":
        return [None, INPUT_CHANNELS, s, s]
    return [None, s, s, INPUT_CHANNELS]


def inputs(net: ConvNet, n: int, seed: int = 0) -> np.ndarray:
    """n deterministic examples in the fed shape (`feed_shape`)."""
    x = _images(net, n, seed)
    if net.pipeline == "pad":
        return np.ascontiguousarray(x[:, 1:-1, 1:-1])
    if net.pipeline == "reshape":
        return x.reshape(n, -1)
    if net.pipeline == "transpose":
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return x


def _images(net: ConvNet, n: int, seed: int) -> np.ndarray:
    """n images: half noise, half a coarse pattern, each its own contrast."""
    rng = np.random.RandomState(seed)
    shape = (n, net.spatial, net.spatial, INPUT_CHANNELS)
    coarse_size = min(net.spatial, 2)
    coarse = rng.uniform(0.0, 1.0, (n, coarse_size, coarse_size, INPUT_CHANNELS))
    repeat = -(-net.spatial // coarse_size)
    coarse = np.repeat(np.repeat(coarse, repeat, 1), repeat, 2)[:, :net.spatial, :net.spatial]
    contrast = np.linspace(0.3, 1.0, n).reshape((n, 1, 1, 1))
    lo, hi = input_range(net)
    return (lo + (hi - lo) * contrast * (0.5 * coarse + 0.5 * rng.uniform(0, 1, shape))
            ).astype(np.float32)


def example_networks() -> dict:
    """Fixed networks with the patterns issue 25 measured (regression seeds)."""
    return {
        # DeepLab's image pooling: the 1x1 conv before the resize gets the
        # concatenation's scale in TFLite.
        "resize_concat": ConvNet(4, "none", (
            ConvBlock("conv", 4), ConvBlock("resize_concat", 3, variant="bilinear"))),
        # A mean over a 1x1 map (a global pool or SE after the map shrank).
        "mean_1x1": ConvNet(1, "none", (
            ConvBlock("conv", 4), ConvBlock("global_pool", variant="mean")), head="logits"),
        # tf_keras Rescaling: a multiply and an add of 0 at the input.
        "rescaling": ConvNet(4, "rescaling", (ConvBlock("conv", 4),), head="softmax"),
        "se": ConvNet(3, "scale_offset", (
            ConvBlock("conv", 4, batch_norm=True), ConvBlock("se", 2, variant="hard_sigmoid"))),
        # An SE squeeze ReLU that never fires at seed 0 (range [0, 0]): TFLite's
        # excite-conv int32 bias overflowed (range_updates.EMPTY_RANGE_WIDTH).
        "dead_squeeze": ConvNet(2, "none", (
            ConvBlock("resize_concat", 2, variant="bilinear"),
            ConvBlock("se", 3, variant="hard_sigmoid"))),
        # A concatenation reading a removed Max over 1x1 after the removed add of
        # Rescaling: the int8 conversion failed ("same scale constraint").
        "removed_max_into_concat": ConvNet(1, "rescaling", (
            ConvBlock("global_pool", variant="max"),
            ConvBlock("resize_concat", 3, variant="bilinear"))),
        # A sigmoid's fixed grid read by the rounding of a mean over a 1x1 map:
        # the eval rewrite read the grid's constants as variables (RewriteError).
        "sigmoid_mean_1x1": ConvNet(1, "none", (ConvBlock("conv", 3, activation="sigmoid"),),
                                    head="softmax"),
        # Issue #33: a dead h-swish's output range, which TFLite's HARD_SWISH
        # refused (activations.cc:289), and a GELU of inputs near -8 whose tiny
        # range saturated the next layer's int32 bias (187 steps off).
        "dead_hard_swish": ConvNet(4, "none", (
            ConvBlock("conv", 4, batch_norm=True, activation="hard_swish", offset=-8.0),
            ConvBlock("conv", 4, activation="gelu", offset=-8.0),
            ConvBlock("conv", 3, activation="none")), head="logits"),
        # Issue #33: slim ResNet's start trained from a FIFO queue (x / 127.5 - 1,
        # then a pad), with an MSE loss against a constant on the logits.
        "queue_pad_mse_const": ConvNet(6, "scale_offset", (
            ConvBlock("conv", 4, stride=2, batch_norm=True),), head="logits",
            feed="queue", pipeline="pad", loss="mse_const"),
    }
