"""Copying and transforming subgraphs (contrib r1.15 `graph_editor.transform`).

A `Transformer` copies the ops of a subgraph view into a destination graph and
scope, one op at a time in creation order, through replaceable handlers. The
result is a new subgraph view and a `TransformerInfo` mapping original ops and
tensors to their copies. `copy`, `copy_with_input_replacements` and
`graph_replace` are the usual entry points.

Differences from TF 1 forced by TF 2.21 (documented behaviour):
  * Ops are built with `tf.Operation.from_node_def` (C API); node attributes,
    devices and shapes are the source op's.
  * Control-flow-v1 loops: the copied `Enter` ops get a new, unique
    `frame_name` (two loops sharing a frame name in one graph would be run as
    one frame by the executor).
  * Resource ops whose `shared_name` is their own op name (the graph-mode
    default for `VarHandleOp`) get the copy's name as `shared_name`, so a copied
    variable is a new variable, as a copied TF 1 `VariableV2` was.
  * Colocation attributes (`_class: loc:@op`) are remapped to the copies of the
    ops they name, kept when they name an op outside the copy in the same graph
    and dropped when that op does not exist in the destination graph.
  * Control-flow-v1 contexts (`WhileContext`, `CondContext`) of loops and
    conds copied whole are rebuilt for the copies, so `tf.gradients` works
    on them; `graph_replace` always copies whole loops and conds. A partial
    copy of a loop (with `copy`) runs only if its inputs from the loop are
    view inputs; its copies have no context.
  * Control-flow-v2 functional ops (`If`, `While`, ...) are copied as single
    ops; the functions they call are added to the destination graph's library.
    Their branches/bodies are not edited (they are not part of the view).
  * Variable objects in collections (`tf.compat.v1.global_variables()` ...) whose
    variable op, initializer and snapshot were all copied are rebuilt in the
    destination graph, so the copies can be initialized and saved as usual.
"""
import logging
from typing import Dict, List, Optional

import tensorflow as tf
from tensorflow.python.framework import func_graph as _func_graph
from tensorflow.python.ops import variables as _variables

from qat.graph_editor import reroute
from qat.graph_editor import select
from qat.graph_editor import subgraph
from qat.graph_editor import util
from qat.graph_editor import _transform_control_flow
from qat.graph_editor import _transform_finish
from qat.graph_editor import _transform_variables
from qat.graph_editor._transform_handlers import _TmpInfo
from qat.graph_editor._transform_handlers import assign_renamed_collections_handler
from qat.graph_editor._transform_handlers import copy_op_handler
from qat.graph_editor._transform_handlers import keep_t_if_possible_handler
from qat.graph_editor._transform_handlers import replace_t_with_placeholder_handler
from qat.graph_editor._transform_handlers import transform_op_if_inside_handler
from qat.graph_editor._transform_handlers import TransformerInfo

__all__ = [
    "replace_t_with_placeholder_handler",
    "keep_t_if_possible_handler",
    "assign_renamed_collections_handler",
    "transform_op_if_inside_handler",
    "copy_op_handler",
    "Transformer",
    "TransformerInfo",
    "copy",
    "copy_with_input_replacements",
    "graph_replace",
]


def _check_not_func_graph(obj) -> None:
    """Raises a clear error for ops or tensors of a FuncGraph (before hashing them)."""
    if isinstance(obj, subgraph.SubGraphView):
        graphs = [obj.graph]
    elif isinstance(obj, tf.Graph):
        graphs = [obj]
    elif isinstance(obj, (tf.Operation, tf.Tensor)):
        graphs = [obj.graph]
    elif isinstance(obj, (str, bytes)) or not util.is_iterable(obj):
        graphs = []
    else:
        graphs = [item.graph for item in util.flatten_tree(list(obj))
                  if isinstance(item, (tf.Operation, tf.Tensor))]
    for graph in graphs:
        if isinstance(graph, _func_graph.FuncGraph):
            raise ValueError(
                "Cannot transform ops of FuncGraph {!r}: the graph editor works on "
                "tf.Graph graphs built in graph mode (tf.compat.v1), not on the body "
                "of a tf.function.".format(graph.name))


def _make_view(sgv):
    _check_not_func_graph(sgv)
    return subgraph.make_view(sgv)


