"""Issue #37 in research/slim's scripts: training-only branches and summaries.

TrainingBranchesTest takes the nets_factory nets whose training graph has an
auxiliary head (Inception v3, NASNet-A and PNASNet-5 mobile) through
train_image_classifier.py, export_inference_graph.py --quantize, a strict
restore, freeze_graph and the uint8 converter; SummariesTest runs ResNet v1
50 as issue #37 did (RMSProp, summaries on). The scripts and the runner are
tests/slim_scripts_test.py's (slim_factory_util); the timings of every
command go to stderr.
"""
import dataclasses
import gc
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from qat import export  # pylint: disable=g-import-not-at-top
import slim_factory_util  # pylint: disable=g-import-not-at-top
import slim_scripts_util  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
Net = slim_factory_util.Net
NETS = slim_factory_util.NETS
_INPUT_FLAGS = slim_factory_util.INPUT_FLAGS
_checkpoint_values = slim_factory_util.checkpoint_values

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


class TrainingBranchesTest(slim_factory_util.NetsTestCase):
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


class SummariesTest(slim_factory_util.NetsTestCase):
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
