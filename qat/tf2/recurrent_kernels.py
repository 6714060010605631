"""Keras recurrent layers are traced on their generic path, never as a cuDNN op.

Keras 3 runs an LSTM or GRU whose arguments cuDNN supports (no `unroll`,
tanh and sigmoid activations, a bias, GRU's `reset_after`, no recurrent
dropout) as one `CudnnRNNV3` op wherever a GPU is visible while it is traced
(`use_cudnn="auto"`, the default; `True` demands it). TFLite has no kernel for
that op and qat cannot see into it: on a machine with a GPU the layer would
stay float, and qat would trace another model than on one without.

So every function of a quantized model is traced with those layers on their
generic path (`GenericRecurrences.trace`): the While loop of the layer's cell
that qat unrolls (`qat.prepare.loops`), reading the same variables (kernel,
recurrent kernel, bias). The ranges, their names, the checkpoint and the
export are the same on every machine; training on a GPU trains the model's
own weights through the unrolled steps (on the GPU, without cuDNN's fused
kernel). The model keeps its setting outside qat's traces.

A layer is recognised by what Keras reads to choose its path (a `use_cudnn`
attribute of "auto" or True), so any recurrent layer offering cuDNN is
covered. A cuDNN op that reaches a graph all the same (a `tf.Module` calling
`tf.raw_ops.CudnnRNNV3`, a graph built on a GPU machine) is named in
`left_float` (`qat.quantize.plan.ops.op_table.FUSED_RECURRENCE_TYPES`).
"""
import contextlib
from typing import Iterator


def _may_use_cudnn(layer) -> bool:
    """Whether Keras may run `layer` as a cuDNN op ("auto" or True)."""
    value = getattr(layer, "use_cudnn", None)
    return value is True or (isinstance(value, str) and value == "auto")


class GenericRecurrences(object):
    """The recurrent layers of a Keras model that may run as a cuDNN op.

    Args:
      model: a Keras 3 or tf_keras model (tf_keras layers have no
        `use_cudnn`: none of them is listed).
    """

    def __init__(self, model):
        self.layers = [layer for layer in model._flatten_layers(include_self=True)  # pylint: disable=protected-access
                       if _may_use_cudnn(layer)]

    @contextlib.contextmanager
    def trace(self) -> Iterator[None]:
        """Within: each of `layers` takes its generic path (its setting restored after)."""
        saved = [(layer, layer.use_cudnn) for layer in self.layers]
        try:
            for layer, _ in saved:
                layer.use_cudnn = False
            yield
        finally:
            for layer, value in saved:
                layer.use_cudnn = value
