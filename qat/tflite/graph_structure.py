"""Recognising what qat built in a graph: quantizers, layers, the data path.

Everything is read from the graph's structure (op types and edges), so the
same code reads a graph rewritten in this process and an eval graph imported
from a `.meta` file:

* a quantizer is a FakeQuantWithMinMaxVars(PerChannel) op; its range
  variables are found by following its min/max inputs back through
  ReadVariableOp / Identity to the VarHandleOp / VariableV2;
* a layer is a Conv2D, DepthwiseConv2dNative, MatMul or Conv2DBackpropInput
  op (`qat.matching.layer_patterns`); its weights are quantized when the weight input
  reaches it through a FakeQuant;
* the data path is what the graph inputs (placeholders) feed and the outputs
  read, without gradient computations and variable updates.
"""
import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence, Set

import tensorflow as tf

from qat.engine import preconditions
from qat.matching import layer_patterns
from qat.matching import tensors
from qat.matching.matcher import GraphMatcher
from qat.quantize.plan.model import lookups
from qat.quantize.plan.ops import op_table
from qat.quantize.plan.ops import patterns as quantize_patterns

FAKE_QUANT_TYPES = tensors.FAKE_QUANT_TYPES
LAYER_TYPES = frozenset(quantize_patterns.LAYER_TYPES)
INPUT_TYPES = quantize_patterns.INPUT_TYPES
# What the planner gives no range of its own (pools, resizes, reshapes, ...).
SAME_SCALE_TYPES = op_table.SAME_SCALE_TYPES | quantize_patterns.SAME_SCALE_TYPES
METADATA_TYPES = quantize_patterns.METADATA_TYPES
BATCH_NORM_TYPES = quantize_patterns.BATCH_NORM_TYPES
VARIABLE_TYPES = frozenset(["VarHandleOp", "VariableV2", "Variable"])
# Ops between a parameter and what reads it (variable reads, the training
# fold's scaling, a quant delay's Select).
_PARAMETER_PATH_TYPES = frozenset(["ReadVariableOp", "Identity", "Mul", "Reshape"])
_SELECT_TYPES = frozenset(["Select", "SelectV2"])
_UNFUSED_BATCH_NORM = GraphMatcher(layer_patterns.UNFUSED_BATCH_NORM)
V1_CONTROL_FLOW_TYPES = frozenset(["Switch", "Merge", "Enter", "Exit", "NextIteration",
                                   "RefSwitch", "RefMerge", "RefEnter", "LoopCond"])


def is_layer(op: tf.Operation) -> bool:
    """A layer op: a conv, matmul or transposed conv, or an Einsum or batch
    matmul with weights."""
    return op.type in LAYER_TYPES and (op.type not in layer_patterns.WEIGHTED_OPERAND_TYPES
                                       or layer_patterns.is_weighted_einsum(op))


@dataclasses.dataclass
class QuantizerOp:
    """One FakeQuant op and the variables holding its range."""
    op: tf.Operation
    min_variable: Optional[str]
    max_variable: Optional[str]

    @property
    def name(self) -> str:
        """The quantizer's scope, e.g. 'net/conv1/act_quant'."""
        return self.op.name.rsplit("/", 1)[0] if "/" in self.op.name else self.op.name

    @property
    def num_bits(self) -> int:
        return int(self.op.get_attr("num_bits"))

    @property
    def narrow_range(self) -> bool:
        return bool(self.op.get_attr("narrow_range"))

    @property
    def per_channel(self) -> bool:
        return self.op.type.endswith("PerChannel")


def variable_of(tensor: tf.Tensor, depth: int = 4) -> Optional[str]:
    """The variable op name a tensor reads (through ReadVariableOp, Identity or
    Snapshot: a ref variable's value before an update, which a concatenation's
    members read in training graphs)."""
    op = tensor.op
    for _ in range(depth):
        if op.type in VARIABLE_TYPES:
            return op.name
        if op.type not in ("ReadVariableOp", "Identity", "Snapshot") or not op.inputs:
            return None
        op = op.inputs[0].op
    return op.name if op.type in VARIABLE_TYPES else None


def quantizer_op(op: tf.Operation) -> QuantizerOp:
    """Wraps a FakeQuant op with its min/max variable names."""
    return QuantizerOp(op, variable_of(op.inputs[1]), variable_of(op.inputs[2]))


def fake_quant_ops(graph: tf.Graph) -> List[tf.Operation]:
    """Every FakeQuant op of `graph` that reads its range from tensors."""
    return [op for op in graph.get_operations() if op.type in FAKE_QUANT_TYPES]


def gradient_ops(graph: tf.Graph) -> Set[tf.Operation]:
    """Ops `tf.gradients` built, gradient kernels, and all they feed."""
    seeds = [op for op in graph.get_operations()
             if getattr(op, "_original_op", None) is not None
             or quantize_patterns.is_gradient_kernel(op)]
    return forward_closure(seeds)


