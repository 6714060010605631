"""The quantized model of a Keras model: a Keras model of the same Keras.

Keras 3 (tf.keras on TF 2.21) and tf_keras (`TF_USE_LEGACY_KERAS=1`) each get
a `Model` subclass whose `call` runs qat's training or eval function and
whose ranges are non-trainable weights (`add_weight`), so `compile`, `fit`,
`evaluate`, `save_weights` and checkpoints work on it as on the model. The
classes are made on first use: a process that never quantizes a Keras model
imports neither Keras.
"""
import functools

import numpy as np
import tensorflow as tf

from qat.tf2 import ranges
from qat.tf2 import rewriter as rewriter_lib


class _Hidden(object):
    """Keeps the rewriter out of Keras's and TensorFlow's tracking."""

    def __init__(self, value):
        self.value = value


def _methods(base):
    """The methods both Keras flavours share, on `base` (their Model)."""

    class QuantizedKerasModel(base):
        """A Keras model with qat's rewrites (from `qat.quantize_model`).

        `qm(x, training=True)` runs the training rewrite, `training=False` (the
        default, and what `evaluate` / `predict` use) the eval rewrite; `fit`
        trains the model's own weights and learns the ranges.
        """

        def __init__(self, model, call, configs, name=None):
            super().__init__(name=name or "quantized_" + model.name)
            self.model = model
            # TensorFlow's checkpoints and SavedModels reach a variable
            # through attributes; Keras's weight lists are not such.
            self.qat_ranges = ranges.RangeHolder()
            # Skipped-batch counters: checkpointed, not Keras weights (weight
            # files keep their layout).
            self.qat_statistics = ranges.RangeHolder("qat_statistics")
            store = ranges.RangeStore(
                self._make_variable, call.name,
                functools.partial(ranges.make_statistic, self.qat_statistics))
            self._qat = _Hidden(rewriter_lib.FunctionRewriter(call, configs, store))
            self._qat.value.plan()
            self.built = True

        def _make_variable(self, name, dtype, shape, initial_value):
            value = np.asarray(initial_value, dtype.as_numpy_dtype)
            weight = self.add_weight(
                name=name.replace("/", "."), shape=tuple(shape), dtype=dtype.name,
                initializer=functools.partial(_constant, value), trainable=False)
            variable = _tf_variable(weight)
            self.qat_ranges.ordered.append(variable)
            return variable

        def fit(self, *args, **kwargs):
            """Keras's `fit`; then warns once of each range that skipped batches
            whose values were not finite (`skipped_batches`)."""
            history = super().fit(*args, **kwargs)
            self._qat.value.skipped_batches()
            return history

        def skipped_batches(self):
            """{range: training batches it skipped}: see
            `qat.tf2.rewriter.FunctionRewriter.skipped_batches`."""
            return self._qat.value.skipped_batches()

        def call(self, inputs, training=None):
            flat = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            return self._qat.value(flat, bool(training))

        def _trackable_children(self, save_type="checkpoint", **kwargs):
            children = super()._trackable_children(save_type, **kwargs)
            if save_type == "savedmodel":
                # Keras 3 weights wrap a tf.Variable; a SavedModel's functions
                # capture the tf.Variable, which must be an object of the
                # SavedModel for its loader and TF's converter to freeze it.
                holder = ranges.RangeHolder()
                holder.ordered = [_tf_variable(v) for v in self.model.variables]
                children["qat_model_variables"] = holder
            return children

        @property
        def _default_save_signature(self):
            """`tf.saved_model.save(qm, path)`'s `serving_default`: the eval rewrite."""
            return self._qat.value.functions[False]

        def _get_save_spec(self, dynamic_batch=True, inputs_only=True):
            del dynamic_batch
            specs = self._qat.value.call.signature
            specs = specs[0] if len(specs) == 1 else list(specs)
            return specs if inputs_only else ((specs,), {})

        @property
        def rewriter(self) -> rewriter_lib.FunctionRewriter:
            """The training and eval functions, and what each trace left float."""
            return self._qat.value

        @property
        def left_float(self):
            """What the rewrite left float, each with the reason (as the graph path
            logs it): batch norms not folded, layers it cannot reach."""
            rewriter = self._qat.value
            return sorted(set(rewriter.left_float[True]) | set(rewriter.left_float[False]))

        def inference_function(self) -> tf.types.experimental.ConcreteFunction:
            """The eval rewrite as a concrete function, for TF 2's TFLite converter.

            See `qat.tf2.module.QuantizedModule.inference_function`.
            """
            return self._qat.value.inference_function()

    return QuantizedKerasModel


def _tf_variable(weight) -> tf.Variable:
    """The tf.Variable of a Keras 3 weight (a tf_keras weight is one)."""
    return weight if isinstance(weight, tf.Variable) else weight.value


def _constant(value, shape=None, dtype=None):
    del shape, dtype
    return tf.constant(value)


@functools.lru_cache(maxsize=None)
def model_class(flavour: str):
    """The quantized model class of "keras" (Keras 3) or "tf_keras"."""
    if flavour == "keras":
        import keras  # pylint: disable=import-outside-toplevel
        return _methods(keras.Model)
    import tf_keras  # pylint: disable=import-outside-toplevel
    return _methods(tf_keras.Model)
