"""Recipes: what precision each layer gets, as data.

A recipe is an ordered list of rules. Each rule selects layers (by name, kind
and position in the model) and says what they get; for every layer, the last
rule that selects it decides, and what that rule leaves unsaid comes from the
rewrite's own options (`weight_bits`, `per_channel_weights`, ...)::

    recipe = qat.Recipe([
        {"layers": ".*", "weight_bits": 4, "per_channel": True},  # every layer...
        {"kind": "depthwise", "weight_bits": 8},                  # ...but these
        {"position": "first", "weight_bits": 8},
        {"position": "last", "float": True},                      # logits in float
    ])
    qm = qat.quantize_model(model, recipe=recipe)

Keys of a rule (all optional; an empty rule selects every layer):

  layers           a regular expression on the layer's name: it selects a
                   layer when it matches a whole '/'-separated part of the
                   layer's name scope (`conv1` selects `model/conv1/Conv2D`'s
                   layer and every layer under `.../conv1/...`; a Keras
                   layer's scope holds its name; a part TF numbered,
                   `conv1_1`, is matched without its suffix too).
  kind             `conv` (convolutions, transposed ones too), `depthwise`,
                   `dense` (matmuls outside recurrent layers), `recurrent`
                   (every step of a recurrent layer), `embedding` (a table
                   read by lookups).
  position         `first` (no layer before it on the data path) or `last`
                   (no layer after it).
  weight_bits      4 or 8: the bit widths LiteRT's integer kernels run.
  per_channel      one weight range per output channel of a convolution
                   (matmul weights stay as the rewrite's `per_channel`
                   option says: TF's converter refuses per-channel
                   FULLY_CONNECTED weights read through a transpose).
  activation_bits  8 or 16 (16: LiteRT's 16x8 kernels).
  float            true: the layer and its activation stay float; the model
                   quantizes and dequantizes at its edges.

Recipes read and write JSON (`Recipe.from_json`, `to_json`, `load`, `save`).
A bad recipe raises `RecipeError`, naming the rule, before anything changes.
"""
import dataclasses
import json
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

KINDS = ("conv", "depthwise", "dense", "recurrent", "embedding")
POSITIONS = ("first", "last")
WEIGHT_BITS = (4, 8)
ACTIVATION_BITS = (8, 16)
FORMAT = "qat.recipe"
VERSION = 1
# The graph collection where a rewrite records the name scopes of the layers
# its recipe keeps float (what `qat.export` holds the converted model to).
FLOAT_LAYERS_COLLECTION = "qat_float_layers"

# JSON key -> Rule field (`float` is a builtin's name in Python).
_KEYS = {"layers": "layers", "kind": "kind", "position": "position",
         "weight_bits": "weight_bits", "per_channel": "per_channel",
         "activation_bits": "activation_bits", "float": "keep_float"}
_SETTINGS = ("weight_bits", "per_channel", "activation_bits", "float")


class RecipeError(ValueError):
    """A recipe that cannot be applied as written; nothing was changed."""


@dataclasses.dataclass(frozen=True)
class Precision:
    """What one layer gets.

    Attributes:
      keep_float: the layer and its activation stay float.
      weight_bits: its weights' bit width.
      per_channel: one weight range per output channel; None: as the
        rewrite's options decide for the layer's kind.
      activation_bits: its output's bit width.
    """
    keep_float: bool = False
    weight_bits: int = 8
    per_channel: Optional[bool] = None
    activation_bits: int = 8

    def describe(self) -> str:
        """`float`, or e.g. `w4 per-channel a8`."""
        if self.keep_float:
            return "float"
        channel = {True: " per-channel", False: " per-tensor", None: ""}[self.per_channel]
        return f"w{self.weight_bits}{channel} a{self.activation_bits}"


