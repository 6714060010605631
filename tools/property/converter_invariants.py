"""The converter-in-the-loop invariants: the eval graph is the integer model.

`check_network(net)` takes a `tools.property.converter_networks.ConvNet` the way a
user would: the training graph is built and rewritten
(`experimental_create_training_graph(symmetric_weights=True)`), trained a
few steps (activation ranges and batch-norm statistics from the batches),
saved; the eval graph is built separately, rewritten and restored with a
plain, strict `Saver()`; it is frozen and converted by TensorFlow's own
converter (`TFLiteConverter.from_session`, `qat.export.convert_frozen_graph`)
to both flavours, uint8 and int8. It returns, for each invariant of
`INVARIANTS`, None when it holds or a message:

* `pipeline_succeeds`: building, rewriting, training, freezing and
  converting raise nothing.
* `strict_restore`: the plain Saver of the eval graph restores the training
  checkpoint.
* `fully_integer`: no TFLite op computes in float (either flavour).
* `ranges_survive`: every activation range of the eval graph is a TFLite
  tensor with exactly its scale and zero point
  (`qat.export.range_survival`, as `layer_numerics` reports it; either
  flavour).
* `layers_within_one_step`: given TFLite's own inputs, the eval graph
  computes every integer TFLite tensor it has a range of within one step,
  and the model output is matched (`qat.report.layer_numerics`' own steps,
  either flavour).
* `kernel_preconditions`: the ranges the training graph's FakeQuants read in
  its last step, and the eval graph's restored ranges, meet every
  precondition of TFLite's integer kernels
  (`qat.quantize.plan.kernels.kernel_preconditions`, checked by
  `qat.export.kernel_checks`).
* `model_prepares`: TFLite prepares and runs the converted model
  (`qat.export.check_runnable`, which refuses scales that would abort the
  process before preparing them; either flavour).
* `no_loss_ranges`: no quantizer of the training graph reads a tensor its
  loss computes (`loss/`: issue #33's tails with constants and labels).
* `same_ranges_as_export`: the training graph (fed by a placeholder, a
  tf.data iterator or a FIFO queue, through pre-processing and a pad,
  reshape or transpose, with its loss) has the activation quantizers and
  range variables of the eval graph that is converted (the placeholder
  `input`, no loss), and the same one quantizes the fed batch; the model
  output has a range in both.
"""
import os
import shutil
import tempfile
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import qat
from qat import export
from qat import report
from qat.export import kernel_checks
from tools.property import converter_networks as networks
from tools.property import converter_graphs
from tools.property import invariants as rewrite_invariants
from tools.property import sequences

INVARIANTS = (
    "pipeline_succeeds",
    "strict_restore",
    "fully_integer",
    "ranges_survive",
    "layers_within_one_step",
    "kernel_preconditions",
    "model_prepares",
    "no_loss_ranges",
    "same_ranges_as_export",
)
FLAVOURS = ("uint8", "int8")
TRAIN_STEPS = 3
TRAIN_BATCH = 8
NUMERICS_EXAMPLES = 8
# Given the same inputs a kernel and the eval graph differ only where a value
# lies within float rounding of a rounding boundary: one step.
MAX_OWN_STEPS = 1.0 + 1e-3


def _family(net):
    """The module that describes `net` (its inputs): `converter_networks`, or
    `sequences` for a recurrent one."""
    return sequences if isinstance(net, sequences.SeqNet) else networks


def _builder(net):
    """The module that builds `net`: `converter_graphs`, or `sequences` for a
    recurrent one."""
    return sequences if isinstance(net, sequences.SeqNet) else converter_graphs


def _session(graph: tf.Graph) -> tf.compat.v1.Session:
    rewrite_options = rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
        graph_options=tf.compat.v1.GraphOptions(rewrite_options=rewrite_options))
    return tf.compat.v1.Session(graph=graph, config=config)


def ranges(built: "converter_graphs.BuiltNet") -> dict:
    """What a rewritten graph quantizes, for `same_ranges_as_export`."""
    quantizers = rewrite_invariants.activation_quantizers(built.graph)
    with built.graph.as_default():
        variables = {v.op.name: tuple(v.shape.as_list()) for v in tf.compat.v1.global_variables()}
    return {"quantizers": quantizers, "variables": variables,
            "fed": rewrite_invariants.fed_quantizers(quantizers, built.input),
            "loss": rewrite_invariants.loss_range_violations(built.graph),
            "output": rewrite_invariants.output_range_violations(built)}