def forward_closure(seeds: Iterable[tf.Operation],
                    exclude: Optional[Set[tf.Operation]] = None) -> Set[tf.Operation]:
    """Ops reachable from `seeds` along data edges (seeds included)."""
    exclude = exclude or set()
    seen = set(op for op in seeds if op not in exclude)
    stack = list(seen)
    while stack:
        op = stack.pop()
        for out in op.outputs:
            for consumer in out.consumers():
                if consumer not in seen and consumer not in exclude:
                    seen.add(consumer)
                    stack.append(consumer)
    return seen


def backward_closure(seeds: Iterable[tf.Operation]) -> Set[tf.Operation]:
    """Ops whose outputs `seeds` read along data edges (seeds included)."""
    seen = set(seeds)
    stack = list(seen)
    while stack:
        op = stack.pop()
        for inp in op.inputs:
            if inp.op not in seen:
                seen.add(inp.op)
                stack.append(inp.op)
    return seen


def topological_order(ops: Set[tf.Operation], graph: tf.Graph) -> List[tf.Operation]:
    """`ops` ordered so every op comes after the ops of `ops` it reads.

    A graph's creation order is not topological after a rewrite (the
    quantizers are created after the ops that now read them). Ties keep the
    creation order.
    """
    position = {op: k for k, op in enumerate(graph.get_operations())}
    order: List[tf.Operation] = []
    done: Set[tf.Operation] = set()
    for root in sorted(ops, key=position.get):
        if root in done:
            continue
        stack = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if op in done:
                continue
            if expanded:
                done.add(op)
                order.append(op)
                continue
            stack.append((op, True))
            for inp in sorted((i.op for i in op.inputs if i.op in ops and i.op not in done),
                              key=position.get, reverse=True):
                stack.append((inp, False))
    return order


def is_batch_norm(op: tf.Operation) -> bool:
    """A fused batch norm, or the final add of an unfused one."""
    if op.type in BATCH_NORM_TYPES:
        return True
    if op.type in ("Add", "AddV2"):
        return _UNFUSED_BATCH_NORM.match_op(op) is not None
    return False


def batch_norms_by_variable(graph: tf.Graph) -> Dict[str, tf.Operation]:
    """{variable name: batch norm op} for every gamma/beta/mean/variance variable."""
    found: Dict[str, tf.Operation] = {}
    for op in graph.get_operations():
        if op.type in BATCH_NORM_TYPES:
            params = list(op.inputs[1:5])
        elif op.type in ("Add", "AddV2"):
            match = _UNFUSED_BATCH_NORM.match_op(op)
            if match is None:
                continue
            params = [match.get_tensor(n) for n in ("gamma", "beta", "mean", "variance")]
        else:
            continue
        for tensor in params:
            variable = variable_of(tensor) if tensor is not None else None
            if variable is not None:
                found.setdefault(variable, op)
    return found


def graph_inputs(graph: tf.Graph) -> List[tf.Operation]:
    """Placeholders (and iterators) with a float output: the data sources."""
    return [op for op in graph.get_operations() if op.type in INPUT_TYPES
            and any(out.dtype.is_floating for out in op.outputs)]


def data_sources(graph: tf.Graph) -> List[tf.Operation]:
    """Float graph inputs, and where integer inputs (token ids, masks) turn
    float: embedding lookups and casts (`qat.quantize.plan.model.lookups`)."""
    return graph_inputs(graph) + list(lookups.entry_ops(graph.get_operations()))


def default_outputs(graph: tf.Graph) -> List[tf.Operation]:
    """The graph's inference outputs, when the caller names none.

    Sinks of what the graph inputs feed, leaving out gradients, variable
    updates, FakeQuants nothing reads and batch norms nothing reads (the
    fold pass leaves folded batch norms in the graph, unread).
    """
    excluded = gradient_ops(graph)
    fed = forward_closure(data_sources(graph), excluded)
    sinks = []
    for op in graph.get_operations():
        if op not in fed or op.type in INPUT_TYPES:
            continue
        if quantize_patterns.is_state_update(op) or preconditions.is_optimizer_op(op):
            continue
        if op.type in FAKE_QUANT_TYPES or is_batch_norm(op) or not op.outputs:
            continue
        if not any(c in fed for out in op.outputs for c in out.consumers()):
            sinks.append(op)
    return sinks


def data_path(graph: tf.Graph, outputs: Optional[Sequence[tf.Operation]] = None
              ) -> Set[tf.Operation]:
    """The ops computing `outputs` from the graph inputs.

    Args:
      graph: the graph.
      outputs: the output ops; default: `default_outputs(graph)`.

    Returns:
      Ops both fed by a graph input and read (transitively) by an output;
      gradient ops excluded.
    """
    excluded = gradient_ops(graph)
    fed = forward_closure(data_sources(graph), excluded)
    outputs = list(outputs) if outputs is not None else default_outputs(graph)
    return fed & backward_closure(outputs)


