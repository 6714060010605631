"""End-to-end qat demo: float training, quantization-aware fine-tuning, TFLite.

On the UCI handwritten digits (sklearn's load_digits, 8x8 images, no
download) this trains a small conv -> BN -> ReLU (x2) -> max-pool -> dense
network in tf.compat.v1 graph mode, the TF1 contrib recipe end to end:

  1. float training graph; train; save a float checkpoint;
  2. new graph, same model, qat.experimental_create_training_graph(
     symmetric_weights=True) (symmetric weights for int8, asymmetric
     activations); restore the float weights; fine-tune; save the QAT
     checkpoint;
  3. new graph, model in inference mode, qat.experimental_create_eval_graph(
     symmetric_weights=True); restore the QAT checkpoint; export uint8 and
     int8 TFLite models from that one eval graph (qat.export);
  4. print accuracies, eval graph <-> TFLite top-1 agreement, sizes, times;
  5. write the qat.report of the eval graph (coverage and per-layer numerics,
     text and JSON) with its plots (per-layer SQNR, ranges over the QAT
     steps, read back from the TensorBoard summaries written while
     fine-tuning) into <output_dir>/report, and print where they are.

Exits with status 1 when a TFLite model loses more than --max_accuracy_drop
points against the float model or agrees with the eval graph on less than
--min_agreement percent of the test examples.
"""
import contextlib
import logging as py_logging
import os
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.compat.v1.layers
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

# tf.compat.v1.layers is the TF1 API this demo shows; its deprecation notes are noise here.
warnings.filterwarnings("ignore", message=r".*`tf\.layers\.\w+` is deprecated",
                        category=UserWarning)

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 30, "Float training epochs.")
flags.DEFINE_integer("qat_epochs", 20, "Quantization-aware fine-tuning epochs.")
flags.DEFINE_string("output_dir", "out/demo", "Checkpoints and .tflite models go here.")
flags.DEFINE_integer("batch_size", 32, "Training batch size.")
flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate of float training.")
flags.DEFINE_float("qat_learning_rate", 3e-4, "Adam learning rate of the QAT fine-tuning.")
flags.DEFINE_integer("seed", 0, "Seed of the split, the initial weights and the shuffling.")
flags.DEFINE_bool("symmetric", True,
                  "int8-ready ranges: qat.experimental_create_{training,eval}_graph("
                  "symmetric_weights=True), i.e. symmetric weights (zero point 0, which the "
                  "int8 TFLite kernels need) and asymmetric activations; uint8 and int8 are "
                  "exported from the one eval graph. With --nosymmetric the contrib-default "
                  "qat.create_training_graph / create_eval_graph (asymmetric weights) are used "
                  "and only uint8 is exported.")
flags.DEFINE_bool("symmetric_activations", False,
                  "With --symmetric, make the activation ranges symmetric too "
                  "(experimental_create_*_graph(symmetric=True)); wastes about one bit after "
                  "ReLU.")
flags.DEFINE_integer("summary_every", 5,
                     "QAT fine-tuning steps between two TensorBoard summaries of the ranges.")
flags.DEFINE_float("max_accuracy_drop", 1.0,
                   "Largest allowed TFLite accuracy loss against float, in points.")
flags.DEFINE_float("min_agreement", 99.0,
                   "Smallest allowed eval graph <-> TFLite top-1 agreement, in percent.")

INPUT_NAME = "images"
OUTPUT_NAME = "probabilities"
INPUT_RANGE = (0.0, 1.0)  # Pixels 0..16 scaled by 1/16.


