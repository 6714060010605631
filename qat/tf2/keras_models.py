"""The quantized model of a Keras model: a Keras model of the same Keras.

Keras 3 (tf.keras on TF 2.21) and tf_keras (`TF_USE_LEGACY_KERAS=1`) each get
a `Model` subclass whose `call` runs qat's training or eval function and
whose ranges are non-trainable weights (`add_weight`), so `compile`, `fit`,
`evaluate`, `save_weights` and checkpoints work on it as on the model. Each
class is a registered serializable class of its Keras (`qat>QuantizedKerasModel`):
`model.save("x.keras")` writes its config and `load_model` rebuilds it
(`qat.tf2.keras_files`). The classes are made when their Keras is imported
(`qat.tf2.keras_registration`): a process that never imports a Keras makes
neither.
"""
import functools
from typing import Optional

import numpy as np
import tensorflow as tf

from qat.tf2 import calls
from qat.tf2 import keras_files
from qat.tf2 import options as options_lib
from qat.tf2 import precision as precision_lib
from qat.tf2 import ranges
from qat.tf2 import recurrent_kernels
from qat.tf2 import replicas
from qat.tf2 import rewriter as rewriter_lib

REGISTERED_PACKAGE = "qat"


class _Hidden(object):
    """Keeps the rewriter out of Keras's and TensorFlow's tracking."""

    def __init__(self, value):
        self.value = value


def _methods(base, saving):
    """The methods both Keras flavours share, on `base` (their Model); `saving`
    is that Keras's saving module."""

    class QuantizedKerasModel(base):
        """A Keras model with qat's rewrites: what `qat.quantize_model` returns for one.

        `qm(x, training=True)` runs the training rewrite, `training=False` (the
        default, and what `evaluate` / `predict` use) the eval rewrite; `fit`
        trains the model's own weights and learns the ranges. `compile`,
        `evaluate`, `predict`, `save_weights` / `load_weights`, `save("x.keras")`
        and `keras.models.load_model` work as on any Keras model.

        Keras 3 and tf_keras each get their own class, made when that Keras is
        imported and registered with it as `qat>QuantizedKerasModel`
        (`keras.saving.get_registered_object("qat>QuantizedKerasModel")`); users
        never construct it.
        """

        def __init__(self, model, call: calls.ModelCall,
                     options: options_lib.QuantizeOptions, name: Optional[str] = None):
            # The model's dtype policy (Keras's compile wraps a mixed_float16
            # model's optimizer in a LossScaleOptimizer), without casting the
            # inputs to its compute dtype: `call` casts them to the signature's.
            super().__init__(name=name or "quantized_" + model.name,
                             dtype=model.dtype_policy, autocast=False)
            self.model = model
            self._qat_options = _Hidden(options)
            # TensorFlow's checkpoints and SavedModels reach a variable
            # through attributes; Keras's weight lists are not such.
            self.qat_ranges = ranges.RangeHolder()
            # Skipped-batch counters: checkpointed, not Keras weights (weight
            # files keep their layout).
            self.qat_statistics = ranges.RangeHolder("qat_statistics")
            store = ranges.RangeStore(
                self._make_variable, call.name,
                functools.partial(ranges.make_statistic, self.qat_statistics))
            precision = precision_lib.Precision(model, calls.keras_flavour(model))
            self._qat = _Hidden(rewriter_lib.FunctionRewriter(
                call, options.rewrite_configs(), store, precision,
                recurrent_kernels.GenericRecurrences(model)))
            self._qat.value.plan()
            self.built = True

        def get_config(self):
            """The model's config, its input signature and quantize_model's options
            (`qat.tf2.keras_files`), for `save("x.keras")`."""
            return keras_files.model_config(self, saving)

        @classmethod
        def from_config(cls, config, custom_objects=None):
            """The model rebuilt from its config and quantized again as it was."""
            loaded = keras_files.load_config(config, saving, custom_objects)
            call = calls.model_call(loaded.model, loaded.input_signature)
            return quantize(loaded.model, call, loaded.options, name=loaded.name)

        def _make_variable(self, name, dtype, shape, initial_value):
            value = np.asarray(initial_value, dtype.as_numpy_dtype)
            weight = self.add_weight(
                name=name.replace("/", "."), shape=tuple(shape), dtype=dtype.name,
                initializer=functools.partial(_constant, value), trainable=False,
                autocast=False)  # Ranges stay float32 under a mixed policy.
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
            """{range name: training batches it skipped}; logs a warning once per range.

            A range skips a training batch whose min or max is NaN or infinite,
            and keeps its value. A range that skipped any batch gets one warning
            per process, naming it and the tensor it quantizes. Called by the
            model after each eager training call, at the end of Keras's `fit` and
            by `inference_function()`; in a custom loop whose step is a
            `tf.function`, call it when you want to know.
            """
            return self._qat.value.skipped_batches()

        def call(self, inputs, training=None):
            flat = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            rewriter = self._qat.value
            return rewriter(_as_signature_dtypes(flat, rewriter.call.signature), bool(training))

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
        def quantize_options(self) -> options_lib.QuantizeOptions:
            """The options `quantize_model` was given."""
            return self._qat_options.value

        @property
        def layer_precisions(self):
            """With a recipe: each layer (`qat.quantize.plan.ranges.precisions.Layer`:
            its name, kind, position) and the precision it got; `describe()` of
            one reads `functional_1/conv1_1 (conv, first): w8 a8 [rule 2]`.
            Empty without a recipe."""
            return self._qat.value.layer_precisions()

        @property
        def left_float(self):
            """What the rewrite left float, each a string "<op>: <reason>" (as
            the graph path logs it): batch norms not folded, layers it cannot
            reach (inside a `tf.cond` branch, say). Empty when nothing is."""
            rewriter = self._qat.value
            return sorted(set(rewriter.left_float[True]) | set(rewriter.left_float[False]))

        def inference_function(self) -> tf.types.experimental.ConcreteFunction:
            """The eval rewrite as a concrete function, for TF 2's TFLite converter.

            Convert it with `tf.lite.TFLiteConverter.from_concrete_functions([f])`
            (no trackable object: every variable is frozen) and `optimizations =
            [tf.lite.Optimize.DEFAULT]`; `inference_input_type = tf.int8` (and
            `inference_output_type`) for int8 input and output. Also reports
            skipped batches (`skipped_batches`). `qat.export.export_model` does
            all of it, checked.
            """
            return self._qat.value.inference_function()

    return saving.register_keras_serializable(package=REGISTERED_PACKAGE)(QuantizedKerasModel)