def quantizer_reading(tensor: tf.Tensor, depth: int = 6) -> Optional[tf.Operation]:
    """The FakeQuant a layer's weight tensor comes from, or None.

    Follows the weight input back through Identity, Reshape, the training
    fold's unscale Mul (input 0) and a quant delay's Select (its quantized
    branch) until a FakeQuant or a parameter.
    """
    op = tensor.op
    for remaining in range(depth, 0, -1):
        if op.type in FAKE_QUANT_TYPES:
            return op
        if op.type in _SELECT_TYPES:  # Select(delay reached, quantized, float).
            for branch in op.inputs[1:]:
                found = quantizer_reading(branch, remaining - 1)
                if found is not None:
                    return found
            return None
        if op.type not in _PARAMETER_PATH_TYPES or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def weight_tensor(layer: tf.Operation) -> tf.Tensor:
    """The weight input of a layer op (after the training fold's unscale)."""
    if layer.type in layer_patterns.LAYER_TYPES:
        return layer_patterns.weight_input(layer)
    return layer.inputs[1]  # Conv2DBackpropInput: (input_sizes, filter, data).


def weight_variable(layer: tf.Operation, depth: int = 8) -> Optional[str]:
    """The variable holding a layer's weights (through fold and FakeQuant)."""
    op = weight_tensor(layer).op
    for _ in range(depth):
        if op.type in VARIABLE_TYPES or op.type == "Const":
            return op.name
        if op.type in _SELECT_TYPES:
            op = op.inputs[1].op
        elif op.inputs:
            op = op.inputs[0].op
        else:
            return None
    return None


def variable_ancestors(tensor: tf.Tensor, depth: int = 8) -> Set[str]:
    """Names of the variables `tensor` is computed from, within `depth` ops."""
    found, frontier, seen = set(), [tensor.op], set()
    for _ in range(depth):
        next_frontier = []
        for op in frontier:
            if op in seen:
                continue
            seen.add(op)
            if op.type in VARIABLE_TYPES:
                found.add(op.name)
            next_frontier.extend(i.op for i in op.inputs)
        frontier = next_frontier
    return found


def layer_of(tensor: tf.Tensor, depth: int = 8) -> Optional[tf.Operation]:
    """The layer op whose (biased, activated) output `tensor` is, if any.

    Walks back through the ops qat puts between a layer and its activation
    quantizer (bias adds, the fold's tail, activations), always along the
    data input.
    """
    op = tensor.op
    walkable = quantize_patterns.TAIL_TYPES | quantize_patterns.ACTIVATION_TYPES
    for _ in range(depth):
        if is_layer(op):
            return op
        if not (op.type in walkable or quantize_patterns.is_tail_op(op)) or not op.inputs:
            return None
        data = [i for i in op.inputs if not layer_patterns.is_parameter(i)
                and i.dtype.is_floating]
        if not data:
            return None
        op = data[0].op
    return None


def plain_read(variable: tf.Operation) -> Optional[tf.Tensor]:
    """An existing tensor holding a variable's value, read with no side effect.

    A training graph's FakeQuant reads its range after the range update
    (a control dependency): fetching that would update the range and need
    the graph's inputs. This returns the variable's own read op instead (no
    control inputs), or the ref variable itself; None if there is none.
    """
    if variable.type in ("VariableV2", "Variable"):
        return variable.outputs[0]
    for consumer in variable.outputs[0].consumers():
        if consumer.type == "ReadVariableOp" and not consumer.control_inputs:
            return consumer.outputs[0]
    return None


def quantizer_values(quantizers: Sequence[QuantizerOp],
                     sess: Optional[tf.compat.v1.Session] = None,
                     reader=None) -> Dict[str, object]:
    """Reads the range variables' values: {variable name: numpy value}.

    Args:
      quantizers: the quantizers whose min/max to read.
      sess: a session on their graph (values read from the variables with
        no side effect, see `plain_read`), or None.
      reader: a `tf.train.load_checkpoint` reader (values by variable name),
        used when there is no session.

    Returns:
      The values found; variables neither source knows are left out.
    """
    values: Dict[str, object] = {}
    if sess is not None:
        fetches = {}
        for q in quantizers:
            for variable, tensor in ((q.min_variable, q.op.inputs[1]),
                                     (q.max_variable, q.op.inputs[2])):
                if variable is None:  # A constant range (a frozen graph's, a fixed grid).
                    value = tf.get_static_value(tensor)
                    if value is not None:
                        values[tensor.name] = value
                    continue
                read = plain_read(sess.graph.get_operation_by_name(variable))
                if read is not None:
                    fetches[variable] = read
        if fetches:
            values.update(sess.run(fetches))
        return values
    if reader is not None:
        known = reader.get_variable_to_shape_map()
        for q in quantizers:
            for variable in (q.min_variable, q.max_variable):
                if variable in known:
                    values[variable] = reader.get_tensor(variable)
    return values
