"""The invariants the property-based checks hold qat's rewrites to.

`tools.property.rewrite_checks.check_network(net)` builds a
`tools.property.networks.Network` in each mode (eval, training, export),
rewrites them and returns, for each invariant of `INVARIANTS`, None when it
holds or a message saying how it was violated; the checks are this module's:

* `rewrite_succeeds`: no rewrite raises.
* `eval_fold_exact`: `fold_batch_norms(is_training=False)` leaves the output
  equal to the unfolded network's within 1e-4 (|a - b| <= 1e-4 (1 + |a|)).
* `all_folded`: the eval fold skips no batch norm (every one follows a layer).
* `gradients_finite`: after `create_training_graph` every trainable
  variable has a gradient and each is finite.
* `idempotent_training` / `idempotent_eval`: a second `create_*_graph` call
  leaves the GraphDef unchanged.
* `weights_quantized`: each layer's weights reach the layers only through a
  FakeQuant (training and eval graphs).
* `no_raw_reader`: every reader of a data tensor (one computed from the
  network input) that has a FakeQuant reads the FakeQuant's output, wherever
  the reader lives (the loss, a head outside the model's scope); only that
  quantizer's range computation reads the raw value (training and eval).
* `one_range_per_layer_output`: no FakeQuant between a layer op and a bias
  add TFLite fuses into it (directly, or through Identity / Squeeze): the
  layer output has one range, after the bias (both graphs).
* `train_eval_symmetry`: every variable of the rewritten eval graph is one
  of the rewritten training graph, with its shape, so a plain `Saver()` in
  the eval graph restores the training checkpoint.
* `shared_concat_ranges`: every data input of a quantized concatenation is
  read through a FakeQuant whose min / max variables are the
  concatenation's (training and eval graphs), or through a fixed grid's
  (a sigmoid's, a tanh's), which TFLite requantizes. A concatenation's range reads
  its other inputs' raw values for its statistics
  (`qat.quantize.plan.ranges.shared_ranges`): `no_raw_reader` counts those reductions as
  range computation.
* `kernel_preconditions`: the ranges the training graph's FakeQuants read in
  its run, and the eval graph's, meet every precondition of TFLite's
  integer kernels (`qat.quantize.plan.kernels.kernel_preconditions`, checked by
  `qat.export.kernel_checks`): the ranges of activations pushed to one side
  (`Block.offset`) included.
* `no_loss_ranges`: no activation quantizer reads a tensor the loss computes
  (`loss/`: mean square, against a constant, cross-entropy at a temperature,
  label smoothing, hinge), in the training graph nor in the eval graph,
  which computes the loss too (issue #33).
* `outputs_keep_ranges`: the model output (the tensor `output` names) is
  read through a FakeQuant, in the training, eval and export graphs.
* `same_ranges_as_export`: the training and eval graphs (fed by a
  placeholder, a tf.data iterator or a FIFO queue, with the loss) have the
  activation quantizers and range variables of the export graph (a
  placeholder, no loss), and the one that quantizes the fed batch is the
  same: the input's range does not move with the feed or the pipeline
  after it (preprocessing, a pad, a reshape, a transpose).

The checks are structural except those that run a Session (one thread).
"""
import collections
from typing import Dict, Iterable, List, Optional, Set

import tensorflow as tf

from qat.engine import marks
from qat.quantize.plan.ops import dropout_patterns
from qat.quantize.plan.ranges import fixed_ranges
from qat.quantize.plan.ops import op_table
from tools.property import network_graphs

INVARIANTS = (
    "rewrite_succeeds",
    "eval_fold_exact",
    "all_folded",
    "gradients_finite",
    "idempotent_training",
    "idempotent_eval",
    "weights_quantized",
    "no_raw_reader",
    "one_range_per_layer_output",
    "train_eval_symmetry",
    "shared_concat_ranges",
    "kernel_preconditions",
    "no_loss_ranges",
    "outputs_keep_ranges",
    "same_ranges_as_export",
)
LAYER_TYPES = frozenset([
    "Conv2D", "DepthwiseConv2dNative", "MatMul", "BatchMatMulV2",
    "Conv2DBackpropInput", "Conv3D"])


