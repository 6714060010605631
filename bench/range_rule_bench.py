"""QAT from scratch, fine-tuning and quant_delay under two activation range rules.

Trains one model several ways with the same seeds and batches and prints the
held-out accuracy of the eval graph (the ranges frozen, as TFLite uses them)
at the given steps:

  float     float training;
  scratch   QAT from the first step (quant_delay=0), under each rule;
  finetune  float training, then QAT at a tenth of the learning rate for half
            the steps, under each rule;
  delay     QAT with quant_delay = half the steps (the current rule).

The rules: "now", qat's bias-corrected moving average (rate (1 - decay) /
(1 - decay^t) at step t), and "before", the plain moving average from the
first batch's range (rate 1 at step 1, then 1 - decay) that qat used before
issue #26, rebuilt here for the comparison. Models: the issue's BERT-style
encoders on "does token 7 occur?" (bert_nn, bert_keras), the digits demo's
model (demo), a small CNN without batch norm on the digits (cnn).

  .venv/bin/python bench/range_rule_bench.py --model=bert_nn --steps=100 --eval_at=25,50
  .venv/bin/python bench/range_rule_bench.py --model=cnn --steps=400 --runs=float,scratch,finetune
"""
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The checkout's root, for the model builders under tools/ (`from tools import ...`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "bert_nn", ["bert_nn", "bert_keras", "demo", "cnn"], "The model.")
flags.DEFINE_integer("steps", 100, "Training steps (fine-tuning: half of them).")
flags.DEFINE_list("eval_at", [], "Further steps at which to evaluate (always: the last).")
flags.DEFINE_list("runs", ["float", "scratch", "finetune", "delay"],
                  "Any of float, scratch, finetune, delay.")
flags.DEFINE_list("rules", ["before", "now"], "Range rules of the scratch and finetune runs.")
flags.DEFINE_integer("batch", 32, "Batch size.")
flags.DEFINE_bool("tflite", False,
                  "Also export the last QAT eval graph of each run to int8 TFLite (qat.export) and "
                  "print the model's accuracy.")
flags.DEFINE_integer("trial_seed", 0, "Seed of the initial weights and of the batch order.")


def _before_rate(self, out, decay, step, counter=None):
    """The rule before issue #26: rate 1 on the first step, then 1 - decay."""
    del counter  # The range's skipped batches: not counted by this rule.
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    rate = out.shared_const("ema_rate", 1.0 - decay, tf.float32)
    if step is None:
        return rate
    writer = self._writer  # pylint: disable=protected-access

    def first_batch_rate():
        scope = writer.shared_scope()
        step_ref = step if isinstance(step, str) else writer.external(step)
        first = writer.node("%s/first_batch_%d" % (scope, writer.serial), "Equal",
                            [step_ref, writer.shared_const("one_step", 1, tf.int64)],
                            T=tf.int64)
        return writer.node(
            "%s/ema_rate_%d" % (scope, writer.serial), "Select",
            [first, writer.shared_const("full_rate", 1.0, tf.float32), rate], T=tf.float32)
    return writer.shared(("first_batch_rate", decay), first_batch_rate)


_NOW_RATE = None


def _set_rule(rule):
    from qat.quantize.emit import range_updates  # pylint: disable=g-import-not-at-top
    global _NOW_RATE
    if _NOW_RATE is None:
        _NOW_RATE = range_updates.RangeUpdates.ema_rate
    range_updates.RangeUpdates.ema_rate = _before_rate if rule == "before" else _NOW_RATE


def _digits():
    from sklearn import datasets, model_selection  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = model_selection.train_test_split(
        x, digits.target.astype(np.int64), test_size=0.25, random_state=0,
        stratify=digits.target)
    return x_train, y_train, x_test, y_test


