"""`tensorflow.contrib.training.HParams` for TF1-era model code, in pure Python.

TF-Slim's NASNet and PNASNet (`nets/nasnet/*.py`, imported by the TF models
repository's `nets_factory`), DeepLab and many TF1 projects build their
configurations as `contrib_training.HParams(name=value, ...)` and override them
with `hparams.parse("a=1,b=[2,3]")`. TensorFlow 2 has no such class; this one
behaves as contrib's did for what such code uses: named values read as
attributes, `add_hparam`, `set_hparam` and `parse` with contrib's type rules
(an int may become a float, nothing else changes type), `values()`,
`override_from_dict`, `to_json` / `parse_json`, `get`, `del_hparam`, `in`.
Building from a `HParamDef` protocol buffer (`from_proto`, `hparam_def=`) is not
provided.
"""
import json
import numbers
import re
from typing import Any, Dict, Optional

__all__ = ["HParams"]

# name=value or name[index]=value, one term of a parse() string.
_TERM = re.compile(r"\s*(?P<name>[A-Za-z_]\w*)\s*(\[\s*(?P<index>\d+)\s*\])?\s*=\s*")


def _cast(name: str, kind: type, value: Any) -> Any:
    """Casts `value` to the hyperparameter's type `kind` where contrib allowed it.

    Raises:
        ValueError: A string for a number or the reverse, a bool for a number
            or the reverse, or a float for an int.
    """
    if isinstance(value, kind) or kind is type(None):
        return value
    refused = (
        issubclass(kind, (str, bytes)) != isinstance(value, (str, bytes))
        or issubclass(kind, bool) != isinstance(value, bool)
        or (issubclass(kind, numbers.Integral) and not isinstance(value, numbers.Integral))
        or (issubclass(kind, numbers.Number) and not isinstance(value, numbers.Number)))
    if refused:
        raise ValueError(f"HParams: cannot set hyperparameter {name!r} of type "
                         f"{kind.__name__} to {value!r} ({type(value).__name__})")
    return kind(value)


def _parse_scalar(name: str, kind: type, text: str) -> Any:
    text = text.strip()
    if kind is bool:
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise ValueError(f"HParams.parse: {name}={text!r} is not a bool (true/false/1/0)")
    if kind is str:
        return text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" else text
    try:
        return _cast(name, kind, json.loads(text) if kind is not type(None) else text)
    except json.JSONDecodeError as e:
        raise ValueError(f"HParams.parse: {name}={text!r} is not a {kind.__name__}") from e


def _split_terms(text: str):
    """Yields (name, index or None, value text) for each term of `text`."""
    position = 0
    while position < len(text):
        match = _TERM.match(text, position)
        if match is None:
            raise ValueError(f"HParams.parse: cannot parse {text[position:]!r} in {text!r} "
                             "(expected name=value, comma separated)")
        start = end = match.end()
        depth = 0
        while end < len(text) and (text[end] != "," or depth):
            depth += {"[": 1, "]": -1}.get(text[end], 0)
            end += 1
        index = match.group("index")
        yield match.group("name"), None if index is None else int(index), text[start:end]
        position = end + 1


