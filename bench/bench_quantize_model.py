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
* the same ratio under `tf.distribute.MirroredStrategy` on --replicas logical
  CPU devices of this machine (`strategy.run` of the step, the same total
  batch split between the replicas; --replicas=0 leaves it out). Both sides
  synchronise their replicas (the gradients; QAT also its range statistics)
  and the replicas share the machine's cores: it says what QAT's
  synchronisation costs, not what more devices gain. Aim: <= 1.40.

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
flags.DEFINE_integer("replicas", 2, "Logical CPU devices of the MirroredStrategy row (0: no such row).")


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


def _configure_replica_devices() -> bool:
    """--replicas logical CPU devices, before TensorFlow initialises (False: refused)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    try:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0],
            [tf.config.LogicalDeviceConfiguration()] * FLAGS.replicas)
    except RuntimeError:
        return False
    return True


def _mirrored_step_fn(strategy, model):
    """A tf.function: `strategy.run` of one GradientTape SGD step, the loss summed."""
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with strategy.scope():
        optimizer = keras.optimizers.SGD(1e-3)
        optimizer.build(model.trainable_variables)  # Mirrored slots, before tracing.
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="sum")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / FLAGS.batch_size
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    @tf.function
    def step(x, y):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    return step


def _mirrored_step_ratios():
    """As `_step_ratios`, both models trained under MirroredStrategy on --replicas devices."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    rng = np.random.RandomState(0)
    x = rng.rand(FLAGS.batch_size, FLAGS.image_size, FLAGS.image_size, 3).astype(np.float32)
    y = rng.randint(0, 10, FLAGS.batch_size)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{k}" for k in range(FLAGS.replicas)])
    with strategy.scope():
        float_model = _model()
        quantized = qat.quantize_model(_model())
    batch = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(FLAGS.batch_size))))
    steps = {"float": _mirrored_step_fn(strategy, float_model),
             "qat": _mirrored_step_fn(strategy, quantized)}
    for step in steps.values():  # Trace and warm up.
        for _ in range(3):
            step(*batch).numpy()
    times = {name: [] for name in steps}
    for _ in range(FLAGS.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(FLAGS.steps_per_round):
                loss = step(*batch)
            loss.numpy()
            times[name].append((time.perf_counter() - start) / FLAGS.steps_per_round)
    ratios = sorted(q / f for q, f in zip(times["qat"], times["float"]))
    quartiles = statistics.quantiles(ratios, n=4)
    return (statistics.median(times["float"]), statistics.median(times["qat"]),
            statistics.median(ratios), quartiles[0], quartiles[2])


def main(argv):
    del argv
    replicas = FLAGS.replicas > 1 and _configure_replica_devices()
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
    if replicas:
        float_step, qat_step, ratio, low, high = _mirrored_step_ratios()
        print(f"MirroredStrategy step, {FLAGS.replicas} logical CPU devices, total batch "
              f"{FLAGS.batch_size}: float {1000 * float_step:.1f} ms, QAT {1000 * qat_step:.1f} "
              f"ms; QAT / float {ratio:.3f} (quartiles {low:.3f}-{high:.3f}, "
              f"{FLAGS.rounds} rounds)")
    elif FLAGS.replicas > 1:
        print("MirroredStrategy step: left out (TensorFlow had started before the "
              "devices could be configured)")


if __name__ == "__main__":
    app.run(main)
