"""Mixed precision: what a quantized Keras model computes in which dtype.

A Keras layer under a `mixed_float16` / `mixed_bfloat16` policy keeps float32
variables and computes in float16 / bfloat16, with casts wherever it meets
float32 (its weights, a batch norm's float32 arithmetic, a float32 output
layer). Those casts are float ops TFLite keeps, and they would stand between
the layers and the ranges qat plans. So qat traces every function of a
quantized model with the Keras layers computing in float32 (`float32_trace`):
the planner, the batch-norm fold and the emitter see the float32 twin's graph,
the ranges, their names and the checkpoint are the float32 twin's, and the
eval function (what `evaluate`, `predict` and TFLite's converter see) is the
float32 twin's eval graph, with float32 inputs and outputs.

Training keeps the speed mixed precision is for where the work is: in the
training function, each layer op qat quantized (conv, depthwise conv, dense /
matmul, transposed conv, weighted einsum) whose Keras layer computes in a low
precision reads its quantized input and quantized weights cast to that dtype
and computes in it; its output is cast back to float32 for the bias, the folded
batch norm, the activation and the FakeQuant, which takes float32 only
(`lower_layers`). The FakeQuant arithmetic, the folding of the weights and the
ranges stay float32; gradients of the low-precision layers are low-precision,
which is what Keras's loss scaling is for.
"""
import contextlib
from typing import Dict, Iterator, List, Optional

import tensorflow as tf

from qat.engine import marks
from qat.engine import node_attrs
from qat.engine import rewrite as rewrite_lib
from qat.matching import layer_patterns
from qat.matching import tensors

LOW_PRECISION = (tf.float16, tf.bfloat16)
# Layer ops that compute in a layer's low precision: the quantized ones.
_LAYER_TYPES = layer_patterns.FOLDABLE_TYPES + layer_patterns.WEIGHTED_OPERAND_TYPES
# How far back from a layer's weights the variables it reads are looked for
# (the fold's scale, the quantizer's reductions and delay).
_MAX_WEIGHT_DEPTH = 24