def _is_fake_quant(op: tf.Operation) -> bool:
    return op.type.startswith("FakeQuantWithMinMax")


def weights_violations(graph: tf.Graph, kernels: Iterable[tf.Operation]) -> List[str]:
    """Weights that reach a layer op without a FakeQuant, or no FakeQuant."""
    problems = []
    for kernel in kernels:
        seen: Set[tf.Operation] = set()
        queue = collections.deque([kernel])
        quantized = False
        while queue:
            op = queue.popleft()
            for t in op.outputs:
                for c in t.consumers():
                    if c in seen or marks.is_replaced(c):
                        continue  # An op a rewrite replaced (a loop unrolled) computes nothing.
                    seen.add(c)
                    if _is_fake_quant(c):
                        quantized = True
                        continue
                    if c.type in LAYER_TYPES:
                        problems.append(f"{kernel.name} reaches {c.name} unquantized")
                        continue
                    queue.append(c)
        if not quantized:
            problems.append(f"{kernel.name} reaches no FakeQuant")
    return problems


def _forward_ops(seed: tf.Operation) -> Set[tf.Operation]:
    seen = {seed}
    queue = collections.deque([seed])
    while queue:
        for t in queue.popleft().outputs:
            for c in t.consumers():
                if c not in seen:
                    seen.add(c)
                    queue.append(c)
    return seen


def _range_ops(fake_quant: tf.Operation, data: tf.Tensor) -> Set[tf.Operation]:
    """The ops between `data` and the FakeQuant (its range computation)."""
    seen = {fake_quant}
    queue = collections.deque([fake_quant])
    while queue:
        op = queue.popleft()
        upstream = [t.op for t in op.inputs if t is not data] + list(op.control_inputs)
        for u in upstream:
            if u not in seen:
                seen.add(u)
                queue.append(u)
    return seen


def raw_and_quantized_violations(graph: tf.Graph, input_tensor: tf.Tensor) -> List[str]:
    """Data tensors read by a FakeQuant and raw by an op outside its range."""
    data_ops = _forward_ops(input_tensor.op)
    problems = []
    for fq in graph.get_operations():
        if not _is_fake_quant(fq) or fq.inputs[0].op not in data_ops:
            continue
        data = fq.inputs[0]
        raw = [c for c in data.consumers() if not _is_fake_quant(c) and not marks.is_replaced(c)]
        if not raw:
            continue
        allowed = _range_ops(fq, data)
        for c in raw:
            if c not in allowed and not _is_statistic(c):
                problems.append(f"{data.name} is read quantized by {fq.name} and raw "
                                f"by {c.name} ({c.type})")
    return problems


def _is_statistic(op: tf.Operation) -> bool:
    """A reduction of a quantizer's range update (a group member's min / max)."""
    return op.type in ("Min", "Max", "Cast") and marks.made_by_qat(op, marks.QUANTIZER)


_SAME_SCALE = frozenset(["Identity", "Reshape", "MaxPool", "Pad", "Squeeze",
                         "ExpandDims", "Select", "Cast", "Transpose",
                         # A sequence's steps (input 0; a Split's is input 1).
                         "Unpack", "StridedSlice", "Split", "ReverseV2",
                         # An atrous layer's range is on the conv output, the
                         # tensor TFLite's CONV_2D writes (docs/what_gets_a_range.md).
                         "BatchToSpaceND", "SpaceToBatchND"])


def _range_variables(fq: tf.Operation) -> Optional[tuple]:
    """The names of the variables a FakeQuant's min and max read, or None."""
    names = []
    for t in fq.inputs[1:3]:
        while t.op.type == "Identity":
            t = t.op.inputs[0]
        if t.op.type != "ReadVariableOp":
            return None
        names.append(t.op.inputs[0].op.name)
    return tuple(names)