class Transformer(object):
    """Copies a subgraph view into a graph, through replaceable handlers.

    Handlers (attributes, replace them to customize the transformation):
      transform_op_handler(info, op, new_inputs) -> (op_, outputs_):
        builds the copy of an op (default: `copy_op_handler`).
      transform_control_input_handler(info, op) -> op_ or None.
      transform_external_input_handler(info, t) -> t_: view inputs (default:
        `replace_t_with_placeholder_handler`).
      transform_external_hidden_input_handler(info, t) -> t_: inputs of the
        view's ops that are not view inputs (default: `keep_t_if_possible_handler`).
      transform_original_op_handler(info, op) -> op_ or None.
      assign_collections_handler(info, elem, elem_): collections of the copies.
    """

    def __init__(self):
        self.transform_control_input_handler = transform_op_if_inside_handler
        self.transform_external_input_handler = replace_t_with_placeholder_handler
        self.transform_external_hidden_input_handler = keep_t_if_possible_handler
        self.transform_op_handler = copy_op_handler
        self.transform_original_op_handler = transform_op_if_inside_handler
        self.assign_collections_handler = assign_renamed_collections_handler

    def __call__(self, sgv, dst_graph: tf.Graph, dst_scope: str, src_scope: str = "",
                 reuse_dst_scope: bool = False):
        """Transforms (copies) the subgraph view `sgv` into `dst_graph`.

        Args:
          sgv: anything `subgraph.make_view` accepts.
          dst_graph: the destination graph.
          dst_scope: the destination scope; made unique unless
            `reuse_dst_scope`.
          src_scope: the source scope; every op of the view must be under it.
          reuse_dst_scope: use `dst_scope` as is even if it already exists.

        Returns:
          A tuple (the transformed SubGraphView, a TransformerInfo).

        Raises:
          TypeError: if `dst_graph` is not a tf.Graph.
          ValueError: if an op is outside `src_scope`, a graph is a FuncGraph,
            a handler transforms an op in place, or TensorFlow refuses a copy.
          RuntimeError: if `dst_graph` is finalized.
        """
        sgv = _make_view(sgv)
        if not isinstance(dst_graph, tf.Graph):
            raise TypeError("Expected a tf.Graph, got: {}".format(type(dst_graph)))
        util.check_graph_modifiable(dst_graph, "copy ops into the destination graph")
        src_scope = util.scope_finalize(src_scope)
        dst_scope = util.scope_finalize(dst_scope)
        # Validate before creating anything, so bad input leaves graphs unchanged.
        for op in sgv.ops:
            if not op.name.startswith(src_scope):
                raise ValueError("Op {!r} does not belong to source scope {!r}; pass "
                                 "a src_scope that contains every op of the view."
                                 .format(op.name, src_scope))
        if self.transform_external_input_handler is replace_t_with_placeholder_handler:
            _transform_variables.check_no_ref_input_slots(sgv)
        if dst_scope and not reuse_dst_scope:
            dst_scope = util.scope_finalize(dst_graph.unique_name(dst_scope[:-1]))

        info = _TmpInfo(sgv, dst_graph, dst_scope, src_scope)
        if info.graph is not None and info.graph is not dst_graph and \
                info.graph._functions:  # pylint: disable=protected-access
            _transform_control_flow.copy_functions(info.graph, dst_graph, sgv.ops)
        self._copy_ops(info)
        self._finalize_cycles(info)
        self._connect_control_inputs(info)
        self._remap_colocations(info)
        _transform_control_flow.restore_control_flow_contexts(info)
        self._copy_variables(info)
        res_info = TransformerInfo(info)
        sgv_ = self._transform_sgv(info, sgv)
        return sgv_, res_info

    def _copy_ops(self, info: _TmpInfo) -> None:
        for op in sorted(info.sgv.ops, key=lambda op: op._id):  # pylint: disable=protected-access
            new_inputs = [self._transformed_t(info, t, op) for t in op.inputs]
            op_, op_outputs_ = self.transform_op_handler(info, op, new_inputs)
            if op is op_:
                raise ValueError("In-place transformation not allowed (op {!r}): the "
                                 "op handler must build a new op.".format(op.name))
            info.transformed_ops[op] = op_
            self.assign_collections_handler(info, op, op_)
            for op_output, op_output_ in zip(op.outputs, op_outputs_):
                info.transformed_ts[op_output] = op_output_
                self.assign_collections_handler(info, op_output, op_output_)

    def _finalize_cycles(self, info: _TmpInfo) -> None:
        _transform_finish.finalize_cycles(info)

    def _connect_control_inputs(self, info: _TmpInfo) -> None:
        for op in info.sgv.ops:
            op_ = info.transformed_ops[op]
            # pylint: disable=protected-access
            if op._original_op is not None:
                original_op = self.transform_original_op_handler(info, op._original_op)
                if original_op is None:
                    logging.debug("Could not find original op for: %s", op_.name)
                op_._original_op = original_op
            # pylint: enable=protected-access
            control_inputs_ = [self.transform_control_input_handler(info, ci)
                               for ci in op.control_inputs]
            control_inputs_ = [ci for ci in control_inputs_ if ci is not None]
            control_inputs_ = list({id(ci): ci for ci in control_inputs_}.values())
            if control_inputs_:
                reroute.add_control_inputs(op_, control_inputs_)

    def _remap_colocations(self, info: _TmpInfo) -> None:
        """Points the copies' `_class: loc:@op` attributes at the copied ops."""
        _transform_finish.remap_colocations(info)

    def _copy_variables(self, info: _TmpInfo) -> None:
        """Rebuilds the variable objects of the source collections that were copied."""
        done = set()
        for items in info.collections.values():
            for var in items:
                if id(var) in done or not isinstance(var, _variables.Variable):
                    continue
                done.add(id(var))
                try:
                    var_op = var.op
                except (AttributeError, ValueError):
                    continue
                if var_op not in info.transformed_ops:
                    continue
                var_ = _transform_variables.transform_variable(info, var)
                if var_ is None:
                    logging.debug("Variable %s copied without its initializer or "
                                  "snapshot: no variable object built.", var.name)
                    continue
                self.assign_collections_handler(info, var, var_)

    def _transform_sgv(self, info: _TmpInfo, sgv):
        ops_ = list(info.transformed_ops.values())
        sgv_ = subgraph.SubGraphView(ops_)
        sgv_inputs_ = frozenset(sgv_.inputs)
        sgv_outputs_ = frozenset(sgv_.outputs)
        input_map_ = []
        for input_t in sgv.inputs:
            input_t_ = info.transformed_ts.get(input_t)
            if input_t_ is None or input_t_ not in sgv_inputs_:
                continue
            input_map_.append(sgv_.input_index(input_t_))
        output_map_ = []
        for output_t in sgv.outputs:
            output_t_ = info.transformed_ts.get(output_t)
            if output_t_ is None or output_t_ not in sgv_outputs_:
                continue
            output_map_.append(sgv_.output_index(output_t_))
        return sgv_.remap(input_map_, output_map_)

    def _transformed_t(self, info: _TmpInfo, t: tf.Tensor, consumer_op: tf.Operation):
        if t in info.sgv_inputs_set:
            # One transformed tensor (e.g. one placeholder) per view input.
            if t not in info.transformed_ts:
                info.transformed_ts[t] = self.transform_external_input_handler(info, t)
            return info.transformed_ts[t]
        if t.op in info.ops:
            if t in info.transformed_ts:
                return info.transformed_ts[t]
            # Not copied yet: a control-flow-v1 loop back edge.
            with info.graph_.as_default():
                t_ = util.make_placeholder_from_tensor(t, scope=info.scope_, prefix="geph_tmp")
            info.tmp_cyclic_ts.append((t, t_, consumer_op))
            return t_
        return self.transform_external_hidden_input_handler(info, t)


