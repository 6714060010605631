r"""Issue #21's fine-tune: a 50-layer network on the upsampled digits, float -> QAT -> int8 TFLite.

The network (graph mode, tf.compat.v1 layers and tf_keras layers), on the UCI
digits (scikit-learn) upsampled 8x8 -> 16x16 by pixel repetition:

* stem: 3x3 conv + batch norm + ReLU;
* dense block 1 (DenseNet-style): `--dense_units` units of
  BN-ReLU-1x1 conv-BN-ReLU-3x3 conv, each unit's output concatenated to the
  block's input (chained concatenations);
* transition: BN-ReLU-1x1 conv, 2x2 average pool (16x16 -> 8x8);
* Inception-style block: 1x1 | 1x1 -> 3x3 | 3x3 average pool (stride 1) -> 1x1,
  each conv with a batch norm and ReLU, concatenated;
* dense block 2 and a second transition (8x8 -> 4x4);
* a transformer block on the 16 positions as tokens: Dense embedding, tf_keras
  MultiHeadAttention (2 heads; query / key / value / output einsums), residual
  add, LayerNormalization, GELU MLP (Dense "gelu" + Dense), residual add,
  LayerNormalization;
* token average, Dense logits.

Procedure: train float (`--float_epochs`), then fine-tune that checkpoint
twice with the same batches (`--fine_tune_epochs` each, a tenth of the
learning rate): in float (the float accuracy quoted) and with
`qat.experimental_create_training_graph(symmetric_weights=True)`; build the
QAT eval graph separately
(`experimental_create_eval_graph`), restore the QAT checkpoint with a plain
strict `Saver().restore`, export with `qat.export.export_tflite` (int8; uint8
is tried and reported: TFLite's BATCH_MATMUL, the attention scores and
context, has no uint8 kernel, so qat.export refuses the model) and print, on the 397 held-out digits: float accuracy
(pretrained and fine-tuned), QAT
eval-graph accuracy, int8 TFLite accuracy, top-1 agreement TFLite / eval
graph, the output difference TFLite - eval graph in output steps (mean, max),
and `qat.report.layer_numerics` per layer: each layer's end-to-end steps and its
own steps (the eval graph given TFLite's inputs to that layer).

Before / after shared ranges (`qat.quantize.plan.ranges.shared_ranges`): the tool uses
whichever `qat` is on PYTHONPATH and prints which (and whether it has shared
ranges). Run it once on this tree and once with PYTHONPATH at a worktree of a
commit without shared ranges (e.g. branch `arch`); the seeds are fixed, so the
float network is the same in both runs:

  PYTHONPATH=. TF_USE_LEGACY_KERAS=1 TF_ENABLE_ONEDNN_OPTS=0 \
      .venv/bin/python tools/finetune_digits.py
  git worktree add --detach /tmp/qat-before arch
  PYTHONPATH=/tmp/qat-before TF_USE_LEGACY_KERAS=1 TF_ENABLE_ONEDNN_OPTS=0 \
      .venv/bin/python tools/finetune_digits.py

tests/finetune_digits_test.py runs these functions at a smaller size. The network and
data are tools/_digits_network.py's.
"""
import dataclasses
import math
import os
import sys
import tempfile
import time
from typing import List, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The network and data (Config, build, count_layers, digits_split).
from _digits_network import Config  # pylint: disable=g-import-not-at-top,wrong-import-position
from _digits_network import build  # pylint: disable=g-import-not-at-top,wrong-import-position
from _digits_network import count_layers  # pylint: disable=g-import-not-at-top,wrong-import-position
from _digits_network import digits_split  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1

def train(cfg: Config, train_data, path: str, quantize: bool,
          init_path: Optional[str] = None, log=print) -> List[float]:
    """Trains and saves; returns the mean loss per epoch.

    From scratch (`init_path` None: `float_epochs` at `float_rate`) or
    fine-tuning the checkpoint `init_path` (`fine_tune_epochs` at
    `fine_tune_rate`), in float or with QAT (`quantize`).
    """
    g, x, labels, _, loss = build(cfg, training=True)
    with g.as_default():
        float_saver = tf1.train.Saver()
        if quantize:
            qat.experimental_create_training_graph(g, symmetric_weights=True)
        fine_tune = init_path is not None
        rate = cfg.fine_tune_rate if fine_tune else cfg.float_rate
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.AdamOptimizer(rate).minimize(loss)
        saver = tf1.train.Saver()
        images, targets = train_data
        # The float and QAT fine-tunes see the same batches.
        rng = np.random.RandomState(cfg.seed + (2 if fine_tune else 1))
        epochs = cfg.fine_tune_epochs if fine_tune else cfg.float_epochs
        steps = len(targets) // cfg.batch
        losses = []
        with tf1.Session(graph=g) as sess:
            sess.run(tf1.global_variables_initializer())
            if init_path is not None:
                float_saver.restore(sess, init_path)
            for epoch in range(epochs):
                start = time.time()
                order = rng.permutation(len(targets))
                total = 0.0
                for step in range(steps):
                    idx = order[step * cfg.batch:(step + 1) * cfg.batch]
                    total += sess.run([train_op, loss],
                                      {x: images[idx], labels: targets[idx]})[1]
                losses.append(total / steps)
                log("  %s epoch %d/%d: loss %.4f (%.1f s)" % (
                    ("QAT fine-tune" if quantize else "float fine-tune") if fine_tune
                    else "float", epoch + 1, epochs, losses[-1],
                    time.time() - start))
                if not math.isfinite(losses[-1]):
                    raise FloatingPointError("loss is %r" % losses[-1])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            saver.save(sess, path)
    return losses


