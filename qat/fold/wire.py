"""How one fold's new ops are wired in: reroutes, the freeze delay, the functional cond.

`qat.fold.emit` describes the new ops of a fold as NodeDefs; `wire` adds to
the pass's rewrite what connects them (the layer reads the folded weights, the
batch norm's consumers the folded output) and, for training folds with a
freeze delay, the shared `frozen` condition (`Freeze`), the moving-average
updates switched off once frozen and, with `use_cond`, the functional cond
that runs one branch (`_cond_output`). A training fold's updates also keep
non-finite values out of the moving statistics (`_update_value`). The
structures are described in `qat.fold.fold_batch_norms`. Importing this module registers the
select_fold gradient ("QatFoldSelect").
"""
from typing import Optional

import tensorflow as tf

from qat.engine import function_graphs
from qat.engine import rewrite as rewrite_lib
from qat.engine import step_counter
from qat.fold import emit as emit_lib
from qat.fold import plan as fold_plan
from qat.matching import batch_norm as bn_lib


def _fold_select_grad(op: tf.Operation, grad: tf.Tensor):
    """Gradient of select_fold: its branches have the output's shape.

    Scaling by the scalar condition is cheaper than Select's generic
    gradient (zeros_like and two selects).
    """
    chosen = tf.cast(op.inputs[0], grad.dtype)
    return None, grad * chosen, grad * (1.0 - chosen)


try:
    tf.RegisterGradient(emit_lib.SELECT_GRADIENT)(_fold_select_grad)
except KeyError:  # Module re-imported (e.g. importlib.reload): already there.
    pass


class Freeze(object):
    """The shared `frozen` condition and the 1 - frozen factor per dtype."""

    def __init__(self, rewrite: rewrite_lib.Rewrite, delay: int):
        nodes = rewrite.nodes
        self._nodes = nodes
        step = step_counter.step_for(rewrite)
        step = step if isinstance(step, str) else nodes.external(step)
        delay_const = nodes.const(nodes.unique_name("fold_batch_norms/Cast"), delay,
                                  tf.int64)
        self.frozen = nodes.node(nodes.unique_name("fold_batch_norms/frozen"), "Greater",
                                 [step, delay_const], T=tf.int64)
        self._keep = {}

    def keep(self, dtype: tf.DType) -> str:
        if dtype not in self._keep:
            nodes = self._nodes
            not_frozen = nodes.node(nodes.unique_name("fold_batch_norms/LogicalNot"),
                                    "LogicalNot", [self.frozen])
            self._keep[dtype] = nodes.node(
                nodes.unique_name("fold_batch_norms/keep_updates"), "Cast", [not_frozen],
                SrcT=tf.bool, DstT=dtype, Truncate=False)
        return self._keep[dtype]


def _update_value(update: bn_lib.MovingAverageUpdate, bn: bn_lib.BatchNorm,
                  freeze: Optional[Freeze], rewrite: rewrite_lib.Rewrite) -> None:
    """What a training fold's moving-average update writes.

    Where this batch's statistics are not finite (a NaN or infinite input
    value) the moving statistics keep their value, channel by channel: the
    training fold scales the weights by the moving variance, so one NaN in
    it would end training where the float model's batch statistics do not
    (`qat.quantize.emit.finite_ranges` does the same for ranges). With a
    freeze delay the update is switched off once frozen: the delta of an
    AssignSub / AssignSubVariableOp becomes 0, an Assign / AssignVariableOp
    assigns the current value.
    """
    op, nodes = update.op, rewrite.nodes
    dtype = op.inputs[1].dtype.base_dtype
    scope = op.name.rpartition("/")[0]
    scope = scope + "/" if scope else ""
    name = nodes.unique_name(scope + "finite_fold")
    current = None
    if not update.is_delta:
        current = _current_value(update, bn, rewrite, name, dtype, new_read=freeze is not None)
        if current is None:
            return  # No read of the statistic to keep (see _current_value).
    value = nodes.external(op.inputs[1])
    finite = nodes.node(name + "/IsFinite", "IsFinite", [value], device=op.device, T=dtype)
    if update.is_delta:
        key = ("finite_fold_zero", dtype)
        if key not in rewrite.memo:
            rewrite.memo[key] = nodes.const(nodes.unique_name("fold_batch_norms/zero"), 0, dtype)
        new = nodes.node(name, "SelectV2", [finite, value, rewrite.memo[key]], device=op.device,
                         T=dtype)
        if freeze is not None:
            new = nodes.node(nodes.unique_name(scope + "freeze_fold"), "Mul",
                             [new, freeze.keep(dtype)], device=op.device, T=dtype)
    else:
        new = nodes.node(name, "SelectV2", [finite, value, current], device=op.device, T=dtype)
        if freeze is not None:
            new = nodes.node(nodes.unique_name(scope + "freeze_fold"), "SelectV2",
                             [freeze.frozen, current, new], device=op.device, T=dtype)
    rewrite.reroute(op, 1, new)


