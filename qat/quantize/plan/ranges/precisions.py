"""What precision each layer gets: a recipe (`qat.engine.recipes`) applied to a graph.

Why this module exists: the rules of the planner decide *where* a range goes;
a recipe decides, per layer, *how many bits* it has and whether the layer is
quantized at all. This collaborator finds the layers as a recipe's rules see
them (`LayerInfo`: the layer's name scope, its kind, first or last on the data
path), resolves each one's `Precision` once, and answers the rules:

* `weight_bits`, `per_channel` of a layer op's weights, `activation_bits` of
  its output range (`RangeRules.visit_layer`), the bits of an embedding table;
* `is_float_op`: the ops of a layer the recipe keeps float (every op under its
  name scope, unless a deeper layer's scope holds it): no range on its
  weights, none on its output; the planner treats them as it treats ops
  outside `scope`, so the integer ops that read them get an `input_quant`
  and the converter quantizes and dequantizes at the float layer's edges.

Layers are found by graph structure, as the planner finds them: layer ops
(`GraphView.layers`) grouped into one layer per name scope; the steps of a
recurrent layer (`qat.quantize.plan.model.recurrences`) and the layer ops
under its scope are one `recurrent` layer; an embedding table
(`GraphView.entries`) is an `embedding` layer named by its first lookup's
scope. A layer is `first` when no other layer is upstream of it on the data
path, `last` when none is downstream. Training and eval graphs of one model
have the same layers, kinds and positions, so one recipe gives them the same
ranges (a checkpoint restores strictly).
"""
import dataclasses
from typing import Dict, List, Optional, Sequence, Set, Tuple

import tensorflow as tf

from qat.engine import recipes
from qat.matching import layer_patterns
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import recurrences

# Which weight bit widths each kind exports at (measured with TF 2.21's
# converter and LiteRT: CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED take
# packed int4 weights; a 4-bit embedding table makes GATHER's output int4,
# and the op reading it fails to convert: "'tfl.mean' op failed to verify
# that input and output must have same element type").
_WEIGHT_BITS_BY_KIND = {"conv": (4, 8), "depthwise": (4, 8), "dense": (4, 8),
                        "recurrent": (4, 8), "embedding": (8,)}


@dataclasses.dataclass
class Layer:
    """One layer as the recipe sees it, with what the planner needs.

    Attributes:
      info: its `LayerInfo` (name, kind, position).
      ops: its layer ops (Conv2D, MatMul, ...; every step of a recurrence).
      lookups: its embedding lookups (an `embedding` layer).
      precision: what it gets.
      rule: the index of the rule that decided, or None (the rewrite's options).
    """
    info: recipes.LayerInfo
    ops: List[tf.Operation] = dataclasses.field(default_factory=list)
    lookups: List[tf.Operation] = dataclasses.field(default_factory=list)
    precision: recipes.Precision = recipes.Precision()
    rule: Optional[int] = None

    def describe(self) -> str:
        """`model/conv1 (conv, first): w4 per-channel a8 [rule 0]`."""
        where = [self.info.kind] + [p for p, on in (("first", self.info.first),
                                                    ("last", self.info.last)) if on]
        rule = "" if self.rule is None else f" [rule {self.rule}]"
        return f"{self.info.name} ({', '.join(where)}): {self.precision.describe()}{rule}"


def _kind(op: tf.Operation) -> str:
    if op.type == "DepthwiseConv2dNative":
        return "depthwise"
    if op.type in ("MatMul", "BatchMatMulV2", "BatchMatMul", "BatchMatMulV3"):
        return "dense"
    return "conv"


def _common_scope(names: Sequence[str]) -> str:
    parts = [n.split("/") for n in names]
    common = []
    for column in zip(*parts):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    return "/".join(common)


def _scope(op: tf.Operation) -> str:
    return plan_graph.own_context(op)


def _under(name: str, scope: str) -> bool:
    return name == scope or name.startswith(scope + "/")


