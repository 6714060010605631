"""What a `Transformer` finishes once every op is copied (helpers of transform.py).

`finalize_cycles`: the copies of control-flow-v1 loop back edges, which read
temporary placeholders while the loop was copied, read the copied tensors.
`remap_colocations`: the copies' colocation attributes (`_class: loc:@op`)
name the copies of the ops they named, are kept when they name an op outside
the copy in the same graph, and are dropped when that op does not exist in the
destination graph.
"""
from tensorflow.core.framework import attr_value_pb2


def finalize_cycles(info) -> None:
    """Connects the copies of loop back edges, read from temporary placeholders."""
    for t, tmp_t_, consumer_op in info.tmp_cyclic_ts:
        if t not in info.transformed_ts:
            raise ValueError("The tensor {} should be transformed by now.".format(t.name))
        if consumer_op not in info.transformed_ops:
            raise ValueError("The op {} should be transformed by now.".format(
                consumer_op.name))
        t_ = info.transformed_ts[t]
        consumer_op_ = info.transformed_ops[consumer_op]
        for index, input_ in enumerate(consumer_op_.inputs):
            if input_ is tmp_t_:
                consumer_op_._update_input(index, t_)  # pylint: disable=protected-access


def remap_colocations(info) -> None:
    """Points the copies' `_class: loc:@op` attributes at the copied ops."""
    ops_by_name = None
    for op, op_ in info.transformed_ops.items():
        try:
            groups = op_.get_attr("_class")
        except ValueError:
            continue
        if ops_by_name is None:
            ops_by_name = {o.name: o for o in info.ops}
        groups_ = []
        for group in groups:
            group = group.decode() if isinstance(group, bytes) else group
            if not group.startswith("loc:@"):
                groups_.append(group)
                continue
            target = ops_by_name.get(group[len("loc:@"):])
            if target is not None and target in info.transformed_ops:
                groups_.append("loc:@" + info.transformed_ops[target].name)
            elif info.graph is info.graph_:
                groups_.append(group)
        # pylint: disable=protected-access
        if groups_:
            op_._set_attr("_class", attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue(
                    s=[g.encode() for g in groups_])))
        else:
            op_._clear_attr("_class")
        # pylint: enable=protected-access