def _model(name):
    """(build(training) -> (graph, input, logits), data, learning rate)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf1 = tf.compat.v1
    if name.startswith("bert"):
        from tools import _text_models  # pylint: disable=g-import-not-at-top
        cfg = _text_models.TextConfig()
        data = (*_text_models.token_task(4096, cfg, seed=1),
                *_text_models.token_task(512, cfg, seed=2))

        def build_bert(training):
            graph, ids, _, logits = _text_models.build_graph(name, training, cfg,
                                                             seed=FLAGS.trial_seed)
            return graph, ids, logits
        return build_bert, data, 1e-3

    def build_digits(training):
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(FLAGS.trial_seed)
            x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
            if name == "demo":
                from tools import qat_demo  # pylint: disable=g-import-not-at-top
                logits = qat_demo.build_model(x, is_training=training)
            else:
                net = x
                for i, (channels, stride) in enumerate(((8, 1), (16, 2), (32, 2))):
                    net = tf1.layers.conv2d(net, channels, 3, stride, "same",
                                            activation=tf.nn.relu, name=f"conv{i}")
                logits = tf1.layers.dense(tf.reduce_mean(net, [1, 2]), 10, name="logits")
        return graph, x, logits
    return build_digits, _digits(), 3e-3


def _evaluate(build, data, path, quantize, last=False):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    tf1 = tf.compat.v1
    x_test, y_test = data[2], data[3]
    graph, x, logits = build(False)
    with graph.as_default():
        if quantize:
            qat.experimental_create_eval_graph(graph, symmetric_weights=True)
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            saver.restore(sess, path)
            out = np.concatenate([sess.run(logits, {x: x_test[i:i + 256]})
                                  for i in range(0, len(x_test), 256)])
            if quantize and FLAGS.tflite and last:
                exported = qat.export.export_tflite(
                    [x.op.name], [logits.op.name], tempfile.mkdtemp(), sess=sess,
                    flavours=("int8",), require_integer=False, default_input_range=(0.0, 1.0))
                lite = qat.export.run_tflite(exported["int8"].model, x_test)
                float_ops = [f.tflite_op for f in
                             qat.export.find_float_ops(exported["int8"].report)]
                print(f"  int8 TFLite: accuracy {100 * np.mean(lite.argmax(1) == y_test):.2f}%, "
                      f"float ops {float_ops}", flush=True)
    return float(np.mean(out.argmax(1) == y_test))


def _train(build, data, rate, steps, quantize, eval_at, quant_delay=0, restore=None):
    """Returns ({step: accuracy}, last checkpoint)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import qat  # pylint: disable=g-import-not-at-top
    tf1 = tf.compat.v1
    x_train, y_train = data[0], data[1]
    graph, x, logits = build(True)
    with graph.as_default():
        labels = tf1.placeholder(tf.int64, [None])
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        model_variables = tf1.global_variables()
        if quantize:
            qat.experimental_create_training_graph(graph, quant_delay=quant_delay,
                                                   symmetric_weights=True)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.AdamOptimizer(rate).minimize(loss)
        saver, float_saver = tf1.train.Saver(), tf1.train.Saver(model_variables)
        sess = tf1.Session()
        sess.run(tf1.global_variables_initializer())
        if restore:
            float_saver.restore(sess, restore)
    bs = FLAGS.batch
    rng = np.random.RandomState(FLAGS.trial_seed)
    order = np.concatenate([rng.permutation(len(x_train))
                            for _ in range(steps * bs // len(x_train) + 1)])
    folder = tempfile.mkdtemp()
    accuracy = {}
    for step in range(1, steps + 1):
        batch = order[(step - 1) * bs:step * bs]
        sess.run(train_op, {x: x_train[batch], labels: y_train[batch].astype(np.int64)})
        if step in eval_at or step == steps:
            path = saver.save(sess, os.path.join(folder, "model"), global_step=step)
            accuracy[step] = _evaluate(build, data, path, quantize, last=step == steps)
    sess.close()
    return accuracy, path


def _show(label, accuracy, start):
    cells = ", ".join(f"step {s}: {100 * a:.2f}%" for s, a in sorted(accuracy.items()))
    print(f"{FLAGS.model} {label:<20} {cells}  ({time.perf_counter() - start:.0f} s)", flush=True)


def main(argv):
    del argv
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.compat.v1.disable_eager_execution()
    build, data, rate = _model(FLAGS.model)
    eval_at = {int(s) for s in FLAGS.eval_at}
    start = time.perf_counter()
    float_path = None
    if "float" in FLAGS.runs or "finetune" in FLAGS.runs:
        accuracy, float_path = _train(build, data, rate, FLAGS.steps, False, eval_at)
        _show("float", accuracy, start)
    for rule in FLAGS.rules:
        _set_rule(rule)
        if "scratch" in FLAGS.runs:
            _show(f"qat scratch {rule}",
                  _train(build, data, rate, FLAGS.steps, True, eval_at)[0], start)
        if "finetune" in FLAGS.runs:
            _show(f"qat finetune {rule}",
                  _train(build, data, rate / 10, FLAGS.steps // 2, True, set(),
                         restore=float_path)[0], start)
    _set_rule("now")
    if "delay" in FLAGS.runs:
        _show(f"qat delay {FLAGS.steps // 2}",
              _train(build, data, rate, FLAGS.steps, True, eval_at,
                     quant_delay=FLAGS.steps // 2)[0], start)
    return 0


if __name__ == "__main__":
    app.run(main)
