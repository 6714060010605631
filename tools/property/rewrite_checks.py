"""Running the rewrite invariants on a random network (`violations(net)`).

`check_network(net)` builds a `tools.property.networks.Network` in each mode
(eval, training, export: `tools.property.network_graphs.build`), rewrites
each, runs what needs a Session, and returns, for each invariant of
`tools.property.invariants.INVARIANTS` (described there, each a check of that
module), None when it holds or a message saying how it was violated;
`violations(net)` only the violated ones.
"""
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import qat
from qat.export import kernel_checks
from tools.property import invariants
from tools.property import network_graphs
from tools.property import networks
from tools.property import sequences

TOLERANCE = 1e-4


def _session(graph: tf.Graph) -> tf.compat.v1.Session:
    # Grappler off: the checks are about qat's graph, not TensorFlow's
    # optimisations of it, and optimising each small graph costs more than
    # running it.
    rewrite_options = rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
        graph_options=tf.compat.v1.GraphOptions(rewrite_options=rewrite_options))
    return tf.compat.v1.Session(graph=graph, config=config)


def _graph_def_bytes(graph: tf.Graph) -> bytes:
    return graph.as_graph_def().SerializeToString(deterministic=True)


def _graph_def_change(before: bytes, graph: tf.Graph) -> Optional[str]:
    """None if the graph still serialises to `before`, else what changed."""
    if _graph_def_bytes(graph) == before:
        return None
    old = tf.compat.v1.GraphDef.FromString(before)
    old_nodes = {n.name: n for n in old.node}
    added = [n.name for n in graph.as_graph_def().node if n.name not in old_nodes]
    changed = [n.name for n in graph.as_graph_def().node
               if n.name in old_nodes and n != old_nodes[n.name]]
    return (f"second call added {len(added)} ops {added[:4]} and changed "
            f"{len(changed)} {changed[:4]}")


def _variables(graph: tf.Graph) -> Dict[str, tuple]:
    with graph.as_default():
        return {v.op.name: tuple(v.shape.as_list())
                for v in tf.compat.v1.global_variables()}


def _family(net):
    """The module that builds `net`: `network_graphs`, or `sequences` for a recurrent one."""
    return sequences if isinstance(net, sequences.SeqNet) else network_graphs


def _inputs(net, seed: int) -> np.ndarray:
    if isinstance(net, sequences.SeqNet):
        return sequences.inputs(net, seed=seed)
    return networks.inputs(net, seed)


def _structural(results, suffix, built) -> None:
    problems = invariants.weights_violations(built.graph, built.kernels)
    if problems:
        results["weights_quantized"] = f"{suffix}: " + "; ".join(problems)
    problems = invariants.raw_and_quantized_violations(built.graph, built.input)
    if problems and results.get("no_raw_reader") is None:
        results["no_raw_reader"] = f"{suffix}: " + "; ".join(problems)
    problems = invariants.double_range_violations(built.graph)
    if problems and results.get("one_range_per_layer_output") is None:
        results["one_range_per_layer_output"] = f"{suffix}: " + "; ".join(problems)
    results.setdefault("_variables", {})[suffix] = _variables(built.graph)
    problems = invariants.shared_concat_violations(built.graph, built.input)
    if problems and results.get("shared_concat_ranges") is None:
        results["shared_concat_ranges"] = f"{suffix}: " + "; ".join(problems)
    _boundary(results, suffix, built)


def _record(results, name: str, suffix: str, problems: List[str]) -> None:
    if problems and results.get(name) is None:
        results[name] = f"{suffix}: " + "; ".join(problems)[:600]


def _boundary(results, suffix, built) -> None:
    """The model/loss boundary and the feed (issue #33)."""
    _record(results, "no_loss_ranges", suffix, invariants.loss_range_violations(built.graph))
    _record(results, "outputs_keep_ranges", suffix, invariants.output_range_violations(built))
    quantizers = invariants.activation_quantizers(built.graph)
    results.setdefault("_quantizers", {})[suffix] = (built, quantizers)


def _check_export(net, results, seed) -> None:
    """The export graph: a placeholder, the model, no loss (eval rewrite)."""
    built = _family(net).build(net, training=False, seed=seed, export=True)
    qat.create_eval_graph(built.graph)
    _record(results, "outputs_keep_ranges", "export", invariants.output_range_violations(built))
    quantizers = invariants.activation_quantizers(built.graph)
    results["_export"] = {
        "quantizers": quantizers, "variables": _variables(built.graph),
        "fed": invariants.fed_quantizers(quantizers, built.input)}


