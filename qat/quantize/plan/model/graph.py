"""What the quantize planner reads off a graph (no decisions, no edits).

`GraphView` finds the layer ops, the gradient ops (never quantized), the
model sources (`qat.quantize.plan.model.feeds`) and the data path (ops downstream
of the sources, embedding lookups and layers), and the consumers a quantizer of
a tensor must feed. It holds the model/loss boundary (`model`, `loss`,
`after_model`) that `qat.quantize.plan.model.boundary` decides (called once,
by `qat.quantize.plan.model.layout`, which also walks the layers' tails).
Module functions recognise quantizers an earlier pass built.
"""
import heapq
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf

from qat.engine import function_library
from qat.engine import marks
from qat.engine import op_index
from qat.matching import frames
from qat.matching import layer_patterns
from qat.matching import tensors
from qat.matching.matcher import GraphMatcher, MatchResult
from qat.matching.tensors import forward_closure
from qat.quantize.plan.model import feeds
from qat.quantize.plan.model import lookups
from qat.quantize.plan.ops import patterns as qp
from qat.quantize.plan.model import tails


def context(op: tf.Operation) -> str:
    """The op's name scope ("" at the root)."""
    return op.name.rsplit("/", 1)[0] if "/" in op.name else ""


def own_context(op: tf.Operation) -> str:
    """The op's scope, or its own name for ops at the root."""
    return context(op) or op.name


def join(ctx: str, kind: str) -> str:
    return ctx + "/" + kind if ctx else kind


is_float = tails.is_float  # Data FakeQuant can quantize (a batch norm's output 0 only).


# Op types a prepare pass replaces and leaves unconnected, though they still
# read the graph's tensors: a loop it unrolled (a While, a TF1 loop's Enter
# ops), a call it inlined. Their reads are none of the model's.
REPLACEABLE_TYPES = function_library.CALL_TYPES | frames.FRAME_TYPES

# FakeQuant ops qat did not build (contrib's, hand-made): reused as ranges.
USER_FAKE_QUANT_TYPES = tensors.FAKE_QUANT_TYPES | {"FakeQuantWithMinMaxArgs"}


def existing_quantizer(t: tf.Tensor):
    """Finds the quantizer on `t`: qat's own (by its mark) or a user's FakeQuant.

    Returns:
      (output tensor consumers read, set of quantizer ops reading `t`), or
      (None, empty set) when `t` has no quantizer.
    """
    out = marks.quantizer_of(t)
    if out is not None:
        internal = {c for c in t.consumers()
                    if marks.made_by_qat(c, marks.QUANTIZER, marks.QUANTIZER_OUTPUT)}
        return out, internal
    for c in t.consumers():
        if c.type in USER_FAKE_QUANT_TYPES and c.inputs[0] is t:
            return c.outputs[0], {c}
    return None, set()


def is_quantized_output(t: tf.Tensor) -> bool:
    """True if `t` is the output of a quantizer (qat's, or a user's FakeQuant)."""
    return (marks.made_by_qat(t.op, marks.QUANTIZER_OUTPUT)
            or t.op.type in USER_FAKE_QUANT_TYPES)


_UNFUSED_BATCH_NORM_MATCHER = GraphMatcher(layer_patterns.UNFUSED_BATCH_NORM)


def _unfused_batch_norms(ops, gradient_ops) -> Dict[tf.Operation, MatchResult]:
    """Batch norms written as arithmetic: final add -> its match
    (`layer_patterns.UNFUSED_BATCH_NORM`)."""
    found = {}
    for op in ops:
        if op.type in ("Add", "AddV2") and op not in gradient_ops:
            match = _UNFUSED_BATCH_NORM_MATCHER.match_op(op)
            if match is not None:
                found[op] = match
    return found


