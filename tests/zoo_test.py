"""The zoo: every architecture of tests/zoo_util.py to fully integer TFLite.

For each model: two training steps with a finite loss; the training
checkpoint restores into a separately built eval graph with a plain, strict
`Saver().restore`; uint8 and int8 TFLite models convert with zero float
compute ops, through `qat.export` and through TensorFlow's converter with the
flags of docs/int8_export.md, every activation range a TFLite tensor with
its scale and zero point (qat.export.range_survival); and the TFLite models agree with the eval graph: every layer,
computed by the eval graph from TFLite's own values of the layers before it,
is within one quantization step of TFLite's (so no kernel disagrees;
concatenations' inputs included, qat.quantize.plan.ranges.shared_ranges), and the outputs,
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
from qat.export import range_survival  # pylint: disable=g-import-not-at-top
from qat.export.parity import run_tflite  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()

_PARITY_EXAMPLES = 8


class ZooChecks(zoo_util.ZooAssertions):
    """The zoo's procedure for one case, as assertions of a TestCase mixin.

    tests/new_arch_test.py runs it on issue #21's blocks
    (tests/arch_cases.py).
    """

    def check_train_restore_export(self, name: str) -> dict:
        """Trains, restores, exports and compares case `name` (see the module).

        Returns:
          {label: (max output steps, worst own steps of a layer)} for each
          flavour of qat.export ("uint8", "int8") and of TF's converter
          ("uint8 (TF)", "int8 (TF)").
        """
        figures = {}
        flavours = zoo_util.case_of(name).flavours
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        checkpoint = os.path.join(workdir, "ckpt", "model")
        losses = zoo_util.train_two_steps(name, checkpoint)
        self.assertTrue(np.all(np.isfinite(losses)), losses)
        sess, x, y = zoo_util.eval_session(name, checkpoint)  # strict restore
        inputs = zoo_util.make_inputs(name, _PARITY_EXAMPLES, seed=5)
        input_range = zoo_util.case_of(name).input_range
        max_diff_steps = zoo_util.case_of(name).max_output_steps or zoo_util.MAX_DIFF_STEPS
        with sess:
            reference = export.run_graph(sess, x.name, y.name, inputs)
            self.assertTrue(np.all(np.isfinite(reference)))
            outputs_vary = zoo_util.case_of(name).outputs_vary
            if outputs_vary:
                self.assert_outputs_vary(reference, "eval graph")
            models = export.export_tflite(
                [x.name], [y.name], workdir, sess=sess,
                flavours=flavours,
                input_ranges={x.op.name: input_range},
                parity_inputs=inputs, max_diff_steps=max_diff_steps)
            self.assertCountEqual(models, flavours)
            if outputs_vary:
                for flavour, exported in models.items():
                    self.assert_outputs_vary(
                        run_tflite(exported.model, inputs),
                        f"{flavour} (qat.export)")
            frozen = export.freeze_session(sess, [y.op.name])
            for flavour, exported in models.items():
                worst = self.assert_each_layer_agrees(frozen, x, y, inputs, flavour,
                                                      exported.model)
                figures[flavour] = (exported.parity.max_diff_steps, worst)
            for flavour in flavours:
                model = zoo_util.convert_with_tf(sess, x, y, flavour,
                                                 input_range, frozen=frozen)
                export.check_fully_integer(model, frozen,
                                           label=f"{name} {flavour} (TF)")
                # Every activation range is a TFLite tensor with its scale
                # (or, removed by the converter, equal to the tensor that
                # holds its value: EfficientNetB0's unadapted Normalization).
                range_survival.check_range_survival(frozen, model, label=f"{name} {flavour} (TF)")
                parity = export.check_parity(model, frozen, x.name, y.name,
                                             inputs,
                                             max_diff_steps=max_diff_steps)
                self.assertLessEqual(parity.max_diff_steps, max_diff_steps)
                worst = figures[flavour][1]
                if model != models[flavour].model:  # Same bytes: checked above.
                    worst = self.assert_each_layer_agrees(frozen, x, y, inputs,
                                                          flavour, model)
                figures[f"{flavour} (TF)"] = (parity.max_diff_steps, worst)
                if outputs_vary:
                    self.assert_outputs_vary(run_tflite(model, inputs),
                                              f"{flavour} (TF)")
        return figures


class ZooTest(ZooChecks, parameterized.TestCase):

    @parameterized.named_parameters(*[(name, name) for name in zoo_util.CASES])
    def test_train_restore_export(self, name):
        self.check_train_restore_export(name)


if __name__ == "__main__":
    absltest.main()
