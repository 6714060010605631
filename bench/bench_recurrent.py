"""Recurrent models of the digit rows, float and QAT, exported int8.

The UCI digits read as sequences (8 rows of 8 features), classified by a
recurrent layer of `--units` units and a dense head. Three measurements:

* `--measure=forms` (default): for each form (`--forms`), a float model is
  trained `--float_steps` Adam steps, then fine-tuned with QAT
  `--qat_steps` steps at a tenth of the rate, exported int8 (TF1 forms also
  uint8) and checked. Printed per form and flavour: float and QAT
  accuracy (test split), the TFLite model's accuracy and top-1 agreement
  with the eval graph, float ops, the largest difference of a layer (at any
  step) given TFLite's own inputs in steps, and the model size.
* `--measure=loops`: one quantized LSTM cell written twice, unrolled and as a
  `tf.while_loop` (its body quantized by hand with FakeQuant ops, state in
  the loop variables, the step input read by a gather), converted by TF's
  converter: float ops, model size, invoke time (batch 1 and 256, LiteRT
  reference kernels) and the output's difference from the TF function.
* `--measure=int16`: the unrolled cell of `--measure=loops` converted in TF's
  16x8 mode (int16 activations, int8 weights), without and with a
  representative dataset: whether it converts, or the converter's errors.

  .venv/bin/python bench/bench_recurrent.py
  .venv/bin/python bench/bench_recurrent.py --forms=k3_lstm,tf1_static_gru --float_steps=300
  .venv/bin/python bench/bench_recurrent.py --measure=loops --steps_per_sequence=8,49
  .venv/bin/python bench/bench_recurrent.py --measure=int16
"""
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl import app, flags  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
FORMS = ("k3_gru_unroll", "k3_lstm_unroll", "k3_lstm", "k3_gru", "k3_simple_rnn",
         "k3_bidirectional", "tf1_static_lstm", "tf1_static_gru", "tf1_dynamic_lstm",
         "tf1_dynamic_gru", "tf1_dynamic_lstm_v1")
flags.DEFINE_enum("measure", "forms", ["forms", "loops", "int16"], "What to measure.")
flags.DEFINE_list("forms", list(FORMS), f"Forms to train and export, of {', '.join(FORMS)}.")
flags.DEFINE_integer("units", 32, "Units of the recurrent layers.")
flags.DEFINE_integer("float_steps", 1500, "Float training steps (batch 32, Adam 3e-3).")
flags.DEFINE_integer("qat_steps", 500, "QAT fine-tuning steps (Adam 3e-4).")
flags.DEFINE_integer("seed", 0, "Seed of the weights and the batches.")
flags.DEFINE_list("steps_per_sequence", ["8", "49"],
                  "--measure=loops and int16: sequence lengths.")


def main(_):
    from tools import _recurrent_models as models  # pylint: disable=g-import-not-at-top
    if FLAGS.measure == "loops":
        for steps in FLAGS.steps_per_sequence:
            for line in models.loop_forms(int(steps), FLAGS.units):
                print(line, flush=True)
        return
    if FLAGS.measure == "int16":
        for steps in FLAGS.steps_per_sequence:
            for line in models.int16_conversions(int(steps), FLAGS.units):
                print(f"{steps} steps, {line}", flush=True)
        return
    print(f"digit rows: 8 steps of 8 features, {FLAGS.units} units; float {FLAGS.float_steps} "
          f"steps, QAT {FLAGS.qat_steps} steps")
    print(f"{'form':<22} {'flavour':<7} {'float':>7} {'QAT':>7} {'TFLite':>7} {'agree':>7} "
          f"{'float_ops':>9} {'own_steps':>9} {'size':>9} {'seconds':>8}")
    for form in FLAGS.forms:
        start = time.time()
        rows = models.run_form(form, FLAGS.units, FLAGS.float_steps, FLAGS.qat_steps,
                               FLAGS.seed, tempfile.mkdtemp())
        for r in rows:
            own = "nan" if math.isnan(r["own_steps"]) else f"{r['own_steps']:.2f}"
            print(f"{form:<22} {r['flavour']:<7} {r['float']:>7.2%} {r['qat']:>7.2%} "
                  f"{r['tflite']:>7.2%} {r['agreement']:>7.2%} {r['float_ops']:>9} {own:>9} "
                  f"{r['size']:>9} {time.time() - start:>8.0f}", flush=True)


if __name__ == "__main__":
    app.run(main)