def load_data(seed: int):
    """Returns (x_train, y_train, x_test, y_test): NHWC float images in [0, 1]."""
    from sklearn import datasets, model_selection  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., np.newaxis]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = model_selection.train_test_split(
        x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_train, y_train, x_test, y_test


def build_model(images, is_training: bool):
    """conv3x3(16) -> BN -> ReLU -> conv3x3(32) -> BN -> ReLU -> maxpool -> dense(10).

    Returns the logits; inference graphs add the softmax output.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    layers = tf.compat.v1.layers
    # TF1 initializers draw from the graph-level seed; tf_keras' defaults would
    # pick a fresh Python-random seed per run.
    init = tf.compat.v1.glorot_uniform_initializer()
    with tf.compat.v1.variable_scope("digits", initializer=init):
        net = images
        for i, channels in enumerate((16, 32), start=1):
            net = layers.conv2d(net, channels, 3, padding="same", use_bias=False,
                                kernel_initializer=init, name=f"conv{i}")
            net = layers.batch_normalization(net, training=is_training, fused=True,
                                             name=f"conv{i}/bn")
            net = tf.nn.relu(net, name=f"conv{i}/relu")
        net = layers.max_pooling2d(net, 2, 2, name="pool")
        net = layers.flatten(net, name="flatten")
        return layers.dense(net, 10, kernel_initializer=init, name="logits")


def _train_graph(quantize: bool, seed: int):
    """Builds a training graph; with `quantize`, rewritten by create_training_graph."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name=INPUT_NAME)
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        logits = build_model(images, is_training=True)
        model_variables = tf1.global_variables()
        # The contrib recipe: forward pass and loss, then the rewrite, then the
        # optimizer. The loss must exist first: the logits' FakeQuant is only
        # routed into (and its range trained by) consumers present at rewrite time.
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
        summaries = None
        if quantize:
            if FLAGS.symmetric:
                qat.experimental_create_training_graph(
                    graph, symmetric=FLAGS.symmetric_activations, symmetric_weights=True)
            else:
                qat.create_training_graph(graph)
            # TensorBoard: every range variable (min, max) and weight histograms.
            summaries = qat.report.add_range_summaries(graph)
        rate = FLAGS.qat_learning_rate if quantize else FLAGS.learning_rate
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.AdamOptimizer(rate).minimize(loss)
        init = tf1.global_variables_initializer()
        float_saver = tf1.train.Saver(model_variables)
        saver = tf1.train.Saver()
    return graph, dict(images=images, labels=labels, loss=loss, train_op=train_op,
                       accuracy=accuracy, init=init, float_saver=float_saver, saver=saver,
                       summaries=summaries)


def train(phase: str, quantize: bool, epochs: int, data, restore_from, save_to: str, seed: int):
    """Trains (or fine-tunes) and saves a checkpoint; returns its prefix."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    x_train, y_train = data[0], data[1]
    graph, t = _train_graph(quantize, seed)
    rng = np.random.RandomState(seed + (1 if quantize else 0))
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        sess.run(t["init"])
        if restore_from:
            t["float_saver"].restore(sess, restore_from)  # Float weights only.
        writer, step = None, 0
        if t["summaries"] is not None:
            writer = tf.compat.v1.summary.FileWriter(tensorboard_dir(), graph)
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            order = rng.permutation(len(x_train))
            losses, accuracies = [], []
            for i in range(0, len(order), FLAGS.batch_size):
                batch = order[i:i + FLAGS.batch_size]
                feed = {t["images"]: x_train[batch], t["labels"]: y_train[batch]}
                if writer is not None and step % FLAGS.summary_every == 0:
                    writer.add_summary(sess.run(t["summaries"]), step)
                step += 1
                _, loss, acc = sess.run([t["train_op"], t["loss"], t["accuracy"]], feed)
                losses.append(loss)
                accuracies.append(acc)
            logging.info("%s epoch %d/%d: loss %.4f, train accuracy %.2f%% (%.1f s)", phase,
                         epoch, epochs, np.mean(losses), 100 * np.mean(accuracies),
                         time.perf_counter() - start)
        if writer is not None:
            writer.add_summary(sess.run(t["summaries"]), step)
            writer.close()
        tf.io.gfile.makedirs(os.path.dirname(save_to))
        return t["saver"].save(sess, save_to)


def tensorboard_dir() -> str:
    """Where the QAT fine-tuning writes its TensorBoard events."""
    return os.path.join(FLAGS.output_dir, "tensorboard", "qat")


def eval_session(checkpoint: str, quantize: bool):
    """Builds the inference graph (create_eval_graph when `quantize`), restores it."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(FLAGS.seed)  # Unused initializers; op determinism wants a seed.
        images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name=INPUT_NAME)
        logits = build_model(images, is_training=False)
        tf.nn.softmax(logits, name=OUTPUT_NAME)
        if quantize:
            if FLAGS.symmetric:
                qat.experimental_create_eval_graph(
                    graph, symmetric=FLAGS.symmetric_activations, symmetric_weights=True)
            else:
                qat.create_eval_graph(graph)
        saver = tf1.train.Saver()
        sess = tf1.Session(graph=graph)
        saver.restore(sess, checkpoint)
        if quantize:  # For tools/export_tflite.py: --graph=<this> --checkpoint=<qat ckpt>.
            saver.export_meta_graph(os.path.join(FLAGS.output_dir, "eval_graph.meta"))
    fake_quants = [op for op in graph.get_operations() if op.type.startswith("FakeQuant")]
    logging.info("%s eval graph restored from %s: %d FakeQuant ops",
                 "quantized" if quantize else "float", checkpoint, len(fake_quants))
    return sess


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return 100.0 * float(np.mean(np.argmax(logits, axis=1) == labels))


