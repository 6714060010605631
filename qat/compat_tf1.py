"""Old path of `qat.compat.tf1`, kept for one release (docs/architecture.md, "Old paths").

`import qat.compat_tf1` gives the module `qat.compat.tf1` itself.
"""
import sys
import warnings

from qat.compat import tf1 as _moved

warnings.warn("qat.compat_tf1 moved to qat.compat.tf1; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
