"""Errors raised by the export pipeline.

Every error names the file, tensor or op at fault and says what to do; none
of them leaves a user's graph modified (export works on copies).
"""


class ExportError(ValueError):
    """Base class: the export could not be done as asked."""


class GraphLoadError(ExportError):
    """A graph file is missing, unreadable or not a GraphDef/MetaGraphDef."""


class CheckpointError(ExportError):
    """A checkpoint is missing or lacks a variable the model reads."""


class NonFiniteError(ExportError):
    """A weight or range of the frozen graph holds NaN or Inf values.

    Attributes:
      variables: the names of the offending constants (the variables they
        were frozen from).
    """

    def __init__(self, message: str, variables=()):
        super().__init__(message)
        self.variables = list(variables)


class TensorNameError(ExportError):
    """An input or output name does not exist in the graph."""


class ConversionError(ExportError):
    """The TFLite converter rejected the frozen graph."""


class FloatOpError(ExportError):
    """A model meant to be fully integer still computes in float.

    Attributes:
      float_ops: the offending `FloatOp` records (TFLite op and TF ops).
    """

    def __init__(self, message: str, float_ops=()):
        super().__init__(message)
        self.float_ops = list(float_ops)


class ParityError(ExportError):
    """The TFLite model disagrees with the eval graph beyond a threshold.

    Attributes:
      report: the `ParityReport` that failed.
    """

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class RangeLostError(ExportError):
    """Activation ranges of the eval graph are not tensors of the TFLite model.

    Attributes:
      lost: the `qat.export.range_survival.LostRange` records.
    """

    def __init__(self, message: str, lost=()):
        super().__init__(message)
        self.lost = list(lost)


class KernelPreconditionError(ExportError):
    """Ranges of the graph violate a precondition of TFLite's integer kernels.

    Raised before converting (`qat.export.kernel_checks`): the kernel would
    refuse to prepare, abort the process, or the converter would saturate a
    bias without a word.

    Attributes:
      violations: the `qat.export.kernel_checks.Violation` records.
    """

    def __init__(self, message: str, violations=()):
        super().__init__(message)
        self.violations = list(violations)