def quantize(model, call: calls.ModelCall, options: options_lib.QuantizeOptions,
             name: Optional[str] = None):
    """`quantize_model` of the Keras model `model` (called as `call` says).

    Raises:
      ValueError / TypeError: as `qat.quantize_model`.
    """
    _build(model, call)
    # Under tf.distribute: qat's variables mirrored as the model's are.
    with replicas.creation_scope(model):
        return model_class(calls.keras_flavour(model))(model, call, options, name=name)


def _build(model, call: calls.ModelCall) -> None:
    """Builds a subclassed Keras model's weights eagerly, outside the trace."""
    if model.built and model.weights:
        return
    zeros = [tf.zeros([1 if d is None else d for d in spec.shape], spec.dtype)
             for spec in call.signature]
    try:
        call(zeros, training=False)
    except (ValueError, TypeError) as e:
        raise type(e)(
            f"qat.quantize_model({call.name}): calling the model on input_signature "
            f"{call.signature} failed: {e}") from e


def _as_signature_dtypes(inputs, signature):
    """Float inputs cast to their signature's float dtype, as Keras casts a
    model's inputs to its compute dtype (the quantized model's functions take
    the signature's dtypes, whatever its policy's compute dtype)."""
    cast = []
    for k, x in enumerate(inputs):
        wanted = signature[k].dtype if k < len(signature) else None
        dtype = getattr(x, "dtype", None)
        if (wanted is not None and wanted.is_floating and dtype is not None
                and tf.as_dtype(dtype).is_floating and tf.as_dtype(dtype) != wanted):
            x = tf.cast(x, wanted)
        cast.append(x)
    return cast


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
        return _methods(keras.Model, keras.saving)
    import tf_keras  # pylint: disable=import-outside-toplevel
    return _methods(tf_keras.Model, tf_keras.saving)
