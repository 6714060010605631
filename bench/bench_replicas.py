"""QAT training step time with data-parallel replicas (issue #27).

Builds three training graphs of the small conv net of
`tools/_replica_models.py` on two logical CPU devices: QAT with 2 replicas
(TF1 towers, or MirroredStrategy with --style=mirrored) on a total batch of
2 x --batch_size, QAT with 1 replica on the same total batch, and float with
2 replicas. Each has its own Session; after warm-up their steps are
interleaved (so all see the same machine load) and the tool prints the
median step times and two ratios from the one run:

  QAT 2 replicas / QAT 1 replica (same total batch): what splitting costs or
      saves, shared ranges included (their statistics combined once per step);
  QAT / float at 2 replicas: the rewrite's overhead with replicas;

and the medians of the per-round ratios (each round times the three graphs one
after the other), which drift less with the load of a shared machine.

  .venv/bin/python bench/bench_replicas.py
  .venv/bin/python bench/bench_replicas.py --style=mirrored --batch_size=32 --image_size=32
"""
import os
import sys
import statistics
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The checkout's root, for the model builders under tools/ (`from tools import ...`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 30, "Timed steps per graph (interleaved).")
flags.DEFINE_integer("warmup", 3, "Untimed steps per graph first.")
flags.DEFINE_integer("batch_size", 16, "Batch size per replica (the 1-replica graph: twice it).")
flags.DEFINE_integer("image_size", 32, "Input height and width.")
flags.DEFINE_enum("style", "towers", ["towers", "mirrored"],
                  "TF1 multi-GPU towers, or MirroredStrategy (the rewrite after the replicas).")


def _graph(replicas: int, quantize: bool):
    from tools import _replica_models as models  # pylint: disable=g-import-not-at-top
    size = (FLAGS.image_size, FLAGS.image_size, 3)
    per_replica = FLAGS.batch_size * 2 // replicas
    if FLAGS.style == "mirrored":
        built = models.build_mirrored(per_replica, "after", num=replicas, quantize=quantize,
                                      size=size)
    else:
        built = models.build_towers(per_replica, num=replicas, quantize=quantize, size=size)
    graph, images, labels, train_op, _ = built
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    sess = tf.compat.v1.Session(graph=graph, config=models.session_config())
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    sess.run(init)
    x, y = models.make_batch(FLAGS.batch_size * 2, seed=0, size=size)
    return lambda: sess.run(train_op, {images: x, labels: y})


def main(argv):
    del argv
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.compat.v1.disable_eager_execution()
    variants = {
        "QAT, 2 replicas": _graph(2, True),
        "QAT, 1 replica": _graph(1, True),
        "float, 2 replicas": _graph(2, False),
    }
    for step in variants.values():
        for _ in range(FLAGS.warmup):
            step()
    times = {name: [] for name in variants}
    for _ in range(FLAGS.steps):
        for name, step in variants.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"style {FLAGS.style}, total batch {2 * FLAGS.batch_size}, "
          f"{FLAGS.image_size}x{FLAGS.image_size}, {FLAGS.steps} interleaved steps each")
    for name, median in medians.items():
        print(f"  {name:20} median step {1000 * median:8.2f} ms")
    print("QAT 2 replicas / QAT 1 replica (same total batch) = %.3f"
          % (medians["QAT, 2 replicas"] / medians["QAT, 1 replica"]))
    print("QAT/float at 2 replicas = %.3f"
          % (medians["QAT, 2 replicas"] / medians["float, 2 replicas"]))
    # The load of a shared machine drifts: each round's ratio, then their median.
    qat2, qat1, float2 = (times[k] for k in variants)
    print("paired: median of the %d per-round ratios: 2 vs 1 replica %.3f, QAT/float %.3f"
          % (FLAGS.steps, statistics.median(a / b for a, b in zip(qat2, qat1)),
             statistics.median(a / b for a, b in zip(qat2, float2))))


if __name__ == "__main__":
    app.run(main)
