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

`tools.property.branch_graphs.BranchHooks` builds them into a graph.
Used by tools/property/training_runs.py and converter_training_runs.py.
"""
import dataclasses
from typing import List, Optional, Sequence, Tuple

from hypothesis import strategies as st

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