def _check_dst_graph(sgv, dst_graph):
    if dst_graph is None:
        dst_graph = sgv.graph
    if dst_graph is None:
        dst_graph = tf.compat.v1.get_default_graph()
    if not isinstance(dst_graph, tf.Graph):
        raise TypeError("Expected a tf.Graph, got: {}".format(type(dst_graph)))
    return dst_graph


def copy(sgv, dst_graph: Optional[tf.Graph] = None, dst_scope: str = "",
         src_scope: str = "", reuse_dst_scope: bool = False):
    """Copies a subgraph; its inputs become placeholders.

    Args:
      sgv: the source subgraph view (anything `subgraph.make_view` accepts).
      dst_graph: the destination graph (the source graph when None).
      dst_scope: the destination scope.
      src_scope: the source scope.
      reuse_dst_scope: use `dst_scope` as is even if it already exists.

    Returns:
      A tuple (the copied SubGraphView, a TransformerInfo).

    Raises:
      TypeError: if `dst_graph` is not a tf.Graph.
      ValueError / RuntimeError: see `Transformer.__call__`.
    """
    sgv = _make_view(sgv)
    dst_graph = _check_dst_graph(sgv, dst_graph)
    return Transformer()(sgv, dst_graph, dst_scope, src_scope,
                         reuse_dst_scope=reuse_dst_scope)


