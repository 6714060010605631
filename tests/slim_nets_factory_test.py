"""One net of every research/slim nets_factory family through the scripts, uint8 at the end.

tests/slim_scripts/ (see tests/slim_scripts_test.py) has a nets_factory with
tf_slim's AlexNet, Inception, OverFeat, ResNet and VGG and, written here,
CifarNet, LeNet, MobileNet v1-v3 and NASNet-A. SlimNetsTest takes one net of
every family through train_image_classifier.py (one clone; two for MobileNet
v1, ResNet v1 50 and MobileNet v3, the last in ten runs),
eval_image_classifier.py --quantize, export_inference_graph.py --quantize, a
strict restore of the training checkpoint into the export graph,
freeze_graph and the uint8 converter: the model prepares, is fully integer,
and each layer agrees with the frozen graph given TFLite's inputs
(slim_factory_util.NetsTestCase). The timings of every command go to stderr.
"""
import dataclasses
import gc
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from qat import export  # pylint: disable=g-import-not-at-top
import slim_factory_util  # pylint: disable=g-import-not-at-top
import slim_scripts_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
NETS = slim_factory_util.NETS
_INPUT_FLAGS = slim_factory_util.INPUT_FLAGS
# mobilenet_v3_small's ten runs with 2 clones (issue #33's acceptance): steps each.
_SEED_RUN_STEPS = 3


class SlimNetsTest(slim_factory_util.NetsTestCase):
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


if __name__ == "__main__":
    absltest.main()
