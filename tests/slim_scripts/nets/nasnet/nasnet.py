"""A NASNet-style net configured with contrib_training.HParams (research/slim style).

research/slim's nets/nasnet/nasnet.py builds its configurations as
`contrib_training.HParams(...)` and copies and updates them per call; this
reduced cell network does the same.
"""
import copy

import tensorflow.compat.v1 as tf
import tf_slim as slim
from tensorflow.contrib import training as contrib_training


def cifar_config():
  return contrib_training.HParams(
      stem_multiplier=3.0,
      drop_path_keep_prob=0.6,
      num_cells=2,
      num_conv_filters=8,
      dense_dropout_keep_prob=1.0,
      data_format='NHWC',
      total_training_steps=937500,
      use_bounded_activation=False,
  )


def _update_hparams(hparams, is_training):
  """Update hparams for given is_training option."""
  if not is_training:
    hparams.set_hparam('drop_path_keep_prob', 1.0)


def nasnet_cifar_arg_scope(weight_decay=5e-4, batch_norm_decay=0.9,
                           batch_norm_epsilon=1e-5):
  batch_norm_params = {'decay': batch_norm_decay, 'epsilon': batch_norm_epsilon,
                       'scale': True, 'fused': True}
  weights_regularizer = slim.l2_regularizer(weight_decay)
  with slim.arg_scope([slim.fully_connected, slim.conv2d],
                      weights_regularizer=weights_regularizer):
    with slim.arg_scope([slim.batch_norm], **batch_norm_params) as sc:
      return sc


def build_nasnet_cifar(images, num_classes, is_training=True, config=None):
  """Builds the reduced NASNet-style net; returns (logits, end_points)."""
  hparams = cifar_config() if config is None else copy.deepcopy(config)
  _update_hparams(hparams, is_training)
  activation_fn = tf.nn.relu6 if hparams.use_bounded_activation else tf.nn.relu
  end_points = {}
  with tf.variable_scope('cifar'):
    with slim.arg_scope([slim.batch_norm], is_training=is_training):
      filters = int(hparams.num_conv_filters * hparams.stem_multiplier)
      net = slim.conv2d(images, filters, 3, activation_fn=None,
                        normalizer_fn=slim.batch_norm, scope='l1_stem_3x3')
      for cell in range(hparams.num_cells):
        branch = slim.conv2d(activation_fn(net), filters, 3, activation_fn=None,
                             normalizer_fn=slim.batch_norm,
                             scope='cell_%d/conv' % cell)
        net = tf.add(net, branch, name='cell_%d/add' % cell)
      net = tf.reduce_mean(activation_fn(net), [1, 2], name='global_pool')
      net = slim.dropout(net, hparams.dense_dropout_keep_prob,
                         is_training=is_training, scope='dropout')
      logits = slim.fully_connected(net, num_classes, activation_fn=None,
                                    scope='FC')
  end_points['Logits'] = logits
  end_points['Predictions'] = tf.nn.softmax(logits, name='predictions')
  return logits, end_points

build_nasnet_cifar.default_image_size = 32
