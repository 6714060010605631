"""A layer reading an activation that is zero on every batch (a dead ReLU).

Such a tensor would learn the range [0, 0]; TF's converter widens it to a
width of 1e-6 and quantizes the next layer's bias with that tiny input scale
times the weight scale, clamping it to int32: TFLite's layer misses its bias.
Activation ranges learn towards a width of at least
`range_updates.MIN_SPAN`, so the bias fits and TFLite agrees with the eval
graph within one step.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import fixed_grid_util as util  # pylint: disable=g-import-not-at-top
import qat  # pylint: disable=g-import-not-at-top
from qat.quantize import range_updates  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def dead_block(x, training):
    del training
    dead = tf.nn.relu(tf1.layers.conv2d(
        x, 4, 1, bias_initializer=tf.constant_initializer(-100.0), name="dead"))
    pooled = tf.reduce_mean(dead, [1, 2])
    return tf1.layers.dense(pooled, 3, bias_initializer=tf.constant_initializer(0.5),
                            name="head")


class DeadActivationTest(tf.test.TestCase):

    def test_next_layer_keeps_its_bias(self):
        path, _ = util.calibrate(dead_block, self.get_temp_dir())
        g, x, y = util.build(dead_block, training=False)
        qat.experimental_create_eval_graph(g, symmetric_weights=True)
        with tf1.Session(graph=g) as sess:
            tf1.train.Saver().restore(sess, path)
            hi, = [sess.run(v) for v in g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                   if v.op.name == "dead/act_quant/max"]
            frozen = tf1.graph_util.convert_variables_to_constants(
                sess, g.as_graph_def(), [y.op.name])
        self.assertAllClose(hi, range_updates.MIN_SPAN, rtol=1e-3)
        for flavour in ("uint8", "int8"):
            util.check_layers(self, frozen, util.convert(frozen, x, y, flavour), flavour)


if __name__ == "__main__":
    tf.test.main()
