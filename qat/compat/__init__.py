"""`tensorflow.contrib` imports for TF1 scripts, and tf-slim on TensorFlow 2.21.

TF 1.x scripts import the libraries qat replaces from `tensorflow.contrib`:

    from tensorflow.contrib import quantize as contrib_quantize
    import tensorflow.contrib.graph_editor as ge
    from tensorflow.contrib import slim
    tf.contrib.quantize.create_training_graph(quant_delay=2000)

After one opt-in call, `qat.compat.install()`, these resolve to qat
(`qat.create_training_graph`, ..., `qat.graph_editor`) and to tf_slim, and the
pure-Python parts of `training` (`HParams`, qat.compat.hparams, and tf_slim's
training functions), `framework` (tf_slim's arg scopes and variable functions)
and `layers` (tf_slim's layers, initializers and regularizers) are provided.
Any other `tensorflow.contrib.<name>` raises an ImportError (AttributeError for
`tf.contrib.<name>`) that says so, and so does a name those three lack.
`install()` also gives back what TF1 scripts had from TF1 and NumPy 1
(qat.compat.tf1): graph mode with ref variables and TF1 control flow, NumPy's
removed aliases (`np.int`, ...) and `Operation._outputs`.

`enable_slim()` makes tf-slim 1.1.0 work on TF 2.21: TensorFlow's
`tensorflow.python.layers.normalization` (which `slim.batch_norm` uses) loads
`tf_keras.legacy_tf_layers`, which tf_keras 2.21 keeps at
`tf_keras.src.legacy_tf_layers`; the old names are registered as aliases.
tf-slim also reads names TensorFlow has since moved out of the internal
modules it imports (`ops.Tensor`, `control_flow_ops.cond`, ...): each missing
one is added back, pointing at its current home (nothing TensorFlow has is
replaced).
"""
import dis
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Callable, Optional, Sequence

from absl import logging
import tensorflow as tf

import qat
from qat.compat import hparams as compat_hparams
from qat.compat import tf1 as compat_tf1
from qat import graph_editor

__all__ = ["install", "uninstall", "installed", "enable_slim", "legacy_keras_enabled"]

CONTRIB = "tensorflow.contrib"
# The tensorflow.contrib modules qat.compat provides, and what they map to.
PROVIDED = ("quantize", "graph_editor", "slim", "training", "framework", "layers")

_LEGACY_LAYERS = "tf_keras.legacy_tf_layers"
_LEGACY_LAYERS_SRC = "tf_keras.src.legacy_tf_layers"
_LEGACY_LAYERS_MODULES = ("base", "convolutional", "core", "migration_utils",
                          "normalization", "pooling", "variable_scope_shim")
_LEGACY_KERAS_VALUES = ("true", "True", "1")
_QUANTIZE_FUNCTIONS = ("create_training_graph", "create_eval_graph",
                       "experimental_create_training_graph",
                       "experimental_create_eval_graph")
# Where a provided module's submodules come from.
_TARGETS = {f"{CONTRIB}.graph_editor": "qat.graph_editor",
            f"{CONTRIB}.slim": "tf_slim"}


def _not_provided(name: str) -> str:
    return (f"{name} is not available: TensorFlow 2 has no tf.contrib, and "
            f"qat.compat provides only tensorflow.contrib.quantize, "
            f"tensorflow.contrib.graph_editor, tensorflow.contrib.slim "
            f"(tf_slim) and the pure-Python parts of tensorflow.contrib."
            f"{{training,framework,layers}} (see docs/coming_from_contrib.md).")


# tensorflow.contrib modules qat builds from parts: name -> the tf_slim modules
# whose __all__ it takes (the homes of contrib's code since TF 2). Their other
# names are refused.
_PARTS = {
    "training": ("tf_slim.training.training", "tf_slim.training.evaluation"),
    "framework": ("tf_slim.ops.arg_scope", "tf_slim.ops.variables"),
    "layers": tuple(f"tf_slim.layers.{m}" for m in (
        "layers", "initializers", "regularizers", "normalization", "optimizers",
        "summaries", "rev_block_lib", "bucketization_op")),
}


