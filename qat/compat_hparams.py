"""Old path of `qat.compat.hparams`, kept for one release (docs/architecture.md, "Old paths").

`import qat.compat_hparams` gives the module `qat.compat.hparams` itself.
"""
import sys
import warnings

from qat.compat import hparams as _moved

warnings.warn("qat.compat_hparams moved to qat.compat.hparams; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
