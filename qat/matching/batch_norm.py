"""Recognising batch norms by structure and describing them for the fold pass.

A batch norm is either a FusedBatchNorm / V2 / V3 op or the unfused arithmetic
of `tf.nn.batch_normalization` (see `qat.matching.layer_patterns`). `find_batch_norms`
returns a `BatchNorm` record for each, with the tensors the fold needs:

* gamma / beta (None without scale / center), epsilon;
* the mean and variance it normalises with, and whether those are batch
  statistics computed from its own input (training mode) or not (inference);
* for batch-statistics batch norms, the moving-average update ops of the
  moving mean and variance (the compat.v1 `AssignMovingAvg` AssignSub, tf_keras'
  AssignSubVariableOp, or an AssignVariableOp / Assign of a new value) and a
  tensor holding each moving statistic.

Batch norms inside the functions of functional control flow (If / While / ...)
cannot be edited from the outer graph; they are listed as skipped.
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Tuple, Union

import tensorflow as tf

from qat.engine import function_library
from qat.engine import op_index
from qat.matching import layer_patterns
from qat.matching.matcher import GraphMatcher

# Op types the forward walk from a batch statistic to its moving-average
# update may pass through.
# Keras 3 writes the update as `moving * momentum + batch * (1 - momentum)`
# and assigns the sum: hence the adds.
_UPDATE_PATH_TYPES = frozenset(
    ["Sub", "Mul", "Add", "AddV2", "Cast", "Identity", "Select", "SelectV2",
     "Squeeze", "Reshape"])
# Update ops: the delta (AssignSub*) or the new value (Assign*) is input 1.
ASSIGN_SUB_TYPES = ("AssignSubVariableOp", "AssignSub")
ASSIGN_TYPES = ("AssignVariableOp", "Assign")
_MAX_UPDATE_DEPTH = 5
_MAX_MOMENTS_DEPTH = 8


@dataclasses.dataclass
class MovingAverageUpdate:
    """One op updating a moving statistic.

    Attributes:
      op: the AssignSub / AssignSubVariableOp (input 1 is the delta) or
        Assign / AssignVariableOp (input 1 is the new value).
      variable: the variable handle (resource) or ref tensor it assigns.
    """
    op: tf.Operation
    variable: tf.Tensor

    @property
    def is_delta(self) -> bool:
        return self.op.type in ASSIGN_SUB_TYPES


@dataclasses.dataclass
class BatchNorm:
    """A recognised batch norm.

    Attributes:
      op: the FusedBatchNorm* op, or the final Add/AddV2 of the unfused form.
      fused: whether it is a FusedBatchNorm* op.
      input: the tensor it normalises.
      output: its normalised output.
      gamma, beta: scale / offset tensors, None when absent.
      mean, variance: what it normalises with.
      epsilon: a float (fused) or the epsilon Const tensor (unfused).
      data_format: "NHWC" or "NCHW" for fused ops; None for unfused.
      uses_batch_statistics: mean / variance are computed from `input`.
      ops: the ops forming the batch norm (the only allowed consumers of
        `input`).
      moving_mean, moving_variance: tensors holding the moving statistics
        (None if not found; for inference-mode batch norms, mean / variance).
      mean_variable, variance_variable: variables updated with the batch
        statistics, when no read tensor could be found for them.
      updates: the moving-average update ops.
    """
    op: tf.Operation
    fused: bool
    input: tf.Tensor
    output: tf.Tensor
    gamma: Optional[tf.Tensor]
    beta: Optional[tf.Tensor]
    mean: tf.Tensor
    variance: tf.Tensor
    epsilon: Union[float, tf.Tensor]
    data_format: Optional[str]
    uses_batch_statistics: bool
    ops: List[tf.Operation]
    moving_mean: Optional[tf.Tensor] = None
    moving_variance: Optional[tf.Tensor] = None
    mean_variable: Optional[tf.Tensor] = None
    variance_variable: Optional[tf.Tensor] = None
    updates: List[MovingAverageUpdate] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.op.name

    def has_moving_statistics(self) -> bool:
        """True if both moving statistics can be read (or are read)."""
        return ((self.moving_mean is not None or self.mean_variable is not None)
                and (self.moving_variance is not None
                     or self.variance_variable is not None))


def same_tensor(a: tf.Tensor, b: tf.Tensor) -> bool:
    """True if `a` and `b` are the same output of the same op."""
    return a.op is b.op and a.value_index == b.value_index


def _reads_variable(t: tf.Tensor, variable: tf.Tensor) -> bool:
    """True if `t` holds the value of `variable` (handle or ref)."""
    if same_tensor(t, variable):
        return variable.dtype != tf.resource
    if t.op.type in ("ReadVariableOp", "Identity") and t.op.inputs:
        return same_tensor(t.op.inputs[0], variable)
    return False


_RESHAPE_TYPES = ("Reshape", "Squeeze", "ExpandDims", "Identity")


def _find_updates(statistic: tf.Tensor) -> List[Tuple[MovingAverageUpdate, Optional[tf.Tensor]]]:
    """Finds the update ops fed by a batch statistic.

    Returns (update, read) pairs where `read` is a tensor already in the graph
    holding the updated variable's value (the `variable` of `variable - value`
    in the moving-average formula), or None.
    """
    found = []
    # The statistic may be a reshape of the one the update reads (Keras 3's
    # BatchNormalization(axis=3) reshapes the squeezed batch mean to
    # [1, 1, 1, c] to normalise; the update reads the squeezed one).
    sources = [statistic]
    while (sources[-1].op.type in _RESHAPE_TYPES and sources[-1].op.inputs
           and len(sources) <= _MAX_UPDATE_DEPTH):
        sources.append(sources[-1].op.inputs[0])
    # Each entry: (tensor, depth, Sub ops passed on the way).
    stack = [(source, 0, ()) for source in sources]
    seen = set()
    while stack:
        tensor, depth, subs = stack.pop()
        for consumer in tensor.consumers():
            key = (consumer, tensor.name)
            if key in seen:
                continue
            seen.add(key)
            if consumer.type in ASSIGN_SUB_TYPES + ASSIGN_TYPES:
                if len(consumer.inputs) > 1 and same_tensor(consumer.inputs[1], tensor):
                    variable = consumer.inputs[0]
                    read = None
                    for sub in subs:
                        if _reads_variable(sub.inputs[0], variable):
                            read = sub.inputs[0]
                    if read is None and consumer.type in ASSIGN_TYPES:
                        read = _read_in_new_value(consumer.inputs[1], variable)
                    found.append((MovingAverageUpdate(consumer, variable), read))
                continue
            if consumer.type in _UPDATE_PATH_TYPES and depth < _MAX_UPDATE_DEPTH:
                new_subs = subs + ((consumer,) if consumer.type == "Sub" else ())
                for out in consumer.outputs:
                    stack.append((out, depth + 1, new_subs))
    return found


def _read_in_new_value(value: tf.Tensor, variable: tf.Tensor) -> Optional[tf.Tensor]:
    """The read of `variable` a new value `old * m + batch * (1 - m)` is made of.

    Through the selects of a training fold (`qat.fold.wire`: the current
    value where the batch's is not finite, or once frozen).
    """
    stack, depth = [value], 0
    while stack and depth < _MAX_UPDATE_DEPTH:
        nxt = []
        for t in stack:
            if _reads_variable(t, variable):
                return t
            if t.op.type in ("Add", "AddV2", "Mul", "Cast", "Identity", "Select", "SelectV2"):
                nxt.extend(t.op.inputs)
        stack, depth = nxt, depth + 1
    return None


def _depends_on(tensor: tf.Tensor, source: tf.Tensor, memo: Dict[tf.Operation, bool],
                depth: int = 0) -> bool:
    if same_tensor(tensor, source):
        return True
    op = tensor.op
    if op in memo:
        return memo[op]
    if depth >= _MAX_MOMENTS_DEPTH:
        return False
    result = any(_depends_on(t, source, memo, depth + 1) for t in op.inputs)
    memo[op] = result
    return result


def _moments_ops(stats: List[tf.Tensor], source: tf.Tensor) -> Tuple[bool, List[tf.Operation]]:
    """Whether `stats` are computed from `source`, and the ops doing it."""
    memo = {}  # type: Dict[tf.Operation, bool]
    depends = all(_depends_on(t, source, memo) for t in stats)
    return depends, [op for op, d in memo.items() if d]


def _attach_moving_statistics(bn: BatchNorm, batch_mean: tf.Tensor,
                              batch_variance: tf.Tensor) -> None:
    for statistic, which in ((batch_mean, "mean"), (batch_variance, "variance")):
        pairs = _find_updates(statistic)
        variables = []
        read = None
        for update, update_read in pairs:
            bn.updates.append(update)
            if not any(same_tensor(v, update.variable) for v in variables):
                variables.append(update.variable)
            if read is None and update_read is not None:
                read = update_read
        if len(variables) != 1:
            continue  # None or ambiguous: the fold pass reports it.
        if read is None and bn.fused and not pairs[0][0].is_delta:
            # exponential_avg_factor form: inputs 3 / 4 hold the old values.
            candidate = bn.op.inputs[3 if which == "mean" else 4]
            if candidate.shape.num_elements() != 0 and _reads_variable(
                    candidate, variables[0]):
                read = candidate
        if which == "mean":
            bn.moving_mean, bn.mean_variable = read, variables[0]
        else:
            bn.moving_variance, bn.variance_variable = read, variables[0]


def _describe_fused(match) -> BatchNorm:
    op = match.get_op("batch_norm")
    training = op.get_attr("is_training")
    data_format = op.get_attr("data_format")
    if isinstance(data_format, bytes):
        data_format = data_format.decode()
    bn = BatchNorm(
        op=op, fused=True, input=op.inputs[0], output=op.outputs[0],
        gamma=op.inputs[1], beta=op.inputs[2], mean=op.inputs[3],
        variance=op.inputs[4], epsilon=float(op.get_attr("epsilon")),
        data_format=data_format, uses_batch_statistics=bool(training), ops=[op])
    if training:
        _attach_moving_statistics(bn, op.outputs[1], op.outputs[2])
    else:
        bn.moving_mean, bn.moving_variance = op.inputs[3], op.inputs[4]
    return bn


def _describe_unfused(match) -> BatchNorm:
    x = match.get_tensor("bn_input")
    mean = match.get_tensor("mean")
    variance = match.get_tensor("variance")
    batch_stats, moment_ops = _moments_ops([mean, variance], x)
    ops = [op for op in match.bound_ops()
           if op is not x.op and op not in (mean.op, variance.op)]
    for op in moment_ops:
        if op not in ops:
            ops.append(op)
    bn = BatchNorm(
        op=match.get_op("batch_norm"), fused=False, input=x,
        output=match.get_op("batch_norm").outputs[0],
        gamma=match.get_tensor("gamma"), beta=match.get_tensor("beta"),
        mean=mean, variance=variance, epsilon=match.get_tensor("epsilon"),
        data_format=None, uses_batch_statistics=batch_stats, ops=ops)
    if batch_stats:
        _attach_moving_statistics(bn, mean, variance)
    else:
        bn.moving_mean, bn.moving_variance = mean, variance
    return bn


def _function_batch_norms(graph: tf.Graph) -> List[Tuple[str, str]]:
    """(name, reason) for batch norms inside functional control flow."""
    flow_ops = op_index.ops_of_types(graph, function_library.CALL_TYPES)
    if not flow_ops:
        return []
    library = function_library.library_of(graph)
    found = []
    reported = set()
    for op in flow_ops:
        pending = function_library.called_functions(op.node_def.attr)
        visited = set()
        while pending:
            fname = pending.pop()
            if fname in visited or fname not in library:
                continue
            visited.add(fname)
            for node in library[fname].node_def:
                name = "%s/%s" % (op.name, node.name)
                if (node.op in layer_patterns.FUSED_BATCH_NORM_TYPES
                        and name not in reported):
                    reported.add(name)  # Once, though in both branches.
                    found.append((
                        name,
                        "inside the function %s of the %s op %s, which the "
                        "fold cannot edit (a tf_keras learning phase that is "
                        "not fixed); build the model with a fixed learning "
                        "phase: tf.compat.v1.keras.backend.set_learning_phase(1) "
                        "(0 for the eval graph) before building it, or "
                        "training=True or False as a Python bool (not a "
                        "tensor), so batch norms are not wrapped in control flow"
                        % (fname, op.type, op.name)))
                pending.extend(function_library.called_functions(node.attr))
    return found


_FUSED_MATCHER = GraphMatcher(layer_patterns.FUSED_BATCH_NORM)
_UNFUSED_MATCHER = GraphMatcher(layer_patterns.UNFUSED_BATCH_NORM)


def describe_batch_norm(op: tf.Operation) -> Optional[BatchNorm]:
    """The batch norm ending at `op` (a FusedBatchNorm*, or the unfused form's
    final op), as `find_batch_norms` describes it, or None."""
    match = _FUSED_MATCHER.match_op(op)
    if match is not None:
        return _describe_fused(match)
    match = _UNFUSED_MATCHER.match_op(op)
    return _describe_unfused(match) if match is not None else None


def find_batch_norms(graph: tf.Graph) -> Tuple[List[BatchNorm], List[Tuple[str, str]]]:
    """Finds every batch norm of `graph` by structure.

    Args:
      graph: the graph to scan.

    Returns:
      (batch_norms, unreachable): `BatchNorm` records in graph order, and
      (name, reason) pairs for batch norms the fold cannot reach (inside the
      functions of functional control flow).
    """
    found = collections.OrderedDict()  # type: Dict[tf.Operation, BatchNorm]
    for match in GraphMatcher(layer_patterns.FUSED_BATCH_NORM).match_graph(graph):
        bn = _describe_fused(match)
        found[bn.op] = bn
    for match in GraphMatcher(layer_patterns.UNFUSED_BATCH_NORM).match_graph(graph):
        bn = _describe_unfused(match)
        found[bn.op] = bn
    # Graph order: the order ops were made in.
    batch_norms = sorted(found.values(), key=lambda b: b.op._id)  # pylint: disable=protected-access
    return batch_norms, _function_batch_norms(graph)
