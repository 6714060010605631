"""qat's variables of a quantized TF 2 model: made once, kept in order.

The graph path makes range variables as graph ops; a `tf.function` cannot
(`qat.engine.function_graphs`). `RangeStore` makes them when
`quantize_model` first traces the model (the plan) and hands the same
variables to every later trace, which must ask for no other: a range a later
trace asks for that the plan did not make means the model's Python code
builds another graph on that call, and is refused with the quantizer's name.

The owner decides what a variable is (`make`): a `tf.Variable` a `tf.Module`
tracks, or a Keras weight of the quantized Keras model, so checkpoints,
`save_weights` and SavedModels hold them. They are tracked in the order the
plan made them, which is the same for every model built from the same code:
a checkpoint restores into a freshly built quantized model whatever names
Keras gave its layers in that process.

Under a `tf.distribute` strategy the variables are mirrored and each
replica's trace uses its own component; the replicas' range statistics are
combined before every update (`qat.tf2.replicas`).
"""
from typing import Callable, Dict, List, Sequence

import numpy as np
import tensorflow as tf

from qat.engine import function_graphs
from qat.tf2 import replicas

# make(name, dtype, shape, initial value) -> a resource tf.Variable.
MakeFn = Callable[[str, tf.DType, Sequence[int], np.ndarray], tf.Variable]


class UnplannedRangeError(ValueError):
    """A trace asked for a range the plan did not make."""


class RangeStore(function_graphs.VariableStore):
    """The variables of one quantized model, by qat's name and in plan order.

    Args:
      make: makes a variable (called outside any function).
      model_name: the model's name, for messages.
    """

    def __init__(self, make: MakeFn, model_name: str):
        self._make = make
        self._model_name = model_name
        self._by_name: Dict[str, tf.Variable] = {}
        self.ordered: List[tf.Variable] = []
        self.planning = True

    def __len__(self) -> int:
        return len(self.ordered)

    def names(self) -> List[str]:
        return list(self._by_name)

    def variable(self, name, dtype, shape, initial_value):
        found = self._by_name.get(name)
        if found is None:
            if not self.planning:
                raise UnplannedRangeError(
                    f"qat: this call of {self._model_name} builds the quantizer "
                    f"'{name.rsplit('/', 1)[0]}', which the model did not have when "
                    "quantize_model traced it: its Python code builds a different graph "
                    "on this call (control flow on Python values that change between "
                    "calls, or layers called only sometimes). qat plans ranges once; "
                    "write such branches with tf.cond on a tensor, or quantize a model "
                    "whose every call runs the same layers.")
            found = self._make(name, dtype, list(shape), initial_value)
            self._by_name[name] = found
            self.ordered.append(found)
        elif (found.dtype.base_dtype != dtype
              or not found.shape.is_compatible_with(tf.TensorShape(shape))):
            raise UnplannedRangeError(
                f"qat: this call of {self._model_name} asks for '{name}' as {dtype.name} "
                f"{list(shape)}; the plan made it {found.dtype.base_dtype.name} "
                f"{found.shape.as_list()} (the model's shapes differ between calls).")
        return found

    def handles(self, variable):
        """Under a strategy: its replica's component (`qat.tf2.replicas`)."""
        return replicas.variable_handles(variable)



class RangeHolder(tf.Module):
    """Tracks a quantized model's variables in plan order, for TensorFlow's
    checkpoints and SavedModels (`ordered`)."""

    def __init__(self):
        super().__init__(name="qat_ranges")
        self.ordered = []
