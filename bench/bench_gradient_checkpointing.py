"""Peak memory of tf.gradients vs qat.gradient_checkpointing.gradients.

Builds a deep MLP or conv net in one tf.compat.v1 graph with both gradient
computations (same variables), then runs each in the same Session, side by
side, and prints the peak memory of each step, the ratio, step times and the
largest difference between the two gradients.

How peak memory is measured: the process's CPU allocator is switched to TF's
BFC allocator (TF_CPU_ALLOCATOR_USE_BFC=true, set before TensorFlow is
imported), which keeps allocation statistics. Before each measured step the
peak is reset (`tf.config.experimental.reset_memory_stats("CPU:0")`); after it,
`get_memory_info("CPU:0")["peak"]` is the most bytes the allocator had in use
at any time during the step. The figure reported is that peak minus the bytes
in use before the step (variables, mostly): the memory the step itself needed
(activations, gradients, temporaries). As a cross-check the same step is run
with `RunOptions(trace_level=FULL_TRACE)` and the largest
`allocator_bytes_in_use` in the step stats is printed too.

Usage:
  .venv/bin/python bench/bench_gradient_checkpointing.py --model=mlp
  .venv/bin/python bench/bench_gradient_checkpointing.py --model=conv --depth=24
"""
import os
import time

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # allocator statistics on CPU
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.compat.v1.layers
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags, logging  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from qat.clients import gradient_checkpointing  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "mlp", ["mlp", "conv"], "The network.")
flags.DEFINE_integer("depth", 64, "Number of dense or conv layers.")
flags.DEFINE_integer("width", 256, "MLP width / conv channels.")
flags.DEFINE_integer("batch", 2048, "Batch size (MLP); conv uses batch // 128.")
flags.DEFINE_integer("image_size", 32, "Conv net input height and width.")
flags.DEFINE_string("checkpoints", "memory",
                    "Checkpoint strategy of the checkpointed gradients: memory or speed.")
flags.DEFINE_integer("runs", 3, "Timed runs per configuration (median reported).")
flags.DEFINE_integer("seed", 0, "Random seed.")

_MIB = float(1 << 20)


def build_model():
    """Returns (loss, feed_dict) of the chosen network in the default graph."""
    rng = np.random.RandomState(FLAGS.seed)
    tf1.set_random_seed(FLAGS.seed)
    if FLAGS.model == "mlp":
        x = tf1.placeholder(tf.float32, [FLAGS.batch, FLAGS.width], name="x")
        h = x
        for i in range(FLAGS.depth):
            h = tf1.layers.dense(
                h, FLAGS.width, activation=tf.nn.tanh, name="dense%d" % i,
                kernel_initializer=tf1.random_normal_initializer(
                    stddev=1.0 / np.sqrt(FLAGS.width)))
        value = rng.randn(FLAGS.batch, FLAGS.width).astype(np.float32)
    else:
        batch = max(1, FLAGS.batch // 128)
        shape = [batch, FLAGS.image_size, FLAGS.image_size, 3]
        x = tf1.placeholder(tf.float32, shape, name="x")
        # He initialization keeps the gradients of a deep ReLU stack non-zero.
        he_init = tf1.variance_scaling_initializer(scale=2.0)
        h = tf1.layers.conv2d(x, FLAGS.width // 8, 3, padding="same", name="stem",
                              kernel_initializer=he_init)
        for i in range(FLAGS.depth):
            h = tf1.layers.conv2d(h, FLAGS.width // 8, 3, padding="same",
                                  activation=tf.nn.relu, name="conv%d" % i,
                                  kernel_initializer=he_init)
        h = tf1.layers.flatten(h)
        value = rng.rand(*shape).astype(np.float32)
    loss = tf.reduce_mean(tf.square(h))
    return loss, {x: value}


def measure(sess, fetches, feed):
    """Runs `fetches` once to warm up, then returns (peak MiB, traced MiB, values)."""
    sess.run(fetches, feed)
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    values = sess.run(fetches, feed)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    metadata = tf1.RunMetadata()
    tf.config.experimental.reset_memory_stats("CPU:0")
    sess.run(fetches, feed, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
             run_metadata=metadata)
    traced = max((m.allocator_bytes_in_use for d in metadata.step_stats.dev_stats
                  for n in d.node_stats for m in n.memory), default=0) - before
    return peak / _MIB, traced / _MIB, values


def time_runs(sess, fetches, feed, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(fetches, feed)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv):
    del argv
    graph = tf.Graph()
    with graph.as_default():
        logging.info("Building the %s (depth %d)...", FLAGS.model, FLAGS.depth)
        loss, feed = build_model()
        xs = tf1.trainable_variables()
        plain = tf.gradients(loss, xs)
        n_before = len(graph.get_operations())
        start = time.perf_counter()
        checkpointed = gradient_checkpointing.gradients(
            loss, xs, checkpoints=FLAGS.checkpoints)
        build_s = time.perf_counter() - start
        n_added = len(graph.get_operations()) - n_before
        kept = len([op for op in graph.get_operations()
                    if op.name.startswith("gradients_with_recompute/checkpoint")])
        init = tf1.global_variables_initializer()
    x_shape = list(feed.values())[0].shape
    print("model={} depth={} width={} input={} trainable variables={}".format(
        FLAGS.model, FLAGS.depth, FLAGS.width, list(x_shape), len(xs)))
    print("checkpointed gradients: strategy={} checkpoints={} ops added={} built in {:.2f} s"
          .format(FLAGS.checkpoints, kept, n_added, build_s))
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        weights_mib = tf.config.experimental.get_memory_info("CPU:0")["current"] / _MIB
        logging.info("Measuring tf.gradients...")
        plain_peak, plain_traced, plain_values = measure(sess, plain, feed)
        logging.info("Measuring checkpointed gradients...")
        ckpt_peak, ckpt_traced, ckpt_values = measure(sess, checkpointed, feed)
        logging.info("Timing %d runs each...", FLAGS.runs)
        plain_s = time_runs(sess, plain, feed, FLAGS.runs)
        ckpt_s = time_runs(sess, checkpointed, feed, FLAGS.runs)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(plain_values, ckpt_values))
    scale = max(float(np.max(np.abs(a))) for a in plain_values)
    print("memory in use before each step (variables): {:.1f} MiB".format(weights_mib))
    print("{:<28} {:>14} {:>18} {:>10}".format(
        "", "peak MiB", "peak MiB (trace)", "step s"))
    print("{:<28} {:>14.1f} {:>18.1f} {:>10.3f}".format(
        "tf.gradients", plain_peak, plain_traced, plain_s))
    print("{:<28} {:>14.1f} {:>18.1f} {:>10.3f}".format(
        "checkpointed gradients", ckpt_peak, ckpt_traced, ckpt_s))
    print("peak memory ratio tf.gradients / checkpointed: {:.2f}x".format(
        plain_peak / max(ckpt_peak, 1e-9)))
    print("step time ratio checkpointed / tf.gradients: {:.2f}x".format(
        ckpt_s / max(plain_s, 1e-9)))
    print("max |gradient difference| = {:.3g} (largest gradient {:.3g})".format(diff, scale))


if __name__ == "__main__":
    app.run(main)
