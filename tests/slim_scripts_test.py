"""The TF models repository's research/slim workflow, run as its scripts are written.

tests/slim_scripts/ holds scripts written the way research/slim's of mid-2020
are (the last version on tf.contrib.quantize): train_image_classifier.py (with
deployment/model_deploy.py's clones), eval_image_classifier.py,
export_inference_graph.py, nets/mobilenet_v1_train.py and
nets/mobilenet_v1_eval.py, with the library modules they import (datasets/,
preprocessing/, nets/nets_factory.py: tf_slim's AlexNet, Inception, OverFeat,
ResNet and VGG, and CifarNet, LeNet, MobileNet v1-v3 and a NASNet-A on
contrib_training.HParams written here). Each script differs from its TF1 form
by one line, `import qat.compat; qat.compat.install()`. They run on a tiny
ImageNet-format TFRecord dataset written here, each command in its own
process (forked from one warm interpreter: slim_scripts_util.ScriptRunner),
and TensorFlow's own tools follow unchanged:
`python -m tensorflow.python.tools.freeze_graph` and
`python -m tensorflow.lite.python.tflite_convert --enable_v1_converter` with
TF1's uint8 flags.

SlimScriptsTest runs MobileNet v1 0.25 through nets/mobilenet_v1_train.py
(float, then quantized from the float checkpoint, and quantized from
scratch), nets/mobilenet_v1_eval.py --quantize, export_inference_graph.py,
freeze_graph and the uint8 converter. One net of every nets_factory family
goes through train_image_classifier.py in tests/slim_nets_factory_test.py;
the nets with training-only branches and issue #37's summaries run in
tests/slim_training_branches_test.py. The timings of every command go to
stderr.
"""
import os
import re

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from qat import export  # pylint: disable=g-import-not-at-top
import slim_factory_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1

_SLIM = slim_factory_util.SLIM
_INSTALL_LINE = "import qat.compat; qat.compat.install()\n"
_SCRIPTS = ("nets/mobilenet_v1_train.py", "nets/mobilenet_v1_eval.py",
            "export_inference_graph.py", "train_image_classifier.py",
            "eval_image_classifier.py")
_OUTPUT = "MobilenetV1/Predictions/Reshape_1"
_NET_FLAGS = ("--num_classes=5", "--image_size=32", "--depth_multiplier=0.25")


