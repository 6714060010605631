"""Evaluates a nets_factory classifier's checkpoint on a slim dataset.

Written the way research/slim's eval_image_classifier.py of mid-2020 works,
with its flags: queue-based input, the network from nets_factory with
is_training=False, `contrib_quantize.create_eval_graph()` with `--quantize`,
streaming accuracy and recall@5, and slim.evaluation.evaluate_once, which
restores `slim.get_variables_to_restore()` (the ranges included) from the
checkpoint with a plain Saver: a variable the checkpoint lacks fails the
restore. The install line is the only one added for TF 2.
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import qat.compat; qat.compat.install()

import math

import tensorflow.compat.v1 as tf
import tf_slim as slim

from tensorflow.contrib import quantize as contrib_quantize

from datasets import dataset_factory
from nets import nets_factory
from preprocessing import preprocessing_factory

flags = tf.app.flags

flags.DEFINE_integer('batch_size', 100, 'Images per evaluation batch.')
flags.DEFINE_integer('max_num_batches', None,
                     'Batches to evaluate (default: one pass over the split).')
flags.DEFINE_string('master', '', 'TensorFlow master address ("" is local).')
flags.DEFINE_string('checkpoint_path', '/tmp/tfmodel/',
                    'A checkpoint, or a directory whose latest one is used.')
flags.DEFINE_string('eval_dir', '/tmp/tfmodel/',
                    'Where the evaluation summaries go.')
flags.DEFINE_integer('num_preprocessing_threads', 4,
                     'Threads that preprocess and batch the images.')
flags.DEFINE_string('dataset_name', 'imagenet', 'dataset_factory\'s name.')
flags.DEFINE_string('dataset_split_name', 'test', 'The split to evaluate.')
flags.DEFINE_string('dataset_dir', None, 'Where the dataset files are.')
flags.DEFINE_integer('labels_offset', 0,
                     'Subtracted from the labels (1 for nets trained '
                     'without ImageNet\'s background class, VGG and ResNet).')
flags.DEFINE_string('model_name', 'inception_v3', 'nets_factory\'s name.')
flags.DEFINE_string('preprocessing_name', None,
                    'preprocessing_factory\'s name (default: model_name).')
flags.DEFINE_float('moving_average_decay', None,
                   'Evaluate the variables\' moving averages with this decay '
                   '(None: the variables themselves).')
flags.DEFINE_integer('eval_image_size', None,
                     'Image size (default: the net\'s default_image_size).')
flags.DEFINE_bool('quantize', False, 'Evaluate the quantized eval graph.')
flags.DEFINE_bool('use_grayscale', False, 'Evaluate on grayscale images.')

FLAGS = flags.FLAGS


def _metrics(logits, labels):
  """Streaming accuracy and recall@5, printed when evaluate_once ends."""
  predictions = tf.argmax(logits, 1)
  labels = tf.squeeze(labels)
  values, updates = slim.metrics.aggregate_metric_map({
      'Accuracy': slim.metrics.streaming_accuracy(predictions, labels),
      'Recall_5': slim.metrics.streaming_recall_at_k(logits, labels, 5),
  })
  for name, value in values.items():
    summary_name = 'eval/%s' % name
    op = tf.summary.scalar(summary_name, value, collections=[])
    op = tf.Print(op, [value], summary_name)
    tf.add_to_collection(tf.GraphKeys.SUMMARIES, op)
  return list(updates.values())


def main(_):
  if not FLAGS.dataset_dir:
    raise ValueError('You must supply the dataset directory with --dataset_dir')

  tf.logging.set_verbosity(tf.logging.INFO)
  with tf.Graph().as_default():
    tf_global_step = slim.get_or_create_global_step()

    dataset = dataset_factory.get_dataset(
        FLAGS.dataset_name, FLAGS.dataset_split_name, FLAGS.dataset_dir)
    network_fn = nets_factory.get_network_fn(
        FLAGS.model_name,
        num_classes=dataset.num_classes - FLAGS.labels_offset,
        is_training=False)

    provider = slim.dataset_data_provider.DatasetDataProvider(
        dataset, shuffle=False,
        common_queue_capacity=2 * FLAGS.batch_size,
        common_queue_min=FLAGS.batch_size)
    image, label = provider.get(['image', 'label'])
    label -= FLAGS.labels_offset

    preprocessing_fn = preprocessing_factory.get_preprocessing(
        FLAGS.preprocessing_name or FLAGS.model_name, is_training=False,
        use_grayscale=FLAGS.use_grayscale)
    size = FLAGS.eval_image_size or network_fn.default_image_size
    image = preprocessing_fn(image, size, size)
    images, labels = tf.train.batch(
        [image, label], batch_size=FLAGS.batch_size,
        num_threads=FLAGS.num_preprocessing_threads,
        capacity=5 * FLAGS.batch_size)

    logits, _ = network_fn(images)

    if FLAGS.quantize:
      contrib_quantize.create_eval_graph()

    if FLAGS.moving_average_decay:
      averages = tf.train.ExponentialMovingAverage(
          FLAGS.moving_average_decay, tf_global_step)
      variables_to_restore = averages.variables_to_restore(
          slim.get_model_variables())
      variables_to_restore[tf_global_step.op.name] = tf_global_step
    else:
      variables_to_restore = slim.get_variables_to_restore()

    eval_ops = _metrics(logits, labels)

    num_batches = FLAGS.max_num_batches or math.ceil(
        dataset.num_samples / float(FLAGS.batch_size))
    checkpoint_path = FLAGS.checkpoint_path
    if tf.gfile.IsDirectory(checkpoint_path):
      checkpoint_path = tf.train.latest_checkpoint(checkpoint_path)
    tf.logging.info('Evaluating %s' % checkpoint_path)

    slim.evaluation.evaluate_once(
        master=FLAGS.master,
        checkpoint_path=checkpoint_path,
        logdir=FLAGS.eval_dir,
        num_evals=num_batches,
        eval_op=eval_ops,
        variables_to_restore=variables_to_restore)


if __name__ == '__main__':
  tf.app.run()