def find_layers(view: plan_graph.GraphView,
                steps: Optional[recurrences.Steps] = None) -> List[Layer]:
    """The model's layers, in graph order (see the module docstring).

    Args:
      view: the graph's `GraphView`.
      steps: its recurrences (found here when None).
    """
    steps = steps if steps is not None else recurrences.find(view)
    by_name: Dict[Tuple[str, str], Layer] = {}
    order: List[Tuple[str, str]] = []

    def add(name, kind, op=None, lookup=None):
        key = (name, kind)
        if key not in by_name:
            by_name[key] = Layer(recipes.LayerInfo(name, kind))
            order.append(key)
        if op is not None:
            by_name[key].ops.append(op)
        if lookup is not None:
            by_name[key].lookups.append(lookup)

    # A recurrent layer: the steps reading one weight, named by their common
    # scope; the layer ops under that scope belong to it.
    chains: Dict[object, List[tf.Operation]] = {}
    for op in sorted(steps.layers, key=lambda o: o._id):  # pylint: disable=protected-access
        chains.setdefault(recurrences.weight_key(layer_patterns.weight_input(op)), []).append(op)
    recurrent_scopes = []
    for chain in chains.values():
        scope = _common_scope([_scope(op) for op in chain]) or _scope(chain[0])
        recurrent_scopes.append(scope)
    for op in view.layers:
        if op in view.gradient_ops:
            continue
        home = next((s for s in recurrent_scopes if _under(op.name, s)), None)
        if home is not None:
            add(home, "recurrent", op=op)
        else:
            add(_scope(op), _kind(op), op=op)
    order_key = lambda entry: entry[0]._id  # pylint: disable=protected-access,unnecessary-lambda-assignment
    for op, table in sorted(view.entries.items(), key=order_key):
        if table is not None:
            add(_scope(op), "embedding", lookup=op)
    layers = [by_name[key] for key in order]
    _positions(view, layers)
    return layers


def _positions(view: plan_graph.GraphView, layers: List[Layer]) -> None:
    """Sets `first` / `last` from the data path: which layers feed which.

    One pass each way over the data ops in topological order, carrying at
    most two layers upstream (downstream) of each op: enough to tell whether
    a layer other than the op's own is there.
    """
    owner: Dict[tf.Operation, int] = {}
    for k, layer in enumerate(layers):
        for op in layer.ops + layer.lookups:
            owner[op] = k
    order = view.ordered_ops()
    index = {op: i for i, op in enumerate(order)}

    def spread(sequence, neighbours):
        seen: Dict[tf.Operation, Set[int]] = {}
        for op in sequence:
            found: Set[int] = set()
            for other in neighbours(op):
                if other in index:
                    found |= seen.get(other, set())
                    if other in owner:
                        found.add(owner[other])
                if len(found) > 1:
                    break
            seen[op] = set(sorted(found)[:2])
        return seen

    def inputs(op):
        return [i.op for i in op.inputs]

    def readers(op):
        return [c for t in op.outputs for c in t.consumers() if c not in view.gradient_ops]

    upstream = spread(order, inputs)
    downstream = spread(reversed(order), readers)
    for k, layer in enumerate(layers):
        members = layer.ops + layer.lookups
        before = any(upstream.get(op, set()) - {k} for op in members)
        after = any(downstream.get(op, set()) - {k} for op in members)
        layer.info = dataclasses.replace(layer.info, first=not before, last=not after)


