"""SubGraphView: a view on a subgraph (contrib r1.15 `graph_editor.subgraph`).

A view holds a list of ops and boundary tensors (inputs, outputs and
passthroughs). Remapping a view reorders or selects its boundary tensors
without touching the graph.
"""
import copy
from typing import List, Optional

import tensorflow as tf

from qat.graph_editor import select
from qat.graph_editor import util

__all__ = [
    "SubGraphView",
    "make_view",
    "make_view_from_scope",
]


def _index_of(ts, t) -> int:
    for i, x in enumerate(ts):
        if x is t:
            return i
    raise ValueError("{} not found".format(getattr(t, "name", t)))


def _finalize_indices(list_of_index_or_t, ts) -> List[int]:
    """Converts a list of indices and/or tensors of `ts` into indices."""
    if not util.is_iterable(list_of_index_or_t):
        list_of_index_or_t = [list_of_index_or_t]
    res = []
    for index_or_t in list_of_index_or_t:
        if isinstance(index_or_t, tf.Tensor):
            res.append(_index_of(ts, index_or_t))
        elif isinstance(index_or_t, int) and not isinstance(index_or_t, bool):
            res.append(index_or_t)
        else:
            raise TypeError("Expected an int index or a tf.Tensor, got: {}".format(
                type(index_or_t)))
    return res


def _check_within_range(mapping, n, repetition) -> None:
    for i in mapping:
        if not 0 <= i < n:
            raise ValueError("Index out of [0, {}[ range: {}".format(n, i))
    if not repetition and len(set(mapping)) != len(mapping):
        raise ValueError("Found repetition in mapping: {}".format(mapping))