class Precision(object):
    """The compute dtypes of a Keras model's layers and how qat traces them.

    Args:
      model: a Keras 3 or tf_keras model.
      flavour: "keras" or "tf_keras".
    """

    def __init__(self, model, flavour: str):
        self._flavour = flavour
        layers = list(model._flatten_layers(include_self=True))  # pylint: disable=protected-access
        self._low_layers = [layer for layer in layers if _compute_dtype(layer) in LOW_PRECISION]
        # id of a variable handle -> the compute dtype of the innermost layer
        # owning it (a layer's weights include its sublayers'; outer first).
        self._dtype_by_handle: Dict[int, tf.DType] = {}
        for layer in layers:
            dtype = _compute_dtype(layer)
            for weight in layer.weights:
                for handle in _handles(weight):
                    self._dtype_by_handle[id(handle)] = dtype

    @property
    def is_mixed(self) -> bool:
        """Whether some layer computes in float16 or bfloat16."""
        return bool(self._low_layers)

    @contextlib.contextmanager
    def float32_trace(self) -> Iterator[None]:
        """Within: every layer computes in float32 (its policy restored after)."""
        saved = [(layer, layer._dtype_policy) for layer in self._low_layers]  # pylint: disable=protected-access
        try:
            for layer, _ in saved:
                _set_policy(layer, self._flavour, "float32")
            yield
        finally:
            for layer, policy in saved:
                _set_policy(layer, self._flavour, policy)

    def lower_layers(self, graph: tf.Graph) -> List[str]:
        """Makes each quantized layer op of `graph` compute in its layer's dtype.

        A layer op whose weights qat quantized and whose weights are computed
        from a variable of a low-precision Keras layer is rebuilt in that
        dtype, reading its float32 inputs cast to it; its readers read its
        output cast back to float32. A layer of several low-precision layers'
        variables (a conv and the batch norm folded into it) takes the
        conv's weights' layer dtype: the first one found from the weights.

        Args:
          graph: a training function's graph after qat's rewrite, while it
            is traced (`qat.engine.function_graphs.editing`).

        Returns:
          The names of the layer ops rebuilt (the originals, now unread).

        Raises:
          qat.engine.rewrite.RewriteError: the new ops fail TensorFlow's checks
            (the graph is unchanged).
        """
        if not self._low_layers:
            return []
        captured = {id(internal.op): external for external, internal in graph.captures}
        rewrite = rewrite_lib.Rewrite(graph, marks.LOW_PRECISION)
        nodes = rewrite.nodes
        lowered = []
        for op in graph.get_operations():
            if op.type not in _LAYER_TYPES or (op.type == "Einsum" and len(op.inputs) != 2):
                continue
            weights = layer_patterns.weight_input(op)
            if not marks.made_by_qat(weights.op, marks.QUANTIZER_OUTPUT):
                continue
            quantized = _fake_quant_input(weights)
            dtype = None if quantized is None else self._weights_dtype(quantized, captured)
            if dtype not in LOW_PRECISION:
                continue
            scope = op.name + "/" + dtype.name
            inputs = []
            for k, t in enumerate(op.inputs):
                if t.dtype == tf.float32:
                    inputs.append(nodes.node(nodes.unique_name(f"{scope}/input_{k}"), "Cast",
                                             [nodes.external(t)], SrcT=tf.float32, DstT=dtype))
                else:
                    inputs.append(nodes.external(t))
            # Every float32 type attribute (T; BatchMatMulV3's Ta, Tb, Tout).
            attrs = {key: (_type_attr(dtype) if value.type == tf.float32.as_datatype_enum
                           else value)
                     for key, value in node_attrs.public_attrs(op.node_def.attr).items()}
            layer = nodes.node(nodes.unique_name(scope), op.type, inputs, device=op.device,
                               **attrs)
            output = nodes.node(nodes.unique_name(f"{scope}/to_float32"), "Cast", [layer],
                                SrcT=dtype, DstT=tf.float32)
            rewrite.reroute_consumers(op.outputs[0], output, op.outputs[0].consumers())
            lowered.append(op.name)
        rewrite_lib.apply(rewrite)
        return lowered

    def _weights_dtype(self, weights: tf.Tensor, captured) -> Optional[tf.DType]:
        """The compute dtype of the low-precision layer whose variable
        `weights` is computed from, nearest first; None if there is none or
        if `weights` is computed from the function's inputs (an activation:
        the second operand of attention scores)."""
        frontier, seen = [weights.op], {weights.op}
        found = None
        for _ in range(_MAX_WEIGHT_DEPTH):
            following = []
            for op in frontier:
                if op.type == "Placeholder":
                    handle = captured.get(id(op))
                    if handle is None:
                        return None  # A function input: data.
                    if found is None:
                        found = self._dtype_by_handle.get(id(handle))
                    continue
                for t in op.inputs:
                    if t.op not in seen:
                        seen.add(t.op)
                        following.append(t.op)
            frontier = following
            if not frontier:
                return found
        return None


def _fake_quant_input(quantizer_output: tf.Tensor) -> Optional[tf.Tensor]:
    """What the quantizer ending in `quantizer_output` quantizes: its
    FakeQuant's input (behind a delay's Select or a depthwise reshape)."""
    frontier, seen = [quantizer_output.op], set()
    while frontier:
        op = frontier.pop()
        if op.type in tensors.FAKE_QUANT_TYPES:
            return op.inputs[0]
        seen.add(op)
        frontier.extend(t.op for t in op.inputs if t.op not in seen
                        and marks.made_by_qat(t.op, marks.QUANTIZER, marks.QUANTIZER_OUTPUT))
    return None


def _compute_dtype(layer) -> Optional[tf.DType]:
    dtype = getattr(layer, "compute_dtype", None)
    try:
        return tf.as_dtype(dtype) if dtype else None
    except TypeError:
        return None


def _set_policy(layer, flavour: str, policy) -> None:
    if flavour == "tf_keras":
        layer._set_dtype_policy(policy)  # pylint: disable=protected-access
    else:
        if isinstance(policy, str):
            from keras import dtype_policies  # pylint: disable=import-outside-toplevel
            policy = dtype_policies.get(policy)
        layer._dtype_policy = policy  # pylint: disable=protected-access


def _handles(weight) -> List[tf.Tensor]:
    """The resource handles a trace may read `weight` through: its own, or
    each replica's component's under a strategy."""
    # A Keras 3 weight wraps a tf.Variable; tf_keras's AutoCastVariable is one.
    variable = weight if isinstance(weight, tf.Variable) else weight.value
    components = getattr(variable, "values", None)
    if components:
        return [c.handle for c in components]
    return [variable.handle]


def _type_attr(dtype: tf.DType):
    from tensorflow.core.framework import attr_value_pb2  # pylint: disable=import-outside-toplevel
    return attr_value_pb2.AttrValue(type=dtype.as_datatype_enum)