def _current_value(update: bn_lib.MovingAverageUpdate, bn: bn_lib.BatchNorm,
                   rewrite: rewrite_lib.Rewrite, name: str, dtype: tf.DType,
                   new_read: bool) -> Optional[str]:
    """The updated moving statistic's value before the update.

    The batch norm's own read of it, else a new read. In a function graph a
    new read made after the update would be ordered after it by TensorFlow's
    automatic control dependencies, a cycle through the update's value: there
    a new read is made only when `new_read` (a freeze delay, which needs it),
    otherwise None.
    """
    op, nodes = update.op, rewrite.nodes
    is_mean = (bn.mean_variable is not None
               and bn_lib.same_tensor(update.variable, bn.mean_variable))
    current = bn.moving_mean if is_mean else bn.moving_variance
    if current is not None:
        return nodes.external(current)
    if function_graphs.is_function_graph(rewrite.graph) and not new_read:
        return None
    if update.variable.dtype == tf.resource:
        return nodes.node(name + "/ReadVariableOp", "ReadVariableOp",
                          [nodes.external(update.variable)], device=op.device, dtype=dtype)
    return nodes.node(name + "/Identity", "Identity", [nodes.external(update.variable)],
                      device=op.device, T=dtype)


def _cond_output(plan: fold_plan.FoldPlan, emitted: emit_lib.Emitted,
                 rewrite: rewrite_lib.Rewrite, frozen: str) -> str:
    """use_cond: a functional cond choosing the folded or batch-norm output."""
    bn, layer_op = plan.bn, plan.layer_op
    dtype = layer_op.outputs[0].dtype.base_dtype
    channels = bn.output.shape[1 if plan.channels_first else -1]
    b_fold = (emitted.b_fold + ":0", dtype, [channels])
    rescale_shape = [channels, 1, 1] if plan.channels_first else [channels]
    rescale = (emitted.rescale + ":0", dtype, rescale_shape)
    inputs = [(frozen + ":0", tf.bool, []), plan.layer_output, b_fold, rescale, bn.output]
    if plan.reshape is not None:
        inputs.append(plan.reshape.inputs[1])
    ctx = layer_op.name.rpartition("/")[0]

    def build(frozen_t, layer_output, b, s, bn_out, shape=None):
        def folded_branch():
            out = tf.multiply(layer_output, s, name="rescale_fold")
            out = tf.nn.bias_add(out, b, data_format="NCHW" if plan.channels_first else None,
                                 name="BiasAdd_Fold")
            if plan.squeeze is not None:
                out = tf.squeeze(out, plan.squeeze.get_attr("squeeze_dims"),
                                 name="Squeeze_Fold")
            if shape is not None:
                out = tf.reshape(out, shape, name="Reshape_Fold")
            return out

        return [tf.cond(frozen_t, folded_branch, lambda: tf.identity(bn_out))]

    refs = rewrite.nodes.python_ops((ctx + "/" if ctx else "") + "select_fold", inputs,
                                    build, device=bn.op.device)
    return refs[0]


def wire(plan: fold_plan.FoldPlan, emitted: emit_lib.Emitted, rewrite: rewrite_lib.Rewrite,
          freeze: Optional[Freeze], use_cond: bool) -> Optional[str]:
    """Adds one fold's reroutes to `rewrite`; returns the new output node."""
    bn, layer_op = plan.bn, plan.layer_op
    if plan.training:
        # The layer reads unscale_fold = w*s / s; its consumers are unchanged.
        rewrite.reroute(layer_op, 1, emitted.unscaled)
    else:
        rewrite.reroute(layer_op, 1, emitted.weights)
        rewrite.reroute_consumers(plan.layer_output, emitted.unscaled, plan.old_consumers)
    output = emitted.select or emitted.folded
    if plan.training:
        if freeze is not None and use_cond:
            output = _cond_output(plan, emitted, rewrite, freeze.frozen)
        for update in bn.updates:
            _update_value(update, bn, freeze, rewrite)
    if output is not None:
        rewrite.reroute_consumers(bn.output, output, emitted.bn_consumers)
    return output