class SubGraphView(object):
    """A subgraph view on an existing tf.Graph.

    inputs = boundary inputs + passthroughs; outputs = boundary outputs +
    passthroughs. A passthrough is a tensor both input and output of the
    view without going through any of its ops. An empty view is falsy.
    """

    def __init__(self, inside_ops=(), passthrough_ts=()):
        """Creates a view.

        Args:
          inside_ops: an op or an iterable of ops (tensors are not allowed).
          passthrough_ts: a tensor or an iterable of tensors; those already
            at the boundary or inside are silently ignored.

        Raises:
          TypeError: if the arguments cannot be converted to ops/tensors.
          ValueError: if they belong to different graphs.
        """
        inside_ops = util.make_list_of_op(inside_ops)
        passthrough_ts = util.make_list_of_t(passthrough_ts)
        ops_and_ts = inside_ops + passthrough_ts
        if ops_and_ts:
            self._graph = util.get_unique_graph(ops_and_ts)
            self._ops = util.concatenate_unique([], inside_ops)
            inputs, outputs, insides = select.compute_boundary_ts(self._ops)
            all_tensors = set(inputs) | set(outputs) | set(insides)
            self._passthrough_ts = util.concatenate_unique(
                [], [t for t in passthrough_ts if t not in all_tensors])
            self._input_ts = inputs + self._passthrough_ts
            self._output_ts = outputs + self._passthrough_ts
        else:
            self._graph = None
            self._passthrough_ts = []
            self._input_ts = []
            self._output_ts = []
            self._ops = []

    def __copy__(self):
        cls = self.__class__
        result = cls.__new__(cls)
        for k, v in self.__dict__.items():
            setattr(result, k, list(v) if isinstance(v, list) else v)
        return result

    def _assign_from(self, other: "SubGraphView") -> None:
        """Assigns the content of `other` to this view (used in place)."""
        if not isinstance(other, SubGraphView):
            raise TypeError("Expected SubGraphView, got: {}".format(type(other)))
        self._graph = other._graph  # pylint: disable=protected-access
        self._ops = list(other._ops)  # pylint: disable=protected-access
        self._passthrough_ts = list(other._passthrough_ts)  # pylint: disable=protected-access
        self._input_ts = list(other._input_ts)  # pylint: disable=protected-access
        self._output_ts = list(other._output_ts)  # pylint: disable=protected-access

    def copy(self) -> "SubGraphView":
        """Returns a copy of this view (the graph is not copied)."""
        return copy.copy(self)

    def _remap_default(self, remove_input_map=True, remove_output_map=True) -> None:
        if not remove_input_map and not remove_output_map:
            return
        inputs, outputs, _ = select.compute_boundary_ts(self._ops)
        if remove_input_map:
            self._input_ts = list(inputs) + self._passthrough_ts
        if remove_output_map:
            self._output_ts = list(outputs) + self._passthrough_ts

    def remap_default(self, remove_input_map=True, remove_output_map=True) -> "SubGraphView":
        """Returns a copy with the default (boundary) inputs and/or outputs."""
        res = self.copy()
        res._remap_default(remove_input_map, remove_output_map)  # pylint: disable=protected-access
        return res

    def _remap_inputs(self, new_input_indices) -> None:
        new_input_indices = _finalize_indices(new_input_indices, self._input_ts)
        _check_within_range(new_input_indices, len(self._input_ts), repetition=False)
        self._input_ts = [self._input_ts[i] for i in new_input_indices]

    def _remap_outputs(self, new_output_indices) -> None:
        new_output_indices = _finalize_indices(new_output_indices, self._output_ts)
        _check_within_range(new_output_indices, len(self._output_ts), repetition=True)
        self._output_ts = [self._output_ts[i] for i in new_output_indices]

    def _remap_outputs_make_unique(self) -> None:
        self._output_ts = util.concatenate_unique([], self._output_ts)

    def _remap_outputs_to_consumers(self) -> None:
        self._remap_outputs_make_unique()
        output_ts = self._output_ts
        self._output_ts = []
        for t in output_ts:
            self._output_ts += [t] * len(t.consumers())

    def remap_outputs_make_unique(self) -> "SubGraphView":
        """Returns a copy whose outputs are unique (first occurrence kept)."""
        res = self.copy()
        res._remap_outputs_make_unique()  # pylint: disable=protected-access
        return res

    def remap_outputs_to_consumers(self) -> "SubGraphView":
        """Returns a copy with each output repeated once per consumer."""
        res = self.copy()
        res._remap_outputs_to_consumers()  # pylint: disable=protected-access
        return res

    def _remove_unused_ops(self, control_inputs=True) -> None:
        ops = set(select.get_walks_union_ops(
            self.connected_inputs, self.connected_outputs,
            within_ops=self._ops, control_inputs=control_inputs))
        self._ops = [op for op in self._ops if op in ops]

    def remove_unused_ops(self, control_inputs=True) -> "SubGraphView":
        """Returns a copy without the ops not connected to its inputs/outputs.

        Args:
          control_inputs: also follow control inputs backward.
        """
        res = self.copy()
        res._remove_unused_ops(control_inputs)  # pylint: disable=protected-access
        return res

    def remap_inputs(self, new_input_indices) -> "SubGraphView":
        """Returns a copy whose inputs are `[inputs[i] for i in indices]`.

        Args:
          new_input_indices: ints and/or input tensors; no repetition.

        Raises:
          ValueError: on an index out of range or a repeated index.
        """
        res = self.copy()
        res._remap_inputs(new_input_indices)  # pylint: disable=protected-access
        return res

    def remap_outputs(self, new_output_indices) -> "SubGraphView":
        """Returns a copy whose outputs are `[outputs[i] for i in indices]`.

        Args:
          new_output_indices: ints and/or output tensors; repetition allowed.

        Raises:
          ValueError: on an index out of range.
        """
        res = self.copy()
        res._remap_outputs(new_output_indices)  # pylint: disable=protected-access
        return res

    def remap(self, new_input_indices=None, new_output_indices=None) -> "SubGraphView":
        """Returns a copy with remapped inputs and/or outputs (None: unchanged)."""
        res = self.copy()
        if new_input_indices is not None:
            res._remap_inputs(new_input_indices)  # pylint: disable=protected-access
        if new_output_indices is not None:
            res._remap_outputs(new_output_indices)  # pylint: disable=protected-access
        return res

    def find_op_by_name(self, op_name: str) -> tf.Operation:
        """Returns the op of the view named `op_name`.

        Raises:
          ValueError: if the view has no such op.
        """
        res = [op for op in self._ops if op.name == op_name]
        if not res:
            raise ValueError("{} not in subgraph.".format(op_name))
        return res[0]

    def __str__(self):
        if not self:
            return "SubGraphView: empty"

        def op_name(op):
            return op.name

        passthroughs = set(self._passthrough_ts)

        def tensor_name(t):
            if t in passthroughs:
                return "{} *".format(t.name)
            return t.name

        lines = ["** ops[{}]:".format(len(self._ops))]
        lines += ["  " + op_name(op) for op in self._ops]
        lines.append("** inputs[{}]:".format(len(self._input_ts)))
        lines += ["  " + tensor_name(t) for t in self._input_ts]
        lines.append("** outputs[{}]:".format(len(self._output_ts)))
        lines += ["  " + tensor_name(t) for t in self._output_ts]
        return "\n".join(lines)

    def __repr__(self):
        return "<SubGraphView ops={} inputs={} outputs={}>".format(
            len(self._ops), len(self._input_ts), len(self._output_ts))

    @property
    def graph(self) -> Optional[tf.Graph]:
        """The graph of the view (None when empty)."""
        return self._graph

    @property
    def ops(self) -> util.ListView:
        """The ops of the view."""
        return util.ListView(self._ops)

    @property
    def inputs(self) -> util.ListView:
        """The input tensors (boundary inputs then passthroughs)."""
        return util.ListView(self._input_ts)

    @property
    def connected_inputs(self) -> List[tf.Tensor]:
        """The inputs that are not passthroughs."""
        passthroughs = set(self._passthrough_ts)
        return [t for t in self._input_ts if t not in passthroughs]

    @property
    def outputs(self) -> util.ListView:
        """The output tensors (boundary outputs then passthroughs)."""
        return util.ListView(self._output_ts)

    @property
    def connected_outputs(self) -> List[tf.Tensor]:
        """The outputs that are not passthroughs."""
        passthroughs = set(self._passthrough_ts)
        return [t for t in self._output_ts if t not in passthroughs]

    @property
    def passthroughs(self) -> util.ListView:
        """The passthrough tensors."""
        return util.ListView(self._passthrough_ts)

    def __bool__(self):
        return self._graph is not None

    def op(self, op_id: int) -> tf.Operation:
        """Returns the op number `op_id` of the view."""
        return self._ops[op_id]

    def is_passthrough(self, t: tf.Tensor) -> bool:
        """Returns True if `t` is a passthrough of the view."""
        return any(t is x for x in self._passthrough_ts)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        pass

    def input_index(self, t: tf.Tensor) -> int:
        """Returns the index of `t` in the inputs (ValueError if absent)."""
        try:
            return _index_of(self._input_ts, t)
        except ValueError:
            raise ValueError("Can't find {} in the inputs of the subgraph.".format(
                getattr(t, "name", t))) from None

    def output_index(self, t: tf.Tensor) -> int:
        """Returns the index of `t` in the outputs (ValueError if absent)."""
        try:
            return _index_of(self._output_ts, t)
        except ValueError:
            raise ValueError("Can't find {} in the outputs of the subgraph.".format(
                getattr(t, "name", t))) from None

    def consumers(self) -> List[tf.Operation]:
        """Returns the ops outside the view consuming its outputs, unique."""
        ops_set = set(self._ops)
        res = []
        seen = set()
        for output in self._output_ts:
            for op in output.consumers():
                if op not in ops_set and op not in seen:
                    seen.add(op)
                    res.append(op)
        return res


