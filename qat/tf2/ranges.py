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

Each range's count of skipped batches (`<prefix>/skipped_batches`,
`qat.quantize.emit.finite_ranges`) is a statistic, not a weight: the owner
makes it apart (`make_statistic`), a plain `tf.Variable` its checkpoints
hold, so the model's weight lists and weight files keep the layout they had
before the counters existed, and an older checkpoint restores (its counters
start at 0).

Under a `tf.distribute` strategy the variables are mirrored and each
replica's trace uses its own component; the replicas' range statistics are
combined before every update (`qat.tf2.replicas`).
"""
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from qat.engine import function_graphs
from qat.tf2 import replicas

# make(name, dtype, shape, initial value) -> a resource tf.Variable.
MakeFn = Callable[[str, tf.DType, Sequence[int], np.ndarray], tf.Variable]


class UnplannedRangeError(ValueError):
    """A call of a quantized TF 2 model builds a graph its first trace did not.

    `qat.quantize_model` plans the ranges from the model's first trace; a
    later trace (another mode or input shape) whose Python code builds other
    layers (a Python `if` on a changing value, a layer called only sometimes)
    asks for ranges that plan did not make, and one whose tensors change shape
    asks for a range of another shape. The error names the layers or the
    range; write such branches with `tf.cond`, and keep shapes the same.
    """


class RangeStore(function_graphs.VariableStore):
    """The variables of one quantized model, by qat's name and in plan order.

    Args:
      make: makes a variable (called outside any function).
      model_name: the model's name, for messages.
      make_statistic: makes a statistic (a skipped-batch counter); default:
        `make`.
    """

    def __init__(self, make: MakeFn, model_name: str,
                 make_statistic: Optional[MakeFn] = None):
        self._make = make
        self._make_statistic = make_statistic or make
        self._model_name = model_name
        self._by_name: Dict[str, tf.Variable] = {}
        self.ordered: List[tf.Variable] = []
        # {name: counter}, in plan order (also in `ordered`).
        self.statistics: Dict[str, tf.Variable] = {}
        self.planning = True

    def __len__(self) -> int:
        return len(self.ordered)

    def names(self) -> List[str]:
        return list(self._by_name)

    def variable(self, name, dtype, shape, initial_value, make=None):
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
            found = (make or self._make)(name, dtype, list(shape), initial_value)
            self._by_name[name] = found
            self.ordered.append(found)
        elif (found.dtype.base_dtype != dtype
              or not found.shape.is_compatible_with(tf.TensorShape(shape))):
            raise UnplannedRangeError(
                f"qat: this call of {self._model_name} asks for '{name}' as {dtype.name} "
                f"{list(shape)}; the plan made it {found.dtype.base_dtype.name} "
                f"{found.shape.as_list()} (the model's shapes differ between calls).")
        return found

    def statistic(self, name, dtype, shape, initial_value):
        found = self.variable(name, dtype, shape, initial_value, make=self._make_statistic)
        self.statistics[name] = found
        return found

    def handles(self, variable):
        """Under a strategy: its replica's component (`qat.tf2.replicas`)."""
        return replicas.variable_handles(variable)


class RangeHolder(tf.Module):
    """Tracks a quantized model's variables in plan order, for TensorFlow's
    checkpoints and SavedModels (`ordered`)."""

    def __init__(self, name: str = "qat_ranges"):
        super().__init__(name=name)
        self.ordered = []


def make_statistic(holder: RangeHolder, name: str, dtype: tf.DType, shape: Sequence[int],
                   initial_value: np.ndarray) -> tf.Variable:
    """A statistic of a quantized model: a plain non-trainable `tf.Variable`
    tracked by `holder` (so checkpoints hold it, and no weight list)."""
    variable = tf.Variable(np.asarray(initial_value, dtype.as_numpy_dtype), trainable=False,
                           name=name, shape=shape)
    holder.ordered.append(variable)
    return variable
