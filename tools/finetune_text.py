r"""Issue #26's synthetic text task: float, QAT fine-tune and QAT from scratch to int8 TFLite.

The task (tools/_text_models.py): "does token 7 occur?" on random
sequences of `--seq` ids from a vocabulary of 1000, half of them with the
token at 1 to 3 positions; trained on fresh random batches, measured on
`--test_examples` held-out sequences (another seed).

Procedure, for the encoder `--style` (bert_nn: BERT's modeling.py style;
bert_keras: tf_keras layers):

1. float training for `--float_steps` steps (Adam, `--rate`);
2. float -> QAT fine-tune: the float checkpoint restored into
   `qat.experimental_create_training_graph(symmetric_weights=True)`,
   `--fine_tune_steps` more steps at a tenth of the rate;
3. QAT from scratch: the same training graph from initialisation with
   `quant_delay=--quant_delay` (default 0) for `--scratch_steps` steps
   (default: the float steps);
4. each QAT checkpoint restored (plain, strict `Saver().restore`) into a
   separately built eval graph (`experimental_create_eval_graph`), exported
   to int8 TFLite with `qat.export.export_tflite` (ids stay int32).

It prints the held-out accuracy of the float graph, of each QAT eval graph
and of each int8 TFLite model, the QAT eval-graph / TFLite top-1 agreement,
the loss at the end of each run, and the size of the int8 .tflite against
the float .tflite (TF's converter without optimisations) of the same encoder.

  PYTHONPATH=. TF_USE_LEGACY_KERAS=1 .venv/bin/python tools/finetune_text.py
  PYTHONPATH=. TF_USE_LEGACY_KERAS=1 .venv/bin/python tools/finetune_text.py \
      --style=bert_keras --float_steps=100
"""
import dataclasses
import os
import sys
import tempfile
import time
from typing import Dict, Optional, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import qat  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat import export  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools import _text_models as text  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1

flags.DEFINE_enum("style", "bert_nn", sorted(text.BUILDERS), "Which encoder.")
flags.DEFINE_integer("blocks", 4, "Transformer blocks.")
flags.DEFINE_integer("float_steps", 100, "Float training steps.")
flags.DEFINE_integer("fine_tune_steps", 50, "QAT fine-tune steps after float training.")
flags.DEFINE_integer("scratch_steps", None, "QAT-from-scratch steps (default: float_steps).")
flags.DEFINE_integer("quant_delay", 0, "quant_delay of the from-scratch QAT run.")
flags.DEFINE_integer("batch", 32, "Examples per step.")
flags.DEFINE_float("rate", 1e-3, "Adam learning rate (fine-tune: a tenth).")
flags.DEFINE_integer("test_examples", 512, "Held-out sequences.")
flags.DEFINE_integer("seed", 0, "Graph seed.")
FLAGS = flags.FLAGS

# Batches of training step s use token_task seed _TRAIN_SEED + s; the
# held-out set seed _TEST_SEED (never a training seed).
_TRAIN_SEED = 1000
_TEST_SEED = 7


@dataclasses.dataclass
class RunResult:
    """One training run's held-out figures."""
    label: str
    final_loss: float
    graph_accuracy: float
    tflite_accuracy: Optional[float] = None
    agreement: Optional[float] = None
    tflite_bytes: Optional[int] = None
    seconds: float = 0.0


def train(style: str, cfg: text.TextConfig, steps: int, checkpoint: str, rate: float,
          batch: int, quantize: bool, init_checkpoint: Optional[str] = None,
          quant_delay: int = 0, seed: int = 0) -> float:
    """Trains `steps` steps and saves `checkpoint`; returns the last loss.

    Args:
      style, cfg: the encoder.
      steps, rate, batch: the schedule (Adam).
      checkpoint: where to save.
      quantize: rewrite the training graph with qat first.
      init_checkpoint: float weights to start from (a fine-tune).
      quant_delay: the rewrite's quant_delay.
      seed: graph seed.
    """
    g, ids, _, logits = text.build_graph(style, True, cfg, seed=seed)
    with g.as_default():
        labels = tf1.placeholder(tf.int32, [None], name="labels")
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        model_vars = tf1.global_variables()
        if quantize:
            qat.experimental_create_training_graph(g, symmetric_weights=True,
                                                   quant_delay=quant_delay)
        train_op = tf1.train.AdamOptimizer(rate).minimize(loss)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            if init_checkpoint:
                tf1.train.Saver(model_vars).restore(sess, init_checkpoint)
            value = float("nan")
            for step in range(steps):
                x, y = text.token_task(batch, cfg, seed=_TRAIN_SEED + step)
                value = sess.run([train_op, loss], {ids: x, labels: y})[1]
            tf1.train.Saver().save(sess, checkpoint)
    return float(value)


def eval_graph(style: str, cfg: text.TextConfig, checkpoint: str, quantized: bool,
               test: Tuple[np.ndarray, np.ndarray], workdir: str, name: str
               ) -> Tuple[float, np.ndarray, bytes]:
    """Restores the eval graph (plain, strict) and exports it.

    Returns:
      (held-out accuracy of the graph, its logits, the .tflite bytes: int8
      through qat.export when `quantized`, else TF's float conversion).
    """
    g, ids, _, logits = text.build_graph(style, False, cfg)
    with g.as_default():
        if quantized:
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
        with tf1.Session() as sess:
            tf1.train.Saver().restore(sess, checkpoint)
            out = sess.run(logits, {ids: test[0]})
            if quantized:
                models = export.export_tflite(
                    [ids.name], [logits.name], workdir, sess=sess, flavours=("int8",),
                    name=name)
                model = models["int8"].model
            else:
                frozen = export.freeze_session(sess, [logits.op.name])
                model = _float_tflite(frozen, ids, logits)
    return float(np.mean(np.argmax(out, -1) == test[1])), out, model


