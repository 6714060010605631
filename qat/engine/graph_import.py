"""How a batch of NodeDefs gets into a graph: TensorFlow's C++ import.

`qat.engine.node_batch` collects the NodeDefs; this module imports them,
into an empty scratch graph to check them (`import_checked`) or into the
user's graph (`import_nodes`, all nodes or none), and gives the new ops
their Python `Operation` objects with as little per-op Python work as the
graph allows: for a network of a few thousand new ops, that wrapping costs
more than the C++ import itself.
"""
import functools
from typing import Dict, Iterable, List, Sequence

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
from tensorflow.python.framework import c_api_util
from tensorflow.python.framework import ops as tf_ops


def empty_graph_def() -> graph_pb2.GraphDef:
    """An empty GraphDef of this TensorFlow's version.

    Without a producer version, a Placeholder of shape [] means "unknown
    shape" (the rule of GraphDefs older than version 21).
    """
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.producer = tf.version.GRAPH_DEF_VERSION
    graph_def.versions.min_consumer = tf.version.GRAPH_DEF_VERSION_MIN_CONSUMER
    return graph_def


@functools.lru_cache(maxsize=None)
def canonical_device(device: str) -> str:
    """`device` as TensorFlow writes it on ops (`/cpu:0` -> `/device:CPU:0`)."""
    return tf.DeviceSpec.from_string(device).to_string()


def no_colocation(node) -> None:
    """Gives `node` an empty colocation list unless it has one.

    TensorFlow's import asks every new op for its `_class` attribute; for an
    op without one that lookup raises and catches an error, which costs more
    than the rest of the import of that op.
    """
    if "_class" not in node.attr:
        node.attr["_class"].list.SetInParent()


def add_stand_in(graph_def: graph_pb2.GraphDef, name: str, dtype: tf.DType,
                  shape: tf.TensorShape) -> None:
    """Adds a node to `graph_def` standing in for a tensor of this dtype and shape.

    Written as a NodeDef rather than with `tf.compat.v1.placeholder`: a
    batch has hundreds of them, and Python op constructors are slow.
    """
    node = graph_def.node.add()
    node.name = name
    if dtype._is_ref_dtype:  # pylint: disable=protected-access
        # Ref inputs (ref variables) need a ref tensor: a variable op.
        node.op = "VariableV2"
        node.attr["dtype"].type = dtype.base_dtype.as_datatype_enum
    else:
        node.op = "Placeholder"
        node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())


def import_checked(serialized_graph_def: bytes,
                   outputs: Sequence[str]) -> Dict[str, tf.TensorSpec]:
    """Imports a GraphDef into an empty scratch graph, in C++ only.

    TensorFlow checks every node (op type, attributes, dtypes, shape
    inference) during the C++ import; `import_graph_def` would then also
    build a Python object for each of them, which costs more than the import
    itself and is not needed for a check. Only the ops of `outputs` get one.

    The scratch graph is dismantled before this returns. Its ops and the
    graph reference each other, so without that it would live on until a
    full garbage collection, and the rewrite would import the batch into the
    user's graph with the scratch copy still in memory: the peak memory of
    the rewrite would hold the new ops twice.

    Returns:
      {`name:<i>`: its dtype and shape} for `outputs`.

    Raises:
      ValueError: TensorFlow's message for a bad node.
    """
    graph = tf.Graph()
    try:
        options = _import_options()
        for ref in outputs:
            name, _, index = ref.partition(":")
            c_api.TF_ImportGraphDefOptionsAddReturnOutput(options.options, name, int(index or 0))
        results = _cpp_import(graph, serialized_graph_def, options)
        found = {}
        returned = c_api.TF_ImportGraphDefResultsReturnOutputs(results.results)
        for ref, output in zip(outputs, returned):
            op = graph._create_op_from_tf_operation(output.oper)  # pylint: disable=protected-access
            t = op.outputs[output.index]
            found[ref] = tf.TensorSpec(t.shape, t.dtype)
        return found
    finally:
        tf_ops.dismantle_graph(graph)