@dataclasses.dataclass(frozen=True)
class LayerInfo:
    """A layer as rules see it.

    Attributes:
      name: its name scope (`model/conv1`), what `layers` matches.
      kind: one of `KINDS`.
      first: no layer before it on the model's data path.
      last: no layer after it.
    """
    name: str
    kind: str
    first: bool = False
    last: bool = False


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule of a recipe (the module docstring explains the keys)."""
    layers: Optional[str] = None
    kind: Optional[str] = None
    position: Optional[str] = None
    weight_bits: Optional[int] = None
    per_channel: Optional[bool] = None
    activation_bits: Optional[int] = None
    keep_float: Optional[bool] = None

    @classmethod
    def from_config(cls, config: Dict[str, Any], index: int = 0) -> "Rule":
        """The rule a JSON object describes.

        Raises:
          RecipeError: unknown keys, values of the wrong type or out of range,
            settings that contradict each other.
        """
        where = f"recipe rule {index} {_json(config)}"
        if not isinstance(config, dict):
            raise RecipeError(f"{where}: a rule is a JSON object (a dict), got "
                              f"{type(config).__name__}.")
        unknown = sorted(set(config) - set(_KEYS))
        if unknown:
            raise RecipeError(f"{where}: unknown key(s) {unknown}; this version of qat knows "
                              f"{sorted(_KEYS)}.")
        rule = cls(**{_KEYS[key]: value for key, value in config.items()})
        rule._check(where)
        return rule

    def _check(self, where: str) -> None:
        if self.layers is not None:
            if not isinstance(self.layers, str):
                raise RecipeError(f"{where}: 'layers' is a regular expression (a string).")
            try:
                re.compile(self.layers)
            except re.error as e:
                raise RecipeError(f"{where}: 'layers' is not a regular expression: {e}.") from e
        for key, allowed in (("kind", KINDS), ("position", POSITIONS)):
            value = getattr(self, key)
            if value is not None and value not in allowed:
                raise RecipeError(f"{where}: '{key}' must be one of {list(allowed)}, got "
                                  f"{value!r}.")
        for key, allowed in (("weight_bits", WEIGHT_BITS),
                             ("activation_bits", ACTIVATION_BITS)):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or value not in allowed):
                raise RecipeError(
                    f"{where}: '{key}' must be one of {list(allowed)} (the bit widths "
                    f"LiteRT's integer kernels run), got {value!r}.")
        for key in ("per_channel", "keep_float"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, bool):
                raise RecipeError(f"{where}: '{_json_key(key)}' must be true or false, got "
                                  f"{value!r}.")
        if self.keep_float and any(getattr(self, key) is not None for key in
                                   ("weight_bits", "per_channel", "activation_bits")):
            raise RecipeError(
                f"{where}: conflicting settings: 'float': true keeps the layers float, so "
                "they have no bit widths; give the bits in a rule of their own.")

    def to_config(self) -> Dict[str, Any]:
        """The rule as a JSON object (only the keys it sets)."""
        return {key: getattr(self, field) for key, field in _KEYS.items()
                if getattr(self, field) is not None}

    def selects(self, layer: LayerInfo) -> bool:
        """Whether the rule applies to `layer`."""
        if self.kind is not None and layer.kind != self.kind:
            return False
        if self.position == "first" and not layer.first:
            return False
        if self.position == "last" and not layer.last:
            return False
        return self.layers is None or name_matches(self.layers, layer.name)

    def apply(self, base: Precision) -> Precision:
        """`base` with this rule's settings."""
        if self.keep_float:
            return Precision(keep_float=True)
        changes = {key: getattr(self, key) for key in
                   ("weight_bits", "per_channel", "activation_bits")
                   if getattr(self, key) is not None}
        return dataclasses.replace(base, keep_float=False, **changes)


# The suffix TF adds to a name scope taken already (Keras 3 layers trace as
# `functional_1/conv1_1`).
_UNIQUE_SUFFIX = re.compile(r"_[0-9]+$")


