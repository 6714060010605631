"""TF1 loops (`tf.compat.v1.disable_control_flow_v2()`): frames of graph ops.

With control flow v1 a `tf.while_loop` (TF1 `dynamic_rnn`) is built from graph
ops: per loop variable an `Enter` into the loop's frame, a `Merge` of it with
the `NextIteration` of the body's result, a `Switch` on the `LoopCond` (its
true output, through an `Identity`, is what the body reads; its false output
leaves through an `Exit`), and an `Enter` with `is_constant` for each value
the loop reads unchanged (weights, a TensorArray's handle). The body and
condition are the frame's other ops.

`frame_loops(graph)` gives each outermost frame whose body computes a layer
as a `qat.matching.loops.Loop`, the form `qat.prepare.loops` unrolls: the
body and condition as one plain graph in which each loop variable is a
Placeholder (what the Merge and the Switch's true output give), each
constant Enter another, without control inputs.
"""
from typing import Dict, List, Optional

import tensorflow as tf

from qat.engine import marks
from qat.engine import node_attrs
from qat.engine import op_index
from qat.matching import loops

# The ops that make a frame, not computations of the body.
FRAME_TYPES = frozenset(["Enter", "Merge", "Switch", "NextIteration", "Exit", "LoopCond",
                         "RefEnter", "RefMerge", "RefSwitch", "RefNextIteration", "RefExit"])


def _frame_name(op: tf.Operation) -> bytes:
    return op.get_attr("frame_name")


def _frame_ops(enters: List[tf.Operation]) -> List[tf.Operation]:
    """The ops of a frame: from its Enter ops on (data and control edges) up
    to its Exit ops, in graph order."""
    seen = set(enters)
    stack = list(enters)
    while stack:
        op = stack.pop()
        if op.type == "Exit":
            continue
        followers = [c for out in op.outputs for c in out.consumers()] + list(op._control_outputs)  # pylint: disable=protected-access
        for c in followers:
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return sorted(seen, key=lambda o: o._id)  # pylint: disable=protected-access


def frame_loops(graph: tf.Graph) -> List[loops.Loop]:
    """The outermost TF1 loops of `graph` whose body computes a layer, not
    unrolled yet (see the module docstring)."""
    frames: Dict[bytes, List[tf.Operation]] = {}
    for op in op_index.ops_of_types(graph, ("Enter",)):
        if not marks.is_replaced(op):
            frames.setdefault(_frame_name(op), []).append(op)
    members = {name: _frame_ops(enters) for name, enters in frames.items()}
    found = []
    for name, enters in frames.items():
        ops = members[name]
        inner = {_frame_name(op) for op in ops if op.type == "Enter"} - {name}
        outer = [other for other, other_ops in members.items()
                 if other != name and enters[0] in other_ops]
        if inner or outer:
            continue  # Nested loops are not unrolled.
        if not any(op.type in loops.LAYER_TYPES for op in ops):
            continue
        # Named after its ops' scope (`rnn/while`), as a While op of the same loop is.
        loop = _loop(enters[0].name.rpartition("/")[0] or name.decode(), enters, ops)
        if loop is not None:
            found.append(loop)
    return found


def _loop(name: str, enters: List[tf.Operation], ops: List[tf.Operation]) -> Optional[loops.Loop]:
    """The frame as a `Loop`, or None if it is not a plain while loop."""
    variables, constants = [], []
    for enter in enters:
        if enter.get_attr("is_constant"):
            constants.append(enter)
            continue
        merges = [c for c in enter.outputs[0].consumers() if c.type == "Merge"]
        if len(merges) != 1:
            return None
        variables.append((enter, merges[0]))
    conds = [op for op in ops if op.type == "LoopCond"]
    if len(conds) != 1:
        return None
    cond = conds[0]
    graph_def = tf.compat.v1.GraphDef()
    placeholders: Dict[str, str] = {}  # tensor name in the graph -> placeholder in the copy
    inputs, outputs, nexts = [], [], []
    for k, (enter, merge) in enumerate(variables):
        switches = [c for c in merge.outputs[0].consumers() if c.type == "Switch"]
        next_ops = [i.op for i in merge.inputs if i.op.type == "NextIteration"]
        if len(switches) != 1 or len(next_ops) != 1:
            return None
        exits = [c for c in switches[0].outputs[0].consumers() if c.type == "Exit"]
        placeholder = _placeholder(graph_def, f"loop_variable_{k}", merge.outputs[0])
        placeholders[merge.outputs[0].name] = placeholder
        placeholders[switches[0].outputs[1].name] = placeholder
        inputs.append(enter.inputs[0])
        outputs.append(exits[0].outputs[0] if exits else None)
        nexts.append(next_ops[0].inputs[0].name)
    for j, enter in enumerate(constants):
        placeholders[enter.outputs[0].name] = _placeholder(graph_def, f"loop_invariant_{j}",
                                                           enter.outputs[0])
        inputs.append(enter.inputs[0])
        outputs.append(None)
    for op in ops:
        if op.type in FRAME_TYPES:
            continue
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        del node.input[:]
        node.ClearField("device")
        node_attrs.drop_internal_attrs(node)  # Colocation with other nodes.
        for t in op.inputs:  # Control inputs left out: they order, values do not need them.
            node.input.append(placeholders.get(t.name, t.name if t.op in ops else None)
                              or _outside(graph_def, t))
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    body_inputs = [graph.get_tensor_by_name(placeholders[merge.outputs[0].name] + ":0")
                   for _, merge in variables]
    body_inputs += [graph.get_tensor_by_name(placeholders[e.outputs[0].name] + ":0")
                    for e in constants]
    body_outputs = [graph.get_tensor_by_name(_in_copy(placeholders, n)) for n in nexts]
    body_outputs += body_inputs[len(variables):]  # Read unchanged.
    cond_output = graph.get_tensor_by_name(_in_copy(placeholders, cond.inputs[0].name))
    return loops.Loop(name, "TF1 while loop", inputs, outputs, ops, enters[0].device,
                      graph, body_inputs, body_outputs, graph, body_inputs, cond_output,
                      layers=[op.name for op in ops if op.type in loops.LAYER_TYPES])


def _in_copy(placeholders: Dict[str, str], name: str) -> str:
    return placeholders[name] + ":0" if name in placeholders else name


def _placeholder(graph_def, name: str, like: tf.Tensor) -> str:
    node = graph_def.node.add(name=name, op="Placeholder")
    node.attr["dtype"].type = like.dtype.base_dtype.as_datatype_enum
    if like.shape.rank is not None:
        node.attr["shape"].shape.CopyFrom(like.shape.as_proto())
    return name


def _outside(graph_def, t: tf.Tensor) -> str:
    """A tensor from outside the frame read without an Enter (a constant
    TensorFlow hoisted): a copy of its Const, or a Placeholder never fed."""
    name = "outside/" + t.op.name
    if not any(n.name == name for n in graph_def.node):
        if t.op.type == "Const":
            node = graph_def.node.add()
            node.CopyFrom(t.op.node_def)
            node.name = name
            node.ClearField("device")
            node_attrs.drop_internal_attrs(node)
        else:
            _placeholder(graph_def, name, t)
    return name