def _is_fixed_range(fq: tf.Operation) -> bool:
    """A FakeQuant of a kernel's fixed grid (`qat.quantize.plan.ranges.fixed_ranges`): constants."""
    def constant(t):
        while t.op.type == "Identity":
            t = t.op.inputs[0]
        return t.op.type == "Const"
    return all(constant(t) for t in fq.inputs[1:3])


def _quantizing_fake_quant(t: tf.Tensor) -> Optional[tf.Operation]:
    """The FakeQuant `t` comes from, back through same-scale and qat's ops."""
    for _ in range(100):
        if _is_fake_quant(t.op):
            return t.op
        dropout = dropout_patterns.dropout_ops(t.op)
        if dropout is not None:  # Looked through: the range is on what it reads.
            t = dropout[t.op]
            continue
        if t.op.type not in _SAME_SCALE or not t.op.inputs:
            return None
        # A delayed quantizer's Select: its quantized input.
        t = t.op.inputs[1] if t.op.type in ("Select", "Split") else t.op.inputs[0]
    return None


def shared_concat_violations(graph: tf.Graph, input_tensor: tf.Tensor) -> List[str]:
    """Inputs of a quantized concatenation not quantized with its range."""
    data_ops = _forward_ops(input_tensor.op)
    problems = []
    for op in graph.get_operations():
        if op.type not in ("ConcatV2", "Concat") or op not in data_ops:
            continue
        own = [c for c in op.outputs[0].consumers() if _is_fake_quant(c)]
        if not own:
            continue
        variables = _range_variables(own[0])
        for t in op.inputs:
            if t.op not in data_ops:
                continue
            fq = _quantizing_fake_quant(t)
            if fq is None:
                problems.append(f"{op.name} reads {t.name} unquantized")
            elif _is_fixed_range(fq):
                continue  # A sigmoid's or tanh's grid: kept, requantized by TFLite.
            elif _range_variables(fq) != variables:
                problems.append(f"{op.name} reads {t.name} through {fq.name} with "
                                f"{_range_variables(fq)}, not {variables}")
    return problems


# Ops between a layer op and a bias add TFLite fuses into the layer. Across an
# atrous conv's BatchToSpaceND or a Reshape the bias is an ADD of its own, with
# a range before and after it, as TFLite computes it.
_LAYER_OUTPUT_PASSTHROUGH = frozenset(["Identity", "Squeeze"])
_BIAS_ADD_TYPES = frozenset(["BiasAdd", "Add", "AddV2"])


def _back_through_passthrough(t: tf.Tensor) -> tf.Tensor:
    while t.op.type in _LAYER_OUTPUT_PASSTHROUGH and t.op.inputs:
        t = t.op.inputs[0]
    return t


def _is_parameter(t: tf.Tensor) -> bool:
    """A variable read or a constant (maybe behind Identity or a FakeQuant)."""
    op = t.op
    while (op.type == "Identity" or _is_fake_quant(op)) and op.inputs:
        op = op.inputs[0].op
    return op.type in ("ReadVariableOp", "Const", "VariableV2", "VarHandleOp")


def double_range_violations(graph: tf.Graph) -> List[str]:
    """Bias adds that read a FakeQuant of a layer op's output."""
    problems = []
    for op in graph.get_operations():
        if op.type not in _BIAS_ADD_TYPES or len(op.inputs) != 2:
            continue
        for data, param in (op.inputs, reversed(op.inputs)):
            if not _is_parameter(param) or param.shape.rank != 1:
                continue
            fq = _back_through_passthrough(data).op
            if not _is_fake_quant(fq):
                continue
            layer = _back_through_passthrough(fq.inputs[0]).op
            if layer.type in LAYER_TYPES:
                problems.append(f"{layer.name} has a range ({fq.name}) before its "
                                f"bias add {op.name}")
    return problems


def symmetry_violations(eval_vars: Dict[str, tuple],
                        training_vars: Dict[str, tuple]) -> List[str]:
    """Eval-graph variables a training checkpoint lacks (or has in another shape)."""
    problems = []
    for name, shape in sorted(eval_vars.items()):
        if name not in training_vars:
            problems.append(f"eval variable {name} is not in the training graph")
        elif training_vars[name] != shape:
            problems.append(f"eval variable {name} {shape} is "
                            f"{training_vars[name]} in training")
    return problems