@contextlib.contextmanager
def _quiet_start_up():
    """TensorFlow's start-up noise kept out of the demo's output, shown if it fails.

    The C++ runtime logs to file descriptor 2 while it loads, before any
    log-level setting applies (oneDNN, CUDA on a machine without a GPU); Python
    warnings at import are TensorFlow's and tf_keras's, not the demo's.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class _OwnInfo(py_logging.Filter):
    """Passes the demo's and qat's own INFO lines, and warnings and errors of anyone."""

    def __init__(self, sources):
        super().__init__()
        self._sources = tuple(sources)

    def filter(self, record):
        return (record.levelno >= py_logging.WARNING
                or any(record.pathname.startswith(s) for s in self._sources))


def main(argv):
    del argv
    with _quiet_start_up():
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        import qat  # pylint: disable=g-import-not-at-top
        from qat import export  # pylint: disable=g-import-not-at-top
    # TensorFlow's INFO lines (the converter's "Using experimental converter") are not the demo's.
    logging.get_absl_handler().addFilter(_OwnInfo(
        [os.path.abspath(__file__), os.path.dirname(os.path.abspath(qat.__file__)) + os.sep]))
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    tf.config.experimental.enable_op_determinism()  # Same seed, same table.
    total_start = time.perf_counter()
    times = {}
    data = load_data(FLAGS.seed)
    x_test, y_test = data[2], data[3]
    logging.info("digits: %d training, %d test images", len(data[0]), len(x_test))
    ckpt_dir = os.path.join(FLAGS.output_dir, "checkpoints")
    tf.io.gfile.makedirs(FLAGS.output_dir)
    np.save(os.path.join(FLAGS.output_dir, "test_images.npy"), x_test)  # Parity inputs for the CLI.

    start = time.perf_counter()
    float_ckpt = train("float", False, FLAGS.epochs, data, None,
                       os.path.join(ckpt_dir, "float", "model.ckpt"), FLAGS.seed)
    times["float training"] = time.perf_counter() - start

    start = time.perf_counter()
    qat_ckpt = train("qat", True, FLAGS.qat_epochs, data, float_ckpt,
                     os.path.join(ckpt_dir, "qat", "model.ckpt"), FLAGS.seed)
    times["QAT fine-tuning"] = time.perf_counter() - start

    start = time.perf_counter()
    float_sess = eval_session(float_ckpt, quantize=False)
    float_probs = export.run_graph(float_sess, INPUT_NAME, OUTPUT_NAME, x_test)
    float_frozen = export.freeze_session(float_sess, [OUTPUT_NAME])
    float_sess.close()
    float_tflite = export.write_model(
        _convert_float(float_frozen), os.path.join(FLAGS.output_dir, "model_float.tflite"))
    qat_sess = eval_session(qat_ckpt, quantize=True)
    qat_probs = export.run_graph(qat_sess, INPUT_NAME, OUTPUT_NAME, x_test)
    times["evaluation"] = time.perf_counter() - start

    coverage = qat.report.coverage_report(qat_sess.graph, outputs=[OUTPUT_NAME], sess=qat_sess)
    start = time.perf_counter()
    try:
        results = export.export_tflite(
            [INPUT_NAME], [OUTPUT_NAME], FLAGS.output_dir, sess=qat_sess,
            flavours=("uint8", "int8") if FLAGS.symmetric else ("uint8",),
            default_input_range=INPUT_RANGE, parity_inputs=x_test)
        flavour = "int8" if "int8" in results else "uint8"
        numerics = qat.report.layer_numerics_from_session(
            qat_sess, INPUT_NAME, [OUTPUT_NAME], x_test, model=results[flavour].model,
            flavour=flavour)
    except export.ExportError as e:
        logging.error("export of the QAT eval graph failed: %s", e)
        return 1
    finally:
        qat_sess.close()
    times["TFLite export + parity"] = time.perf_counter() - start
    tflite_acc = {f: accuracy(export.run_tflite(r.model, x_test), y_test)
                  for f, r in results.items()}

    float_acc = accuracy(float_probs, y_test)
    rows = [("float (eval graph)", float_acc, None, os.path.getsize(float_tflite), "float32"),
            ("QAT eval graph", accuracy(qat_probs, y_test), None, None, "fake quant")]
    for flavour, result in results.items():
        rows.append((f"TFLite {flavour}", tflite_acc[flavour], result.parity, result.size_bytes,
                     "fully integer"))
    print()
    print(f"UCI digits test split: {len(x_test)} images (seed {FLAGS.seed}), "
          f"{FLAGS.epochs} float + {FLAGS.qat_epochs} QAT epochs; ranges: " +
          ("contrib default (asymmetric)" if not FLAGS.symmetric else
           "symmetric weights, " + ("symmetric" if FLAGS.symmetric_activations
                                    else "asymmetric") + " activations"))
    print(f"{'model':<20} {'accuracy':>9} {'vs float':>9} {'top-1 agree':>12} "
          f"{'max diff':>10} {'size':>10}  kernels")
    for name, acc, par, size, kind in rows:
        agree = f"{100 * par.top1_agreement:.2f}%" if par else "-"
        diff = f"{par.max_diff_steps:.1f} steps" if par else "-"
        size_text = f"{size / 1024:.1f} KiB" if size else "-"
        print(f"{name:<20} {acc:>8.2f}% {acc - float_acc:>+8.2f}  {agree:>12} {diff:>10} "
              f"{size_text:>10}  {kind}")
    print("(top-1 agree / max diff: TFLite vs the QAT eval graph on the test images, diff in "
          "output quantization steps; size: .tflite file, float row: the float model unquantized)")
    print("size ratio float/quantized: " + ", ".join(
        f"{flavour} {os.path.getsize(float_tflite) / r.size_bytes:.2f}x"
        for flavour, r in results.items()))
    times["total"] = time.perf_counter() - total_start
    print("wall times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    print(f"models: {', '.join(r.path for r in results.values())}")
    _write_report(coverage, numerics)

    failures = []
    for flavour, result in results.items():
        if float_acc - tflite_acc[flavour] > FLAGS.max_accuracy_drop:
            failures.append(f"TFLite {flavour} accuracy {tflite_acc[flavour]:.2f}% is more than "
                            f"{FLAGS.max_accuracy_drop} points below float {float_acc:.2f}%")
        if 100 * result.parity.top1_agreement < FLAGS.min_agreement:
            failures.append(f"TFLite {flavour} agrees with the eval graph on "
                            f"{100 * result.parity.top1_agreement:.2f}% < {FLAGS.min_agreement}%")
    for failure in failures:
        logging.error("%s", failure)
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 1 if failures else 0


def _write_report(coverage, numerics) -> None:
    """Writes report text/JSON and plots into <output_dir>/report; prints the paths."""
    from qat import report  # pylint: disable=g-import-not-at-top
    ranges = report.range_history(report.read_scalars(tensorboard_dir()))
    paths = report.write_reports(os.path.join(FLAGS.output_dir, "report"), coverage,
                                 numerics, ranges)
    print()
    print("qat.report:")
    for line in coverage.summary_lines() + numerics.summary_lines():
        print(f"  {line}")
    for kind, path in paths.items():
        print(f"  {kind}: {path}")
    print(f"  TensorBoard ranges and weights: tensorboard --logdir {tensorboard_dir()}")


def _convert_float(frozen) -> bytes:
    """A float TFLite model of the float eval graph, for the size comparison."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(frozen, name="")
        with tf.compat.v1.Session(graph=graph) as sess:
            converter = tf.compat.v1.lite.TFLiteConverter.from_session(
                sess, [graph.get_tensor_by_name(INPUT_NAME + ":0")],
                [graph.get_tensor_by_name(OUTPUT_NAME + ":0")])
    return converter.convert()


if __name__ == "__main__":
    app.run(main)
