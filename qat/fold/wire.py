"""How one fold's new ops are wired in: reroutes, the freeze delay, the functional cond.

`qat.fold.emit` describes the new ops of a fold as NodeDefs; `wire` adds to
the pass's rewrite what connects them (the layer reads the folded weights, the
batch norm's consumers the folded output) and, for training folds with a
freeze delay, the shared `frozen` condition (`Freeze`), the moving-average
updates switched off once frozen (`_freeze_update`) and, with `use_cond`, the
functional cond that runs one branch (`_cond_output`). The structures are
described in `qat.fold.fold_batch_norms`. Importing this module registers the
select_fold gradient ("QatFoldSelect").
"""
from typing import Optional

import tensorflow as tf

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


def _freeze_update(update: bn_lib.MovingAverageUpdate, bn: bn_lib.BatchNorm,
                   freeze: Freeze, rewrite: rewrite_lib.Rewrite) -> None:
    """Switches a moving-average update off once the batch norm is frozen."""
    op, nodes = update.op, rewrite.nodes
    value = op.inputs[1]
    dtype = value.dtype.base_dtype
    scope = op.name.rpartition("/")[0]
    name = nodes.unique_name((scope + "/" if scope else "") + "freeze_fold")
    if update.is_delta:
        new = nodes.node(name, "Mul", [nodes.external(value), freeze.keep(dtype)],
                         device=op.device, T=dtype)
    else:
        is_mean = (bn.mean_variable is not None
                   and bn_lib.same_tensor(update.variable, bn.mean_variable))
        current = bn.moving_mean if is_mean else bn.moving_variance
        if current is not None:
            current = nodes.external(current)
        elif update.variable.dtype == tf.resource:
            current = nodes.node(name + "/ReadVariableOp", "ReadVariableOp",
                                 [nodes.external(update.variable)], device=op.device,
                                 dtype=dtype)
        else:
            current = nodes.node(name + "/Identity", "Identity",
                                 [nodes.external(update.variable)], device=op.device, T=dtype)
        new = nodes.node(name, "SelectV2", [freeze.frozen, current, nodes.external(value)],
                         device=op.device, T=dtype)
    rewrite.reroute(op, 1, new)


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
    if plan.training and freeze is not None:
        if use_cond:
            output = _cond_output(plan, emitted, rewrite, freeze.frozen)
        for update in bn.updates:
            _freeze_update(update, bn, freeze, rewrite)
    if output is not None:
        rewrite.reroute_consumers(bn.output, output, emitted.bn_consumers)
    return output
