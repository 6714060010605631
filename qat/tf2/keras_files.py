"""A quantized Keras model in Keras's own files: `.keras` and `.weights.h5`.

Keras writes a model as its config (`get_config`: what rebuilds it) and its
weights, which it finds by walking the model's attributes and saves by path,
not by name: the quantized model's own weights (qat's step counter and ranges,
made by the plan in the order the traced graph gives, whatever names Keras
gave the layers) at `vars/<i>`, the quantized model's model at
`layers/<its class, snake case>/...`, the optimizer's at `optimizer/vars/<i>`.

The quantized model's config is its model's config (Keras's own serialization
of it: a functional or Sequential model's layers, a subclassed model's
`get_config()`), the input signature and `quantize_model`'s options. Loading
rebuilds the model from its config and quantizes it again with the same
options and signature, so the plan makes the same variables in the same
order; Keras then loads every weight at its path. The same holds for
tf_keras, whose `.keras` files are walked the same way.
"""
import dataclasses
from typing import Any, Dict, List, Optional

import tensorflow as tf

from qat.tf2 import options as options_lib

# Keys of a quantized Keras model's config.
MODEL = "model"
INPUT_SIGNATURE = "input_signature"
OPTIONS = "options"
NAME = "name"


@dataclasses.dataclass
class LoadedConfig:
    """What a quantized Keras model's config rebuilds.

    Attributes:
      model: the model, rebuilt from its config (not yet quantized).
      input_signature: one `tf.TensorSpec` per input.
      options: `quantize_model`'s options.
      name: the quantized model's name.
    """
    model: Any
    input_signature: List[tf.TensorSpec]
    options: options_lib.QuantizeOptions
    name: Optional[str]


def model_config(qm, saving) -> Dict[str, Any]:
    """The config of the quantized Keras model `qm`.

    Args:
      qm: a quantized Keras model.
      saving: its Keras's `saving` module (`keras.saving`, `tf_keras.saving`).

    Returns:
      A JSON-serializable dict `load_config` reads.

    Raises:
      NotImplementedError: the model cannot write its config (a subclassed
        model whose `__init__` takes objects and that has no `get_config`).
    """
    model = qm.model
    try:
        serialized = saving.serialize_keras_object(model)
    except NotImplementedError as e:
        cls = type(model).__name__
        raise NotImplementedError(
            f"qat: {qm.name} cannot be saved as a Keras model file (.keras): its model "
            f"'{model.name}' ({cls}) cannot write its config ({e.__class__.__name__} from "
            f"{cls}.get_config). Loading a .keras file rebuilds the model from its config, "
            f"then quantizes it again. Either give {cls} a get_config() that returns its "
            "__init__ arguments (and decorate the class with "
            "@keras.saving.register_keras_serializable()), or save the weights only "
            "(qm.save_weights('x.weights.h5'), ModelCheckpoint(..., save_weights_only=True), "
            "tf.train.Checkpoint(model=qm)) and restore them into "
            "qat.quantize_model of a freshly built model.") from e
    return {
        NAME: qm.name,
        MODEL: serialized,
        INPUT_SIGNATURE: [_spec_config(spec) for spec in qm.rewriter.call.signature],
        OPTIONS: qm.quantize_options.to_config(),
    }


def load_config(config: Dict[str, Any], saving,
                custom_objects: Optional[Dict[str, Any]] = None) -> LoadedConfig:
    """Rebuilds what `model_config` wrote (the model unquantized).

    Args:
      config: a quantized Keras model's config.
      saving: the Keras's `saving` module.
      custom_objects: Keras's custom objects, for the model's classes.

    Returns:
      The rebuilt model, its signature and options, the quantized model's name.

    Raises:
      ValueError: a config without the model or an option qat does not know.
      TypeError: the model's config names a class Keras cannot find.
    """
    missing = [key for key in (MODEL, INPUT_SIGNATURE, OPTIONS) if key not in config]
    if missing:
        raise ValueError(
            f"qat: the quantized Keras model's config lacks {missing}; it was not written "
            "by a quantized model's get_config.")
    try:
        model = saving.deserialize_keras_object(config[MODEL], custom_objects=custom_objects)
    except TypeError as e:
        raise TypeError(
            f"qat: rebuilding the model of the quantized model {config.get(NAME)!r} from its "
            "config failed. A subclassed model is rebuilt from its class: import the module "
            "that defines it (registered with @keras.saving.register_keras_serializable()) "
            f"before loading, or pass the class in custom_objects. Keras: {e}") from e
    return LoadedConfig(
        model=model,
        input_signature=[_spec_from_config(c) for c in config[INPUT_SIGNATURE]],
        options=options_lib.QuantizeOptions.from_config(config[OPTIONS]),
        name=config.get(NAME))


def _spec_config(spec: tf.TensorSpec) -> Dict[str, Any]:
    return {"shape": spec.shape.as_list(), "dtype": spec.dtype.name, "name": spec.name}


def _spec_from_config(config: Dict[str, Any]) -> tf.TensorSpec:
    return tf.TensorSpec(config["shape"], tf.as_dtype(config["dtype"]), name=config["name"])
