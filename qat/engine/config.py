"""The one validated configuration of a rewrite.

The public functions build a `RewriteConfig` once (every argument checked
there, with one rule per argument for every entry point) and hand it to the
passes, instead of threading keyword arguments through each layer.
"""
import dataclasses
from typing import Optional

import tensorflow as tf

from qat.engine import recipes

# Bit widths TFLite's integer kernels and FakeQuant's integer grid agree on.
MIN_BITS = 2
MAX_BITS = 8


def check_bits(value, what: str) -> None:
    """Raises ValueError unless `value` is an int in [MIN_BITS, MAX_BITS]."""
    if (isinstance(value, bool) or not isinstance(value, int)
            or not MIN_BITS <= value <= MAX_BITS):
        raise ValueError(f"{what} must be an integer between {MIN_BITS} and "
                         f"{MAX_BITS}, got {value!r}.")


def check_delay(value, what: str) -> None:
    """Raises ValueError unless `value` is None or an int >= 0."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 0):
        raise ValueError(f"{what} must be None or an integer >= 0, got {value!r}.")


def _check_bool(value, what: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be a bool, got {type(value).__name__}.")


@dataclasses.dataclass(frozen=True)
class RewriteConfig:
    """What a rewrite builds; validated when constructed.

    Attributes:
      is_training: training structure (range updates, batch statistics) or
        eval structure (the learnt ranges and moving statistics are read).
      weight_bits: weight bit width, 2..8.
      activation_bits: activation bit width, 2..8.
      symmetric: symmetric ranges for weights and activations.
      symmetric_weights: symmetric narrow-range weights (int8 zero point 0)
        while activations follow `symmetric`.
      per_channel: one weight range per output channel, for every layer
        (matmuls included).
      per_channel_weights: TFLite int8's own weight scheme: symmetric
        narrow-range weights (zero point 0), one range per output channel
        for convolutions and depthwise convolutions, one range for matmuls
        (TFLite's FULLY_CONNECTED weights are per-tensor) and transposed
        convolutions. Implies symmetric weights; activations follow
        `symmetric`.
      ema_decay: decay of the activation range moving averages, in [0, 1].
      quant_delay: steps before FakeQuant outputs are used; None or 0: none.
      freeze_bn_delay: steps after which batch norms use moving statistics;
        None: never.
      scope: only layers whose op names start with it are quantized.
      vars_collection: extra collection for the range variables.
      recipe: what each layer gets (`qat.engine.recipes`): a `Recipe`, a
        list of rule dicts, JSON text or a JSON file's path (kept as a
        `Recipe`); None: every layer as the options above say.

    Raises:
      ValueError: for bit widths outside 2..8, negative or non-integer
        delays, an EMA decay outside [0, 1]; `RecipeError` (a ValueError)
        for a bad recipe.
      TypeError: for flags that are not bools, a scope that is not a string,
        a recipe of another type.
    """
    is_training: bool = True
    weight_bits: int = 8
    activation_bits: int = 8
    symmetric: bool = False
    symmetric_weights: bool = False
    per_channel: bool = False
    per_channel_weights: bool = False
    ema_decay: float = 0.999
    quant_delay: Optional[int] = None
    freeze_bn_delay: Optional[int] = None
    scope: Optional[str] = None
    vars_collection: Optional[str] = tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES
    recipe: Optional[recipes.Recipe] = None

    def __post_init__(self):
        object.__setattr__(self, "recipe", recipes.as_recipe(self.recipe) or None)
        for name in ("is_training", "symmetric", "symmetric_weights", "per_channel",
                     "per_channel_weights"):
            _check_bool(getattr(self, name), name)
        check_bits(self.weight_bits, "weight_bits")
        check_bits(self.activation_bits, "activation_bits")
        check_delay(self.quant_delay, "quant_delay")
        check_delay(self.freeze_bn_delay, "freeze_bn_delay")
        if (isinstance(self.ema_decay, bool) or not isinstance(self.ema_decay, (int, float))
                or not 0.0 <= float(self.ema_decay) <= 1.0):
            raise ValueError(f"ema_decay must be a number in [0, 1], got {self.ema_decay!r}.")
        for name in ("scope", "vars_collection"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string or None, got "
                                f"{type(value).__name__}.")

    def weights_symmetric(self) -> bool:
        return self.symmetric or self.symmetric_weights or self.per_channel_weights

    def conv_weights_per_channel(self) -> bool:
        """One range per output channel for conv and depthwise weights."""
        return self.per_channel or self.per_channel_weights

    def matmul_weights_per_channel(self) -> bool:
        """One range per output channel for matmul weights too."""
        return self.per_channel

    def base_precision(self) -> recipes.Precision:
        """What a layer no recipe rule selects gets."""
        return recipes.Precision(weight_bits=self.weight_bits,
                                 activation_bits=self.activation_bits)

    def describe(self) -> str:
        """A one-line summary, as recorded in the graph and quoted in errors.

        The recipe, when there is one, as its compact JSON (`recipe=[...]`).
        """
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "recipe"}
        text = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        return text + (f", recipe={self.recipe.describe()}" if self.recipe else "")
