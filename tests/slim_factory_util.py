"""The nets_factory nets of tests/slim_scripts/ and the tests' shared fixture.

`ScriptsTestCase` gives each test class the tiny ImageNet-format dataset and
the warm script runner of slim_scripts_util, made once per process and shared
by every class in it (one warm interpreter a test process, not one a class).
`NETS` is one net of every nets_factory family as the tests train it, and
`NetsTestCase` a net's commands with their checks: train_image_classifier.py,
eval_image_classifier.py --quantize, export_inference_graph.py --quantize,
freeze_graph and the uint8 converter (each layer against the frozen graph).
Used by tests/slim_scripts_test.py, tests/slim_nets_factory_test.py and
tests/slim_training_branches_test.py.
"""
import atexit
import dataclasses
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
SLIM = os.path.join(_TESTS_DIR, "slim_scripts")
_REPO_ROOT = os.path.dirname(_TESTS_DIR)


def checkpoint_values(path: str) -> dict:
    """{variable name: value} of every variable in the checkpoint at `path`."""
    reader = tf1.train.NewCheckpointReader(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


# (workdir, dataset_dir, runner) of this process, made by the first class that needs it.
_FIXTURE = []


def _fixture():
    if not _FIXTURE:
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        dataset_dir = os.path.join(workdir, "imagenet")
        slim_scripts_util.write_dataset(dataset_dir)
        # research/slim's root on PYTHONPATH, as its scripts are run.
        runner = slim_scripts_util.ScriptRunner([SLIM, _REPO_ROOT], workdir)
        atexit.register(runner.close)
        _FIXTURE.append((workdir, dataset_dir, runner))
    return _FIXTURE[0]


class ScriptsTestCase(absltest.TestCase):
    """The dataset, and the runner the commands go through, once per process.

    Every class's commands run in one shared work directory (their outputs
    are named after their tests); each class prints the timings of its own.
    """

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir, cls.dataset_dir, cls.runner = _fixture()
        cls._first_timing = len(cls.runner.timings)

    @classmethod
    def tearDownClass(cls):
        for t in cls.runner.timings[cls._first_timing:]:
            print("slim_scripts timing: %(label)s %(wall_s).1f s wall, %(cpu_s).1f s CPU, "
                  "%(max_rss_mb).0f MB" % t, file=sys.stderr)
        super().tearDownClass()


# The uint8 input flags for each preprocessing (--mean_values, an integer, and
# --std_dev_values): real = (q - mean) / std covers the range its pixels lie in.
INPUT_FLAGS = {
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
PARITY_IMAGES = 4


class NetsTestCase(ScriptsTestCase):
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
        return self.runner.run([os.path.join(SLIM, name), *flags], label=label)

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
        mean, std = INPUT_FLAGS[net.preprocessing]
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
            os.path.join(SLIM, "preprocessing", f"{net.preprocessing}_preprocessing.py"),
            net.image_size, PARITY_IMAGES)
