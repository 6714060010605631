"""`quantize_model`'s options, kept with the quantized model.

The options decide the rewrite (`rewrite_configs`); a quantized Keras model
also writes them into its `.keras` config, so loading the file quantizes the
rebuilt model exactly as before (the same ranges, made in the same order).
"""
import dataclasses
from typing import Any, Dict, Optional

from qat.engine import config as config_lib
from qat.engine import recipes


@dataclasses.dataclass(frozen=True)
class QuantizeOptions:
    """The keyword options of `qat.quantize_model` (documented there)."""
    weight_bits: int = 8
    activation_bits: int = 8
    symmetric: bool = False
    quant_delay: int = 0
    freeze_bn_delay: Optional[int] = None
    scope: Optional[str] = None
    symmetric_weights: bool = True
    per_channel_weights: bool = False
    recipe: Optional[recipes.Recipe] = None

    def __post_init__(self):
        object.__setattr__(self, "recipe", recipes.as_recipe(self.recipe) or None)

    def rewrite_configs(self) -> Dict[bool, config_lib.RewriteConfig]:
        """{training: the validated RewriteConfig of that mode}.

        Raises:
          ValueError: bad bit widths or delays.
          TypeError: flags of the wrong type.
        """
        shared = dict(weight_bits=self.weight_bits, activation_bits=self.activation_bits,
                      symmetric=self.symmetric, scope=self.scope,
                      symmetric_weights=self.symmetric_weights,
                      per_channel_weights=self.per_channel_weights, recipe=self.recipe)
        return {
            True: config_lib.RewriteConfig(is_training=True, quant_delay=self.quant_delay,
                                           freeze_bn_delay=self.freeze_bn_delay, **shared),
            False: config_lib.RewriteConfig(is_training=False, **shared),
        }

    def to_config(self) -> Dict[str, Any]:
        """The options as JSON-serializable values (a recipe as its rules)."""
        config = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        config["recipe"] = self.recipe.to_config() if self.recipe else None
        return config

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "QuantizeOptions":
        """The options `to_config` wrote.

        Raises:
          ValueError: an option this version of qat does not know;
            `qat.RecipeError` for a recipe this version cannot read.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"qat: the saved quantize_model options {unknown} are unknown to this "
                f"version of qat (it knows {sorted(known)}).")
        return cls(**config)
