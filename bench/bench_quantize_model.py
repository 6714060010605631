"""qat.quantize_model on Keras 3 MobileNetV2: rewrite time and training-step ratio.

Two figures for TF 2 code, measured side by side in one run:

* the time of `qat.quantize_model(model)` (one traced rewrite of the training
  function: the model traced, batch norms folded, quantizers planned and
  built, the ranges made), beside the time of tracing the float model alone
  into a `tf.function` (what any TF 2 training loop pays once), and the
  rewrite's own share (`qat.api.rewrite_graph`) of it. Aim: the rewrite
  <= 1 s.
* the QAT / float ratio of a `tf.function` GradientTape training step (SGD),
  the float model and its quantized model stepping alternately so both see
  the same machine load: the median of the per-round ratios and its
  quartiles. Aim: <= 1.25.
* the same ratio with both steps `tf.function(jit_compile=True)` (XLA on
  both sides; Keras 3's `jit_compile="auto"` on a GPU machine), and the time
  of each side's first (compiling) step. Aim: <= 1.10.

  .venv/bin/python bench/bench_quantize_model.py
  .venv/bin/python bench/bench_quantize_model.py --image_size=96 --rounds=30
"""
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_integer("image_size", 32, "Input height and width.")
flags.DEFINE_float("alpha", 0.35, "MobileNetV2 width multiplier.")
flags.DEFINE_integer("batch_size", 32, "Batch size of the training step.")
flags.DEFINE_integer("rounds", 20, "Timed rounds; each times a few steps of both models.")
flags.DEFINE_integer("steps_per_round", 5, "Steps per model per round.")
flags.DEFINE_integer("rewrites", 3, "quantize_model calls timed (fresh models); the median counts.")
flags.DEFINE_bool("xla", True, "Also time both steps under tf.function(jit_compile=True).")


def _model():
    import keras  # pylint: disable=g-import-not-at-top
    return keras.applications.MobileNetV2(
        input_shape=(FLAGS.image_size, FLAGS.image_size, 3), alpha=FLAGS.alpha,
        weights=None, classes=10)


def _rewrite_times():
    """(quantize_model s, of which rewrite_graph s, float trace s), medians."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    from qat import api  # pylint: disable=g-import-not-at-top
    spent = []
    original = api.rewrite_graph

    def timed_rewrite(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    totals, rewrites, traces = [], [], []
    api.rewrite_graph = timed_rewrite
    try:
        for _ in range(FLAGS.rewrites):
            model = _model()
            spec = tf.TensorSpec([None, FLAGS.image_size, FLAGS.image_size, 3])
            start = time.perf_counter()
            tf.function(lambda x, m=model: m(x, training=True)).get_concrete_function(spec)
            traces.append(time.perf_counter() - start)
            del spent[:]
            start = time.perf_counter()
            qat.quantize_model(model)
            totals.append(time.perf_counter() - start)
            rewrites.append(sum(spent))
    finally:
        api.rewrite_graph = original
    return statistics.median(totals), statistics.median(rewrites), statistics.median(traces)


def _step_fn(model, jit_compile=False):
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    optimizer = keras.optimizers.SGD(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def _step_ratios(jit_compile=False):
    import numpy as np  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    rng = np.random.RandomState(0)
    x = rng.rand(FLAGS.batch_size, FLAGS.image_size, FLAGS.image_size, 3).astype(np.float32)
    y = rng.randint(0, 10, FLAGS.batch_size)
    float_model = _model()
    quantized = qat.quantize_model(_model())
    steps = {"float": _step_fn(float_model, jit_compile),
             "qat": _step_fn(quantized, jit_compile)}
    first = {}
    for name, step in steps.items():  # Trace (compile) and warm up.
        start = time.perf_counter()
        step(x, y).numpy()
        first[name] = time.perf_counter() - start
        for _ in range(2):
            step(x, y).numpy()
    times = {name: [] for name in steps}
    for _ in range(FLAGS.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(FLAGS.steps_per_round):
                loss = step(x, y)
            loss.numpy()
            times[name].append((time.perf_counter() - start) / FLAGS.steps_per_round)
    ratios = sorted(q / f for q, f in zip(times["qat"], times["float"]))
    quartiles = statistics.quantiles(ratios, n=4)
    return (statistics.median(times["float"]), statistics.median(times["qat"]),
            statistics.median(ratios), quartiles[0], quartiles[2], first)


def main(argv):
    del argv
    total, rewrite, trace = _rewrite_times()
    print(f"Keras 3 MobileNetV2 alpha {FLAGS.alpha}, {FLAGS.image_size}x{FLAGS.image_size}")
    print(f"quantize_model: {total:.3f} s (median of {FLAGS.rewrites}); its rewrite "
          f"(fold + plan + emit, ranges made): {rewrite:.3f} s; tracing the float model "
          f"alone: {trace:.3f} s; quantize_model / float trace {total / trace:.2f}")
    for jit_compile in (False, True) if FLAGS.xla else (False,):
        float_step, qat_step, ratio, low, high, first = _step_ratios(jit_compile)
        label = "jit_compile=True (XLA) step" if jit_compile else "GradientTape step"
        print(f"{label}, batch {FLAGS.batch_size}: float {1000 * float_step:.1f} ms, "
              f"QAT {1000 * qat_step:.1f} ms; QAT / float {ratio:.3f} "
              f"(quartiles {low:.3f}-{high:.3f}, {FLAGS.rounds} rounds); first step "
              f"(trace{', compile' if jit_compile else ''}) float {first['float']:.1f} s, "
              f"QAT {first['qat']:.1f} s")


if __name__ == "__main__":
    app.run(main)