class SlimScriptsTest(slim_factory_util.ScriptsTestCase):

    def _train(self, checkpoint_dir: str, steps: int, *flags: str) -> str:
        return self.runner.run([os.path.join(_SLIM, "nets/mobilenet_v1_train.py"),
                                f"--dataset_dir={self.dataset_dir}",
                                f"--checkpoint_dir={checkpoint_dir}", "--batch_size=8",
                                f"--number_of_steps={steps}", "--log_every_n_steps=10",
                                "--save_summaries_secs=0", "--save_interval_secs=0",
                                *_NET_FLAGS, *flags])

    def test_one_added_line_per_script(self):
        for name in _SCRIPTS:
            with open(os.path.join(_SLIM, name)) as f:
                self.assertEqual(f.read().count(_INSTALL_LINE), 1, name)
        libraries = [os.path.relpath(os.path.join(d, f), _SLIM)
                     for d, _, files in os.walk(_SLIM) for f in files
                     if f.endswith(".py") and os.path.relpath(os.path.join(d, f), _SLIM)
                     not in _SCRIPTS]
        self.assertIn("deployment/model_deploy.py", libraries)
        self.assertIn("nets/mobilenet/conv_blocks.py", libraries)
        for library in libraries:
            with open(os.path.join(_SLIM, library)) as f:
                self.assertNotIn("qat", f.read(), library)

    def test_float_then_quantized_fine_tune_eval_export_freeze_convert(self):
        float_dir = os.path.join(self.workdir, "float")
        output = self._train(float_dir, 30)
        self.assertIn("global step 30", output)
        float_ckpt = tf1.train.latest_checkpoint(float_dir)
        float_values = slim_factory_util.checkpoint_values(float_ckpt)
        self.assertFalse([n for n in float_values if "_quant" in n])

        # --quantize from the float checkpoint: the ranges are missing from it
        # and ignored (ignore_missing_vars=True), everything else restores.
        quant_dir = os.path.join(self.workdir, "quantized")
        output = self._train(quant_dir, 20, "--quantize", f"--fine_tune_checkpoint={float_ckpt}")
        self.assertIn("global step 20", output)
        self.assertRegex(output, r"Variable MobilenetV1/\S*weights_quant/min missing in checkpoint")
        quant_ckpt = tf1.train.latest_checkpoint(quant_dir)
        self.assertTrue(quant_ckpt.endswith("model.ckpt-20"))  # The global step was reset.
        quant_values = slim_factory_util.checkpoint_values(quant_ckpt)
        self.assertIn("fake_quantization_step", quant_values)
        act_max = [n for n in quant_values if n.endswith("act_quant/max")]
        self.assertNotEmpty(act_max)
        weights = "MobilenetV1/Conv2d_0/weights"
        # 20 steps at 1e-4 from the float weights, far from a fresh initialization.
        np.testing.assert_allclose(quant_values[weights], float_values[weights], atol=2e-3)

        output = self.runner.run([os.path.join(_SLIM, "nets/mobilenet_v1_eval.py"),
                                  f"--dataset_dir={self.dataset_dir}",
                                  f"--checkpoint_dir={quant_dir}",
                                  f"--eval_dir={os.path.join(self.workdir, 'eval')}",
                                  "--batch_size=8", "--num_examples=32", "--quantize",
                                  *_NET_FLAGS])
        accuracy = float(re.search(r"eval/Accuracy: ([0-9.]+)", output).group(1))
        self.assertBetween(accuracy, 0.0, 1.0)

        graph_path = os.path.join(self.workdir, "mobilenet_v1_quant.pb")
        self.runner.run([os.path.join(_SLIM, "export_inference_graph.py"),
                         "--model_name=mobilenet_v1_025", "--image_size=32", "--batch_size=1",
                         "--quantize", f"--output_file={graph_path}"])
        graph_def = tf1.GraphDef()
        with open(graph_path, "rb") as f:
            graph_def.ParseFromString(f.read())
        ops = {n.op for n in graph_def.node}
        self.assertIn("FakeQuantWithMinMaxVars", ops)
        self.assertIn("VariableV2", ops)  # TF1's ref variables, model and ranges alike.
        self.assertNotIn("VarHandleOp", ops)

        frozen_path = os.path.join(self.workdir, "frozen.pb")
        self.runner.run(["-m", "tensorflow.python.tools.freeze_graph",
                         f"--input_graph={graph_path}", "--input_binary=true",
                         f"--input_checkpoint={quant_ckpt}", f"--output_graph={frozen_path}",
                         f"--output_node_names={_OUTPUT}"])
        frozen = tf1.GraphDef()
        with open(frozen_path, "rb") as f:
            frozen.ParseFromString(f.read())
        self.assertFalse({n.op for n in frozen.node} & {"VariableV2", "VarHandleOp"})

        tflite_path = os.path.join(self.workdir, "model.tflite")
        self.runner.run(["-m", "tensorflow.lite.python.tflite_convert", "--enable_v1_converter",
                         f"--graph_def_file={frozen_path}", f"--output_file={tflite_path}",
                         "--input_arrays=input", f"--output_arrays={_OUTPUT}",
                         "--input_shapes=1,32,32,3", "--inference_type=QUANTIZED_UINT8",
                         "--mean_values=128", "--std_dev_values=127"])
        with open(tflite_path, "rb") as f:
            model = f.read()
        export.check_fully_integer(model, frozen, label="slim mobilenet_v1 uint8")
        # The exported graph's batch is 1 (its Reshape to [1, 5] is static).
        for image in np.random.RandomState(1).uniform(-1, 1, (4, 1, 32, 32, 3)):
            parity = export.check_parity(model, frozen, "input:0", f"{_OUTPUT}:0",
                                         image.astype(np.float32), max_diff_steps=4.0)
            self.assertLessEqual(parity.max_diff_steps, 4.0)

    def test_quantize_from_scratch_learns_ranges_during_the_delay(self):
        checkpoint_dir = os.path.join(self.workdir, "scratch")
        output = self._train(checkpoint_dir, 10, "--quantize")
        self.assertIn("global step 10", output)
        values = slim_factory_util.checkpoint_values(tf1.train.latest_checkpoint(checkpoint_dir))
        self.assertEqual(int(values["fake_quantization_step"]), 10)
        # The 250,000-step delay keeps the float path; the ranges learn anyway.
        moved = [n for n in values if n.endswith("act_quant/max") and values[n] != 6.0]
        self.assertNotEmpty(moved)

    def test_nets_factory_with_contrib_training_hparams(self):
        graph_path = os.path.join(self.workdir, "nasnet_quant.pbtxt")
        self.runner.run([os.path.join(_SLIM, "export_inference_graph.py"),
                         "--model_name=nasnet_cifar", "--quantize", "--write_text_graphdef",
                         f"--output_file={graph_path}"])
        with open(graph_path) as f:
            text = f.read()
        # nets_factory imported the HParams NASNet and the np.int MobileNet v3
        # spec; the NASNet built from its HParams got ranges.
        self.assertIn("cifar/final_layer/FC/weights_quant", text)
        self.assertIn("FakeQuantWithMinMaxVars", text)


if __name__ == "__main__":
    absltest.main()