def train(net: "networks.ConvNet", checkpoint: str, seed: int = 0
          ) -> Tuple[dict, Optional[str]]:
    """Builds, rewrites and trains the training graph; saves `checkpoint`.

    Returns:
      What the rewritten training graph quantizes (`ranges`), and the kernel
      preconditions the ranges its FakeQuants read in the last step violate
      (a message), or None.
    """
    built = _builder(net).build(net, training=True, seed=seed, batch=TRAIN_BATCH)
    graph = built.graph
    with graph.as_default():
        qat.experimental_create_training_graph(graph, symmetric_weights=True)
        found = ranges(built)
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(updates + [built.loss]):
            if tf.compat.v1.trainable_variables():
                train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
                    built.loss)
            else:  # Pools only: the steps calibrate the ranges.
                train_op = tf.no_op()
        init = tf.compat.v1.global_variables_initializer()
        saver = tf.compat.v1.train.Saver()
        range_check = kernel_checks.RangeCheck(graph)
    with _session(graph) as sess:
        sess.run(init)
        for step in range(TRAIN_STEPS):
            _, values = sess.run([train_op, range_check.fetches],
                                 {built.input: _family(net).inputs(net, TRAIN_BATCH, seed + step)})
        saver.save(sess, checkpoint)
    return found, _describe(range_check.violations(values))


def _describe(violations) -> Optional[str]:
    return "; ".join(v.describe() for v in violations[:2]) or None


def _eval_kernel_violations(sess: tf.compat.v1.Session) -> Optional[str]:
    return _describe(kernel_checks.RangeCheck(sess.graph).in_session(sess))


def restore_eval(net: "networks.ConvNet", checkpoint: str, seed: int = 0, found=None,
                 hooks=None) -> tf.compat.v1.Session:
    """The eval graph, rewritten and restored with a plain Saver (strict).

    `found`, a dict, gets what the eval graph quantizes (`ranges`); `hooks`
    build what a generator family adds (`converter_graphs.build`).
    """
    if isinstance(net, sequences.SeqNet):  # The export graph: the placeholder, no loss.
        built = sequences.build(net, training=False, seed=seed, export=True, batch=None)
    else:
        built = converter_graphs.build(net, training=False, seed=seed, hooks=hooks)
    graph = built.graph
    with graph.as_default():
        qat.experimental_create_eval_graph(graph, symmetric_weights=True)
        if found is not None:
            found.update(ranges(built))
        saver = tf.compat.v1.train.Saver()
    sess = _session(graph)
    try:
        saver.restore(sess, checkpoint)
    except Exception:
        sess.close()
        raise
    return sess


def _fully_integer(model: bytes, frozen) -> Optional[str]:
    float_ops = export.find_float_ops(export.describe_model(model), frozen)
    if not float_ops:
        return None
    return "; ".join(f.describe() for f in float_ops[:3]) + (
        f" (+{len(float_ops) - 3} more)" if len(float_ops) > 3 else "")


def _layers(numerics: "report.NumericsReport") -> Optional[str]:
    problems = []
    if numerics.rows[-1].tflite_tensor is None:
        problems.append("the model output has no TFLite tensor")
    for row in numerics.rows:
        if row.max_own_steps > MAX_OWN_STEPS:
            problems.append(f"{row.name} ({row.tflite_tensor}) {row.max_own_steps:.2f} steps "
                            "off given TFLite's inputs")
    return "; ".join(problems[:4]) or None


def _record(results: Dict[str, Optional[str]], name: str, flavour: str,
            message: Optional[str]) -> None:
    if message and results[name] is None:
        results[name] = f"{flavour}: {message}"[:600]