def eval_session(cfg: Config, path: str, quantize: bool):
    """The eval graph (QAT-rewritten if `quantize`), restored with a plain strict Saver."""
    g, x, _, logits, _ = build(cfg, training=False)
    with g.as_default():
        if quantize:
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
        sess = tf1.Session(graph=g)
        tf1.train.Saver().restore(sess, path)
    return sess, x, logits


@dataclasses.dataclass
class Figures:
    """What one run measures."""
    pretrained_acc: float       # The float network the fine-tunes start from.
    float_acc: float            # Fine-tuned in float (the same batches as QAT).
    qat_acc: float
    int8_acc: float
    top1_agreement: float       # TFLite int8 vs the eval graph.
    mean_output_steps: float
    max_output_steps: float
    fully_integer: bool
    uint8: str                  # "converts: ..." or why not.
    numerics: "report.NumericsReport" = None
    worst_own: Optional["report.TensorNumerics"] = None
    worst_end_to_end: Optional["report.TensorNumerics"] = None
    checked_rows: int = 0


def float_accuracy(cfg: Config, test_data, path: str) -> float:
    images, targets = test_data
    sess, x, logits = eval_session(cfg, path, quantize=False)
    with sess:
        return 100.0 * np.mean(sess.run(logits, {x: images}).argmax(1) == targets)


def evaluate(cfg: Config, test_data, pretrained_path: str, float_path: str, qat_path: str,
             workdir: str, numerics_examples: int = 100, log=print) -> Figures:
    """Accuracies, export, output parity and per-layer numerics on the test digits."""
    images, targets = test_data
    pretrained_acc = float_accuracy(cfg, test_data, pretrained_path)
    float_acc = float_accuracy(cfg, test_data, float_path)
    log("float accuracy: pretrained %.2f%%, fine-tuned %.2f%%" % (pretrained_acc, float_acc))
    sess, x, logits = eval_session(cfg, qat_path, quantize=True)
    with sess:
        qat_out = export.run_graph(sess, x.name, logits.name, images)
        qat_acc = 100.0 * np.mean(qat_out.argmax(1) == targets)
        log("QAT eval graph accuracy %.2f%%" % qat_acc)
        frozen = export.freeze_session(sess, [logits.op.name])
    models = export.export_tflite([x.name], [logits.name], workdir, frozen_graph_def=frozen,
                                  flavours=("int8",), input_ranges={x.op.name: (0.0, 1.0)})
    model = models["int8"].model
    lite = export.run_tflite(model, images)
    int8_acc = 100.0 * np.mean(lite.argmax(1) == targets)
    parity = export.check_parity(model, frozen, x.name, logits.name, images)
    try:
        export.check_fully_integer(model, frozen, label="finetune_digits int8")
        fully_integer = True
    except Exception as e:  # pylint: disable=broad-except
        log("NOT fully integer: %s" % e)
        fully_integer = False
    log("int8 TFLite accuracy %.2f%%, top-1 agreement with the eval graph %.2f%%, "
        "output TFLite - eval graph: mean %.3f, max %.2f steps" % (
            int8_acc, 100.0 * parity.top1_agreement, parity.mean_diff_steps,
            parity.max_diff_steps))
    try:
        uint8_model = export.export_tflite(
            [x.name], [logits.name], workdir, frozen_graph_def=frozen, flavours=("uint8",),
            input_ranges={x.op.name: (0.0, 1.0)})["uint8"].model
    except Exception as e:  # pylint: disable=broad-except
        uint8 = "refused: %s" % str(e).strip().splitlines()[-1][:200]
    else:
        try:
            uint8_out = export.run_tflite(uint8_model, images)
            uint8 = "converts, accuracy %.2f%%" % (
                100.0 * np.mean(uint8_out.argmax(1) == targets))
        except Exception as e:  # pylint: disable=broad-except
            uint8 = "converts, does not run: %s" % str(e).strip().splitlines()[0][:200]
    log("uint8: %s" % uint8)
    numerics = report.layer_numerics(frozen, x.name, [logits.op.name],
                                     images[:numerics_examples], flavour="int8", model=model)
    checked = [r for r in numerics.rows
               if r.tflite_tensor is not None and not math.isnan(r.max_own_steps)]
    figures = Figures(pretrained_acc, float_acc, qat_acc, int8_acc, 100.0 * parity.top1_agreement,
                      parity.mean_diff_steps, parity.max_diff_steps, fully_integer, uint8,
                      numerics, max(checked, key=lambda r: r.max_own_steps, default=None),
                      max(checked, key=lambda r: r.max_diff_steps, default=None),
                      len(checked))
    return figures


