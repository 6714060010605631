"""The TF models repository's research/slim workflow, run as its scripts are written.

tests/slim_scripts/ holds scripts written the way research/slim's of mid-2020
are (the last version on tf.contrib.quantize): nets/mobilenet_v1_train.py,
nets/mobilenet_v1_eval.py and export_inference_graph.py, with the library
modules they import (datasets/, preprocessing/, nets/nets_factory.py, which
imports a NASNet built on contrib_training.HParams and a MobileNet v3 spec on
np.int). Each script differs from its TF1 form by one line,
`import qat.compat; qat.compat.install()`. They run as subprocesses on a tiny
ImageNet-format TFRecord dataset written here, and TensorFlow's own tools
follow unchanged: `python -m tensorflow.python.tools.freeze_graph` and
`python -m tensorflow.lite.python.tflite_convert --enable_v1_converter` with
TF1's uint8 flags.
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from qat import export  # pylint: disable=g-import-not-at-top
import slim_scripts_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_SLIM = os.path.join(_TESTS_DIR, "slim_scripts")
_REPO_ROOT = os.path.dirname(_TESTS_DIR)
_INSTALL_LINE = "import qat.compat; qat.compat.install()\n"
_SCRIPTS = ("nets/mobilenet_v1_train.py", "nets/mobilenet_v1_eval.py",
            "export_inference_graph.py")
_OUTPUT = "MobilenetV1/Predictions/Reshape_1"
_NET_FLAGS = ("--num_classes=5", "--image_size=32", "--depth_multiplier=0.25")


def _run(args, cwd: str) -> str:
    """Runs `python *args` as research/slim was run (its root on PYTHONPATH)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [_SLIM, _REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{output[-6000:]}")
    return output


def _checkpoint_values(path: str) -> dict:
    reader = tf1.train.NewCheckpointReader(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


class SlimScriptsTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        cls.dataset_dir = os.path.join(cls.workdir, "imagenet")
        slim_scripts_util.write_dataset(cls.dataset_dir)

    def _train(self, checkpoint_dir: str, steps: int, *flags: str) -> str:
        return _run([os.path.join(_SLIM, "nets/mobilenet_v1_train.py"),
                     f"--dataset_dir={self.dataset_dir}", f"--checkpoint_dir={checkpoint_dir}",
                     "--batch_size=8", f"--number_of_steps={steps}", "--log_every_n_steps=10",
                     "--save_summaries_secs=0", "--save_interval_secs=0", *_NET_FLAGS, *flags],
                    self.workdir)

    def test_one_added_line_per_script(self):
        for name in _SCRIPTS:
            with open(os.path.join(_SLIM, name)) as f:
                self.assertEqual(f.read().count(_INSTALL_LINE), 1, name)
        for library in ("nets/nets_factory.py", "nets/nasnet/nasnet.py",
                        "nets/mobilenet/mobilenet_v3.py", "nets/mobilenet_v1.py",
                        "datasets/imagenet.py"):
            with open(os.path.join(_SLIM, library)) as f:
                self.assertNotIn("qat", f.read(), library)

    def test_float_then_quantized_fine_tune_eval_export_freeze_convert(self):
        float_dir = os.path.join(self.workdir, "float")
        output = self._train(float_dir, 30)
        self.assertIn("global step 30", output)
        float_ckpt = tf1.train.latest_checkpoint(float_dir)
        float_values = _checkpoint_values(float_ckpt)
        self.assertFalse([n for n in float_values if "_quant" in n])

        # --quantize from the float checkpoint: the ranges are missing from it
        # and ignored (ignore_missing_vars=True), everything else restores.
        quant_dir = os.path.join(self.workdir, "quantized")
        output = self._train(quant_dir, 20, "--quantize", f"--fine_tune_checkpoint={float_ckpt}")
        self.assertIn("global step 20", output)
        self.assertRegex(output, r"Variable MobilenetV1/\S*weights_quant/min missing in checkpoint")
        quant_ckpt = tf1.train.latest_checkpoint(quant_dir)
        self.assertTrue(quant_ckpt.endswith("model.ckpt-20"))  # The global step was reset.
        quant_values = _checkpoint_values(quant_ckpt)
        self.assertIn("fake_quantization_step", quant_values)
        act_max = [n for n in quant_values if n.endswith("act_quant/max")]
        self.assertNotEmpty(act_max)
        weights = "MobilenetV1/Conv2d_0/weights"
        # 20 steps at 1e-4 from the float weights, far from a fresh initialization.
        np.testing.assert_allclose(quant_values[weights], float_values[weights], atol=2e-3)

        output = _run([os.path.join(_SLIM, "nets/mobilenet_v1_eval.py"),
                       f"--dataset_dir={self.dataset_dir}", f"--checkpoint_dir={quant_dir}",
                       f"--eval_dir={os.path.join(self.workdir, 'eval')}", "--batch_size=8",
                       "--num_examples=32", "--quantize", *_NET_FLAGS], self.workdir)
        accuracy = float(re.search(r"eval/Accuracy: ([0-9.]+)", output).group(1))
        self.assertBetween(accuracy, 0.0, 1.0)

        graph_path = os.path.join(self.workdir, "mobilenet_v1_quant.pb")
        _run([os.path.join(_SLIM, "export_inference_graph.py"), "--model_name=mobilenet_v1_025",
              "--image_size=32", "--batch_size=1", "--quantize", f"--output_file={graph_path}"],
             self.workdir)
        graph_def = tf1.GraphDef()
        with open(graph_path, "rb") as f:
            graph_def.ParseFromString(f.read())
        ops = {n.op for n in graph_def.node}
        self.assertIn("FakeQuantWithMinMaxVars", ops)
        self.assertIn("VariableV2", ops)  # TF1's ref variables, model and ranges alike.
        self.assertNotIn("VarHandleOp", ops)

        frozen_path = os.path.join(self.workdir, "frozen.pb")
        _run(["-m", "tensorflow.python.tools.freeze_graph", f"--input_graph={graph_path}",
              "--input_binary=true", f"--input_checkpoint={quant_ckpt}",
              f"--output_graph={frozen_path}", f"--output_node_names={_OUTPUT}"], self.workdir)
        frozen = tf1.GraphDef()
        with open(frozen_path, "rb") as f:
            frozen.ParseFromString(f.read())
        self.assertFalse({n.op for n in frozen.node} & {"VariableV2", "VarHandleOp"})

        tflite_path = os.path.join(self.workdir, "model.tflite")
        _run(["-m", "tensorflow.lite.python.tflite_convert", "--enable_v1_converter",
              f"--graph_def_file={frozen_path}", f"--output_file={tflite_path}",
              "--input_arrays=input", f"--output_arrays={_OUTPUT}", "--input_shapes=1,32,32,3",
              "--inference_type=QUANTIZED_UINT8", "--mean_values=128", "--std_dev_values=127"],
             self.workdir)
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
        values = _checkpoint_values(tf1.train.latest_checkpoint(checkpoint_dir))
        self.assertEqual(int(values["fake_quantization_step"]), 10)
        # The 250,000-step delay keeps the float path; the ranges learn anyway.
        moved = [n for n in values if n.endswith("act_quant/max") and values[n] != 6.0]
        self.assertNotEmpty(moved)

    def test_nets_factory_with_contrib_training_hparams(self):
        graph_path = os.path.join(self.workdir, "nasnet_quant.pbtxt")
        _run([os.path.join(_SLIM, "export_inference_graph.py"), "--model_name=nasnet_cifar",
              "--quantize", "--write_text_graphdef", f"--output_file={graph_path}"], self.workdir)
        with open(graph_path) as f:
            text = f.read()
        # nets_factory imported the HParams NASNet and the np.int MobileNet v3
        # spec; the NASNet built from its HParams got ranges.
        self.assertIn("cifar/FC/weights_quant", text)
        self.assertIn("FakeQuantWithMinMaxVars", text)


if __name__ == "__main__":
    absltest.main()
