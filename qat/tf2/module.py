"""The quantized model of a `tf.Module` or a callable: a `tf.Module` itself."""
import functools
from typing import Dict

import numpy as np
import tensorflow as tf

from qat.tf2 import ranges
from qat.tf2 import rewriter as rewriter_lib


class _Hidden(object):
    """Holds what a tf.Module must not track (the functions: one SavedModel
    signature, `serve`, and no checkpoint entry for them)."""

    def __init__(self, value):
        self.value = value


class QuantizedModule(tf.Module):
    """A model with qat's training and eval rewrites (from `qat.quantize_model`).

    `qm(*inputs, training=True)` runs the training rewrite (batch norms folded
    with batch statistics, ranges learned), `training=False` the eval rewrite.
    `trainable_variables` are the model's own; the ranges and qat's step
    counter are non-trainable variables of this module, so
    `tf.train.Checkpoint(model=qm)` and `tf.saved_model.save(qm, path)` hold
    them. The SavedModel's `serving_default` is the eval rewrite.
    """

    def __init__(self, model, call, configs, name=None):
        super().__init__(name=name)
        self.model = model
        self.qat_ranges = ranges.RangeHolder()
        self.qat_statistics = ranges.RangeHolder("qat_statistics")
        # A plain callable's variables are found by tracing it; kept here so
        # `trainable_variables` lists them.
        self.model_variables = []
        store = ranges.RangeStore(
            self._make_variable, call.name,
            functools.partial(ranges.make_statistic, self.qat_statistics))
        self._qat = _Hidden(rewriter_lib.FunctionRewriter(call, configs, store))
        self._qat.value.plan()
        if not isinstance(model, tf.Module):
            self.model_variables.extend(self._qat.value.model_variables)
        self.serve = self._qat.value.functions[False]

    def _make_variable(self, name, dtype, shape, initial_value) -> tf.Variable:
        variable = tf.Variable(np.asarray(initial_value, dtype.as_numpy_dtype),
                               trainable=False, name=name, shape=shape)
        self.qat_ranges.ordered.append(variable)
        return variable

    def __call__(self, *inputs, training: bool = False):
        return self._qat.value(inputs, training)

    def skipped_batches(self) -> Dict[str, int]:
        """{range name: training batches it skipped}; logs a warning once per range.

        A range skips a training batch whose min or max is NaN or infinite,
        and keeps its value. A range that skipped any batch gets one warning
        per process, naming it and the tensor it quantizes. Called by the
        model after each eager training call, at the end of Keras's `fit` and
        by `inference_function()`; in a custom loop whose step is a
        `tf.function`, call it when you want to know.
        """
        return self._qat.value.skipped_batches()

    @property
    def rewriter(self) -> rewriter_lib.FunctionRewriter:
        """The training and eval functions, and what each trace left float."""
        return self._qat.value

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

    def save(self, filepath, *args, **kwargs):
        """Refused: Keras's model files (`.keras`) hold Keras models only.

        Raises:
          TypeError: always, saying how this model is saved.
        """
        del args, kwargs
        raise TypeError(
            f"qat: cannot save {filepath!r}: the quantized model of a tf.Module or a function "
            "is a tf.Module, not a Keras model, and Keras's model files hold Keras models "
            "only. Save it with tf.train.Checkpoint(model=qm).save(path) (it restores into "
            "qat.quantize_model of a freshly built model) or tf.saved_model.save(qm, path) "
            "(serving_default is the eval rewrite).")

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