def check_network(net: "networks.ConvNet", seed: int = 0) -> Dict[str, Optional[str]]:
    """Checks every invariant on `net`.

    Args:
      net: the network to build.
      seed: graph-level random seed and input seed.

    Returns:
      {invariant: None if it holds, else a message}, for every INVARIANTS name.
    """
    results: Dict[str, Optional[str]] = {name: None for name in INVARIANTS}
    workdir = tempfile.mkdtemp(prefix="qat_converter_property_")
    stage = ["training"]
    try:
        checkpoint = os.path.join(workdir, "model")
        training, kernel_violations = train(net, checkpoint, seed)
        _record(results, "kernel_preconditions", "training graph", kernel_violations)
        check_export(net, checkpoint, training, results, seed, stage=stage)
    except Exception as e:  # pylint: disable=broad-except
        record_failure(results, stage[0], e)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def record_failure(results: Dict[str, Optional[str]], stage: str, e: Exception) -> None:
    """`pipeline_succeeds`: what raised, at which stage (first and last lines)."""
    lines = str(e).strip().splitlines() or [""]
    text = lines[0] + (f" ... {lines[-1]}" if len(lines) > 1 else "")
    results["pipeline_succeeds"] = f"{stage}: {type(e).__name__}: {text}"[:600]


def check_export(net: "networks.ConvNet", checkpoint: str, training: dict,
                 results: Dict[str, Optional[str]], seed: int = 0, hooks=None,
                 stage: Optional[list] = None) -> None:
    """Every invariant after training: the eval graph (built with `hooks`)
    restored strictly from `checkpoint`, frozen, converted to both flavours
    and checked; `training` is what the training graph quantizes (`ranges`).

    `results` gets the violations; `stage[0]` says what runs (for a failure's
    message). Raises what the pipeline raises.
    """
    stage = stage if stage is not None else [""]
    sess = None
    try:
        stage[0] = "eval graph"
        eval_ranges = {}
        try:
            sess = restore_eval(net, checkpoint, seed, found=eval_ranges, hooks=hooks)
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as e:
            results["strict_restore"] = str(e).splitlines()[0][:400]
            return
        finally:
            _compare(results, training, eval_ranges)
        _record(results, "kernel_preconditions", "eval graph", _eval_kernel_violations(sess))
        stage[0] = "freeze"
        frozen = export.freeze_session(sess, ["output"])
        for flavour in FLAVOURS:
            stage[0] = f"{flavour} conversion"
            model = export.convert_frozen_graph(
                frozen, ["input"], ["output"], flavour,
                input_ranges={"input": _family(net).input_range(net)})
            stage[0] = f"{flavour} checks"
            try:
                export.check_runnable(model, frozen, label=flavour)
            except export.ConversionError as e:
                _record(results, "model_prepares", flavour, str(e).replace("\n", " "))
                continue
            _record(results, "fully_integer", flavour, _fully_integer(model, frozen))
            # The numerics check range survival too (`lost_ranges`).
            numerics = report.layer_numerics(
                frozen, "input:0", ["output"],
                _family(net).inputs(net, NUMERICS_EXAMPLES, seed=100), flavour=flavour,
                model=model, input_range=_family(net).input_range(net))
            _record(results, "ranges_survive", flavour,
                    "; ".join(r.describe() for r in numerics.lost_ranges[:3]) or None)
            _record(results, "layers_within_one_step", flavour, _layers(numerics))
    finally:
        if sess is not None:
            sess.close()


def _compare(results: Dict[str, Optional[str]], training: dict, eval_ranges: dict) -> None:
    """`no_loss_ranges` and `same_ranges_as_export` from the two graphs' `ranges`."""
    if training["loss"]:
        results["no_loss_ranges"] = "training: " + "; ".join(training["loss"])[:600]
    if not eval_ranges:
        return
    problems = [f"{graph}: {p}" for graph, found in (("training", training),
                                                      ("eval", eval_ranges))
                for p in found["output"]]
    problems += rewrite_invariants.export_violations(
        "training", training["fed"], training["quantizers"], training["variables"],
        eval_ranges)
    if problems:
        results["same_ranges_as_export"] = "; ".join(problems)[:600]


def violations(net: "networks.ConvNet", seed: int = 0) -> Dict[str, str]:
    """The violated invariants only."""
    return {k: v for k, v in check_network(net, seed).items() if v is not None}


def inputs_vary(net: "networks.ConvNet") -> bool:
    """Whether the numerics' examples differ (a sanity check for the tests)."""
    x = _family(net).inputs(net, NUMERICS_EXAMPLES, seed=100)
    return len(np.unique(x.reshape(len(x), -1), axis=0)) > 1