def format_layers(numerics) -> str:
    lines = ["%-44s %10s %10s %10s" % ("layer (int8, TFLite vs eval graph)",
                                        "own max", "e2e max", "e2e mean")]
    for r in numerics.rows:
        if r.tflite_tensor is None:
            lines.append("%-44s %10s" % (r.name[:44], "unmatched"))
        else:
            lines.append("%-44s %10.2f %10.2f %10.3f" % (
                r.name[:44], r.max_own_steps, r.max_diff_steps, r.mean_diff_steps))
    return "\n".join(lines)


def has_shared_ranges() -> bool:
    try:
        from qat.quantize.plan.ranges import shared_ranges  # pylint: disable=g-import-not-at-top,unused-import
        return True
    except ImportError:
        return False


def run(cfg: Config, workdir: str, log=print) -> Figures:
    """The whole procedure; returns the figures."""
    start = time.time()
    tf1.disable_eager_execution()
    counts = count_layers(cfg)
    log("network: %s" % counts)
    train_data, test_data = digits_split(cfg.size)
    pretrained_path = os.path.join(workdir, "pretrained", "model")
    float_path = os.path.join(workdir, "float", "model")
    qat_path = os.path.join(workdir, "qat", "model")
    log("float training (%d epochs)" % cfg.float_epochs)
    train(cfg, train_data, pretrained_path, quantize=False, log=log)
    log("float and QAT fine-tunes (%d epochs each)" % cfg.fine_tune_epochs)
    train(cfg, train_data, float_path, quantize=False, init_path=pretrained_path, log=log)
    train(cfg, train_data, qat_path, quantize=True, init_path=pretrained_path, log=log)
    log("evaluating (%.0f s so far)" % (time.time() - start))
    figures = evaluate(cfg, test_data, pretrained_path, float_path, qat_path, workdir, log=log)
    log("total %.0f s" % (time.time() - start))
    return figures


FLAGS = flags.FLAGS
flags.DEFINE_integer("float_epochs", Config.float_epochs, "float training epochs")
flags.DEFINE_integer("fine_tune_epochs", Config.fine_tune_epochs,
                     "float and QAT fine-tune epochs (each)")
flags.DEFINE_integer("dense_units", Config.dense_units, "units per dense block")
flags.DEFINE_integer("size", Config.size, "input side (multiple of 8)")
flags.DEFINE_integer("seed", Config.seed, "graph and data-order seed")
flags.DEFINE_string("workdir", None, "checkpoints and .tflite files (default: a temp dir)")
flags.DEFINE_boolean("layers", True, "print every layer's row")


def main(argv):
    del argv
    cfg = Config(float_epochs=FLAGS.float_epochs, fine_tune_epochs=FLAGS.fine_tune_epochs,
                 dense_units=FLAGS.dense_units, size=FLAGS.size, seed=FLAGS.seed)
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="finetune_digits_")

    def log(line):
        print(line, flush=True)

    log("qat from %s (shared ranges: %s); %s" % (
        os.path.dirname(qat.__file__), "yes" if has_shared_ranges() else "no", cfg))
    figures = run(cfg, workdir, log=log)
    if FLAGS.layers:
        log(format_layers(figures.numerics))
    log("worst own: %s %.2f steps; worst end to end: %s %.2f steps (%d rows checked)" % (
        figures.worst_own.name, figures.worst_own.max_own_steps,
        figures.worst_end_to_end.name, figures.worst_end_to_end.max_diff_steps,
        figures.checked_rows))
    log("SUMMARY float pretrained %.2f%% fine-tuned %.2f%% | QAT eval %.2f%% | int8 TFLite %.2f%% | top-1 agreement "
        "%.2f%% | output steps mean %.3f max %.2f | fully integer %s | uint8 %s" % (
            figures.pretrained_acc, figures.float_acc, figures.qat_acc, figures.int8_acc, figures.top1_agreement,
            figures.mean_output_steps, figures.max_output_steps, figures.fully_integer,
            figures.uint8))
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
