"""Times qat fold_batch_norms on tf_keras MobileNetV2 and ResNet50 graphs.

Each model (weights=None) is built in graph mode with the learning phase set
(training and inference), then folded with is_training matching; the tool
prints the graph build time, the fold time, the number of batch norms folded
and the graph's op count before and after, for each model and mode. With
--repeats N each measurement builds a fresh graph N times and reports the
median fold time.

  .venv/bin/python bench/bench_fold.py
  .venv/bin/python bench/bench_fold.py --models=resnet50 --repeats=3
"""
import os
import statistics
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["mobilenet_v2", "resnet50"],
                  "Models to fold: mobilenet_v2 (96x96 input), resnet50 (64x64).")
flags.DEFINE_list("modes", ["train", "eval"], "Fold modes: train and/or eval.")
flags.DEFINE_integer("repeats", 1, "Fresh graphs folded per model and mode (median reported).")
flags.DEFINE_integer("batch_size", 2, "Batch dimension of the input placeholder.")
flags.DEFINE_integer("step_time_steps", 0,
                     "If > 0: also time this many SGD training steps (batch --step_batch_size) "
                     "of the float graph and of the training-folded graphs (Select tail and "
                     "use_cond tail), alternating, and print the folded/float step-time ratios.")
flags.DEFINE_integer("step_batch_size", 8, "Batch size of the step-time measurement.")

_SIZES = {"mobilenet_v2": 96, "resnet50": 64}


def _build(name: str, training: bool, batch_size=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top
    constructors = {"mobilenet_v2": tf_keras.applications.MobileNetV2,
                    "resnet50": tf_keras.applications.ResNet50}
    size = _SIZES[name]
    g = tf.Graph()
    with g.as_default():
        tf_keras.backend.set_learning_phase(1 if training else 0)
        x = tf.compat.v1.placeholder(
            tf.float32, [batch_size or FLAGS.batch_size, size, size, 3], name="images")
        model = constructors[name](input_tensor=x, weights=None)
    return g, model


def main(argv):
    del argv
    from qat.api import fold_batch_norms  # pylint: disable=g-import-not-at-top
    for name in FLAGS.models:
        if name not in _SIZES:
            raise app.UsageError("Unknown model %r; choose from %s." % (name, sorted(_SIZES)))
    for mode in FLAGS.modes:
        if mode not in ("train", "eval"):
            raise app.UsageError("Unknown mode %r; choose train and/or eval." % mode)
    rows = []
    for name in FLAGS.models:
        for mode in FLAGS.modes:
            training = mode == "train"
            fold_times, build_times = [], []
            for i in range(FLAGS.repeats):
                logging.info("%s %s: building graph %d/%d", name, mode, i + 1, FLAGS.repeats)
                start = time.perf_counter()
                g, _ = _build(name, training)
                build_times.append(time.perf_counter() - start)
                ops_before = len(g.get_operations())
                bn_count = len([op for op in g.get_operations()
                                if op.type.startswith("FusedBatchNorm")])
                start = time.perf_counter()
                result = fold_batch_norms(g, is_training=training,
                                          freeze_batch_norm_delay=1000 if training else None)
                fold_times.append(time.perf_counter() - start)
                ops_after = len(g.get_operations())
                logging.info("%s %s: folded %d/%d in %.3f s", name, mode,
                             len(result.folded), bn_count, fold_times[-1])
            rows.append((name, mode, len(result.folded), bn_count, len(result.skipped),
                         statistics.median(build_times), statistics.median(fold_times),
                         ops_before, ops_after))
    print("%-13s %-5s %8s %8s %9s %9s %10s %10s" % (
        "model", "mode", "folded", "skipped", "build_s", "fold_s", "ops_before", "ops_after"))
    for name, mode, folded, total, skipped, build_s, fold_s, before, after in rows:
        print("%-13s %-5s %4d/%-3d %8d %9.3f %9.3f %10d %10d" % (
            name, mode, folded, total, skipped, build_s, fold_s, before, after))
    for name, mode, _, _, _, build_s, fold_s, _, _ in rows:
        print("%s %s: fold time / graph build time = %.3f" % (name, mode, fold_s / build_s))
    if FLAGS.step_time_steps > 0:
        for name in FLAGS.models:
            _step_time(name, fold_batch_norms)


def _train_step(name: str, fold_fn, use_cond=False):
    """A float training step (SGD + moving-average updates), folded or not."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    g, model = _build(name, True, FLAGS.step_batch_size)
    with g.as_default():
        if fold_fn is not None:
            fold_fn(g, is_training=True, freeze_batch_norm_delay=10**9, use_cond=use_cond)
        labels = tf.one_hot(tf.zeros([FLAGS.step_batch_size], tf.int32), 1000)
        logits = model.output.op.inputs[0]
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        with tf.control_dependencies(model.updates):
            train = tf.compat.v1.train.GradientDescentOptimizer(1e-3).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=g)
    sess.run(init)
    size = _SIZES[name]
    feed = {g.get_tensor_by_name("images:0"): np.random.RandomState(0).uniform(
        -1, 1, [FLAGS.step_batch_size, size, size, 3]).astype(np.float32)}
    return sess, train, feed


def _step_time(name: str, fold_fn) -> None:
    import time as _time  # pylint: disable=g-import-not-at-top
    logging.info("%s: building float and folded training steps", name)
    runs = {"float": _train_step(name, None), "folded": _train_step(name, fold_fn),
            "folded_cond": _train_step(name, fold_fn, use_cond=True)}
    for sess, train, feed in runs.values():
        for _ in range(3):  # Warm-up.
            sess.run(train, feed)
    times = {key: [] for key in runs}
    for i in range(FLAGS.step_time_steps):
        for key, (sess, train, feed) in runs.items():  # Alternate: same load.
            start = _time.perf_counter()
            sess.run(train, feed)
            times[key].append(_time.perf_counter() - start)
        logging.info("%s: step %d/%d", name, i + 1, FLAGS.step_time_steps)
    medians = {key: statistics.median(v) for key, v in times.items()}
    minimums = {key: min(v) for key, v in times.items()}
    print("%s training step minimums: float %.4f s, folded %.4f s, folded_cond %.4f s; "
          "ratios %.3f, %.3f" % (name, minimums["float"], minimums["folded"],
                                 minimums["folded_cond"],
                                 minimums["folded"] / minimums["float"],
                                 minimums["folded_cond"] / minimums["float"]))
    print("%s training step (batch %d), median of %d: float %.4f s, folded (Select) "
          "%.4f s, folded (use_cond) %.4f s; folded/float = %.3f, folded_cond/float = %.3f"
          % (name, FLAGS.step_batch_size, FLAGS.step_time_steps, medians["float"],
             medians["folded"], medians["folded_cond"], medians["folded"] / medians["float"],
             medians["folded_cond"] / medians["float"]))
    for sess, _, _ in runs.values():
        sess.close()


if __name__ == "__main__":
    app.run(main)
