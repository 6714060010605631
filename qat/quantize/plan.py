"""Planning the quantize pass: which tensors get a quantizer, named how.

`Planner` walks an unchanged graph and returns `Plan`s; `qat.quantize` builds
them. See `qat.quantize` for what gets a range and why.
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Set

import tensorflow as tf

from qat.matching import layer_patterns
from qat.quantize import quantizer_batch
from qat.quantize import patterns as qp
from qat.quantize import standalone_batch_norm


@dataclasses.dataclass
class Plan:
    tensor: tf.Tensor
    prefix: str
    is_weight: bool
    init_min: float
    consumers: List[tf.Operation]  # Ops whose inputs are rerouted.
    per_channel: bool = False
    # Layer ops reading the same weights through another read of the same
    # resource variable: their input 1 is set to the quantized weights.
    weight_sharers: List[tf.Operation] = dataclasses.field(default_factory=list)


def _context(op: tf.Operation) -> str:
    return op.name.rsplit("/", 1)[0] if "/" in op.name else ""


def _own_context(op: tf.Operation) -> str:
    """The op's scope, or its own name for ops at the root."""
    return _context(op) or op.name


def _join(ctx: str, kind: str) -> str:
    return ctx + "/" + kind if ctx else kind


def _in_scope(op: tf.Operation, scope: Optional[str]) -> bool:
    return not scope or op.name.startswith(scope)


def _is_float(t: tf.Tensor) -> bool:
    # Floats FakeQuant can quantize (float16 / bfloat16 through float32);
    # not a fused batch norm's statistics outputs (only output 0 is data).
    return t.dtype.base_dtype in quantizer_batch.QUANTIZABLE_DTYPES and not (
        t.value_index and t.op.type in qp.BATCH_NORM_TYPES)


def _reaches(start: tf.Operation, target: tf.Operation, depth: int = 5) -> bool:
    frontier = [start]
    for _ in range(depth):
        nxt = []
        for op in frontier:
            if op is target:
                return True
            for out in op.outputs:
                nxt.extend(out.consumers())
        frontier = nxt
    return any(op is target for op in frontier)


def existing_quantizer(t: tf.Tensor):
    """Finds the quantizer an earlier pass put on `t`.

    Returns:
      (output tensor consumers read, set of quantizer ops reading `t`), or
      (None, empty set) when `t` has no quantizer.
    """
    fake_quant = None
    reshape = None
    for c in t.consumers():
        if c.type in quantizer_batch.FAKE_QUANT_TYPES and c.inputs[0] is t:
            fake_quant = c
        elif c.type == "Reshape":
            for cc in c.outputs[0].consumers():
                if cc.type in quantizer_batch.FAKE_QUANT_TYPES:
                    fake_quant, reshape = cc, c
    if fake_quant is None:
        return None, set()
    out = fake_quant.outputs[0]
    if reshape is not None:
        back = [c for c in out.consumers() if c.type == "Reshape"]
        if back:
            out = back[0].outputs[0]
    internal = {fake_quant}
    if reshape is not None:
        internal.add(reshape)
    for c in out.consumers():
        if c.type in ("Select", "SelectV2") and c.inputs[2] is t:
            internal.add(c)
            out = c.outputs[0]
    for c in t.consumers():
        if c.type in ("Min", "Max") and _reaches(c, fake_quant):
            internal.add(c)
    return out, internal


def is_quantized_output(t: tf.Tensor) -> bool:
    """True if `t` is the output of a quantizer (FakeQuant or its delay)."""
    op = t.op
    if op.type in quantizer_batch.FAKE_QUANT_TYPES:
        return True
    if op.type in ("Select", "SelectV2", "Reshape"):
        return any(i.op.type in quantizer_batch.FAKE_QUANT_TYPES for i in op.inputs)
    return False


