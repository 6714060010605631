"""Old path of `qat.quantize.plan.model.control_flow`, kept for one release.

docs/known_limits.md named `qat.quantize.control_flow.find_function_layers`;
`import qat.quantize.control_flow` gives the module at its new path itself
(docs/architecture.md, "Old paths").
"""
import sys
import warnings

from qat.quantize.plan.model import control_flow as _moved

warnings.warn("qat.quantize.control_flow moved to qat.quantize.plan.model.control_flow; "
              "the old path goes in the next release", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
