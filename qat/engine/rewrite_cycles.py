"""A rewrite must not make a cycle: its new edges are checked before it is applied.

TensorFlow runs no graph with a cycle ("Graph is invalid, contains a cycle"),
but builds one: `_update_input` and `_add_control_inputs` check nothing, so a
rule whose new op reads a tensor computed from the op it feeds (a range
statistic of a later tensor, a control dependency on an op downstream)
produces a graph that fails only when a session runs it. The graph before a
rewrite has no cycle but the back edges of TF1 while loops (NextIteration
into Merge, which TensorFlow allows), so a cycle after it passes through an
edge the rewrite adds: into an op it reroutes or gives control inputs. The
search starts at those ops and at the new ones, and walks only what they
reach in the rewritten graph.
"""
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from qat.engine import op_index

# An op of the graph, or a node of the rewrite's batch by name.
Node = Union[tf.Operation, str]

# Loop back edges TensorFlow allows: a NextIteration's output into a Merge.
_NEXT_ITERATION = frozenset(["NextIteration", "RefNextIteration"])
_MERGE = frozenset(["Merge", "RefMerge"])


def _name(ref: str) -> str:
    """The node a NodeDef input (`name`, `name:<i>`, `^name`) names."""
    return ref.lstrip("^").partition(":")[0]


class _RewrittenGraph(object):
    """The successors of each node as the rewrite will leave the graph."""

    def __init__(self, nodes: Sequence[node_def_pb2.NodeDef], externals: Dict[str, tf.Tensor],
                 reroutes: Sequence[Tuple[tf.Operation, int, tf.Tensor, Union[str, tf.Tensor]]],
                 control: Sequence[Tuple[tf.Operation, Sequence[str]]]):
        stand_ins = {_name(ref): t.op for ref, t in externals.items()}
        self.batch = [node.name for node in nodes]
        self.out: Dict[Node, List[Node]] = {name: [] for name in self.batch}
        out = self.out
        names: Dict[str, Node] = {}  # input reference -> the node it names
        for node, name in zip(nodes, self.batch):
            for ref in node.input:
                source = names.get(ref)
                if source is None:
                    base = _name(ref)
                    source = names[ref] = stand_ins.get(base, base)
                if source in out:
                    out[source].append(name)
                else:
                    out[source] = [name]
        moved: Set[Tuple[tf.Operation, int]] = set()
        for consumer, index, _, new in reroutes:
            moved.add((consumer, index))
            source = _name(new) if isinstance(new, str) else new.op
            self.out.setdefault(source, []).append(consumer)
        for op, names in control:
            for name in names:
                self.out.setdefault(name, []).append(op)
        # Data edges the reroutes take away: every input of the consumer that
        # read the old op's outputs now reads a new tensor.
        # {old op: the consumers whose edges from it go}.
        self.removed: Dict[tf.Operation, Set[tf.Operation]] = {}
        for consumer, _, old, _ in reroutes:
            if all((consumer, i) in moved for i, t in enumerate(consumer.inputs)
                   if t.op is old.op):
                self.removed.setdefault(old.op, set()).add(consumer)
        self.targets = [r[0] for r in reroutes] + [op for op, _ in control]
        # Loop back edges from the graph's index of op types, not from the
        # type of each op walked (a call into TensorFlow each).
        ops = [t.op for t in externals.values()] + self.targets
        graph = ops[0].graph if ops else None
        self._loops_back: Set[tf.Operation] = (
            set(op_index.ops_of_types(graph, _NEXT_ITERATION)) if graph is not None else set())
        self._merges: Set[tf.Operation] = (
            set(op_index.ops_of_types(graph, _MERGE)) if self._loops_back else set())

    def successors(self, node: Node) -> Iterable[Node]:
        if isinstance(node, str):
            return self.out[node]
        found = list(self.out.get(node, ()))
        removed = self.removed.get(node)
        if removed is None and node not in self._loops_back:
            for t in node.outputs:
                found.extend(t.consumers())
        else:
            removed = removed or ()
            merges = self._merges if node in self._loops_back else ()
            for t in node.outputs:
                for consumer in t.consumers():
                    if consumer not in removed and consumer not in merges:
                        found.append(consumer)
        found.extend(node._control_outputs)  # pylint: disable=protected-access
        return found


def find_cycle(nodes: Sequence[node_def_pb2.NodeDef], externals: Dict[str, tf.Tensor],
               reroutes: Sequence[Tuple[tf.Operation, int, tf.Tensor, Union[str, tf.Tensor]]],
               control: Sequence[Tuple[tf.Operation, Sequence[str]]]) -> Optional[List[str]]:
    """A cycle the rewrite would make, or None.

    Args:
      nodes: the batch's NodeDefs (inputs name batch nodes or stand-ins).
      externals: {stand-in input name: the graph's tensor it stands for}.
      reroutes: (consumer, input index, old tensor, new tensor: a batch node
        reference or a tensor of the graph).
      control: (op of the graph, names of batch nodes it will run after).

    Returns:
      The names of the ops and new nodes along one cycle, in order, or None.
    """
    rewritten = _RewrittenGraph(nodes, externals, reroutes, control)
    state: Dict[Node, int] = {}  # 1: on the current path, 2: done.
    for root in list(dict.fromkeys(rewritten.targets)) + rewritten.batch:
        if root in state:
            continue
        path: List[Node] = [root]
        pending = [iter(rewritten.successors(root))]
        state[root] = 1
        while pending:
            nxt = next(pending[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                pending.pop()
            elif state.get(nxt) == 1:
                cycle = path[path.index(nxt):]
                # Told from an op of the graph on (the op the rewrite feeds).
                start = next((k for k, n in enumerate(cycle) if not isinstance(n, str)), 0)
                cycle = cycle[start:] + cycle[:start + 1]
                return [n if isinstance(n, str) else n.name for n in cycle]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                pending.append(iter(rewritten.successors(nxt)))
    return None