def copy_with_input_replacements(sgv, replacement_ts: Dict[tf.Tensor, tf.Tensor],
                                 dst_graph: Optional[tf.Graph] = None, dst_scope: str = "",
                                 src_scope: str = "", reuse_dst_scope: bool = False):
    """Copies a subgraph, replacing some of its inputs.

    Args:
      sgv: the source subgraph view (anything `subgraph.make_view` accepts).
      replacement_ts: dict from original tensors to their replacements; view
        inputs not in it are kept when the copy stays in the same graph and
        become placeholders otherwise.
      dst_graph: the destination graph (the source graph when None).
      dst_scope: the destination scope.
      src_scope: the source scope.
      reuse_dst_scope: use `dst_scope` as is even if it already exists.

    Returns:
      A tuple (the copied SubGraphView, a TransformerInfo).

    Raises:
      TypeError: if `dst_graph` is not a tf.Graph or `replacement_ts` not a dict.
      ValueError / RuntimeError: see `Transformer.__call__`.
    """
    sgv = _make_view(sgv)
    dst_graph = _check_dst_graph(sgv, dst_graph)
    if not isinstance(replacement_ts, dict):
        raise TypeError("replacement_ts must be a dict from tensors to tensors, got: "
                        "{}".format(type(replacement_ts)))
    for t, t_ in replacement_ts.items():
        if not isinstance(t, tf.Tensor) or not isinstance(t_, tf.Tensor):
            raise TypeError("replacement_ts must map tf.Tensor to tf.Tensor, got: "
                            "{!r} -> {!r}".format(t, t_))
        if t_.graph is not dst_graph:
            raise ValueError("Replacement {} of {} is not in the destination graph."
                             .format(t_.name, t.name))

    def replace_t_with_replacement_handler(info, t):
        if t in replacement_ts:
            return replacement_ts[t]
        return keep_t_if_possible_handler(info, t)

    copier = Transformer()
    copier.transform_external_input_handler = replace_t_with_replacement_handler
    return copier(sgv, dst_graph, dst_scope, src_scope, reuse_dst_scope=reuse_dst_scope)


def graph_replace(target_ts, replacement_ts: Dict[tf.Tensor, tf.Tensor], dst_scope: str = "",
                  src_scope: str = "", reuse_dst_scope: bool = False):
    """Creates a copy of the graph computing `target_ts` from `replacement_ts`.

    The ops between the replaced tensors and the targets are copied (in the
    same graph) with the replaced tensors substituted; the originals are left
    untouched.

    Args:
      target_ts: a tensor or a nested structure (list, tuple, namedtuple,
        dict, OrderedDict) of tensors to compute.
      replacement_ts: dict from original tensors to their replacements.
      dst_scope: the destination scope.
      src_scope: the source scope.
      reuse_dst_scope: use `dst_scope` as is even if it already exists.

    Returns:
      `target_ts`' structure holding the copies of the targets (targets that
      the replacements do not reach are returned unchanged).

    Raises:
      ValueError: if the targets and the replacements are not connected, or
        they are in different graphs.
    """
    flatten_target_ts = util.flatten_tree(target_ts)
    graph = util.get_unique_graph(flatten_target_ts, check_types=(tf.Tensor,))
    util.check_graph_modifiable(graph, "replace tensors of")
    control_ios = util.ControlOutputs(graph)
    ops = select.get_walks_intersection_ops(
        list(replacement_ts.keys()), flatten_target_ts, control_ios=control_ios)
    if not ops:
        raise ValueError("Targets and replacements are not connected!")
    _transform_control_flow.add_control_flow_ops(ops, control_ios)
    _, info = copy_with_input_replacements(
        ops, replacement_ts, None, dst_scope, src_scope, reuse_dst_scope)
    return info.transformed(target_ts, missing_fn=lambda original_t: original_t)
