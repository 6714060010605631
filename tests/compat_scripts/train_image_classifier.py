"""Trains a slim classifier, in the style of slim/train_image_classifier.py.

`--quantize_delay >= 0` rewrites the training graph with contrib.quantize
after the loss, before the optimizer, as the TF models repo did. The digits
of scikit-learn (8x8) stand in for the dataset. The one line after the
docstring is the only one added for TF 2.
"""
import qat.compat; qat.compat.install()
from absl import app
from absl import flags
import numpy as np
from sklearn import datasets
import tensorflow.compat.v1 as tf
from tensorflow.contrib import quantize as contrib_quantize
from tensorflow.contrib import slim

import lenet_bn

flags.DEFINE_string('train_dir', '/tmp/tfmodel/',
                    'Directory where checkpoints and event logs are written to.')
flags.DEFINE_integer('quantize_delay', -1,
                     'Number of steps to start quantized training. Set to -1 '
                     'would disable quantized training.')
flags.DEFINE_integer('max_number_of_steps', 20,
                     'The maximum number of training steps.')
flags.DEFINE_integer('batch_size', 32, 'The number of samples in each batch.')
flags.DEFINE_float('learning_rate', 0.05, 'Initial learning rate.')
flags.DEFINE_float('momentum', 0.9, 'The momentum for the MomentumOptimizer.')
flags.DEFINE_float('weight_decay', 0.00004,
                   'The weight decay on the model weights.')
FLAGS = flags.FLAGS


def main(_):
  tf.disable_v2_behavior()
  tf.logging.set_verbosity(tf.logging.INFO)
  with tf.Graph().as_default():
    global_step = slim.create_global_step()

    digits = datasets.load_digits()
    x = (digits.images[:1400] / 16.0).astype(np.float32)[..., None]
    y = digits.target[:1400].astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.shuffle(1400, seed=0).repeat().batch(FLAGS.batch_size)
    images, labels = tf.data.make_one_shot_iterator(dataset).get_next()
    labels = slim.one_hot_encoding(labels, 10)

    with slim.arg_scope(lenet_bn.lenet_bn_arg_scope(
        weight_decay=FLAGS.weight_decay)):
      logits, end_points = lenet_bn.lenet_bn(images, num_classes=10,
                                             is_training=True)
    tf.losses.softmax_cross_entropy(labels, logits, weights=1.0)
    total_loss = tf.losses.get_total_loss()

    if FLAGS.quantize_delay >= 0:
      contrib_quantize.create_training_graph(quant_delay=FLAGS.quantize_delay)

    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    optimizer = tf.train.MomentumOptimizer(FLAGS.learning_rate,
                                           momentum=FLAGS.momentum)
    grads = optimizer.compute_gradients(total_loss)
    grad_updates = optimizer.apply_gradients(grads, global_step=global_step)
    update_ops.append(grad_updates)
    update_op = tf.group(*update_ops)
    with tf.control_dependencies([update_op]):
      train_tensor = tf.identity(total_loss, name='train_op')

    slim.learning.train(
        train_tensor,
        logdir=FLAGS.train_dir,
        number_of_steps=FLAGS.max_number_of_steps,
        log_every_n_steps=5,
        save_summaries_secs=0,
        save_interval_secs=0)


if __name__ == '__main__':
  app.run(main)
