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

SlimNetsTest takes one net of every nets_factory family through
train_image_classifier.py (one clone; two for MobileNet v1, ResNet v1 50 and
MobileNet v3, the last in ten runs), eval_image_classifier.py --quantize,
export_inference_graph.py --quantize, a strict restore of the training
checkpoint into the export graph, freeze_graph and the uint8 converter: the
model prepares, is fully integer, and each layer agrees with the frozen graph
given TFLite's inputs. TrainingBranchesTest takes the nets whose training
graph has an auxiliary head (Inception v3, NASNet-A and PNASNet-5 mobile)
through training, export, strict restore, freeze_graph and the converter;
SummariesTest runs ResNet v1 50 as issue #37 did (RMSProp, summaries on).
The timings of every command go to stderr.
"""
import dataclasses
import gc
import os
import re
import resource
import sys
import tempfile
import time
from typing import Tuple

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
            "export_inference_graph.py", "train_image_classifier.py",
            "eval_image_classifier.py")
_OUTPUT = "MobilenetV1/Predictions/Reshape_1"
_NET_FLAGS = ("--num_classes=5", "--image_size=32", "--depth_multiplier=0.25")


def _checkpoint_values(path: str) -> dict:
    reader = tf1.train.NewCheckpointReader(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


class _ScriptsTestCase(absltest.TestCase):
    """The dataset, and the runner the commands go through, once per class."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        cls.dataset_dir = os.path.join(cls.workdir, "imagenet")
        slim_scripts_util.write_dataset(cls.dataset_dir)
        # research/slim's root on PYTHONPATH, as its scripts are run.
        cls.runner = slim_scripts_util.ScriptRunner([_SLIM, _REPO_ROOT], cls.workdir)

    @classmethod
    def tearDownClass(cls):
        cls.runner.close()
        for t in cls.runner.timings:
            print("slim_scripts_test timing: %(label)s %(wall_s).1f s wall, %(cpu_s).1f s CPU, "
                  "%(max_rss_mb).0f MB" % t, file=sys.stderr)
        super().tearDownClass()


class SlimScriptsTest(_ScriptsTestCase):

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
        values = _checkpoint_values(tf1.train.latest_checkpoint(checkpoint_dir))
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


# --- train_image_classifier.py, eval_image_classifier.py, export_inference_graph.py

# The uint8 input flags for each preprocessing (--mean_values, an integer, and
# --std_dev_values): real = (q - mean) / std covers the range its pixels lie in.
_INPUT_FLAGS = {
    "inception": (128, 127.0),      # [-1.008, 1]: [-1, 1]
    "vgg": (114, 0.92),             # [-123.9, 153.3]: [0, 255] less the channel means, [-123.68, 151.06]
    "lenet": (128, 128.0),          # [-1, 127/128]
    "cifarnet": (128, 32.0),        # [-4, 3.97]: per-image standardization
}


@dataclasses.dataclass(frozen=True)
class Net:
    """One nets_factory net: how it trains here and what its frozen graph outputs."""
    model_name: str
    output: str                  # The export's output node (freeze_graph, tflite_convert).
    image_size: int
    preprocessing: str           # preprocessing/<name>_preprocessing.py: the input range.
    batch_size: int = 4
    steps: int = 3
    optimizer: str = "rmsprop"
    learning_rate: float = 0.01
    train_flags: Tuple[str, ...] = ()
    # TF ops TFLite has no integer kernel for: float in the uint8 model, and
    # only they (CifarNet's local response normalizations).
    float_ops: Tuple[str, ...] = ()
    # Each layer against the frozen graph (qat.report.layer_numerics). Off for
    # VGG and OverFeat: for a 130-145 M parameter frozen graph it takes 70 s
    # of CPU and 11 GB in this process (VGG-A); AlexNet checks the same kinds
    # of layers.
    numerics: bool = True