def name_matches(pattern: str, name: str) -> bool:
    """Whether `pattern` matches a whole '/'-separated part of `name`.

    `conv1` matches `model/conv1` and `model/conv1/inner`, not `model/conv10`;
    `model/conv.*` matches both. The name is matched as it is and with each
    part's numbered suffix (`_1`, TF's for a scope taken already) removed:
    `conv1` matches Keras 3's `functional_1/conv1_1`.
    """
    compiled = re.compile(pattern)
    raw = name.split("/")
    for parts in (raw, [_UNIQUE_SUFFIX.sub("", part) or part for part in raw]):
        if any(compiled.fullmatch("/".join(parts[i:j]))
               for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class Recipe:
    """An ordered list of rules; the last rule selecting a layer decides.

    Build one from a list of dicts (`Recipe([{...}, ...])`), JSON text
    (`Recipe.from_json`) or a file (`Recipe.load`); see the module docstring.
    """
    rules: Tuple[Rule, ...] = ()

    def __init__(self, rules: Iterable[Union[Rule, Dict[str, Any]]] = ()):
        if isinstance(rules, (str, bytes, dict)):
            raise RecipeError("qat.Recipe takes a list of rules (dicts); for JSON text use "
                              "qat.Recipe.from_json, for a file qat.Recipe.load.")
        built = []
        for index, rule in enumerate(rules):
            if isinstance(rule, Rule):
                rule._check(f"recipe rule {index} {_json(rule.to_config())}")  # pylint: disable=protected-access
                built.append(rule)
            else:
                built.append(Rule.from_config(rule, index))
        object.__setattr__(self, "rules", tuple(built))

    # --- JSON ---------------------------------------------------------------

    def to_config(self) -> List[Dict[str, Any]]:
        """The rules as JSON objects."""
        return [rule.to_config() for rule in self.rules]

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The recipe as JSON text (what `from_json` and `load` read)."""
        return json.dumps({"format": FORMAT, "version": VERSION, "rules": self.to_config()},
                          indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Recipe":
        """The recipe in JSON text: a list of rules, or `to_json`'s object.

        Raises:
          RecipeError: not JSON, another format or a newer version, bad rules.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise RecipeError(f"a recipe is JSON: {e}.") from e
        if isinstance(data, dict):
            unknown = sorted(set(data) - {"format", "version", "rules"})
            if data.get("format", FORMAT) != FORMAT or unknown:
                raise RecipeError(f"not a qat recipe: expected a list of rules or "
                                  f"{{\"format\": \"{FORMAT}\", \"rules\": [...]}}, got keys "
                                  f"{sorted(data)}.")
            version = data.get("version", VERSION)
            if not isinstance(version, int) or version > VERSION:
                raise RecipeError(f"recipe version {version!r} is newer than this qat's "
                                  f"({VERSION}); upgrade qat.")
            data = data.get("rules", [])
        if not isinstance(data, list):
            raise RecipeError(f"a recipe is a list of rules, got {type(data).__name__}.")
        return cls(data)

    def save(self, path: str) -> str:
        """Writes `to_json()` to `path` and returns the path."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path: str) -> "Recipe":
        """The recipe in the JSON file `path`.

        Raises:
          RecipeError: a file that is not a recipe (its path in the message).
          OSError: the file cannot be read.
        """
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            return cls.from_json(text)
        except RecipeError as e:
            raise RecipeError(f"{path}: {e}") from e

    # --- Resolution -----------------------------------------------------------

    def resolve(self, layer: LayerInfo, base: Precision) -> Tuple[Precision, Optional[int]]:
        """What `layer` gets: `base` with its last selecting rule's settings.

        Returns:
          (the precision, the index of that rule, or None when none selects it).
        """
        chosen = None
        for index, rule in enumerate(self.rules):
            if rule.selects(layer):
                chosen = index
        if chosen is None:
            return base, None
        return self.rules[chosen].apply(base), chosen

    def check_selects(self, layers: Sequence[LayerInfo]) -> None:
        """Raises RecipeError naming each rule that selects none of `layers`."""
        idle = [index for index, rule in enumerate(self.rules)
                if not any(rule.selects(layer) for layer in layers)]
        if idle:
            described = "; ".join(f"rule {i} {_json(self.rules[i].to_config())}" for i in idle)
            names = ", ".join(f"{layer.name} ({layer.kind})" for layer in layers[:12])
            more = f" and {len(layers) - 12} more" if len(layers) > 12 else ""
            raise RecipeError(
                f"recipe {described} selects no layer. The model's layers: {names}{more}. "
                "Fix the rule's 'layers' expression, 'kind' or 'position', or remove it.")

    def describe_rule(self, index: int) -> str:
        """`rule 2 {"kind": "dense", "weight_bits": 4}`, as errors quote a rule."""
        return f"rule {index} {_json(self.rules[index].to_config())}"

    def describe(self) -> str:
        """The rules as compact JSON (recorded with a rewrite, quoted in errors)."""
        return json.dumps(self.to_config(), sort_keys=True, separators=(",", ":"))

    def __bool__(self) -> bool:
        return bool(self.rules)


# What the public functions accept as `recipe=`.
RecipeLike = Union[None, Recipe, Sequence[Dict[str, Any]], str, os.PathLike]


def as_recipe(value: RecipeLike) -> Optional[Recipe]:
    """A `Recipe` from what the public functions accept as `recipe=`.

    Args:
      value: None, a Recipe, a list of rule dicts, JSON text, or the path of a
        JSON file.

    Raises:
      RecipeError: a bad recipe; TypeError: another type.
    """
    if value is None or isinstance(value, Recipe):
        return value
    if isinstance(value, os.PathLike):
        return Recipe.load(os.fspath(value))
    if isinstance(value, str):
        stripped = value.lstrip()
        if stripped.startswith(("[", "{")):
            return Recipe.from_json(value)
        return Recipe.load(value)
    if isinstance(value, (list, tuple)):
        return Recipe(value)
    raise TypeError(f"recipe must be a qat.Recipe, a list of rule dicts, JSON text or a JSON "
                    f"file's path, got {type(value).__name__}.")


def _json_key(field: str) -> str:
    return {v: k for k, v in _KEYS.items()}[field]


def _json(value) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)
