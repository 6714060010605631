"""How qat calls a TF 2 model: which function, with which inputs.

`quantize_model` takes a Keras 3 or tf_keras model, a `tf.Module` or any
callable of tensors. `ModelCall` hides the difference: it knows the input
signature (given, or stated by the model), whether the model takes
`training=`, and whether it takes its inputs as one argument (a tensor, or a
list for several, as Keras models do) or as positional arguments.

A callable that is a `tf.function` (a decorated `__call__` of a `tf.Module`
included) is called through its Python function: qat traces the model into
its own function, where every layer is visible, instead of calling a nested
function whose layers it could not reach.
"""
import dataclasses
import inspect
from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf


@dataclasses.dataclass
class ModelCall:
    """A model and how to call it.

    Attributes:
      fn: the Python callable.
      signature: one `tf.TensorSpec` per input.
      takes_training: `fn` accepts `training=`.
      inputs_as_one: `fn(inputs)` (Keras) rather than `fn(*inputs)`.
      name: the model's name, for messages.
    """
    fn: Callable[..., Any]
    signature: List[tf.TensorSpec]
    takes_training: bool
    inputs_as_one: bool
    name: str

    def __call__(self, inputs: Sequence[tf.Tensor], training: bool):
        kwargs = {"training": training} if self.takes_training else {}
        if self.inputs_as_one:
            return self.fn(inputs[0] if len(inputs) == 1 else list(inputs), **kwargs)
        return self.fn(*inputs, **kwargs)


def is_keras_model(model) -> bool:
    """A Keras 3 or a tf_keras model (tf.keras of either kind)."""
    return keras_flavour(model) is not None


def keras_flavour(model) -> Optional[str]:
    """"keras" (Keras 3), "tf_keras" (Keras 2) or None."""
    for cls in type(model).__mro__:
        module = cls.__module__ or ""
        if cls.__name__ == "Model" and module.startswith("keras."):
            return "keras"
        if cls.__name__ == "Model" and module.startswith("tf_keras."):
            return "tf_keras"
    return None


def _takes_training(fn: Callable) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "training" or p.kind == p.VAR_KEYWORD for p in parameters)


def _stated_signature(model, fn) -> Optional[List[tf.TensorSpec]]:
    """The input signature the model states, or None."""
    if is_keras_model(model):
        inputs = getattr(model, "inputs", None) if _keras_built(model) else None
        if inputs:
            return [tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype),
                                  name=_keras_input_name(t)) for t in inputs]
        return None
    signature = getattr(fn, "input_signature", None)
    if signature:
        return list(signature)
    return None


def _keras_built(model) -> bool:
    try:
        return bool(model.built) and bool(getattr(model, "inputs", None))
    except (AttributeError, ValueError):  # A subclassed model has no inputs.
        return False


def _keras_input_name(t) -> Optional[str]:
    name = getattr(t, "name", None) or ""
    name = name.split(":")[0]
    return name or None


def _check_signature(signature, name: str) -> List[tf.TensorSpec]:
    if isinstance(signature, tf.TensorSpec):
        signature = [signature]
    if not isinstance(signature, (list, tuple)) or not signature:
        raise TypeError(
            f"qat.quantize_model({name}): input_signature must be a non-empty list of "
            f"tf.TensorSpec, got {signature!r}.")
    for k, spec in enumerate(signature):
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError(
                f"qat.quantize_model({name}): input_signature[{k}] is "
                f"{type(spec).__name__}; give a tf.TensorSpec (shape and dtype of "
                "that input, None for the batch dimension).")
        if spec.shape.rank is None:
            raise ValueError(
                f"qat.quantize_model({name}): input_signature[{k}] has an unknown rank; "
                "give its shape (None for the batch dimension).")
    return list(signature)


def model_call(model, input_signature: Optional[Sequence[tf.TensorSpec]]) -> ModelCall:
    """How to call `model`, with its checked input signature.

    Raises:
      TypeError: `model` is not callable, or a bad signature entry.
      ValueError: no signature given and the model states none.
    """
    if not callable(model):
        raise TypeError(
            f"qat.quantize_model(): the model must be a Keras model, a tf.Module or a "
            f"callable of tensors; got {type(model).__name__}, which is not callable.")
    name = getattr(model, "name", None) or getattr(model, "__name__", None) or type(model).__name__
    keras = is_keras_model(model)
    fn = model
    if not keras and not inspect.isroutine(model) and not hasattr(model, "python_function"):
        method = getattr(model, "__call__")  # A tf.Module's tf.function __call__?
        if hasattr(method, "python_function"):
            fn = method
    stated = _stated_signature(model, fn)
    if hasattr(fn, "python_function"):  # A tf.function: trace its Python code.
        fn = fn.python_function
    if input_signature is None:
        if stated is None:
            raise ValueError(
                f"qat.quantize_model({name}): the model states no inputs (a subclassed "
                "Keras model, a tf.Module or a function without an input signature): pass "
                "input_signature=[tf.TensorSpec(shape, dtype), ...], one per input, None "
                "for the batch dimension.")
        signature = stated
    else:
        signature = _check_signature(input_signature, name)
    return ModelCall(fn=fn, signature=signature,
                     takes_training=keras or _takes_training(fn),
                     inputs_as_one=keras, name=name)