def _check_graph(sgv: SubGraphView, graph: Optional[tf.Graph]) -> SubGraphView:
    if not isinstance(sgv, SubGraphView):
        raise TypeError("Expected a SubGraphView, got: {}".format(type(sgv)))
    if graph is None or not sgv:
        return sgv
    if not isinstance(graph, tf.Graph):
        raise TypeError("Expected a tf.Graph, got: {}".format(type(graph)))
    if sgv.graph is not graph:
        raise ValueError("The subgraph view does not belong to the given graph.")
    return sgv


def make_view(*args, **kwargs) -> SubGraphView:
    """Creates a SubGraphView from selected ops and passthrough tensors.

    Args:
      *args: a SubGraphView (returned as is), or anything `select_ops_and_ts`
        accepts: ops, tensors, iterables of them, regexes (with graph=).
        Tensors become passthroughs.
      **kwargs: graph and the keywords of `select_ops_and_ts`.

    Returns:
      The view.

    Raises:
      TypeError / ValueError: as `select_ops_and_ts`, or if a given view does
        not belong to graph.
    """
    graph = kwargs.get("graph")
    if len(args) == 1 and isinstance(args[0], SubGraphView):
        return _check_graph(args[0], graph)
    ops, ts = select.select_ops_and_ts(*args, **kwargs)
    return _check_graph(SubGraphView(ops, ts), graph)


def make_view_from_scope(scope: str, graph: tf.Graph) -> SubGraphView:
    """Returns a view of the ops of `graph` under the name scope `scope`."""
    ops = select.get_name_scope_ops(graph, scope)
    return SubGraphView(ops)