class LayerPrecisions(object):
    """Each layer's precision under a recipe (see the module docstring).

    Args:
      view: the graph's `GraphView`.
      steps: its recurrences.
      recipe: the `qat.Recipe`, or None (every layer gets `base`).
      base: what a layer no rule selects gets (the rewrite's options).
      in_scope: the layers a recipe may select (the rewrite's `scope`).
      per_channel_conv, per_channel_matmul: the options' per channel, for
        a convolution's and a matmul's weights. A rule's `per_channel`
        decides for convolutions; matmul weights stay as the options say
        (TF's converter refuses per-channel FULLY_CONNECTED weights read
        through a transpose) unless the rule says false. Each layer's
        resolved precision says which it got.

    Raises:
      RecipeError: a rule that selects no layer, bits no LiteRT kernel of
        the layer's kind runs.
    """

    def __init__(self, view: plan_graph.GraphView, steps: recurrences.Steps,
                 recipe: Optional[recipes.Recipe], base: recipes.Precision,
                 in_scope=lambda op: True, per_channel_conv: bool = False,
                 per_channel_matmul: bool = False):
        self.recipe = recipe
        self.layers = find_layers(view, steps) if recipe else []
        self.layers = [layer for layer in self.layers
                       if all(in_scope(op) for op in layer.ops + layer.lookups)]
        self._of: Dict[tf.Operation, Layer] = {}
        self._float_scopes: Dict[str, bool] = {}
        if not recipe:
            return
        recipe.check_selects([layer.info for layer in self.layers])
        for layer in self.layers:
            layer.precision, layer.rule = recipe.resolve(layer.info, base)
            if not layer.precision.keep_float:
                chosen = layer.precision.per_channel
                if layer.info.kind in ("conv", "depthwise"):
                    chosen = per_channel_conv if chosen is None else chosen
                elif layer.info.kind == "embedding":
                    chosen = False  # GATHER gives its output the table's one scale.
                else:
                    chosen = per_channel_matmul and chosen is not False
                layer.precision = dataclasses.replace(layer.precision, per_channel=chosen)
            for op in layer.ops + layer.lookups:
                self._of[op] = layer
        check_supported(recipe, self.layers)
        for layer in self.layers:
            for op in layer.ops + layer.lookups:
                scope = _scope(op) if layer.info.kind != "recurrent" else layer.info.name
                self._float_scopes.setdefault(scope, layer.precision.keep_float)

    def mark_recurrent_ranges(self, plans) -> None:
        """A recurrent layer's activation bits for every learnt range inside
        it (gates, cell state, its steps' outputs), not only its layer ops'
        outputs. Fixed grids (LOGISTIC, TANH) keep their own.

        A range a 16-bit one shares (the steps' outputs and their stack) is
        16-bit too: one range, one grid (LiteRT's int16 grid, symmetric).
        """
        plans = list(plans)
        for layer in self.layers:
            if layer.info.kind != "recurrent" or layer.precision.keep_float:
                continue
            for plan in plans:
                if (not plan.is_weight and plan.fixed is None and plan.bits is None
                        and _under(plan.tensor.op.name, layer.info.name)):
                    plan.bits = layer.precision.activation_bits
        changed = True
        while changed:
            changed = False
            for plan in plans:
                owner = plan.shared
                if (plan.bits == 16 and owner is not None and not owner.is_weight
                        and owner.fixed is None and owner.bits != 16):
                    owner.bits, changed = 16, True

    def of(self, op: tf.Operation) -> Optional[recipes.Precision]:
        """The precision of the layer `op` (a layer op or a lookup) belongs to."""
        layer = self._of.get(op)
        return layer.precision if layer is not None else None

    def layer_of(self, op: tf.Operation) -> Optional[Layer]:
        """The layer `op` (a layer op or a lookup) belongs to, if a recipe applies."""
        return self._of.get(op)

    def is_float_op(self, op: tf.Operation) -> bool:
        """Whether `op` lies in a layer the recipe keeps float (its deepest
        layer scope is that layer's)."""
        if not self._float_scopes:
            return False
        name = op.name
        while name:
            if name in self._float_scopes:
                return self._float_scopes[name]
            name = name.rsplit("/", 1)[0] if "/" in name else ""
        return False

    def float_reason(self, op: tf.Operation) -> str:
        """Why `op` stays float: the rule keeping its layer float."""
        name = op.name
        while name and name not in self._float_scopes:
            name = name.rsplit("/", 1)[0] if "/" in name else ""
        layer = next((l for l in self.layers if l.precision.keep_float
                      and (l.info.name == name or any(_scope(o) == name for o in l.ops
                                                      + l.lookups))), None)
        if layer is None or layer.rule is None:
            return "float by the recipe"
        return f"float by the recipe's {self.recipe.describe_rule(layer.rule)}"


def check_supported(recipe: recipes.Recipe, layers: Sequence[Layer]) -> None:
    """Raises RecipeError for weight bits no LiteRT kernel runs, naming rule and layers.

    Weight bits a kind's LiteRT kernel does not run (`_WEIGHT_BITS_BY_KIND`).
    16-bit activations train in any layer; their export is `qat.export`'s
    business (TF's converter runs them only in a whole-model 16x8 graph).
    """
    by_rule: Dict[int, List[Layer]] = {}
    for layer in layers:
        p = layer.precision
        if (not p.keep_float and layer.rule is not None
                and p.weight_bits not in _WEIGHT_BITS_BY_KIND[layer.info.kind]):
            by_rule.setdefault(layer.rule, []).append(layer)
    for rule, bad in sorted(by_rule.items()):
        bits = bad[0].precision.weight_bits
        raise recipes.RecipeError(
            f"recipe {recipe.describe_rule(rule)} gives "
            f"{bits}-bit weights to {', '.join(l.info.name + ' (' + l.info.kind + ')' for l in bad)}"
            f": LiteRT has no {bits}-bit kernel for a {bad[0].info.kind} layer (it runs "
            f"{' or '.join(str(b) for b in _WEIGHT_BITS_BY_KIND[bad[0].info.kind])}-bit). "
            "Narrow the rule ('kind', 'layers') or give these layers 8 bits.")
