"""The quantized Keras model classes, registered with each Keras once it is imported.

`keras.models.load_model("x.keras")` finds a quantized model's class by its
registered name (`qat>QuantizedKerasModel`), so the class must be registered
with that Keras before loading, by `import qat` alone, whichever of qat and
Keras the process imports first. Importing a Keras takes seconds, and qat
imports none a process does not use: `register()` (run by `import qat`)
registers the class at once with each Keras already imported (Keras 3 when
TensorFlow's `tf.keras` is Keras 3, tf_keras under `TF_USE_LEGACY_KERAS=1`),
and for the other puts a finder on `sys.meta_path` that registers it as soon
as that Keras's package has finished importing.
"""
import functools
import importlib.abc
import sys
import threading
from typing import Callable, Dict

from absl import logging

from qat.tf2 import keras_models

# The package of each Keras flavour (`keras_models.model_class`).
PACKAGES = {"keras": "keras", "tf_keras": "tf_keras"}


def register() -> None:
    """Registers the quantized model class with every Keras, now or when imported."""
    pending = {}
    for package, flavour in PACKAGES.items():
        if package in sys.modules:
            keras_models.model_class(flavour)
        else:
            pending[package] = functools.partial(keras_models.model_class, flavour)
    if pending and not any(isinstance(f, AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(pending))


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls a function right after a package has been imported (executed).

    It finds the package's spec with the other finders and wraps only that
    spec's loader's `exec_module`, for that one execution; the import itself
    is theirs. Once every package has been imported it leaves `sys.meta_path`.

    Args:
      pending: {package name: what to call once it is imported}.
    """

    def __init__(self, pending: Dict[str, Callable[[], object]]):
        self._pending = dict(pending)
        self._finding = threading.local()

    def find_spec(self, fullname, path, target=None):
        then = self._pending.get(fullname)
        if then is None or getattr(self._finding, "active", False):
            return None
        self._finding.active = True
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._finding.active = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module):
            if module.__name__ != fullname:  # Another module of a shared loader (a zip's).
                execute(module)
                return
            try:
                execute(module)
            finally:
                loader.__dict__.pop("exec_module", None)
            self._imported(fullname, then)

        try:
            loader.exec_module = exec_module
        except AttributeError:  # A loader without instance attributes: not ours to wrap.
            logging.warning("qat: cannot register the quantized model class with %s on its "
                            "import; import %s before qat to load quantized .keras files.",
                            fullname, fullname)
        return spec

    def _imported(self, package: str, then: Callable[[], object]) -> None:
        self._pending.pop(package, None)
        if not self._pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            then()
        except Exception as e:  # pylint: disable=broad-except
            # The user's import of Keras must not fail for qat's class.
            logging.warning("qat: registering the quantized model class with %s failed (%s); "
                            "quantized .keras files will not load in this process.", package, e)