def import_nodes(graph: tf.Graph, graph_def: graph_pb2.GraphDef, serialized: bytes,
            input_map: Dict[str, tf.Tensor], names: Sequence[str]) -> Dict[str, tf.Operation]:
    """Imports a batch's nodes into `graph` (all of them or, on failure, none).

    Where TensorFlow's `import_graph_def` has nothing to do after the C++
    import but wrap each new op in Python (no functions to register, no
    device function active), that is all this does: TensorFlow's import
    would also read every new op's colocation list and re-apply its device,
    and a batch's nodes have empty colocation lists and canonical devices.

    Returns:
      The ops of `names`, by name.

    Raises:
      ValueError: TensorFlow's message for a bad node or a taken name.
    """
    with graph.as_default(), graph.control_dependencies(None):
        if graph_def.library.function or graph._device_functions_outer_to_inner:  # pylint: disable=protected-access
            return dict(zip(names, tf.graph_util.import_graph_def(
                graph_def, input_map=input_map, return_elements=names, name="")))
        new_ops = _import_in_cpp(graph, serialized, input_map)
    return {name: new_ops[name] for name in names}


def _import_in_cpp(graph: tf.Graph, serialized_graph_def: bytes,
                   input_map: Dict[str, tf.Tensor]) -> Dict[str, tf.Operation]:
    """The C++ import, then a Python `Operation` for each new op, by name."""
    options = _import_options()
    # A batch reserves its names: a clash is an error, never a renamed op.
    c_api.TF_ImportGraphDefOptionsSetUniquifyNames(options.options, False)
    for key, t in input_map.items():
        name, _, index = key.partition(":")
        c_api.TF_ImportGraphDefOptionsAddInputMapping(
            options.options, name, int(index or 0),
            t._as_tf_output())  # pylint: disable=protected-access
    with graph._mutation_lock():  # pylint: disable=protected-access
        _cpp_import(graph, serialized_graph_def, options)
        new_ops = _wrap_new_ops(graph, input_map.values())
    return {op.name: op for op in new_ops}


def _import_options() -> c_api_util.ScopedTFImportGraphDefOptions:
    """Import options with no name prefix."""
    options = c_api_util.ScopedTFImportGraphDefOptions()
    c_api.TF_ImportGraphDefOptionsSetPrefix(options.options, "")
    return options


def _cpp_import(graph: tf.Graph, serialized_graph_def: bytes,
                options: c_api_util.ScopedTFImportGraphDefOptions
                ) -> c_api_util.ScopedTFImportGraphDefResults:
    """TensorFlow's C++ GraphDef import into `graph` (all nodes or none).

    Raises:
      ValueError: TensorFlow's message for a bad node or a taken name.
    """
    buffer = c_api.TF_NewBufferFromString(serialized_graph_def)
    try:
        with graph._c_graph.get() as c_graph:  # pylint: disable=protected-access
            return c_api_util.ScopedTFImportGraphDefResults(
                c_api.TF_GraphImportGraphDefWithResults(c_graph, buffer, options.options))
    except tf.errors.InvalidArgumentError as e:
        raise ValueError(str(e)) from e
    finally:
        c_api.TF_DeleteBuffer(buffer)


def _wrap_new_ops(graph: tf.Graph, inputs: Iterable[tf.Tensor]) -> List[tf.Operation]:
    """`Graph._add_new_tf_operations`, minus what cannot apply to a batch.

    TensorFlow's version also reads each new op's inputs, to add the control
    dependencies of the `control_dependencies` blocks active (`import_nodes` runs
    under `control_dependencies(None)`: none) and to check the inputs
    against TensorFlow 1 control-flow contexts (`tf.while_loop` without
    control flow v2). Where no new op can meet such a context (none is
    active and no existing input has one), each op only needs its Python
    `Operation`.
    """
    if graph._get_control_flow_context() is not None or any(  # pylint: disable=protected-access
            t.op._get_control_flow_context() is not None for t in inputs):  # pylint: disable=protected-access
        return graph._add_new_tf_operations(compute_devices=False)  # pylint: disable=protected-access
    graph._check_not_finalized()  # pylint: disable=protected-access
    return [graph._create_op_from_tf_operation(c_op, compute_device=False)  # pylint: disable=protected-access
            for c_op in graph.new_operations()]


def name_in_use(graph: tf.Graph, key: str) -> bool:
    """Whether the lower-cased absolute name `key` is in the graph's names-in-use table.

    Read directly, not through `graph.unique_name`, which prepends the active
    name scope (a rewrite called inside `tf.name_scope("replica_1")`, as
    `tf.distribute` replica functions are, would never see its own name).
    """
    return graph._names_in_use.get(key, 0) > 0  # pylint: disable=protected-access


def mark_name_used(graph: tf.Graph, key: str) -> None:
    """Marks the absolute name `key` used, as a Python constructor would."""
    names = graph._names_in_use  # pylint: disable=protected-access
    if not names.get(key, 0):
        names[key] = 1
