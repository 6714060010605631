"""Variables and reference tensors in the graph editor's Transformer.

* `transform_variable`: rebuilds the `tf.Variable` object (resource or TF 1
  ref variable) of a copied variable from its `VariableDef`, with every name
  mapped to the copies, so copied variables can be initialized and saved.
* `check_no_ref_input_slots`: placeholders cannot feed reference inputs
  (`Assign` of a TF 1 variable); fail before the graph is changed.
"""
import tensorflow as tf
from tensorflow.python.ops import ref_variable
from tensorflow.python.ops import resource_variable_ops

from qat.graph_editor import util


def check_no_ref_input_slots(sgv) -> None:
    """Placeholders cannot feed reference inputs (TF 1 variables): fail early."""
    ops = frozenset(sgv.ops)
    for t in sgv.inputs:
        if not t.dtype._is_ref_dtype:  # pylint: disable=protected-access
            continue
        for op in t.consumers():
            if op not in ops:
                continue
            for index, input_ in enumerate(op.inputs):
                if input_ is t and util.input_slot_is_ref(op, index):
                    raise ValueError(
                        "View input {} is a reference (a TF 1 variable) that op {!r} ({}) "
                        "assigns to; a placeholder cannot replace it. Add the variable "
                        "to the view, or keep it with copy_with_input_replacements."
                        .format(t.name, op.name, op.type))


def transform_variable(info, var):
    """Builds the variable object of a copied variable, or None if incomplete."""
    with info.graph.as_default():
        proto = var.to_proto()
    if proto is None:
        return None
    graph, ts, ops = info.graph, info.transformed_ts, info.transformed_ops

    def transformed_name(name):
        if not name:
            return name
        elem = graph.as_graph_element(name)
        elem_ = ts.get(elem) if isinstance(elem, tf.Tensor) else ops.get(elem)
        if elem_ is None:
            raise KeyError(name)
        return elem_.name

    try:
        proto.variable_name = transformed_name(proto.variable_name)
        proto.initializer_name = transformed_name(proto.initializer_name)
        proto.snapshot_name = transformed_name(proto.snapshot_name)
        proto.initial_value_name = transformed_name(proto.initial_value_name)
    except KeyError:
        return None
    if proto.HasField("save_slice_info_def"):
        proto.ClearField("save_slice_info_def")
    with info.graph_.as_default():
        if proto.is_resource:
            return resource_variable_ops.ResourceVariable(variable_def=proto)
        return ref_variable.RefVariable(variable_def=proto)

