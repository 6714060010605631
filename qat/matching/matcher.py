"""A small pattern language for matching subgraphs of a `tf.Graph`.

A pattern is a tree written from the output op back to its inputs::

    conv = OpTypePattern("Conv2D|DepthwiseConv2dNative", name="layer",
                         inputs=["*", OpTypePattern("ReadVariableOp")])
    bias = OpTypePattern("BiasAdd", name="bias", inputs=[conv, "*"])
    for match in GraphMatcher(bias).match_graph(graph):
        layer_op = match.get_op("layer")

* `OpTypePattern(op_type)`: `op_type` is one type, alternatives `"A|B"` or
  `"*"` (any op). `inputs=None` accepts any inputs; a list must have one
  sub-pattern per data input of the op (the string `"*"` is a shorthand for
  `OpTypePattern("*")`). With `ordered_inputs=False` the inputs may match in
  any order.
* `OneofPattern([p1, p2, ...])`: the first alternative that matches.
* A pattern object used at two places of one tree must bind to the same op
  both times (handy for "this mean is also used there").
* Names: `MatchResult.get_op(name)` / `get_tensor(name)`. Several patterns
  may share a name (alternatives); the bound one answers.

Matching backtracks fully: every alternative and input permutation is tried
until the whole tree matches, so a match is found whenever one exists.

`GraphMatcher.match_graph` indexes the graph's ops by type once and starts only
from ops of the anchor types of the root pattern, so it is linear in the graph
size (times the small pattern size).
"""
import itertools
from typing import (Dict, Iterable, Iterator, List, Optional, Sequence, Tuple,
                    Union)

import tensorflow as tf

from qat.engine import op_index

_ANY = "*"


class Pattern(object):
    """Base class of patterns."""

    def anchor_types(self) -> Optional[List[str]]:
        """Op types a root op can have, or None if any type can match."""
        raise NotImplementedError


class OpTypePattern(Pattern):
    """Matches an op by type and, optionally, its inputs.

    Args:
      op_type: `"Conv2D"`, alternatives `"Add|AddV2"`, or `"*"` for any op.
      name: optional name to look the matched op up with in a `MatchResult`.
      inputs: None (any inputs), or a list of sub-patterns (or `"*"`), one per
        data input of the op.
      ordered_inputs: if False the inputs may match in any order.

    Raises:
      ValueError: if `op_type` is empty.
    """

    def __init__(self,
                 op_type: str,
                 name: Optional[str] = None,
                 inputs: Optional[Sequence[Union["Pattern", str]]] = None,
                 ordered_inputs: bool = True):
        if not op_type:
            raise ValueError("OpTypePattern needs an op type (or '*').")
        self._op_type = op_type
        self._types = None if op_type == _ANY else frozenset(op_type.split("|"))
        self._name = name
        if inputs is not None:
            inputs = [_as_pattern(p) for p in inputs]
        self._inputs = inputs
        self._ordered_inputs = ordered_inputs

    @property
    def op_type(self) -> str:
        return self._op_type

    @property
    def name(self) -> Optional[str]:
        return self._name

    @property
    def inputs(self) -> Optional[List["Pattern"]]:
        return self._inputs

    @property
    def ordered_inputs(self) -> bool:
        return self._ordered_inputs

    def matches_type(self, op: tf.Operation) -> bool:
        return self._types is None or op.type in self._types

    def anchor_types(self) -> Optional[List[str]]:
        return None if self._types is None else sorted(self._types)

    def __repr__(self) -> str:
        return "OpTypePattern(%r, name=%r)" % (self._op_type, self._name)


class OneofPattern(Pattern):
    """Matches if any one of `sub_patterns` matches (tried in order).

    Args:
      sub_patterns: the alternatives.
      name: optional name bound to the op matched by the chosen alternative.

    Raises:
      ValueError: if `sub_patterns` is empty.
    """

    def __init__(self, sub_patterns: Sequence[Union[Pattern, str]],
                 name: Optional[str] = None):
        if not sub_patterns:
            raise ValueError("OneofPattern needs at least one sub-pattern.")
        self._sub_patterns = [_as_pattern(p) for p in sub_patterns]
        self._name = name

    @property
    def sub_patterns(self) -> List[Pattern]:
        return self._sub_patterns

    @property
    def name(self) -> Optional[str]:
        return self._name

    def anchor_types(self) -> Optional[List[str]]:
        types = set()
        for sub in self._sub_patterns:
            sub_types = sub.anchor_types()
            if sub_types is None:
                return None
            types.update(sub_types)
        return sorted(types)

    def __repr__(self) -> str:
        return "OneofPattern(%r, name=%r)" % (self._sub_patterns, self._name)


def _as_pattern(p: Union[Pattern, str]) -> Pattern:
    if isinstance(p, Pattern):
        return p
    if p == _ANY:
        return OpTypePattern(_ANY)
    raise TypeError("Expected a Pattern or '*', got %r." % (p,))


_Binding = Tuple[tf.Operation, Optional[tf.Tensor]]


