"""The zoo: every architecture of tests/zoo_util.py to fully integer TFLite.

For each model: two training steps with a finite loss; the training
checkpoint restores into a separately built eval graph with a plain, strict
`Saver().restore`; uint8 and int8 TFLite models convert with zero float
compute ops, through `qat.export` and through TensorFlow's converter with the
README's flags; and the TFLite models agree with the eval graph: every layer,
computed by the eval graph from TFLite's own values of the layers before it,
is within one quantization step of TFLite's (so no kernel disagrees;
concatenations' inputs included, qat.quantize.shared_ranges), and the outputs,
where rounding differences have added up through the whole network, within a
looser bound (per case where measured apart). Where the case declares it
(zoo_util.Case.outputs_vary), the eval graph and every TFLite model give
different outputs for different examples.
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# oneDNN fuses Conv2D+BiasAdd+LeakyRelu and drops alpha (TF bug): the eval
# graph must compute what the model says.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

from qat import export  # pylint: disable=g-import-not-at-top
from qat.export.parity import run_tflite  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

# Given the same inputs, a TFLite kernel and the eval graph differ only where
# a value lies within float rounding (or the bias's int32 rounding) of a
# rounding boundary: one step.
_MAX_OWN_STEPS = 1.0 + 1e-3
# Such one-step differences add up through the network, most where a layer's
# gain is high (ResNet50V2's pre-activation batch norms amplify a one-step
# input difference to six output steps). Worst measured end to end without a
# concatenation: 13.00 steps (ResNet50V2; README "The zoo"). The zoo is
# seeded: the margin (1.4x or more) is for other thread counts and TensorFlow
# versions. Cases measured apart (zoo_util.Case.max_output_steps) have their
# own bound.
_MAX_DIFF_STEPS = 24.0
# Rows TFLite keeps no tensor of (a layer's own range before a ReLU that
# TFLite fuses into it) are not compared; the rest must be, at least half.
_MIN_MATCHED_ROWS = 0.5
_PARITY_EXAMPLES = 8


class ZooTest(parameterized.TestCase):

    @parameterized.named_parameters(*[(name, name) for name in zoo_util.CASES])
    def test_train_restore_export(self, name):
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        checkpoint = os.path.join(workdir, "ckpt", "model")
        losses = zoo_util.train_two_steps(name, checkpoint)
        self.assertTrue(np.all(np.isfinite(losses)), losses)
        sess, x, y = zoo_util.eval_session(name, checkpoint)  # strict restore
        inputs = zoo_util.make_inputs(name, _PARITY_EXAMPLES, seed=5)
        input_range = zoo_util.CASES[name].input_range
        max_diff_steps = zoo_util.CASES[name].max_output_steps or _MAX_DIFF_STEPS
        with sess:
            reference = export.run_graph(sess, x.name, y.name, inputs)
            self.assertTrue(np.all(np.isfinite(reference)))
            outputs_vary = zoo_util.CASES[name].outputs_vary
            if outputs_vary:
                self._assert_outputs_vary(reference, "eval graph")
            models = export.export_tflite(
                [x.name], [y.name], workdir, sess=sess,
                flavours=("uint8", "int8"),
                input_ranges={x.op.name: input_range},
                parity_inputs=inputs, max_diff_steps=max_diff_steps)
            self.assertCountEqual(models, ["uint8", "int8"])
            if outputs_vary:
                for flavour, exported in models.items():
                    self._assert_outputs_vary(
                        run_tflite(exported.model, inputs),
                        f"{flavour} (qat.export)")
            frozen = export.freeze_session(sess, [y.op.name])
            for flavour, exported in models.items():
                self._assert_each_layer_agrees(frozen, x, y, inputs, flavour,
                                               exported.model)
            for flavour in ("uint8", "int8"):
                model = zoo_util.convert_with_tf(sess, x, y, flavour,
                                                 input_range)
                export.check_fully_integer(model, frozen,
                                           label=f"{name} {flavour} (TF)")
                parity = export.check_parity(model, frozen, x.name, y.name,
                                             inputs,
                                             max_diff_steps=max_diff_steps)
                self.assertLessEqual(parity.max_diff_steps, max_diff_steps)
                if model != models[flavour].model:  # Same bytes: checked above.
                    self._assert_each_layer_agrees(frozen, x, y, inputs, flavour,
                                                   model)
                if outputs_vary:
                    self._assert_outputs_vary(run_tflite(model, inputs),
                                              f"{flavour} (TF)")

    def _assert_each_layer_agrees(self, frozen, x, y, inputs, flavour, model):
        agreement = zoo_util.layer_agreement(frozen, x, y, inputs, flavour, model)
        numerics = agreement.numerics
        self.assertGreaterEqual(len(agreement.matched),
                                _MIN_MATCHED_ROWS * len(numerics.rows), numerics.format())
        self.assertIsNotNone(numerics.rows[-1].tflite_tensor, "the model output")
        self.assertTrue(agreement.checked)
        worst = agreement.worst
        self.assertLessEqual(worst.max_own_steps, _MAX_OWN_STEPS,
                             f"{flavour}: {worst.name}\n{numerics.format()}")

    def _assert_outputs_vary(self, outputs, label):
        """Parity means little if every example gets the same output."""
        flat = np.reshape(outputs, (len(outputs), -1))
        self.assertGreater(len(np.unique(flat, axis=0)), 1,
                           f"{label}: the same output for every example")


if __name__ == "__main__":
    absltest.main()