def _check_eval(net, results, seed) -> None:
    built = _family(net).build(net, training=False, seed=seed)
    g = built.graph
    feed = {built.input: _inputs(net, seed)}
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with _session(g) as sess:
        sess.run(init)
        reference = sess.run(built.output, feed)
        fold = qat.fold_batch_norms(g, is_training=False)
        folded = sess.run(built.output, feed)
    if fold.skipped:
        results["all_folded"] = "; ".join(f"{s}" for s in fold.skipped)
    if reference.shape != folded.shape:
        results["eval_fold_exact"] = f"shape {reference.shape} -> {folded.shape}"
    else:
        error = np.abs(reference - folded) - TOLERANCE * (1 + np.abs(reference))
        if np.max(error) > 0 or not np.all(np.isfinite(folded)):
            results["eval_fold_exact"] = (
                f"max |unfolded - folded| = {np.max(np.abs(reference - folded)):.3g} "
                f"(max |unfolded| {np.max(np.abs(reference)):.3g})")
    qat.create_eval_graph(g)
    _structural(results, "eval", built)
    before = _graph_def_bytes(g)
    qat.create_eval_graph(g)
    results["idempotent_eval"] = _graph_def_change(before, g)
    range_check = kernel_checks.RangeCheck(g)
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with _session(g) as sess:
        sess.run(init)
        found = range_check.in_session(sess)
    _kernel_violations(results, "eval", found)


def _kernel_violations(results, suffix, found) -> None:
    if found and results.get("kernel_preconditions") is None:
        results["kernel_preconditions"] = f"{suffix}: " + "; ".join(
            v.describe() for v in found[:2])


def _check_training(net, results, seed) -> None:
    built = _family(net).build(net, training=True, seed=seed)
    g = built.graph
    qat.create_training_graph(g)
    _structural(results, "training", built)
    before = _graph_def_bytes(g)
    qat.create_training_graph(g)
    results["idempotent_training"] = _graph_def_change(before, g)
    with g.as_default():
        variables = tf.compat.v1.trainable_variables()
        grads = tf.gradients(built.loss, variables)
        missing = [v.op.name for v, d in zip(variables, grads) if d is None]
        if missing:
            results["gradients_finite"] = f"no gradient for {missing}"
            return
        init = tf.compat.v1.global_variables_initializer()
    range_check = kernel_checks.RangeCheck(g)
    with _session(g) as sess:
        sess.run(init)
        values, ranges = sess.run([grads, range_check.fetches],
                                  {built.input: _inputs(net, seed)})
    _kernel_violations(results, "training", range_check.violations(ranges))
    bad = [v.op.name for v, d in zip(variables, values) if not np.all(np.isfinite(d))]
    if bad:
        results["gradients_finite"] = f"non-finite gradient for {bad}"


def check_network(net: "networks.Network", seed: int = 0) -> Dict[str, Optional[str]]:
    """Checks every invariant on `net`.

    Args:
      net: the network to build.
      seed: graph-level random seed and input seed.

    Returns:
      {invariant: None if it holds, else a message}, for every invariants.INVARIANTS name.
    """
    results: Dict[str, Optional[str]] = {name: None for name in invariants.INVARIANTS}
    for check in (_check_eval, _check_training, _check_export):
        try:
            check(net, results, seed)
        except Exception as e:  # pylint: disable=broad-except
            results["rewrite_succeeds"] = (
                f"{check.__name__[7:]}: {type(e).__name__}: {e}"[:400])
    variables = results.pop("_variables", {})
    quantizers = results.pop("_quantizers", {})
    export = results.pop("_export", None)
    if export is not None:
        for suffix, (built, found) in sorted(quantizers.items()):
            if suffix in variables:
                _record(results, "same_ranges_as_export", suffix, invariants.export_violations(
                    suffix, invariants.fed_quantizers(found, built.input), found, variables[suffix],
                    export))
    if len(variables) == 2:
        problems = invariants.symmetry_violations(variables["eval"], variables["training"])
        if problems:
            results["train_eval_symmetry"] = "; ".join(problems)
    return results


def violations(net: "networks.Network", seed: int = 0) -> Dict[str, str]:
    """The violated invariants only."""
    return {k: v for k, v in check_network(net, seed).items() if v is not None}
