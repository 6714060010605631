"""The quantization step counter shared by the fold and quantize passes.

`quant_delay` and `freeze_bn_delay` compare against one int64 variable,
`fake_quantization_step` (contrib's name, so checkpoints carry over). The
tensor handed to the passes increments it: any Session.run that evaluates a
delayed FakeQuant or a freezable batch norm advances it exactly once.

The passes find the counter through a graph collection, not by its name.

Distributed training (between-graph replication): the counter is ONE variable
placed with the model's variables (the ps, `qat.engine.placement`), not one
per worker and not the global step. Every worker's run increments it, so all
workers read the same count and a delay switches at one moment for the whole
cluster; it counts the batches the cluster has trained on, which is the
global step with asynchronous updates and R times the global step with
`SyncReplicasOptimizer(replicas_to_aggregate=R)`. It does not depend on the
optimizer being given the global step, and single-process graphs keep
contrib's semantics and checkpoint name. Like the range variables it is a ref
or a resource variable as the model's are (`qat.engine.range_variables`).
"""
from typing import Optional, Union

import tensorflow as tf
from qat.engine import marks
from qat.engine import placement
from qat.engine import range_variables

QUANTIZATION_STEP_NAME = "fake_quantization_step"
# Collection holding [variable, incremented step tensor] once created.
QUANTIZATION_STEP_COLLECTION = "qat_quantization_step"


def get_quantization_step(graph: Optional[tf.Graph] = None) -> Optional[tf.Tensor]:
    """Returns the incremented step tensor of `graph`, or None if it has none."""
    graph = graph or tf.compat.v1.get_default_graph()
    found = graph.get_collection(QUANTIZATION_STEP_COLLECTION)
    return found[1] if found else None


def get_quantization_step_variable(graph: Optional[tf.Graph] = None):
    """Returns the `fake_quantization_step` variable of `graph`, or None."""
    graph = graph or tf.compat.v1.get_default_graph()
    found = graph.get_collection(QUANTIZATION_STEP_COLLECTION)
    return found[0] if found else None


def get_or_create_quantization_step(graph: Optional[tf.Graph] = None) -> tf.Tensor:
    """Returns the step tensor, creating the counter variable on first use.

    Args:
      graph: the graph to use; the default graph when None.

    Returns:
      An int64 scalar tensor: the value of `fake_quantization_step` after this
      run's increment (1 on the first run that evaluates it).
    """
    graph = graph or tf.compat.v1.get_default_graph()
    existing = get_quantization_step(graph)
    if existing is not None:
        return existing
    with graph.as_default(), graph.name_scope(None), \
            graph.device(placement.shared_variable_device(graph)):
        variable = tf.compat.v1.get_variable(
            QUANTIZATION_STEP_NAME,
            shape=[],
            dtype=tf.int64,
            initializer=tf.compat.v1.zeros_initializer(),
            trainable=False,
            use_resource=(range_variables.variable_kind(graph)
                          == range_variables.RESOURCE),
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
        with graph.name_scope(QUANTIZATION_STEP_NAME + "/"):
            step = tf.identity(
                tf.compat.v1.assign_add(variable, 1), name="Identity")
    range_variables.track_for_keras(variable)
    graph.add_to_collection(QUANTIZATION_STEP_COLLECTION, variable)
    graph.add_to_collection(QUANTIZATION_STEP_COLLECTION, step)
    return step


def step_for(rewrite) -> Union[tf.Tensor, str]:
    """The step tensor for the ops of `rewrite`: existing, or added by it.

    Args:
      rewrite: a `qat.engine.rewrite.Rewrite`; when the graph has no counter
        yet, the rewrite gets its ops (a variable `fake_quantization_step` of
        the model's kind, `qat.engine.range_variables`, its increment and the
        incremented value),
        added to the graph with the rewrite's other ops.

    Returns:
      The existing step tensor, or the rewrite's node (`name:0`) computing it.
    """
    existing = get_quantization_step(rewrite.graph)
    if existing is not None:
        return existing
    if "step" in rewrite.memo:
        return rewrite.memo["step"]
    nodes = rewrite.nodes
    name = nodes.unique_name(QUANTIZATION_STEP_NAME)
    int64 = tf.int64
    # One counter for a whole cluster: with the model's variables.
    device = placement.shared_variable_device(rewrite.graph)
    emitter = range_variables.VariableEmitter.for_rewrite(rewrite)
    mark = {marks.ATTR: marks.STEP_COUNTER}
    zero = nodes.const(name + "/Initializer/zeros", 0, int64, device=device)
    variable_def = emitter.variable(name, int64, [], zero, device=device,
                                    initial_array=0, **mark)
    one = nodes.const(name + "/AssignAdd/value", 1, int64, device=device)
    read = emitter.assign_add(name, name, one, device=device, **mark)
    step = nodes.node(name + "/Identity", "Identity", [read], T=int64, device=device,
                      **mark) + ":0"

    def register(ops):
        graph = rewrite.graph
        if variable_def is None:  # A function graph's: made by its store.
            variable = emitter.captured[name]
        else:
            with graph.as_default():
                variable = range_variables.wrap(variable_def)
            graph.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, variable)
        graph.add_to_collection(QUANTIZATION_STEP_COLLECTION, variable)
        graph.add_to_collection(QUANTIZATION_STEP_COLLECTION, nodes.tensor(ops, step))

    rewrite.after_import(register)
    rewrite.memo["step"] = step
    return step