class _PartialModule(types.ModuleType):
    """A contrib module qat provides in part; a missing name says so."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        message = _not_provided(f"{self.__name__}.{name}")
        if not legacy_keras_enabled():
            message += (" Its tf_slim names need TF_USE_LEGACY_KERAS=1 set before "
                        "tensorflow is imported.")
        if _called_by_import_from():
            # `from <module> import <name>`: Python would replace an
            # AttributeError by a generic "cannot import name".
            raise ImportError(message, name=self.__name__)
        raise AttributeError(message)


def _called_by_import_from() -> bool:
    """Whether the frame that asked for an attribute is running IMPORT_FROM."""
    try:
        caller = sys._getframe(2)  # pylint: disable=protected-access
        return caller.f_code.co_code[caller.f_lasti] == dis.opmap["IMPORT_FROM"]
    except (AttributeError, IndexError, KeyError, ValueError):
        return False


def _build_partial(name: str) -> types.ModuleType:
    module = _PartialModule(f"{CONTRIB}.{name}", f"tf.contrib.{name} as far as qat.compat "
                            "provides it (pure Python; see docs/coming_from_contrib.md).")
    names = []
    if legacy_keras_enabled() or name != "training":  # HParams alone needs no tf_keras.
        enable_slim()  # Raises, saying what to set, without TF_USE_LEGACY_KERAS=1.
        for source in _PARTS[name]:
            part = importlib.import_module(source)
            for attr in getattr(part, "__all__", ()):
                setattr(module, attr, getattr(part, attr))
                names.append(attr)
    if name == "training":
        module.HParams = compat_hparams.HParams
        names.append("HParams")
    module.__all__ = sorted(set(names))
    module.__path__ = []  # A package: `import <module>.python...` reaches the finder, which refuses it.
    return module


def legacy_keras_enabled() -> bool:
    """Whether TensorFlow routes `tf.compat.v1.layers` to tf_keras.

    True when TF_USE_LEGACY_KERAS is set now and was set when tensorflow was
    imported (TensorFlow reads it then).

    Returns:
        Whether tf.compat.v1.layers and tf.compat.v1.keras are tf_keras's.
    """
    now = os.environ.get("TF_USE_LEGACY_KERAS") in _LEGACY_KERAS_VALUES
    at_import = getattr(sys.modules.get("tensorflow"), "_tf_uses_legacy_keras", now)
    return now and bool(at_import)


def enable_slim() -> None:
    """Makes tf-slim 1.1.0 (`import tf_slim`) work on TensorFlow 2.21.

    Registers `tf_keras.legacy_tf_layers` and its modules as aliases of
    `tf_keras.src.legacy_tf_layers` in sys.modules (`slim.batch_norm` loads
    them), and adds back the names tf_slim reads from TensorFlow's internal
    modules where TensorFlow has moved them (`ops.Tensor`, ...; existing
    names are never replaced). Idempotent.

    Raises:
        RuntimeError: TF_USE_LEGACY_KERAS=1 was not set before tensorflow was
            imported (tf.compat.v1.layers, which TF1 scripts and slim models
            use beside slim, would be Keras 3's and fail).
    """
    if not legacy_keras_enabled():
        raise RuntimeError(
            "qat.compat: tf-slim and tf.compat.v1.layers need tf_keras: set the "
            "environment variable TF_USE_LEGACY_KERAS=1 before tensorflow is "
            "imported, e.g. `TF_USE_LEGACY_KERAS=1 python train.py`, or "
            "`import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'` as the "
            "script's first lines (now: TF_USE_LEGACY_KERAS="
            f"{os.environ.get('TF_USE_LEGACY_KERAS')!r}).")
    _restore_moved_names()
    if _LEGACY_LAYERS in sys.modules:
        return
    sys.modules[_LEGACY_LAYERS] = importlib.import_module(_LEGACY_LAYERS_SRC)
    for name in _LEGACY_LAYERS_MODULES:
        sys.modules[f"{_LEGACY_LAYERS}.{name}"] = importlib.import_module(
            f"{_LEGACY_LAYERS_SRC}.{name}")
    logging.vlog(1, "qat.compat: %s -> %s", _LEGACY_LAYERS, _LEGACY_LAYERS_SRC)


# (module, name, where TensorFlow 2.21 keeps it): names tf_slim 1.1.0 reads
# from TensorFlow's internal modules that TensorFlow has since moved.
_MOVED_NAMES = (
    ("tensorflow.python.framework.ops", "Tensor",
     "tensorflow.python.framework.tensor"),
    ("tensorflow.python.framework.ops", "IndexedSlices",
     "tensorflow.python.framework.indexed_slices"),
    ("tensorflow.python.ops.array_ops", "stack",
     "tensorflow.python.ops.array_ops_stack"),
    ("tensorflow.python.ops.array_ops", "unstack",
     "tensorflow.python.ops.array_ops_stack"),
    ("tensorflow.python.ops.control_flow_ops", "Assert",
     "tensorflow.python.ops.control_flow_assert"),
    ("tensorflow.python.ops.control_flow_ops", "case",
     "tensorflow.python.ops.control_flow_case"),
    ("tensorflow.python.ops.control_flow_ops", "cond",
     "tensorflow.python.ops.cond"),
    ("tensorflow.python.ops.control_flow_ops", "while_loop",
     "tensorflow.python.ops.while_loop"),
    ("tensorflow.python.ops.variable_scope", "variable",
     "tensorflow.python.ops.variable_v1:VariableV1"),
)


def _restore_moved_names() -> None:
    """Adds back each of _MOVED_NAMES that its old module lacks."""
    for module_name, name, new_home in _MOVED_NAMES:
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            continue
        home, _, new_name = new_home.partition(":")
        setattr(module, name, getattr(importlib.import_module(home), new_name or name))
        logging.vlog(1, "qat.compat: %s.%s -> %s", module_name, name, new_home)


class _ContribModule(types.ModuleType):
    """`tensorflow.contrib`: quantize, graph_editor and slim; nothing else."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("slim",) + tuple(_PARTS):  # Loaded on first use: enable_slim may refuse.
            return importlib.import_module(f"{CONTRIB}.{name}")
        raise AttributeError(_not_provided(f"tf.contrib.{name}"))

    def __dir__(self) -> Sequence[str]:
        return sorted(set(super().__dir__()) | set(PROVIDED))


def _quantize_module() -> types.ModuleType:
    module = types.ModuleType(f"{CONTRIB}.quantize", (
        "tf.contrib.quantize, provided by qat (qat.create_training_graph, ...)."))
    for name in _QUANTIZE_FUNCTIONS:
        setattr(module, name, getattr(qat, name))
    module.__all__ = list(_QUANTIZE_FUNCTIONS)
    return module


_MODULE_ATTRS = ("__name__", "__loader__", "__package__", "__spec__", "__path__",
                 "__file__", "__cached__")


class _AliasLoader(importlib.abc.Loader):
    """Gives an existing module under a second name, leaving it unchanged."""

    def __init__(self, target: str, setup=None):
        self._target = target
        self._setup = setup
        self._saved = {}

    def create_module(self, spec):
        if self._setup is not None:
            self._setup()
        module = importlib.import_module(self._target)
        # The import system writes the alias's spec into the module; the
        # module keeps its own.
        self._saved = {k: module.__dict__[k] for k in _MODULE_ATTRS
                       if k in module.__dict__}
        return module

    def exec_module(self, module):
        for key in _MODULE_ATTRS:
            if key in self._saved:
                module.__dict__[key] = self._saved[key]
            else:
                module.__dict__.pop(key, None)


class _BuiltLoader(importlib.abc.Loader):
    """Gives a module qat builds (`_build_partial`)."""

    def __init__(self, build: Callable[[], types.ModuleType]):
        self._build = build

    def create_module(self, spec):
        return self._build()

    def exec_module(self, module):
        pass


class _ContribFinder(importlib.abc.MetaPathFinder):
    """Finds the submodules of the provided modules; refuses other contrib names."""

    def find_spec(self, fullname: str, path=None, target=None):
        if not fullname.startswith(CONTRIB + "."):
            return None
        short = fullname[len(CONTRIB) + 1:]
        if short in _PARTS:
            return importlib.machinery.ModuleSpec(
                fullname, _BuiltLoader(lambda: _build_partial(short)), is_package=True)
        for alias, real in _TARGETS.items():
            if fullname == alias or fullname.startswith(alias + "."):
                real_name = real + fullname[len(alias):]
                setup = enable_slim if real == "tf_slim" else None
                if setup is None and importlib.util.find_spec(real_name) is None:
                    raise ModuleNotFoundError(
                        f"No module named {fullname!r} ({real_name!r} does not "
                        f"exist)", name=fullname)
                return importlib.machinery.ModuleSpec(
                    fullname, _AliasLoader(real_name, setup),
                    is_package=True)
        # ImportError, not ModuleNotFoundError, which `from tensorflow.contrib
        # import <name>` would swallow for a vaguer message.
        raise ImportError(_not_provided(fullname), name=fullname)


_finder: Optional[_ContribFinder] = None
_tf2_state: Optional[compat_tf1.Tf2State] = None


def _tf_modules():
    """The module objects a script may reach `contrib` through."""
    return [tf, tf.compat.v1]


def install(graph_mode: bool = True, numpy_aliases: bool = True) -> None:
    """Gives TF1 scripts `tensorflow.contrib` (as far as qat can) and TF1's defaults.

    After it, `from tensorflow.contrib import quantize`,
    `import tensorflow.contrib.graph_editor as ge`,
    `from tensorflow.contrib import slim` and the attributes
    `tf.contrib.quantize` / `tf.compat.v1.contrib.quantize` work, and so do the
    pure-Python parts of `tensorflow.contrib.training` (`HParams`, tf_slim's
    training functions), `.framework` and `.layers`. Also calls
    `enable_slim()` when TF_USE_LEGACY_KERAS=1 was set (otherwise slim's
    first use raises enable_slim's error), gives `tf.Operation` TF1's
    `_outputs`, and, by default, TF1's graph mode and NumPy's removed
    aliases (qat.compat.tf1). Idempotent.

    Args:
        graph_mode: TF1's defaults for `tf.compat.v1` code: eager execution
            off, ref variables from `tf.compat.v1.get_variable`, TF1 control
            flow outside `tf.function` (`qat.compat.tf1.enable_tf1_graph_mode`).
            `uninstall()` restores the previous settings.
        numpy_aliases: bind `np.int`, `np.float`, `np.object`, `np.float_`
            and the other names NumPy 1.24 and 2.0 removed to what they
            meant (`qat.compat.tf1.NUMPY_ALIASES`; names NumPy has are kept).
    """
    global _finder, _tf2_state
    if legacy_keras_enabled():
        enable_slim()
    if graph_mode and _tf2_state is None:
        _tf2_state = compat_tf1.enable_tf1_graph_mode()
    if numpy_aliases:
        compat_tf1.add_numpy_aliases()
    compat_tf1.add_operation_outputs()
    if _finder is None:
        _finder = _ContribFinder()
        sys.meta_path.insert(0, _finder)
    contrib = sys.modules.get(CONTRIB)
    if not isinstance(contrib, _ContribModule):
        contrib = _ContribModule(CONTRIB, "tf.contrib as provided by qat.compat: "
                                 "quantize, graph_editor, slim and parts of "
                                 "training, framework and layers.")
        contrib.__path__ = []  # A package: its submodules go through the finder.
        contrib.quantize = _quantize_module()
        contrib.graph_editor = graph_editor
        sys.modules[CONTRIB] = contrib
        sys.modules[f"{CONTRIB}.quantize"] = contrib.quantize
        sys.modules[f"{CONTRIB}.graph_editor"] = graph_editor
    for module in _tf_modules():
        setattr(module, "contrib", contrib)
    logging.info("qat.compat: tensorflow.contrib.{quantize,graph_editor,slim} "
                 "resolve to qat and tf_slim%s", "; TF1 graph mode" if _tf2_state else "")


def uninstall() -> None:
    """Undoes `install()` (the slim aliases stay: they only add names).

    Eager execution, resource variables and TF 2 control flow come back as
    they were before `install()`; NumPy's aliases and `Operation._outputs`
    go.
    """
    global _finder, _tf2_state
    if _finder is not None:
        sys.meta_path.remove(_finder)
        _finder = None
    if _tf2_state is not None:
        compat_tf1.restore_tf2_behavior(_tf2_state)
        _tf2_state = None
    compat_tf1.remove_numpy_aliases()
    compat_tf1.remove_operation_outputs()
    for name in [n for n in sys.modules if n == CONTRIB or n.startswith(CONTRIB + ".")]:
        del sys.modules[name]
    for module in _tf_modules():
        if "contrib" in vars(module) or hasattr(module, "contrib"):
            try:
                delattr(module, "contrib")
            except AttributeError:
                pass


def installed() -> bool:
    """Whether `install()` is in effect."""
    return _finder is not None