class Planner(object):
    """Plans the quantizers of one graph without changing it."""

    def __init__(self, graph, is_training, scope, per_channel):
        self.graph = graph
        self.is_training = is_training
        self.scope = scope
        self.per_channel = per_channel
        self.plans: "collections.OrderedDict[tf.Tensor, Plan]" = (
            collections.OrderedDict())
        self.prefixes: Set[str] = set()
        self.tail_ops: Set[tf.Operation] = set()
        self.weight_plans: Dict[object, Plan] = {}
        self.standalone_bns: List[tf.Operation] = []
        self.library = None
        ops = graph.get_operations()
        self.gradient_ops = self._gradient_ops(ops)
        layers = layer_patterns.layer_ops(graph)
        layers += [op for op in ops if op.type in qp.TRANSPOSED_CONV_TYPES]
        self.layers = [op for op in layers if op not in self.gradient_ops]
        self.data_ops = self._data_ops(ops)

    # --- Graph analysis -----------------------------------------------------

    @staticmethod
    def _forward_closure(seeds) -> Set[tf.Operation]:
        seen = set(seeds)
        stack = list(seeds)
        while stack:
            op = stack.pop()
            for out in op.outputs:
                for c in out.consumers():
                    if c not in seen:
                        seen.add(c)
                        stack.append(c)
        return seen

    def _gradient_ops(self, ops) -> Set[tf.Operation]:
        # tf.gradients builds each gradient function under its forward op
        # (recorded as `_original_op`); imported graphs lose that, so gradient
        # kernels (ReluGrad, Conv2DBackpropInput, ...) are seeds as well.
        seeds = [op for op in ops
                 if getattr(op, "_original_op", None) is not None
                 or qp.is_gradient_kernel(op)]
        return self._forward_closure(seeds)

    def _data_ops(self, ops) -> Set[tf.Operation]:
        seeds = list(self.layers)
        seeds.extend(qp.data_input(layer).op for layer in self.layers)
        seeds.extend(op for op in ops if op.type in qp.INPUT_TYPES
                     and any(_is_float(o) for o in op.outputs))
        return self._forward_closure(seeds)

    def _library(self):
        """{function name: FunctionDef} of the graph (If branches)."""
        if self.library is None:
            self.library = {f.signature.name: f for f in
                            self.graph.as_graph_def().library.function}
        return self.library

    def _is_data(self, t: tf.Tensor) -> bool:
        return t.op in self.data_ops

    def _consumers(self, t: tf.Tensor, exclude=()) -> List[tf.Operation]:
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

    def _walk_tail(self, layer: tf.Operation):
        """Returns (tail ops, layer output tensor) of a layer op."""
        tail = {layer}
        stack = [layer]
        while stack:
            op = stack.pop()
            for out in op.outputs:
                for c in out.consumers():
                    if (c in tail or c in self.gradient_ops
                            or c.type not in qp.TAIL_TYPES):
                        continue
                    if all(i.op in tail or not self._is_data(i)
                           for i in c.inputs):
                        tail.add(c)
                        stack.append(c)
        self._prune_reshaping_leaves(layer, tail)
        exits = []
        for op in tail:
            for out in op.outputs:
                if not _is_float(out):
                    continue
                outside = [c for c in out.consumers()
                           if c not in tail and c not in self.gradient_ops
                           and not qp.is_state_update(c)
                           and c.type not in qp.METADATA_TYPES]
                if outside:
                    exits.append(out)
        if not exits:
            # Nothing reads the tail yet (a final layer the user fetches).
            exits = [out for op in tail for out in op.outputs
                     if _is_float(out) and not out.consumers()]
        rank = layer.outputs[0].shape.rank
        same_rank = [t for t in exits if t.shape.rank == rank]
        exits = same_rank or exits
        if not exits:
            return tail, None
        exits.sort(key=lambda t: (t.op._id, t.value_index))  # pylint: disable=protected-access
        return tail, exits[-1]

    def _prune_reshaping_leaves(self, layer, tail) -> None:
        """Drops reshaping ops that end a tail (global pooling, flatten).

        `conv -> Mean` or `conv -> Reshape -> MatMul` leave the layer there;
        the conv output, not the pooled one, is the layer output.
        """
        changed = True
        while changed:
            changed = False
            for op in list(tail):
                if op is layer or op.type not in qp.RESHAPING_TYPES:
                    continue
                consumers = [c for out in op.outputs for c in out.consumers()
                             if c not in self.gradient_ops]
                if (not any(c in tail for c in consumers) and any(
                        not qp.is_state_update(c) for c in consumers)):
                    tail.discard(op)
                    changed = True

    # --- Planning -----------------------------------------------------------

    def _unique_prefix(self, prefix: str) -> str:
        candidate, i = prefix, 0
        while candidate in self.prefixes or self._name_taken(candidate):
            i += 1
            candidate = "%s_%d" % (prefix, i)
        self.prefixes.add(candidate)
        return candidate

    def _name_taken(self, prefix: str) -> bool:
        try:
            self.graph.get_operation_by_name(prefix + "/min")
            return True
        except KeyError:
            return False

    def _is_handled(self, t: tf.Tensor) -> bool:
        return (t in self.plans or is_quantized_output(t)
                or existing_quantizer(t)[0] is not None)

    def _plan(self, t: tf.Tensor, ctx: str, kind: str, init_min: float,
              consumers: List[tf.Operation], is_weight: bool = False,
              per_channel: bool = False, allow_unused: bool = False) -> bool:
        if self._is_handled(t) or not _is_float(t):
            return False
        if not consumers and not allow_unused:
            return False
        self.plans[t] = Plan(t, self._unique_prefix(_join(ctx, kind)),
                              is_weight, init_min, consumers, per_channel)
        return True

    def _effective(self, t: tf.Tensor) -> tf.Tensor:
        out, _ = existing_quantizer(t)
        return t if out is None else out

    def _activation_of(self, t: tf.Tensor) -> Optional[tf.Operation]:
        """The activation reading `t`; a real one before an Identity."""
        found = [c for c in self._consumers(t, exclude=self.tail_ops)
                 if c.type in qp.ACTIVATION_TYPES and c.inputs[0] is t]
        found.sort(key=lambda c: c.type == "Identity")
        return found[0] if found else None

    def _residual_adds(self, t: tf.Tensor) -> List[tf.Operation]:
        found = []
        for c in self._consumers(t, exclude=self.tail_ops):
            if c.type not in qp.RESIDUAL_ADD_TYPES or len(c.inputs) != 2:
                continue
            if all(self._is_data(i) for i in c.inputs):
                found.append(c)
        return found

    def _weight_readers(self, w: tf.Tensor) -> List[tf.Operation]:
        """Layers reading weights `w`, or the training fold's unscale Mul
        (`layer_patterns.UNSCALED_WEIGHTS`) they read `w` through."""
        def reads(c):
            return c.type in qp.LAYER_TYPES and c.inputs[1] is w
        return [c for c in w.consumers() if c not in self.gradient_ops and (
            reads(c) or c.type == "Mul" and any(
                op.type in layer_patterns.LAYER_TYPES
                and layer_patterns.weight_input(op) is w
                for op in c.outputs[0].consumers()))]

    def plan_weights(self, layer: tf.Operation) -> None:
        # Input 1 for every layer type; w*s behind the fold's unscale Mul.
        w = (layer_patterns.weight_input(layer)
             if layer.type in layer_patterns.LAYER_TYPES else layer.inputs[1])
        if is_quantized_output(w):
            return
        # Reads of one resource variable are one weight: quantized once.
        key = w.op.inputs[0] if w.op.type == "ReadVariableOp" else w
        shared = self.weight_plans.get(key)
        if shared is not None:
            if shared.tensor is not w and layer not in shared.weight_sharers:
                shared.weight_sharers.append(layer)
            return
        sharing = self._weight_readers(w)
        # Per channel means along the output channels, the last axis of the
        # weights (depthwise: reshaped in _spec); not for transposed layouts.
        per_channel = (self.per_channel and w.shape.rank in (2, 4)
                       and layer.type not in qp.TRANSPOSED_CONV_TYPES
                       and not (layer.type == "MatMul"
                                and layer.get_attr("transpose_b")))
        if self._plan(w, _context(layer), "weights_quant", -6.0, sharing,
                      is_weight=True, per_channel=per_channel):
            self.weight_plans[key] = self.plans[w]

    def plan_layer_output(self, layer: tf.Operation) -> None:
        tail, out = self._walk_tail(layer)
        self.tail_ops |= tail
        if out is None:
            return
        ctx = _context(layer)
        activation = self._activation_of(out)
        if (out.op.type in qp.ACTIVATION_TYPES and
                (activation is None or activation.type == "Identity")):
            # An Identity ending the tail is the activation, unless a real
            # one follows (tf.cond's output Identity before a Relu).
            activation = out.op
        if activation is not None:
            act_out = activation.outputs[0]
            consumers = self._consumers(act_out)
            if activation.type == "Identity" and not consumers:
                self._plan_fetched_identity(activation, tail, ctx)
                return
            # A fetched activation output still gets its range (a warning
            # says to export the act_quant output).
            self._plan(act_out, ctx, "act_quant", 0.0, consumers,
                       allow_unused=True)
            for add in self._residual_adds(self._effective(act_out)):
                self.plan_add_output(add, after_activation=True)
            return
        adds = self._residual_adds(self._effective(out))
        consumers = self._consumers(out, exclude=tail)
        consumers += self._fetched_identities(out, tail)
        if adds:
            self._plan(out, ctx, "conv_quant", -6.0, consumers)
            for add in adds:
                self.plan_add_output(add, after_activation=False)
        else:
            # A final layer's output may have no consumer yet (fetched by
            # the user): it still gets its range for export.
            self._plan(out, ctx, "act_quant", -6.0, consumers,
                       allow_unused=True)

    def _fetched_identities(self, t: tf.Tensor, tail) -> List[tf.Operation]:
        """Tail Identity ops reading `t` whose output only the user fetches."""
        return [c for c in t.consumers()
                if c.type == "Identity" and c in tail
                and not self._consumers(c.outputs[0])]

    def _plan_fetched_identity(self, identity: tf.Operation, tail,
                               ctx: str) -> None:
        """act_quant for a layer ending in an Identity nothing reads.

        `tf.identity(logits, name="output")` is the model output the user
        fetches and exports: a FakeQuant after it would feed nothing and the
        exported layer would stay float. The act_quant goes on the Identity's
        input and the Identity reads it: the same values as a FakeQuant after
        the Identity (contrib's place), under the name the user fetches.
        """
        t = identity.inputs[0]
        consumers = [c for c in self._consumers(t)
                     if c is identity or c not in tail]
        self._plan(t, ctx, "act_quant", -6.0, consumers)

    def plan_add_output(self, add: tf.Operation, after_activation: bool) -> None:
        if not _in_scope(add, self.scope) or add in self.gradient_ops:
            return
        out = add.outputs[0]
        ctx = _context(add)
        activation = self._activation_of(out)
        if activation is not None:
            act_out = activation.outputs[0]
            self._plan(act_out, ctx, "act_quant", 0.0,
                       self._consumers(act_out))
            return
        kind = "post_activation_bypass_quant" if after_activation else "add_quant"
        self._plan(out, ctx, kind, -6.0, self._consumers(out))

    def _handled_through(self, t: tf.Tensor) -> bool:
        """True if `t` has a range, maybe behind same-scale ops (pooling...)."""
        while not self._is_handled(t):
            if t.op.type not in qp.SAME_SCALE_TYPES or not t.op.inputs:
                return False
            t = t.op.inputs[0]
        return True

    @staticmethod
    def _is_spatial_mean(op: tf.Operation) -> bool:
        """A global average pooling: Mean of a 4-D tensor over H and W."""
        if op.inputs[0].shape.rank != 4 or op.inputs[1].op.type != "Const":
            return False
        axes = tf.make_ndarray(op.inputs[1].op.get_attr("value")).ravel()
        axes = {int(a) % 4 for a in axes}
        return axes in ({1, 2}, {2, 3})

    def plan_other_outputs(self) -> None:
        """Concat, global-pooling Mean and residual-add outputs outside tails.

        Only where the inputs already have ranges, so model code gets them
        and loss arithmetic (a mean of the cross entropy, a sum of losses)
        does not.
        """
        for op in sorted(self.data_ops, key=lambda o: o._id):  # pylint: disable=protected-access
            if (op in self.tail_ops or op in self.gradient_ops
                    or not _in_scope(op, self.scope) or not op.outputs):
                continue
            if op.type in qp.CONCAT_TYPES:
                values = [i for i in op.inputs if _is_float(i)]
                if values and all(self._handled_through(i) for i in values):
                    self._plan(op.outputs[0], _own_context(op), "concat_quant",
                               -6.0, self._consumers(op.outputs[0]))
            elif op.type in qp.MEAN_TYPES:
                if (self._is_spatial_mean(op)
                        and self._handled_through(op.inputs[0])):
                    self._plan(op.outputs[0], _own_context(op), "mean_quant",
                               -6.0, self._consumers(op.outputs[0]))
            elif (op.type in qp.BATCH_NORM_TYPES
                  or standalone_batch_norm.is_batch_norm_cond(
                      op, self._library())):
                self.plan_standalone_batch_norm(op)
            elif (op.type in qp.RESIDUAL_ADD_TYPES and len(op.inputs) == 2
                  and all(self._is_data(i) for i in op.inputs)
                  and all(self._handled_through(i) for i in op.inputs)):
                after = any(i.op.type in qp.ACTIVATION_TYPES
                            or is_quantized_output(i) for i in op.inputs)
                self.plan_add_output(op, after_activation=after)

    def plan_standalone_batch_norm(self, bn: tf.Operation) -> None:
        """A range for a batch norm that follows no layer (contrib had none).

        Input normalisation, or a batch norm after a concat or an add: the
        fold pass leaves it alone. Its input gets a range as a layer input
        would, its output `<bn ctx>/bn_quant`, or `<bn ctx>/act_quant` after
        the activation reading it. Eval graphs then replace it by a 1x1
        depthwise conv TFLite runs in integer (`qat.quantize.standalone_batch_norm`).
        """
        if standalone_batch_norm.is_replaced(bn):
            return  # An earlier pass moved its consumers to the depthwise form.
        self.standalone_bns.append(bn)
        x = standalone_batch_norm.data_input(bn, self._is_data)
        if x is not None:
            self.plan_layer_input(bn, x)
        out = bn.outputs[0]
        ctx = _context(bn)
        activation = self._activation_of(out)
        if activation is not None and activation.type != "Identity":
            act_out = activation.outputs[0]
            self._plan(act_out, ctx, "act_quant", 0.0,
                       self._consumers(act_out), allow_unused=True)
            others = [c for c in self._consumers(out) if c is not activation]
            if others:
                self._plan(out, ctx, "bn_quant", -6.0, others)
            return
        self._plan(out, ctx, "bn_quant", -6.0, self._consumers(out),
                   allow_unused=True)

    def plan_layer_input(self, layer: tf.Operation,
                         t: Optional[tf.Tensor] = None) -> None:
        t = qp.data_input(layer) if t is None else t
        while (t.op.type in qp.SAME_SCALE_TYPES and t.op.inputs
               and not self._is_handled(t)):
            t = t.op.inputs[0]
        if self._is_handled(t) or not _is_float(t):
            return
        kind = "input_quant" if t.op.type in qp.INPUT_TYPES else "output_quant"
        self._plan(t, _own_context(t.op), kind, -6.0, self._consumers(t))

    def run(self) -> List[Plan]:
        layers = [op for op in self.layers if _in_scope(op, self.scope)]
        for layer in layers:
            self.plan_weights(layer)
        for layer in layers:
            self.plan_layer_output(layer)
        self.plan_other_outputs()
        for layer in layers:
            self.plan_layer_input(layer)
        return list(self.plans.values())