def _float_tflite(frozen, ids, logits) -> bytes:
    g = tf.Graph()
    with g.as_default():
        tf.import_graph_def(frozen, name="")
        with tf1.Session(graph=g) as sess:
            converter = tf1.lite.TFLiteConverter.from_session(
                sess, [g.get_tensor_by_name(ids.name)], [g.get_tensor_by_name(logits.name)])
            return converter.convert()


def run_tflite_ids(model: bytes, ids: np.ndarray) -> np.ndarray:
    """Runs a TFLite model on int32 ids as they are; returns float outputs."""
    from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
    interp = Interpreter(model_content=model)
    inp = interp.get_input_details()[0]
    interp.resize_tensor_input(inp["index"], list(ids.shape))
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], ids.astype(inp["dtype"]))
    interp.invoke()
    out = interp.get_output_details()[0]
    value = interp.get_tensor(out["index"])
    scale, zero_point = out["quantization"]
    if np.issubdtype(value.dtype, np.integer) and scale:
        value = (value.astype(np.float32) - zero_point) * scale
    return value


def run_all(style: str, cfg: text.TextConfig, float_steps: int, fine_tune_steps: int,
            scratch_steps: int, quant_delay: int, batch: int, rate: float,
            test_examples: int, workdir: str, seed: int = 0) -> Dict[str, RunResult]:
    """The procedure of the module; returns {"float", "fine_tune", "scratch": RunResult}.

    A QAT run of 0 steps is left out.
    """
    test = text.token_task(test_examples, cfg, seed=_TEST_SEED)
    results = {}
    start = time.time()
    float_ckpt = os.path.join(workdir, "float", "model")
    loss = train(style, cfg, float_steps, float_ckpt, rate, batch, False, seed=seed)
    acc, _, model = eval_graph(style, cfg, float_ckpt, False, test, workdir, "float")
    results["float"] = RunResult("float", loss, acc, tflite_bytes=len(model),
                                 seconds=time.time() - start)
    runs = (("fine_tune", fine_tune_steps, rate / 10, float_ckpt, 0),
            ("scratch", scratch_steps, rate, None, quant_delay))
    for label, steps, run_rate, init, delay in runs:
        if not steps:
            continue
        start = time.time()
        ckpt = os.path.join(workdir, label, "model")
        loss = train(style, cfg, steps, ckpt, run_rate, batch, True, init_checkpoint=init,
                     quant_delay=delay, seed=seed)
        acc, logits, model = eval_graph(style, cfg, ckpt, True, test, workdir, label)
        lite = run_tflite_ids(model, test[0])
        results[label] = RunResult(
            label, loss, acc, float(np.mean(np.argmax(lite, -1) == test[1])),
            float(np.mean(np.argmax(lite, -1) == np.argmax(logits, -1))), len(model),
            time.time() - start)
    return results


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else "%.4f" % value


def format_results(results: Dict[str, RunResult], steps: Dict[str, int]) -> str:
    """The figures of `run_all` as a table, with the int8 / float size ratio."""
    lines = ["%-10s %6s %10s %10s %10s %10s %10s %8s" % (
        "run", "steps", "loss", "graph acc", "int8 acc", "agreement", "bytes", "seconds")]
    for label, r in results.items():
        lines.append("%-10s %6d %10.4f %10.4f %10s %10s %10s %8.1f" % (
            label, steps[label], r.final_loss, r.graph_accuracy, _fmt(r.tflite_accuracy),
            _fmt(r.agreement), r.tflite_bytes, r.seconds))
    float_bytes = results["float"].tflite_bytes
    for label in ("fine_tune", "scratch"):
        if label in results:
            lines.append("int8 / float .tflite size (%s): %.3f" % (
                label, results[label].tflite_bytes / float_bytes))
    return "\n".join(lines)


def main(argv):
    del argv
    tf1.disable_eager_execution()
    cfg = text.TextConfig(blocks=FLAGS.blocks)
    scratch = FLAGS.scratch_steps if FLAGS.scratch_steps is not None else FLAGS.float_steps
    workdir = tempfile.mkdtemp(prefix="finetune_text_")
    print("qat from", os.path.dirname(qat.__file__))
    results = run_all(FLAGS.style, cfg, FLAGS.float_steps, FLAGS.fine_tune_steps, scratch,
                      FLAGS.quant_delay, FLAGS.batch, FLAGS.rate, FLAGS.test_examples,
                      workdir, FLAGS.seed)
    steps = {"float": FLAGS.float_steps, "fine_tune": FLAGS.fine_tune_steps,
             "scratch": scratch}
    print("style %s, %d held-out sequences, quant_delay %d (scratch)" % (
        FLAGS.style, FLAGS.test_examples, FLAGS.quant_delay))
    print(format_results(results, steps))


if __name__ == "__main__":
    app.run(main)