def quantized_tensor(fake_quant: tf.Operation) -> tf.Tensor:
    """The tensor a FakeQuant quantizes (back through qat's own ops)."""
    t = fake_quant.inputs[0]
    for _ in range(16):
        if marks.computes_the_model(t.op):
            return t
        t = t.op.inputs[0]
    return t


def activation_quantizers(graph: tf.Graph) -> Dict[str, tf.Tensor]:
    """{activation quantizer name: the tensor it quantizes} (no weights, no gradients)."""
    found = {}
    for op in graph.get_operations():
        if not _is_fake_quant(op) or op.name.startswith("gradients"):
            continue
        name = op.name.rsplit("/", 1)[0]
        if not name.endswith("weights_quant"):
            found[name] = quantized_tensor(op)
    return found


def _range_variable_names(variables: Dict[str, tuple]) -> Set[str]:
    return {name for name in variables if name.endswith(("_quant/min", "_quant/max"))
            and "weights_quant" not in name}


def loss_range_violations(graph: tf.Graph) -> List[str]:
    """Quantizers on loss arithmetic (tensors computed under `loss/`)."""
    return [f"{name} quantizes the loss's {t.name}"
            for name, t in sorted(activation_quantizers(graph).items())
            if t.op.name.startswith("loss/")]


def output_range_violations(built: "network_graphs.Built") -> List[str]:
    """The model output, if it has no range: no FakeQuant quantizes it or what
    it reads through same-scale ops (a pool keeps its input's scale) and
    dropout (a training graph's drop path on the last block: looked through as
    the planner does), and it is not on a kernel's fixed grid (a softmax's:
    `qat.quantize.plan.ranges.fixed_ranges`)."""
    t = built.output.op.inputs[0]
    for _ in range(100):
        if _is_fake_quant(t.op) or fixed_ranges.fixed_grid(t.op) is not None:
            return []
        dropout = dropout_patterns.dropout_ops(t.op)
        if dropout is not None and t.op in dropout:
            t = dropout[t.op]
            continue
        if not t.op.inputs or not (t.op.type in op_table.SAME_SCALE_TYPES
                                   or t.op.type == "Select"
                                   or not marks.computes_the_model(t.op)):
            break
        # A delayed quantizer's Select: its quantized input.
        t = t.op.inputs[1] if t.op.type == "Select" else t.op.inputs[
            op_table.same_scale_input(t.op, t.value_index)]
    out = built.output.op.inputs[0]
    return [f"the model output {out.name} ({out.op.type}) has no range"]


def fed_quantizers(quantizers: Dict[str, tf.Tensor], fed: tf.Tensor) -> List[str]:
    """The quantizers of the fed batch (the input's range before the pipeline)."""
    return sorted(name for name, t in quantizers.items() if t is fed)


def export_violations(suffix: str, fed: List[str], quantizers: Dict[str, tf.Tensor],
                      variables: Dict[str, tuple], export: dict) -> List[str]:
    """How a training or eval graph's ranges differ from the export graph's.

    Args:
      suffix: the graph's name in messages.
      fed: its quantizers of the fed batch (`fed_quantizers`).
      quantizers: its `activation_quantizers`.
      variables: its {variable name: shape}.
      export: the export graph's "quantizers", "variables" and "fed".
    """
    problems = []
    names, export_names = set(quantizers), set(export["quantizers"])
    if names != export_names:
        problems.append(f"{suffix} quantizers {sorted(names - export_names)} not in the export "
                        f"graph, {sorted(export_names - names)} missing")
    ranges, export_ranges = (_range_variable_names(variables),
                             _range_variable_names(export["variables"]))
    if ranges != export_ranges:
        problems.append(f"{suffix} range variables {sorted(ranges - export_ranges)} not in "
                        f"the export graph, {sorted(export_ranges - ranges)} missing")
    if fed != export["fed"]:
        problems.append(f"{suffix} quantizes the fed batch with {fed}, the export graph "
                        f"with {export['fed']}")
    return problems


