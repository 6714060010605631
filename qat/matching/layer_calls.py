"""A function call that computes one layer op, recognised by its body.

A function call (PartitionedCall / StatefulPartitionedCall) whose body is one
layer op of `CALLED_LAYER_TYPES` reading the call's two arguments (data,
weights) and returned, maybe through Identity ops, is that layer
(`called_layer`). tf_keras computes a grouped `Conv2D(groups > 1)` this way
(an XLA-compiled `_jit_compiled_convolution_op`, whose Conv2D reads
[kh, kw, in / groups, out] weights), Keras 3 too, passing the variable's
handle; `qat.prepare.layer_calls` puts the layer op in the graph before the
passes run.
"""
import dataclasses
from typing import Dict, Optional

import tensorflow as tf
from tensorflow.core.framework import function_pb2
from tensorflow.core.framework import node_def_pb2

from qat.engine import function_library
from qat.matching.layer_patterns import VARIABLE_READ_TYPES

# Function calls whose body can be one layer op (`called_layer`).
LAYER_CALL_TYPES = function_library.FUNCTION_CALL_TYPES
CALLED_LAYER_TYPES = ("Conv2D",)


def _body_source(ref: str) -> str:
    """The node (or argument) name of a FunctionDef tensor reference."""
    return ref.split(":")[0]


@dataclasses.dataclass(frozen=True)
class CalledLayer:
    """The layer op a function call computes (`called_layer`).

    Attributes:
      node: the body's layer NodeDef.
      data: which input of the call is the layer's data.
      weights: which input of the call holds the weights.
      read_dtype: None when that input is the weights tensor; the variable's
        dtype when it is the variable's resource handle, which the body reads
        (ReadVariableOp) into the layer.
    """
    node: node_def_pb2.NodeDef
    data: int
    weights: int
    read_dtype: Optional[tf.DType] = None


def called_layer(call_op: tf.Operation,
                 library: Dict[str, function_pb2.FunctionDef]
                 ) -> Optional[CalledLayer]:
    """The layer a function call computes, if its body is just that layer.

    The body is one `CALLED_LAYER_TYPES` op reading the function's two
    arguments, data and weights in either order (tf_keras passes the weights
    tensor, Keras 3 the variable's handle, read in the body by a
    ReadVariableOp), returned maybe through Identity ops; a NoOp may hold
    the read as a control output.

    Args:
      call_op: any op; only a `LAYER_CALL_TYPES` op with two inputs and one
        output can be a layer call.
      library: the graph's functions by name.

    Returns:
      The called layer, or None if `call_op` is not such a call.
    """
    if (call_op.type not in LAYER_CALL_TYPES or len(call_op.inputs) != 2
            or len(call_op.outputs) != 1):
        return None
    body = library.get(call_op.get_attr("f").name)
    if (body is None or len(body.signature.input_arg) != 2
            or len(body.signature.output_arg) != 1):
        return None
    nodes = {node.name: node for node in body.node_def}
    args = [arg.name for arg in body.signature.input_arg]
    layers = [n for n in body.node_def if n.op in CALLED_LAYER_TYPES]
    reads = [n for n in body.node_def if n.op in VARIABLE_READ_TYPES]
    if len(layers) != 1 or len(reads) > 1:
        return None
    layer = layers[0]
    if any(n.op not in ("Identity", "NoOp") for n in body.node_def
           if n is not layer and n not in reads):
        return None
    if any(_body_source(ref) not in [r.name for r in reads]
           for ref in body.control_ret.values()):
        return None
    sources = [_body_source(i) for i in layer.input if not i.startswith("^")]
    if len(sources) != 2 or sources[0] not in args:
        return None  # The data must come straight from an argument.
    data = args.index(sources[0])
    read_dtype = None
    if reads:
        read = reads[0]
        if sources[1] != read.name or [_body_source(i) for i in read.input] != [args[1 - data]]:
            return None
        read_dtype = tf.as_dtype(read.attr["dtype"].type)
    elif sources[1] != args[1 - data]:
        return None
    source = _body_source(body.ret[body.signature.output_arg[0].name])
    while source in nodes and nodes[source].op == "Identity":
        if any(i.startswith("^") and _body_source(i[1:]) not in nodes
               for i in nodes[source].input):
            return None
        source = _body_source(nodes[source].input[0])
    if source != layer.name:
        return None
    return CalledLayer(layer, data, 1 - data, read_dtype)