class HParams:
    """Named hyperparameters with contrib's type rules (`tf.contrib.training.HParams`).

    Each keyword argument becomes an attribute. Its type (or, for a list, its
    elements' type) is fixed: later `set_hparam`, `parse` and
    `override_from_dict` calls convert ints to floats and refuse every other
    change of type.
    """

    _RESERVED = frozenset(
        ["add_hparam", "set_hparam", "del_hparam", "parse", "override_from_dict",
         "set_from_map", "values", "to_json", "parse_json", "get", "set_model_structure",
         "get_model_structure"])

    def __init__(self, hparam_def=None, model_structure=None, **kwargs: Any):
        """Creates the hyperparameters.

        Args:
            hparam_def: contrib's HParamDef protocol buffer; not supported.
            model_structure: any object, returned by `get_model_structure()`.
            **kwargs: the hyperparameters and their initial values.

        Raises:
            NotImplementedError: `hparam_def` was given.
            ValueError: a name is used twice or is one of the methods'.
        """
        if hparam_def is not None:
            raise NotImplementedError(
                "qat.compat's HParams does not read HParamDef protocol buffers "
                "(TensorFlow 2 has no hparam_pb2): pass the values as keyword arguments")
        self._types: Dict[str, type] = {}
        self._lists: Dict[str, bool] = {}
        self._model_structure = model_structure
        for name, value in kwargs.items():
            self.add_hparam(name, value)

    def add_hparam(self, name: str, value: Any) -> None:
        """Adds a hyperparameter; its type is the value's (a list's: its elements').

        Raises:
            ValueError: `name` exists, is reserved, or the list mixes types.
        """
        if name in self._types or hasattr(self, name) or name in self._RESERVED:
            raise ValueError(f"HParams: hyperparameter name {name!r} is already used")
        if isinstance(value, (list, tuple)):
            kinds = {type(v) for v in value}
            if len(kinds) > 1:
                names = sorted(k.__name__ for k in kinds)
                raise ValueError(f"HParams: the list {name!r} mixes types {names}")
            self._types[name] = kinds.pop() if kinds else type(None)
            self._lists[name] = True
        else:
            self._types[name] = type(value)
            self._lists[name] = False
        setattr(self, name, value)

    def set_hparam(self, name: str, value: Any) -> None:
        """Sets an existing hyperparameter, converting as contrib did.

        Raises:
            KeyError: no hyperparameter `name`.
            ValueError: the value's type cannot become the hyperparameter's.
        """
        if name not in self._types:
            raise KeyError(f"HParams: no hyperparameter {name!r}; add_hparam adds one")
        kind = self._types[name]
        if self._lists[name]:
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"HParams: {name!r} is a list; got {value!r}")
            setattr(self, name, [_cast(name, kind, v) for v in value])
        elif isinstance(value, (list, tuple)):
            raise ValueError(f"HParams: {name!r} is not a list; got {value!r}")
        else:
            setattr(self, name, _cast(name, kind, value))

    def del_hparam(self, name: str) -> None:
        """Removes a hyperparameter (nothing happens when there is none)."""
        if name in self._types:
            del self._types[name]
            del self._lists[name]
            delattr(self, name)

    def parse(self, values: str) -> "HParams":
        """Overrides hyperparameters from `"a=1,b=[2,3],c=text,d[0]=4"`.

        Returns:
            self.

        Raises:
            ValueError: unknown names, bad syntax or values of the wrong type.
        """
        updates: Dict[str, Any] = {}
        for name, index, text in _split_terms(values or ""):
            if name not in self._types:
                raise ValueError(f"HParams.parse: unknown hyperparameter {name!r} in {values!r}")
            kind = self._types[name]
            if index is not None:
                if not self._lists[name]:
                    raise ValueError(f"HParams.parse: {name!r} is not a list; cannot set {name}[{index}]")
                target = list(updates.get(name, getattr(self, name)))
                if index >= len(target):
                    raise ValueError(f"HParams.parse: {name}[{index}] is past the list's end")
                target[index] = _parse_scalar(name, kind, text)
                updates[name] = target
            elif self._lists[name]:
                body = text.strip()
                if not (body.startswith("[") and body.endswith("]")):
                    raise ValueError(f"HParams.parse: {name!r} is a list; write {name}=[...]")
                items = [t for t in body[1:-1].split(",") if t.strip()]
                updates[name] = [_parse_scalar(name, kind, t) for t in items]
            else:
                updates[name] = _parse_scalar(name, kind, text)
        return self.override_from_dict(updates)

    def override_from_dict(self, values_dict: Dict[str, Any]) -> "HParams":
        """Sets each `name: value` of the dict with `set_hparam`; returns self."""
        for name, value in values_dict.items():
            self.set_hparam(name, value)
        return self

    set_from_map = override_from_dict

    def set_model_structure(self, model_structure: Any) -> None:
        """Keeps `model_structure` (any object) for `get_model_structure`."""
        self._model_structure = model_structure

    def get_model_structure(self) -> Any:
        """The object given as `model_structure`, or None."""
        return self._model_structure

    def values(self) -> Dict[str, Any]:
        """The hyperparameters as a new dict {name: value}."""
        return {name: getattr(self, name) for name in self._types}

    def get(self, key: str, default: Optional[Any] = None) -> Any:
        """The value of `key`, or `default` when there is no such hyperparameter.

        Raises:
            ValueError: `default` has a type the hyperparameter cannot take.
        """
        if key not in self._types:
            return default
        if default is not None:
            if self._lists[key]:
                [_cast(key, self._types[key], v) for v in default]  # pylint: disable=expression-not-assigned
            else:
                _cast(key, self._types[key], default)
        return getattr(self, key)

    def to_json(self, indent=None, separators=None, sort_keys: bool = False) -> str:
        """The hyperparameters as a JSON object."""
        return json.dumps(self.values(), indent=indent, separators=separators, sort_keys=sort_keys)

    def parse_json(self, values_json: str) -> "HParams":
        """Overrides hyperparameters from a JSON object; returns self."""
        return self.override_from_dict(json.loads(values_json))

    def __contains__(self, key: str) -> bool:
        return key in self._types

    def __str__(self) -> str:
        return str(sorted(self.values().items()))

    def __repr__(self) -> str:
        return f"HParams({self.values()!r})"
