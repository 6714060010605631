"""A small slim classifier in the style of the TF models repo's slim/nets.

Unchanged TF 1.x library code: no qat line here, the scripts that import it
call qat.compat.install() first.
"""
import tensorflow.compat.v1 as tf
from tensorflow.contrib import slim


def lenet_bn(images, num_classes=10, is_training=False,
             dropout_keep_prob=0.5, prediction_fn=slim.softmax,
             scope='LeNet'):
  end_points = {}
  with tf.variable_scope(scope, 'LeNet', [images]):
    with slim.arg_scope([slim.batch_norm, slim.dropout],
                        is_training=is_training):
      net = end_points['conv1'] = slim.conv2d(images, 16, [3, 3], scope='conv1')
      net = end_points['pool1'] = slim.max_pool2d(net, [2, 2], 2, scope='pool1')
      net = end_points['conv2'] = slim.conv2d(net, 32, [3, 3], scope='conv2')
      net = slim.flatten(net)
      end_points['Flatten'] = net
      net = end_points['fc3'] = slim.fully_connected(net, 64, scope='fc3')
      net = end_points['dropout3'] = slim.dropout(
          net, dropout_keep_prob, scope='dropout3')
      logits = end_points['Logits'] = slim.fully_connected(
          net, num_classes, activation_fn=None, normalizer_fn=None,
          scope='fc4')
  end_points['Predictions'] = prediction_fn(logits, scope='Predictions')
  return logits, end_points
lenet_bn.default_image_size = 8


def lenet_bn_arg_scope(weight_decay=0.0004):
  batch_norm_params = {'decay': 0.99, 'epsilon': 0.001,
                       'updates_collections': tf.GraphKeys.UPDATE_OPS}
  with slim.arg_scope(
      [slim.conv2d, slim.fully_connected],
      weights_regularizer=slim.l2_regularizer(weight_decay),
      weights_initializer=tf.truncated_normal_initializer(stddev=0.1),
      activation_fn=tf.nn.relu,
      normalizer_fn=slim.batch_norm,
      normalizer_params=batch_norm_params):
    with slim.arg_scope([slim.batch_norm], **batch_norm_params) as sc:
      return sc
