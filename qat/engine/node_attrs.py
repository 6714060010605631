"""A NodeDef's attributes without TensorFlow's internal ones.

Attributes whose name starts with `_` are TensorFlow's bookkeeping, not part
of what an op computes: `_class` (colocation with other nodes, by name),
`_XlaCompile` and `_XlaScope` (a compilation cluster), `_output_shapes`,
`_read_only_resource_inputs`. A pass that copies an op under a new name, into
another graph or out of a function body drops them (the names they refer to
are gone there); one that compares two ops ignores them. Both use this
module:

* `public_attrs(attrs)`: {name: AttrValue} without the `_` ones;
* `drop_internal_attrs(node)`: deletes them from a NodeDef in place.
"""
from typing import Dict, Mapping

from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import node_def_pb2


def is_internal(name: str) -> bool:
    """Whether the attribute `name` is TensorFlow's bookkeeping (`_class`, ...).

    Args:
      name: an attribute name.

    Returns:
      True for a name starting with `_`.
    """
    return name.startswith("_")


def public_attrs(attrs: Mapping[str, attr_value_pb2.AttrValue]
                 ) -> Dict[str, attr_value_pb2.AttrValue]:
    """The attributes of `attrs` that are not internal (see the module docstring).

    Args:
      attrs: a NodeDef's `attr` map (`op.node_def.attr`, `node.attr`).

    Returns:
      {name: AttrValue} in `attrs`' order, the values not copied.
    """
    return {key: value for key, value in attrs.items() if not is_internal(key)}


def drop_internal_attrs(node: node_def_pb2.NodeDef) -> None:
    """Deletes the internal attributes of `node` (it is modified).

    Args:
      node: a NodeDef, usually a copy about to go into another graph.
    """
    for key in [k for k in node.attr if is_internal(k)]:
        del node.attr[key]
