"""Container helpers of the graph editor (re-exported by `util`).

Unique concatenation, read-only list views and tree (nested structure)
helpers.
"""
import collections
from collections import abc as collections_abc
from typing import Any, Callable, Iterable, Optional

import tensorflow as tf


def concatenate_unique(la: list, lb: Iterable) -> list:
    """Adds the items of `lb` not in `la` to the end of `la`, in place.

    Args:
      la: the list to extend.
      lb: the items to add.

    Returns:
      `la`.
    """
    la_set = set(la)
    for item in lb:
        if item not in la_set:
            la.append(item)
            la_set.add(item)
    return la


_GRAPH_TYPES = (tf.Tensor, tf.Operation, tf.Variable)


def _same(a, b) -> bool:
    # Graph objects compare by identity (Tensor.__eq__ may build an op).
    if a is b:
        return True
    if isinstance(a, _GRAPH_TYPES) or isinstance(b, _GRAPH_TYPES):
        return False
    return a == b


class ListView(object):
    """A read-only view of a list (item assignment raises TypeError)."""

    def __init__(self, list_: list):
        if not isinstance(list_, list):
            raise TypeError("Expected a list, got: {}.".format(type(list_)))
        self._list = list_

    def __iter__(self):
        return iter(self._list)

    def __len__(self):
        return len(self._list)

    def __bool__(self):
        return bool(self._list)

    def __getitem__(self, i):
        return self._list[i]

    def __contains__(self, item):
        return any(_same(item, x) for x in self._list)

    def __eq__(self, other):
        if not isinstance(other, (list, tuple, ListView)):
            return NotImplemented
        return len(self) == len(other) and all(
            _same(a, b) for a, b in zip(self._list, other))

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None

    def __add__(self, other):
        if not isinstance(other, list):
            other = list(other)
        return list(self) + other

    def __radd__(self, other):
        return list(other) + list(self)

    def index(self, item) -> int:
        for i, x in enumerate(self._list):
            if _same(x, item):
                return i
        raise ValueError("{} is not in the list".format(item))

    def __repr__(self):
        return "ListView({!r})".format(self._list)


def is_iterable(obj: Any) -> bool:
    """Returns True if `obj` is iterable; a `tf.Tensor` is not."""
    if isinstance(obj, (tf.Tensor, tf.Operation)):
        return False
    try:
        _ = iter(obj)
    except Exception:  # pylint: disable=broad-except
        return False
    return True


def _is_leaf(obj) -> bool:
    return isinstance(obj, (str, bytes)) or not is_iterable(obj)


def flatten_tree(tree: Any, leaves: Optional[list] = None) -> list:
    """Flattens a tree of dicts and iterables into a list of leaves.

    Dict values are visited in the dict's order; strings are leaves.

    Args:
      tree: the tree.
      leaves: a list to append the leaves to (a new one when None).

    Returns:
      The list of leaves.
    """
    if leaves is None:
        leaves = []
    if isinstance(tree, dict):
        for child in tree.values():
            flatten_tree(child, leaves)
    elif _is_leaf(tree):
        leaves.append(tree)
    else:
        for child in tree:
            flatten_tree(child, leaves)
    return leaves


def transform_tree(tree: Any, fn: Callable[[Any], Any], iterable_type=tuple) -> Any:
    """Applies `fn` to the leaves of a tree, keeping its structure.

    dict (and subclasses such as OrderedDict), namedtuple, tuple and list keep
    their type; other iterables (e.g. sets) become `iterable_type`.

    Args:
      tree: the tree.
      fn: the function applied to each leaf.
      iterable_type: the type built for iterables that are not dict, tuple or
        a sequence.

    Returns:
      A tree of the same structure with the transformed leaves.
    """
    if _is_leaf(tree):
        return fn(tree)
    if isinstance(tree, dict):
        items = [(k, transform_tree(v, fn, iterable_type)) for k, v in tree.items()]
        if isinstance(tree, collections.defaultdict):
            res = collections.defaultdict(tree.default_factory)
            res.update(items)
            return res
        return type(tree)(items)
    if isinstance(tree, tuple):
        children = [transform_tree(c, fn, iterable_type) for c in tree]
        if hasattr(tree, "_fields"):  # namedtuple
            return type(tree)(*children)
        return type(tree)(children)
    if isinstance(tree, collections_abc.Sequence):
        return type(tree)(transform_tree(c, fn, iterable_type) for c in tree)
    return iterable_type(transform_tree(c, fn, iterable_type) for c in tree)