# The smallest configurations: 32x32 where the net takes any size; the
# default size where a VALID head needs it (AlexNet, OverFeat, VGG: 224, 231;
# Inception v1's 7x7 average pool: 224). Batch 1 and SGD for the nets with
# 50-145 M parameters (no optimizer slots in the checkpoint), at a learning rate
# that keeps their ReLUs alive on VGG preprocessing's [-124, 151] pixels.
_BIG = dict(batch_size=1, steps=2, optimizer="sgd", learning_rate=1e-4)
NETS = {
    "alexnet_v2": Net("alexnet_v2", "alexnet_v2/fc8/squeezed", 224, "vgg",
                      train_flags=("--preprocessing_name=vgg",), **_BIG),
    "cifarnet": Net("cifarnet", "CifarNet/Predictions/Reshape_1", 32, "cifarnet",
                    float_ops=("CifarNet/norm1", "CifarNet/norm2")),
    "inception_v1": Net("inception_v1", "InceptionV1/Logits/Predictions/Reshape_1", 224,
                        "inception", batch_size=2, steps=2, optimizer="sgd"),
    "lenet": Net("lenet", "Predictions/Reshape_1", 28, "lenet"),
    "mobilenet_v1_025": Net("mobilenet_v1_025", "MobilenetV1/Predictions/Reshape_1", 32,
                            "inception"),
    "mobilenet_v2_035": Net("mobilenet_v2_035", "MobilenetV2/Predictions/Reshape_1", 32,
                            "inception"),
    "mobilenet_v3_small": Net("mobilenet_v3_small", "MobilenetV3/Predictions/Reshape_1", 32,
                              "inception"),
    "nasnet_cifar": Net("nasnet_cifar", "cifar/final_layer/predictions", 32, "inception"),
    "overfeat": Net("overfeat", "overfeat/fc8/squeezed", 231, "vgg",
                    train_flags=("--preprocessing_name=vgg",), numerics=False, **_BIG),
    "resnet_v1_50": Net("resnet_v1_50", "resnet_v1_50/predictions/Reshape_1", 32, "vgg",
                        optimizer="sgd"),
    "resnet_v2_50": Net("resnet_v2_50", "resnet_v2_50/predictions/Reshape_1", 32, "vgg",
                        optimizer="sgd"),
    "vgg_a": Net("vgg_a", "vgg_a/fc8/squeezed", 224, "vgg", numerics=False, **_BIG),
}
_PARITY_IMAGES = 4
# mobilenet_v3_small's ten runs with 2 clones (issue #33's acceptance): steps each.
_SEED_RUN_STEPS = 3