class GraphView(object):
    """Layers, gradient ops, data path and consumers of one graph."""

    def __init__(self, graph: tf.Graph):
        self.graph = graph
        ops = graph.get_operations()
        self.ops = ops
        # tf.gradients builds each gradient function under its forward op
        # (recorded as `_original_op`); imported graphs lose that, so gradient
        # kernels (ReluGrad, Conv2DBackpropFilter, ...) are seeds as well.
        kernels = set(op_index.ops_of_types(graph, [
            t for t in op_index.op_types(graph) if qp.is_gradient_kernel_type(t)]))
        self.gradient_ops = forward_closure(
            [op for op in ops if getattr(op, "_original_op", None) is not None
             or op in kernels])
        layers = layer_patterns.layer_ops(graph)
        layers += op_index.ops_of_types(graph, qp.TRANSPOSED_CONV_TYPES)
        # Ops a rewrite replaced (a loop it unrolled): no reader of theirs computes.
        self.replaced = {op for op in op_index.ops_of_types(graph, REPLACEABLE_TYPES)
                         if marks.is_replaced(op)}
        self.gradient_layers = [op for op in layers if op in self.gradient_ops]
        self.layers = sorted((op for op in layers if op not in self.gradient_ops),
                             key=lambda o: o._id)  # pylint: disable=protected-access
        # Integer inputs enter through embedding lookups and casts.
        # Only gathers and casts can be entries.
        entry_candidates = op_index.ops_of_types(
            graph, lookups.GATHER_TYPES | lookups.RESOURCE_GATHER_TYPES | {"Cast"})
        self.entries = {op: table for op, table in lookups.entry_ops(entry_candidates).items()
                        if op not in self.gradient_ops and (
                            table is not None or self._reaches_layer(op))}
        # Batch norms are model ops wherever they are (one that follows no
        # layer gets a range of its own, `standalone_batch_norm`).
        self.batch_norms = [op for op in op_index.ops_of_types(graph, qp.BATCH_NORM_TYPES)
                            if op not in self.gradient_ops]
        self.params = feeds.Parameters()
        # Matched once here; the planner's structures read them too.
        self.unfused_batch_norm_matches = _unfused_batch_norms(
            op_index.ops_of_types(graph, ("Add", "AddV2")), self.gradient_ops)
        self._find_sources()
        self.model_ops = self._ancestors(self.layers + self.batch_norms)
        # Set by `find_boundary` (the planner, once the layers' tails are known).
        self.model: Set[tf.Operation] = set(self.model_ops)
        self.loss: Set[tf.Operation] = set()
        self.after_model: Set[tf.Operation] = set()
        # Summaries, prints, asserts, metric updates (`qat.quantize.plan.model.observers`).
        self.observers: Set[tf.Operation] = set()
        self.library = None
        self._topological: Optional[Dict[tf.Operation, int]] = None
        self._ordered: Optional[List[tf.Operation]] = None
        self._update_only = {}  # op -> feeds_only_state_updates(op)

    def _find_sources(self) -> None:
        """The model sources (`qat.quantize.plan.model.feeds`) and the data path.

        Sets `sources` (tensors), `data_ops` (the ops computing from the
        layers, the entries and the sources) and, for a source op whose
        other outputs are not data (an iterator's labels), which are.
        """
        self.sources: Set[tf.Tensor] = set()
        self._data_outputs: Dict[tf.Operation, Set[int]] = {}
        seeds = list(self.layers) + list(self.entries) + self.batch_norms
        while True:
            readers = [c for t in self.sources for c in t.consumers()]
            closure = forward_closure(seeds + readers) - self.gradient_ops
            self._data_outputs = {}
            for t in self.sources:
                if t.op not in closure:
                    self._data_outputs.setdefault(t.op, set()).add(t.value_index)
            self.data_ops = closure | set(self._data_outputs)
            found = set()
            inputs = ([qp.data_input(layer) for layer in self.layers]
                      + [bn.inputs[0] for bn in self.batch_norms])
            for x in inputs:
                if tensors.is_float(x) and not self.is_data(x):
                    found.add(feeds.walk_to_source(x, self.params, self._carried_input))
            # Other operands only once the layers' inputs are data: a batch
            # norm's statistics read the tensor it normalises, found first.
            late = found <= self.sources
            source_ops = {t.op for t in self.sources}
            for op in self._ancestors(self.layers + self.batch_norms) if late else ():
                if (op in source_ops or op in self.layers or op in self.batch_norms
                        or self._carried_input(op) is not None):
                    continue
                for t in feeds.value_operands(op, 0, self.params):
                    if self.is_data(t) or t.shape.rank == 0:
                        continue
                    s = feeds.walk_to_source(t, self.params, self._carried_input)
                    if not feeds.is_random(s.op):
                        found.add(s)
            if found <= self.sources:
                return
            self.sources |= found

    def _carried_input(self, op: tf.Operation) -> Optional[tf.Tensor]:
        """The one value `op` carries on (dropout, a batch norm written as
        arithmetic, whose statistics read that value too), else None."""
        match = self.unfused_batch_norm_matches.get(op)
        return match.get_tensor("bn_input") if match is not None else feeds.dropout_input(op)

    def is_source(self, t: tf.Tensor) -> bool:
        """Whether `t` is where model data enters (`qat.quantize.plan.model.feeds`)."""
        return t in self.sources

    def _reaches_layer(self, op: tf.Operation) -> bool:
        reached = forward_closure([op]) - self.gradient_ops
        return any(layer in reached for layer in self.layers)

    def _ancestors(self, ops) -> Set[tf.Operation]:
        """Data ops some layer reads, directly or not (the model proper)."""
        seen = set(ops)
        stack = list(ops)
        while stack:
            op = stack.pop()
            for i in op.inputs:
                if self.is_data(i) and i.op not in seen:
                    seen.add(i.op)
                    stack.append(i.op)
        return seen

    def ordered_ops(self) -> List[tf.Operation]:
        """The data ops in graph order, except that an op comes after the data
        ops it reads (a rewrite made them after their readers: a loop it
        unrolled); graph order is creation order, already topological
        otherwise. A cycle (a TF1 loop's, unrolled and left unconnected) is
        broken in graph order."""
        if self._ordered is None:
            ops = self.data_ops
            pending = {op: sum(1 for i in op.inputs if i.op in ops and i.op is not op)
                       for op in ops}
            readers: Dict[tf.Operation, List[tf.Operation]] = {}
            for op in ops:
                for i in op.inputs:
                    if i.op in ops and i.op is not op:
                        readers.setdefault(i.op, []).append(op)
            key = lambda o: o._id  # pylint: disable=protected-access
            ready = [(key(op), op) for op, n in pending.items() if n == 0]
            heapq.heapify(ready)
            remaining = sorted(ops, key=key)
            done: Set[tf.Operation] = set()
            order: List[tf.Operation] = []
            while len(order) < len(ops):
                if not ready:  # A cycle: its first op in graph order.
                    first = next(op for op in remaining if op not in done)
                    heapq.heappush(ready, (key(first), first))
                _, op = heapq.heappop(ready)
                if op in done:
                    continue
                done.add(op)
                order.append(op)
                for reader in readers.get(op, ()):
                    pending[reader] -= 1
                    if pending[reader] == 0 and reader not in done:
                        heapq.heappush(ready, (key(reader), reader))
            self._ordered = order
        return self._ordered

    def topological_index(self) -> Dict[tf.Operation, int]:
        """Each data op's position in `ordered_ops`."""
        if self._topological is None:
            self._topological = {op: k for k, op in enumerate(self.ordered_ops())}
        return self._topological

    def function_library(self):
        """{function name: FunctionDef} of the graph (If branches)."""
        if self.library is None:
            self.library = function_library.library_of(self.graph)
        return self.library

    def is_data(self, t: tf.Tensor) -> bool:
        """Whether `t` is computed from the model's sources, layers or entries."""
        if t.op not in self.data_ops:
            return False
        outputs = self._data_outputs.get(t.op)
        return outputs is None or t.value_index in outputs

    def feeds_only_state_updates(self, op: tf.Operation) -> bool:
        """Whether everything `op` computes ends in variable updates only.

        The arithmetic of a moving average (Keras 3's `moving_mean * m +
        batch_mean * (1 - m)` before its AssignVariableOp): not model data.
        """
        memo = self._update_only

        def only_updates(o, depth=0):
            if o not in memo:
                memo[o] = False  # Cycles and deep chains: not only updates.
                readers = [c for out in o.outputs for c in out.consumers()
                           if c not in self.gradient_ops]
                memo[o] = bool(readers) and depth < 16 and all(
                    qp.is_state_update(c) or only_updates(c, depth + 1) for c in readers)
            return memo[o]
        return only_updates(op)

    def consumers(self, t: tf.Tensor, exclude=()) -> List[tf.Operation]:
        """Consumers a quantizer of `t` reroutes (also via an old quantizer)."""
        out, internal = existing_quantizer(t)
        found = [c for c in t.consumers() if c not in internal]
        if out is not None:
            found.extend(out.consumers())
        result = []
        for c in found:
            if (c in exclude or c in self.gradient_ops or c in result
                    or qp.is_state_update(c)):
                continue
            result.append(c)
        return result

    def readers(self, t: tf.Tensor, exclude=()) -> List[tf.Operation]:
        """Consumers that compute with the value (not Shape & co, nor an op a
        rewrite replaced: those still read their inputs, quantized as every
        consumer, but compute nothing)."""
        return [c for c in self.consumers(t, exclude)
                if c.type not in qp.METADATA_TYPES and c not in self.replaced]
