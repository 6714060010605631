"""Training step time, QAT / float, on tf_keras MobileNetV2 (96x96, batch 16).

Builds training graphs of the same model (weights=None): a float one, one
rewritten by qat.create_training_graph, (--fold_only) one with only the
batch norms folded, (--relu_fusion) a QAT one whose ReLUs keep TensorFlow's
own gradient instead of qat's fused one and (--tf_gradient) a QAT one whose
FakeQuant ops and ReLUs keep TensorFlow's own gradients. Each has its own
Session; the tool warms them up, then interleaves their steps (float, QAT,
folded, float, ...) so all see the same machine load, and prints the median
step times and the QAT / float ratio (target: <= 1.10), with the part due to
folding. On a shared machine
the load drifts during a run; the median of the per-round ratios (each QAT
step over the float step just before it) and its quartiles show how much.

  .venv/bin/python bench/bench_train_step.py
  .venv/bin/python bench/bench_train_step.py --steps=50 --batch_size=32
"""
import os
import statistics
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 40, "Timed steps per graph (interleaved).")
flags.DEFINE_integer("warmup", 3, "Untimed steps per graph first.")
flags.DEFINE_integer("batch_size", 16, "Batch size.")
flags.DEFINE_integer("image_size", 96, "Input height and width.")
flags.DEFINE_integer("quant_delay", 0,
                     "quant_delay of the QAT graph (0: quantized from step 1).")
flags.DEFINE_bool("use_cond", False,
                  "Rewrite with fold_batch_norms(use_cond=True, "
                  "freeze_batch_norm_delay=10**9) + insert_quant_ops instead "
                  "of create_training_graph (the fold's functional-cond "
                  "training tail, built only with a freeze delay; the delay "
                  "is never reached).")
flags.DEFINE_bool("tf_gradient", False,
                  "Also time a QAT graph whose FakeQuant ops use TensorFlow's "
                  "own gradient (three outputs) instead of qat's input-only "
                  "one, to show what the latter saves.")
flags.DEFINE_bool("relu_fusion", True,
                  "Also time a QAT graph whose ReLUs keep TensorFlow's own "
                  "gradient (a second masked pass over each quantized ReLU "
                  "output), to show what qat's fused ReLU gradient saves.")
flags.DEFINE_bool("xla", False,
                  "Also time the float and QAT graphs with XLA "
                  "auto-clustering (global_jit_level=ON_1), a user option "
                  "of TensorFlow's.")
flags.DEFINE_bool("fold_only", True,
                  "Also time a third graph with batch norms folded (training "
                  "structure) but no FakeQuant ops, to split the overhead.")

# A freeze delay never reached in a benchmark (use_cond needs a delay).
_NEVER = 10**9


def _session(variant: str):
    """Builds a MobileNetV2 training step; returns (session, train op, feed)."""
    xla = variant.endswith("_xla")
    variant = variant[:-len("_xla")] if xla else variant
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    size, batch = FLAGS.image_size, FLAGS.batch_size
    g = tf.Graph()
    with g.as_default():
        tf_keras.backend.set_learning_phase(1)
        x = tf.compat.v1.placeholder(tf.float32, [batch, size, size, 3],
                                     name="images")
        labels = tf.compat.v1.placeholder(tf.int32, [batch], name="labels")
        model = tf_keras.applications.MobileNetV2(input_tensor=x,
                                                  weights=None, classes=10)
        logits = model.output.op.inputs[0]  # Before the softmax.
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        if variant in ("qat", "qat_tf_gradient", "qat_no_relu_fusion"):
            start = time.perf_counter()
            if FLAGS.use_cond:
                qat.fold_batch_norms(g, is_training=True, use_cond=True,
                                     freeze_batch_norm_delay=_NEVER)
                qat.insert_quant_ops(g, is_training=True,
                                     quant_delay=FLAGS.quant_delay or None)
            else:
                qat.create_training_graph(g, quant_delay=FLAGS.quant_delay)
            logging.info("rewrite: %.2f s", time.perf_counter() - start)
            if variant == "qat_tf_gradient":
                for op in g.get_operations():
                    if op.type.startswith("FakeQuantWithMinMaxVars"):
                        op._clear_attr("_gradient_op_type")  # pylint: disable=protected-access
            if variant in ("qat_tf_gradient", "qat_no_relu_fusion"):
                relu_gradient = (qat.quantize.emit.fake_quant_gradient
                                 .RELU_GRADIENT_OP_TYPE.encode())
                for op in g.get_operations():
                    if op.type in ("Relu", "Relu6") and op.node_def.attr[
                            "_gradient_op_type"].s == relu_gradient:
                        op._clear_attr("_gradient_op_type")  # pylint: disable=protected-access
        elif variant == "folded":
            qat.fold_batch_norms(
                g, is_training=True, use_cond=FLAGS.use_cond,
                freeze_batch_norm_delay=_NEVER if FLAGS.use_cond else None)
        with tf.control_dependencies(model.updates):
            train = tf.compat.v1.train.MomentumOptimizer(
                1e-3, 0.9).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto()
    if xla:
        config.graph_options.optimizer_options.global_jit_level = (
            tf.compat.v1.OptimizerOptions.ON_1)
    sess = tf.compat.v1.Session(graph=g, config=config)
    sess.run(init)
    rng = np.random.RandomState(0)
    feed = {x: rng.uniform(-1, 1, [batch, size, size, 3]).astype(np.float32),
            labels: rng.randint(0, 10, size=batch).astype(np.int32)}
    return sess, train, feed


