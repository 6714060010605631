"""Placeholder and scope naming of the graph editor (part of contrib's `util`).

`qat.graph_editor.util` re-exports every name here, as contrib had them there.
"""
from typing import Optional

import tensorflow as tf

from qat.graph_editor._checks import check_graph_modifiable

_DEFAULT_PLACEHOLDER_PREFIX = "geph"


def scope_finalize(scope: str) -> str:
    """Returns `scope` ending with "/" ("" stays "")."""
    if scope and scope[-1] != "/":
        scope += "/"
    return scope


def scope_dirname(scope: str) -> str:
    """Returns the scope part of a name: "a/b/op" -> "a/b/"."""
    slash = scope.rfind("/")
    if slash == -1:
        return ""
    return scope[:slash + 1]


def scope_basename(scope: str) -> str:
    """Returns the last part of a name: "a/b/op" -> "op"."""
    slash = scope.rfind("/")
    if slash == -1:
        return scope
    return scope[slash + 1:]


def placeholder_name(t: Optional[tf.Tensor] = None, scope: Optional[str] = None,
                     prefix: str = _DEFAULT_PLACEHOLDER_PREFIX) -> str:
    """Returns the name of a placeholder standing for `t`.

    Args:
      t: the tensor (or None for a generic name).
      scope: the scope of the placeholder ("" is the root); the scope of
        `t`'s op when None.
      prefix: the name prefix.

    Returns:
      "<scope>/<prefix>__<op basename>_<output index>", or "<scope><prefix>"
      without `t`. A name already made by this function is returned as is.

    Raises:
      TypeError: if `t` is not None nor a tf.Tensor.
    """
    if scope is not None:
        scope = scope_finalize(scope)
    if t is None:
        return (scope or "") + prefix
    if not isinstance(t, tf.Tensor):
        raise TypeError("Expected a tf.Tensor, got: {}".format(type(t)))
    op_dirname = scope_dirname(t.op.name)
    op_basename = scope_basename(t.op.name)
    if scope is None:
        scope = op_dirname
    if op_basename.startswith("{}__".format(prefix)):
        ph_name = op_basename
    else:
        ph_name = "{}__{}_{}".format(prefix, op_basename, t.value_index)
    return scope + ph_name


def _absolute_placeholder(dtype, shape, name: str) -> tf.Tensor:
    # Names are absolute (like contrib's, relative to the graph root) so a
    # placeholder lands in the scope `placeholder_name` chose.
    graph = tf.compat.v1.get_default_graph()
    check_graph_modifiable(graph, "create a placeholder")
    scope_name = scope_dirname(name)
    base_name = scope_basename(name)
    # No control dependencies: a placeholder must not wait on anything.
    with graph.name_scope(scope_name or None), graph.control_dependencies(None):
        return tf.compat.v1.placeholder(dtype=dtype, shape=shape, name=base_name)


def make_placeholder_from_tensor(t: tf.Tensor, scope: Optional[str] = None,
                                 prefix: str = _DEFAULT_PLACEHOLDER_PREFIX
                                 ) -> tf.Tensor:
    """Creates a placeholder like `t` (dtype and shape) in the default graph.

    Args:
      t: the tensor.
      scope: the placeholder's scope ("" is the root; `t`'s scope when None).
      prefix: the name prefix.

    Returns:
      The placeholder tensor, named by `placeholder_name`.

    Raises:
      TypeError: if `t` is not a tensor.
      ValueError / RuntimeError: if the default graph cannot be modified.
    """
    return _absolute_placeholder(
        t.dtype, t.get_shape(), placeholder_name(t, scope=scope, prefix=prefix))


def make_placeholder_from_dtype_and_shape(dtype, shape=None,
                                          scope: Optional[str] = None,
                                          prefix: str = _DEFAULT_PLACEHOLDER_PREFIX
                                          ) -> tf.Tensor:
    """Creates a placeholder in the default graph named `<scope><prefix>`.

    Args:
      dtype: the placeholder's dtype.
      shape: its shape (unknown when None).
      scope: its scope (root when None).
      prefix: the name prefix.

    Returns:
      The placeholder tensor.

    Raises:
      ValueError / RuntimeError: if the default graph cannot be modified.
    """
    return _absolute_placeholder(
        dtype, shape, placeholder_name(scope=scope, prefix=prefix))
