"""Layers computed by a function call, put in the graph as the layer op itself.

tf_keras computes a grouped convolution (`Conv2D(groups=g)`, g > 1, also
`groups == channels` as ConvNeXt writes its depthwise convolutions) as a call
of an XLA-compiled function whose body is one Conv2D with weights
[kh, kw, in / g, out] (`qat.matching.layer_calls.called_layer`). Function
bodies are out of the passes' reach: the batch norm after the call was not
folded and the weights stayed float. `inline_layer_calls` adds the body's
Conv2D to the graph, reading the call's own inputs, and moves the call's
consumers onto it; the call is left unconnected and marked
(`qat.engine.marks.is_replaced`). From then on the grouped Conv2D is a layer
like any other: batch norm folded per output channel, weights quantized
(per channel where the flavour asks for it), the bias and activation after it
fused by TFLite into one CONV_2D (TFLite keeps a grouped Conv2D as a grouped
CONV_2D, integer in both flavours, also when groups == channels).

A call the user asked XLA to compile (`_XlaMustCompile`, as tf_keras does) is
replaced by a Conv2D XLA still compiles (`_XlaCompile`, `_XlaScope`), whose
gradient TensorFlow then compiles too: TensorFlow's own CPU kernels compute a
grouped convolution but refuse its gradient without oneDNN.
"""
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from qat.engine import function_library
from qat.engine import marks
from qat.engine import node_attrs
from qat.engine import op_index
from qat.engine import rewrite as rewrite_lib
from qat.matching import layer_calls


def _must_compile(op: tf.Operation) -> bool:
    try:
        return bool(op.get_attr("_XlaMustCompile"))
    except ValueError:
        return False


def inline_layer_calls(graph: tf.Graph) -> int:
    """Replaces each function call that computes one layer by that layer op.

    Args:
      graph: the graph to rewrite in place (training or eval). Calls nothing
        reads and calls replaced before are left alone, so a second call
        changes nothing.

    Returns:
      How many calls were replaced.

    Raises:
      qat.engine.rewrite.RewriteError: if the new ops fail their checks; the
        graph is then unchanged.
    """
    calls = [op for op in op_index.ops_of_types(graph, layer_calls.LAYER_CALL_TYPES)
             if not marks.is_replaced(op)
             and op.outputs and op.outputs[0].consumers()]
    if not calls:
        return 0
    library = function_library.library_of(graph)
    rewrite = rewrite_lib.Rewrite(graph, marks.LAYER_CALL)
    nodes = rewrite.nodes
    count = 0
    for call in calls:
        called = layer_calls.called_layer(call, library)
        if called is None:
            continue
        layer = called.node
        scope = call.name.rpartition("/")[0]
        name = nodes.unique_name(f"{scope}/{layer.op}" if scope else layer.op)
        attrs = node_attrs.public_attrs(layer.attr)
        if _must_compile(call):
            attrs["_XlaCompile"] = attr_value_pb2.AttrValue(b=True)
            attrs["_XlaSeparateCompiledGradients"] = attr_value_pb2.AttrValue(b=False)
            attrs["_XlaScope"] = attr_value_pb2.AttrValue(s=("qat_" + name).encode())
        weights = nodes.external(call.inputs[called.weights])
        if called.read_dtype is not None:
            # Keras 3 passes the variable's handle: read it here, as the body did.
            weights = nodes.node(nodes.unique_name(name + "/ReadVariableOp"), "ReadVariableOp",
                                 [weights], device=call.device, dtype=called.read_dtype)
        out = nodes.node(name, layer.op, [nodes.external(call.inputs[called.data]), weights],
                         device=call.device, **attrs)
        rewrite.reroute_consumers(call.outputs[0], out, call.outputs[0].consumers())
        rewrite.set_attr(call, marks.REPLACED_BY_ATTR,
                         attr_value_pb2.AttrValue(s=out.encode()))
        count += 1
    if count:
        rewrite_lib.apply(rewrite)
    return count