def main(argv):
    del argv
    if FLAGS.steps < 1 or FLAGS.batch_size < 1:
        raise app.UsageError("--steps and --batch_size must be positive.")
    logging.info("building the MobileNetV2 training graphs")
    variants = (["float", "qat"] + (["folded"] if FLAGS.fold_only else [])
                + (["qat_tf_gradient"] if FLAGS.tf_gradient else [])
                + (["qat_no_relu_fusion"] if FLAGS.relu_fusion else [])
                + (["float_xla", "qat_xla"] if FLAGS.xla else []))
    runs = {key: _session(key) for key in variants}
    for key, (sess, train, feed) in runs.items():
        logging.info("warming up %s", key)
        for _ in range(FLAGS.warmup):
            sess.run(train, feed)
    times = {key: [] for key in runs}
    for i in range(FLAGS.steps):
        for key, (sess, train, feed) in runs.items():
            start = time.perf_counter()
            sess.run(train, feed)
            times[key].append(time.perf_counter() - start)
        logging.info("step %d/%d: %s", i + 1, FLAGS.steps, ", ".join(
            "%s %.3f s" % (key, times[key][-1]) for key in runs))
    med = {key: statistics.median(v) for key, v in times.items()}
    ratio = med["qat"] / med["float"]
    print("MobileNetV2 %dx%d batch %d, median of %d interleaved steps: "
          "float %.4f s, QAT %.4f s, QAT/float = %.3f (target <= 1.10: %s)"
          % (FLAGS.image_size, FLAGS.image_size, FLAGS.batch_size,
             FLAGS.steps, med["float"], med["qat"], ratio,
             "met" if ratio <= 1.10 else "NOT met"))
    paired = [q / f for q, f in zip(times["qat"], times["float"])]
    quartiles = (statistics.quantiles(paired, n=4) if len(paired) > 1
                 else paired * 3)
    print("  paired: median of the %d per-round ratios (QAT step / the float "
          "step just before it) %.3f, quartiles %.3f-%.3f"
          % (len(paired), statistics.median(paired), quartiles[0], quartiles[2]))
    if "folded" in med:
        print("  split: folded (no FakeQuant) %.4f s = %.3f x float; "
              "FakeQuant ops on top: %.3f x float"
              % (med["folded"], med["folded"] / med["float"],
                 (med["qat"] - med["folded"]) / med["float"]))
    if "qat_no_relu_fusion" in med:
        fused = statistics.median(
            [q / u for q, u in zip(times["qat"], times["qat_no_relu_fusion"])])
        print("  without the fused ReLU gradient: %.4f s, QAT/float = %.3f; "
              "QAT / that, median per round: %.3f"
              % (med["qat_no_relu_fusion"], med["qat_no_relu_fusion"] / med["float"],
                 fused))
    if "qat_tf_gradient" in med:
        print("  with TensorFlow's FakeQuant gradient: %.4f s, QAT/float = %.3f"
              % (med["qat_tf_gradient"], med["qat_tf_gradient"] / med["float"]))
    if "qat_xla" in med:
        print("  with XLA auto-clustering: float %.4f s (%.3f x float without), "
              "QAT %.4f s, QAT/float = %.3f"
              % (med["float_xla"], med["float_xla"] / med["float"],
                 med["qat_xla"], med["qat_xla"] / med["float_xla"]))
    for sess, _, _ in runs.values():
        sess.close()


if __name__ == "__main__":
    app.run(main)