class MatchResult(object):
    """The ops (and consumed tensors) bound to the patterns of one match."""

    def __init__(self, bindings: Dict[Pattern, _Binding],
                 names: Dict[str, List[Pattern]]):
        self._bindings = bindings
        self._names = names

    def _lookup(self, pattern_or_name) -> Optional[_Binding]:
        if isinstance(pattern_or_name, str):
            if pattern_or_name not in self._names:
                raise ValueError("No pattern named %r in this matcher's pattern."
                                 % pattern_or_name)
            for pattern in self._names[pattern_or_name]:
                if pattern in self._bindings:
                    return self._bindings[pattern]
            return None
        return self._bindings.get(pattern_or_name)

    def get_op(self, pattern_or_name: Union[Pattern, str]) -> Optional[tf.Operation]:
        """Returns the op bound to a pattern (or pattern name), None if unbound.

        Raises:
          ValueError: for a name no pattern of the tree carries.
        """
        found = self._lookup(pattern_or_name)
        return found[0] if found else None

    def get_tensor(self, pattern_or_name: Union[Pattern, str]) -> Optional[tf.Tensor]:
        """Returns the tensor the parent pattern's op consumed from the bound op.

        For the root pattern (no parent) this is the op's only output, or None
        if it has several. Unbound patterns give None.

        Raises:
          ValueError: for a name no pattern of the tree carries.
        """
        found = self._lookup(pattern_or_name)
        return found[1] if found else None

    def bound_ops(self) -> List[tf.Operation]:
        """Every op bound by this match (each once)."""
        seen = []
        for op, _ in self._bindings.values():
            if op not in seen:
                seen.append(op)
        return seen


def _collect_names(pattern: Pattern, names: Dict[str, List[Pattern]]) -> None:
    if pattern.name is not None:
        carriers = names.setdefault(pattern.name, [])
        if pattern in carriers:
            return  # A shared sub-tree: already visited.
        carriers.append(pattern)
    if isinstance(pattern, OneofPattern):
        for sub in pattern.sub_patterns:
            _collect_names(sub, names)
    elif pattern.inputs:
        for sub in pattern.inputs:
            _collect_names(sub, names)


class GraphMatcher(object):
    """Finds the matches of one pattern in graphs.

    Args:
      pattern: the root pattern (its op is the output of the matched subgraph).

    Several patterns may carry the same name (typically the alternatives of a
    `OneofPattern`): the name then looks up whichever of them was bound.
    """

    def __init__(self, pattern: Pattern):
        self._pattern = _as_pattern(pattern)
        self._names = {}  # type: Dict[str, List[Pattern]]
        _collect_names(self._pattern, self._names)

    @property
    def pattern(self) -> Pattern:
        return self._pattern

    def match_op(self, op: tf.Operation) -> Optional[MatchResult]:
        """Returns the match rooted at `op`, or None."""
        tensor = op.outputs[0] if len(op.outputs) == 1 else None
        for bindings in _match(self._pattern, op, tensor, {}):
            return MatchResult(bindings, self._names)
        return None

    def match_ops(self, ops: Iterable[tf.Operation]) -> Iterator[MatchResult]:
        """Yields the match rooted at each op of `ops` that matches."""
        for op in ops:
            result = self.match_op(op)
            if result is not None:
                yield result

    def match_graph(self, graph: tf.Graph) -> Iterator[MatchResult]:
        """Yields every match in `graph`, in graph-creation order of the root op.

        Only ops whose type can anchor the root pattern are tried.
        """
        types = self._pattern.anchor_types()
        ops = (graph.get_operations() if types is None
               else op_index.ops_of_types(graph, types))
        return self.match_ops(ops)


def _match(pattern: Pattern, op: tf.Operation, tensor: Optional[tf.Tensor],
           bindings: Dict[Pattern, _Binding]) -> Iterator[Dict[Pattern, _Binding]]:
    """Yields every extension of `bindings` under which `pattern` matches op."""
    bound = bindings.get(pattern)
    if bound is not None:
        if bound[0] is op:
            yield bindings
        return
    if isinstance(pattern, OneofPattern):
        for sub in pattern.sub_patterns:
            for result in _match(sub, op, tensor, bindings):
                result = dict(result)
                result[pattern] = (op, tensor)
                yield result
        return
    if not pattern.matches_type(op):
        return
    bindings = dict(bindings)
    bindings[pattern] = (op, tensor)
    if pattern.inputs is None:
        yield bindings
        return
    op_inputs = list(op.inputs)
    if len(op_inputs) != len(pattern.inputs):
        return
    if pattern.ordered_inputs:
        orders = [op_inputs]
    else:
        orders = itertools.permutations(op_inputs)
    for order in orders:
        for result in _match_inputs(pattern.inputs, list(order), bindings):
            yield result


def _match_inputs(patterns: List[Pattern], tensors: List[tf.Tensor],
                  bindings: Dict[Pattern, _Binding]) -> Iterator[Dict[Pattern, _Binding]]:
    if not patterns:
        yield bindings
        return
    head, tensor = patterns[0], tensors[0]
    for partial in _match(head, tensor.op, tensor, bindings):
        for result in _match_inputs(patterns[1:], tensors[1:], partial):
            yield result