class _NetsTestCase(_ScriptsTestCase):
    """A net's commands: train, eval, export, freeze and convert with their checks."""

    def _timed(self, label, fn, *args):
        """Runs fn(*args) in this process, its wall and CPU seconds in the runner's timings."""
        wall, cpu = time.time(), time.process_time()
        try:
            return fn(*args)
        finally:
            self.runner.timings.append({"label": f"(in test) {label}", "wall_s": time.time() - wall,
                                        "cpu_s": time.process_time() - cpu,
                                        "max_rss_mb": resource.getrusage(
                                            resource.RUSAGE_SELF).ru_maxrss / 1024.0})

    def _script(self, name, *flags, label=""):
        return self.runner.run([os.path.join(_SLIM, name), *flags], label=label)

    def _train(self, net: Net, train_dir: str, num_clones: int = 1) -> str:
        output = self._script(
            "train_image_classifier.py", f"--model_name={net.model_name}",
            f"--dataset_dir={self.dataset_dir}", f"--train_dir={train_dir}",
            f"--num_clones={num_clones}", "--clone_on_cpu", "--quantize_delay=0",
            f"--batch_size={net.batch_size}", f"--max_number_of_steps={net.steps}",
            f"--train_image_size={net.image_size}", f"--optimizer={net.optimizer}",
            f"--learning_rate={net.learning_rate}", "--log_every_n_steps=1",
            "--save_summaries_secs=0", "--save_interval_secs=0", *net.train_flags,
            label=f"train {net.model_name} x{num_clones}")
        self.assertIn(f"global step {net.steps}:", output)
        checkpoint = tf1.train.latest_checkpoint(train_dir)
        self.assertTrue(checkpoint.endswith(f"model.ckpt-{net.steps}"), checkpoint)
        return checkpoint

    def _eval(self, net: Net, train_dir: str) -> float:
        preprocessing = [f for f in net.train_flags if f.startswith("--preprocessing_name")]
        output = self._script(
            "eval_image_classifier.py", f"--model_name={net.model_name}", "--quantize",
            f"--dataset_dir={self.dataset_dir}", "--dataset_split_name=validation",
            f"--checkpoint_path={train_dir}", f"--eval_dir={train_dir}_eval",
            "--batch_size=8", "--max_num_batches=1", f"--eval_image_size={net.image_size}",
            *preprocessing, label=f"eval {net.model_name}")
        return float(re.search(r"eval/Accuracy\[([0-9.]+)\]", output).group(1))

    def _export(self, net: Net, path: str) -> str:
        self._script("export_inference_graph.py", f"--model_name={net.model_name}", "--quantize",
                     f"--image_size={net.image_size}", "--batch_size=1", f"--output_file={path}",
                     label=f"export {net.model_name}")
        return path

    def _freeze_convert_check(self, net: Net, graph_path: str, checkpoint: str, tag: str,
                              images: np.ndarray) -> None:
        """freeze_graph, tflite_convert uint8: prepares, fully integer, each layer agrees."""
        frozen_path = os.path.join(self.workdir, f"{tag}_frozen.pb")
        frozen = slim_scripts_util.freeze(self.runner, graph_path, checkpoint, net.output,
                                          frozen_path, load=net.numerics)
        mean, std = _INPUT_FLAGS[net.preprocessing]
        model = slim_scripts_util.convert_uint8(
            self.runner, frozen_path, os.path.join(self.workdir, f"{tag}.tflite"), net.output,
            net.image_size, mean, std)
        export.check_runnable(model, frozen, label=f"slim {tag} uint8")
        if net.float_ops:
            float_ops = export.find_float_ops(export.describe_model(model), frozen)
            self.assertEqual({name for op in float_ops for name, _ in op.tf_ops},
                             set(net.float_ops), tag)
        else:
            export.check_fully_integer(model, frozen, label=f"slim {tag} uint8")
        if not net.numerics:
            print(f"slim_scripts_test: {tag}: prepares, fully uint8", file=sys.stderr)
            return
        self.assertFalse({n.op for n in frozen.node} & {"VariableV2", "VarHandleOp"})
        numerics, checked = self._timed(f"layers {tag}", slim_scripts_util.layer_agreement, model,
                                        frozen, net.output, images)
        matched = [r for r in numerics.rows if r.tflite_tensor is not None]
        output = numerics.rows[-1]
        self.assertGreaterEqual(len(matched), len(numerics.rows) // 2, numerics.format())
        self.assertIsNotNone(output.tflite_tensor, f"{tag}: the model output")
        coarse = slim_scripts_util.coarse_accumulator_tensors(model)
        checked = [r for r in checked if r.tflite_tensor not in coarse]
        self.assertNotEmpty(checked, numerics.format())
        worst_own = max(checked, key=lambda r: r.max_own_steps)
        float_note = f" but {', '.join(net.float_ops)}" if net.float_ops else ""
        coarse_note = "".join(f"; not compared: {name.split(';')[0]} (s_in*s_w/s_out {m:.1f})"
                              for name, m in coarse.items())
        print(f"slim_scripts_test: {tag}: prepares, fully uint8{float_note}; {len(checked)} of "
              f"{len(numerics.rows)} layers compared, each within {worst_own.max_own_steps:.2f} "
              f"steps of the frozen graph given TFLite's inputs ({worst_own.name}); the output "
              f"within {output.max_diff_steps:.2f} steps{coarse_note}", file=sys.stderr)
        self.assertLessEqual(worst_own.max_own_steps, slim_scripts_util.MAX_OWN_STEPS,
                             f"{tag}: {worst_own.name}\n{numerics.format()}")
        self.assertLessEqual(output.max_diff_steps, slim_scripts_util.MAX_DIFF_STEPS,
                             f"{tag}\n{numerics.format()}")

    def _images(self, net: Net) -> np.ndarray:
        return slim_scripts_util.eval_images(
            self.dataset_dir,
            os.path.join(_SLIM, "preprocessing", f"{net.preprocessing}_preprocessing.py"),
            net.image_size, _PARITY_IMAGES)


class SlimNetsTest(_NetsTestCase):
    """Each net through train -> eval --quantize -> export --quantize -> freeze -> uint8."""

    def _check_net(self, name: str, num_clones: int = 1):
        net = NETS[name]
        tag = f"{name}_x{num_clones}"
        train_dir = os.path.join(self.workdir, tag)
        checkpoint = self._train(net, train_dir, num_clones)
        self.assertBetween(self._eval(net, train_dir), 0.0, 1.0)
        graph_path = self._export(net, os.path.join(self.workdir, f"{tag}_export.pb"))
        # Every variable of the export graph, ranges included, from the
        # training checkpoint with a plain Saver.
        self.assertGreater(self._timed(f"strict restore {tag}", slim_scripts_util.strict_restore,
                                       graph_path, checkpoint), 0)
        self._freeze_convert_check(net, graph_path, checkpoint, tag, self._images(net))
        gc.collect()

    def _two_clone_runs(self, runs):
        """mobilenet_v3_small, 2 clones, trained anew per run: each converts and prepares.

        The runs differ as a user's do: the script sets no seed, so each
        process draws its own initial weights and input order (checked below:
        no two runs start from the same weights). One export graph serves
        every run (it does not depend on the checkpoint).
        """
        net = dataclasses.replace(NETS["mobilenet_v3_small"], batch_size=4, steps=_SEED_RUN_STEPS)
        graph_path = self._export(net, os.path.join(self.workdir, f"v3_runs_{runs[0]}_export.pb"))
        failures, first_weights = [], {}
        for run in runs:
            tag = f"mobilenet_v3_small_x2_run{run}"
            train_dir = os.path.join(self.workdir, tag)
            checkpoint = self._train(net, train_dir, num_clones=2)
            first_weights[run] = tf1.train.load_variable(checkpoint, "MobilenetV3/Conv/weights")
            try:
                slim_scripts_util.strict_restore(graph_path, checkpoint)
                frozen_path = os.path.join(self.workdir, f"{tag}_frozen.pb")
                frozen = slim_scripts_util.freeze(self.runner, graph_path, checkpoint,
                                                  net.output, frozen_path)
                mean, std = _INPUT_FLAGS[net.preprocessing]
                model = slim_scripts_util.convert_uint8(
                    self.runner, frozen_path, os.path.join(self.workdir, f"{tag}.tflite"),
                    net.output, net.image_size, mean, std)
                export.check_runnable(model, frozen, label=tag)
                export.check_fully_integer(model, frozen, label=tag)
                print(f"slim_scripts_test: {tag}: prepares, fully uint8; smallest HARD_SWISH "
                      f"margin s_out / (s_in / 128) = {slim_scripts_util.hard_swish_margin(model):.1f}",
                      file=sys.stderr)
            except Exception as e:  # pylint: disable=broad-except
                failures.append(f"run {run} ({checkpoint}): {type(e).__name__}: {str(e)[:3000]}")
        self.assertEqual(failures, [], "\n".join(failures))
        firsts = list(first_weights.values())
        for i, a in enumerate(firsts):
            for b in firsts[i + 1:]:
                self.assertFalse(np.array_equal(a, b), "two runs started from the same weights")

    def test_mobilenet_v3_small_two_clones_runs_0_to_4(self):
        self._two_clone_runs(range(0, 5))

    def test_mobilenet_v3_small_two_clones_runs_5_to_9(self):
        self._two_clone_runs(range(5, 10))

    def test_alexnet_v2(self):
        self._check_net("alexnet_v2")

    def test_cifarnet(self):
        self._check_net("cifarnet")

    def test_inception_v1(self):
        self._check_net("inception_v1")

    def test_lenet(self):
        self._check_net("lenet")

    def test_mobilenet_v1_025_two_clones(self):
        self._check_net("mobilenet_v1_025", num_clones=2)

    def test_mobilenet_v2_035(self):
        self._check_net("mobilenet_v2_035")

    def test_mobilenet_v3_small(self):
        self._check_net("mobilenet_v3_small")

    def test_nasnet_cifar(self):
        self._check_net("nasnet_cifar")

    def test_overfeat(self):
        self._check_net("overfeat")

    def test_resnet_v1_50(self):
        self._check_net("resnet_v1_50")

    def test_resnet_v1_50_two_clones(self):
        self._check_net("resnet_v1_50", num_clones=2)

    def test_resnet_v2_50(self):
        self._check_net("resnet_v2_50")

    def test_vgg_a(self):
        self._check_net("vgg_a")


# Nets whose training graph has more than dropout (every net of NETS but the
# ResNets has dropout, and NASNet-A CIFAR drop paths and an auxiliary head):
# an auxiliary head, built in training graphs only (NASNet-A and PNASNet-5
# mobile: a ReLU of the cell output before the second reduction, made before
# the next cell's identical ReLU) or in both but read by a loss in training
# only (Inception v3). At the smallest size each builds (the auxiliary
# heads' 5x5 VALID pools), one step of batch 2.
_STEP = dict(batch_size=2, steps=1, optimizer="sgd")
BRANCH_NETS = {
    "inception_v3": (Net("inception_v3", "InceptionV3/Predictions/Reshape_1", 107, "inception",
                         **_STEP), "InceptionV3/AuxLogits/"),
    "nasnet_mobile": (Net("nasnet_mobile", "final_layer/predictions", 72, "inception", **_STEP),
                      "aux_7/"),
    "pnasnet_mobile": (Net("pnasnet_mobile", "final_layer/predictions", 72, "inception", **_STEP),
                       "aux_5/"),
}


class TrainingBranchesTest(_NetsTestCase):
    """Issue #37: a branch only the training graph has renames no range of the export graph.

    Trained by the script, the checkpoint restores strictly into the export
    graph (before: pnasnet_mobile's lacked `cell_6/act_quant_1`, whose name a
    ReLU of the auxiliary head had taken), then freeze_graph and the uint8
    converter: fully integer.
    """

    def _check_branch_net(self, name: str):
        net, aux_scope = BRANCH_NETS[name]
        train_dir = os.path.join(self.workdir, name)
        checkpoint = self._train(net, train_dir)
        trained = _checkpoint_values(checkpoint)
        self.assertTrue([n for n in trained if n.startswith(aux_scope) and "_quant/" in n],
                        f"{name}: no range of the auxiliary head in the training checkpoint")
        graph_path = self._export(net, os.path.join(self.workdir, f"{name}_export.pb"))
        self.assertGreater(self._timed(f"strict restore {name}", slim_scripts_util.strict_restore,
                                       graph_path, checkpoint), 0)
        frozen_path = os.path.join(self.workdir, f"{name}_frozen.pb")
        frozen = slim_scripts_util.freeze(self.runner, graph_path, checkpoint, net.output,
                                          frozen_path)
        self.assertFalse([n.name for n in frozen.node if n.name.startswith(aux_scope)])
        mean, std = _INPUT_FLAGS[net.preprocessing]
        model = slim_scripts_util.convert_uint8(
            self.runner, frozen_path, os.path.join(self.workdir, f"{name}.tflite"), net.output,
            net.image_size, mean, std)
        export.check_runnable(model, frozen, label=f"slim {name} uint8")
        export.check_fully_integer(model, frozen, label=f"slim {name} uint8")
        gc.collect()

    def test_inception_v3(self):
        self._check_branch_net("inception_v3")

    def test_nasnet_mobile(self):
        self._check_branch_net("nasnet_mobile")

    def test_pnasnet_mobile(self):
        self._check_branch_net("pnasnet_mobile")


class SummariesTest(_NetsTestCase):
    """Issue #37's command as a user runs it: summaries on, the script's defaults.

    The Supervisor's summary thread runs the model (its histograms and
    zero fractions of every end point) beside the first training step: both
    update the ranges. Before, the two runs' moving-average deltas added up
    past the batch's range (the global pool's range went to [3.0, 3.0], a
    zero scale, NaN logits: `Nan in summary histogram`, in 3 of 4 runs on a
    loaded machine), and the zero fractions' TF1 conds were 154 "left float"
    warnings. tests/range_schedule_test.py replays the overlap at unit size.
    """

    def test_resnet_v1_50_rmsprop_with_summaries(self):
        net = dataclasses.replace(NETS["resnet_v1_50"], image_size=96, batch_size=4, steps=4,
                                  optimizer="rmsprop")
        train_dir = os.path.join(self.workdir, "resnet_summaries")
        output = self._script(
            "train_image_classifier.py", "--model_name=resnet_v1_50", "--quantize_delay=0",
            f"--train_image_size={net.image_size}", f"--batch_size={net.batch_size}",
            f"--max_number_of_steps={net.steps}", f"--dataset_dir={self.dataset_dir}",
            f"--train_dir={train_dir}", "--clone_on_cpu", "--log_every_n_steps=1",
            label="train resnet_v1_50 with summaries")
        self.assertIn(f"global step {net.steps}:", output)
        self.assertNotIn("Nan in summary", output)
        self.assertNotIn("left float", output)
        checkpoint = tf1.train.latest_checkpoint(train_dir)
        bad = [n for n, v in _checkpoint_values(checkpoint).items()
               if v.dtype.kind == "f" and not np.all(np.isfinite(v))]
        self.assertEqual(bad, [])
        graph_path = self._export(net, os.path.join(self.workdir, "resnet_summaries_export.pb"))
        slim_scripts_util.strict_restore(graph_path, checkpoint)
        frozen_path = os.path.join(self.workdir, "resnet_summaries_frozen.pb")
        frozen = slim_scripts_util.freeze(self.runner, graph_path, checkpoint, net.output,
                                          frozen_path)
        mean, std = _INPUT_FLAGS[net.preprocessing]
        model = slim_scripts_util.convert_uint8(
            self.runner, frozen_path, os.path.join(self.workdir, "resnet_summaries.tflite"),
            net.output, net.image_size, mean, std)
        export.check_fully_integer(model, frozen, label="slim resnet_v1_50 with summaries")


if __name__ == "__main__":
    absltest.main()
