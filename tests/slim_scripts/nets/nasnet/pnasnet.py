"""PNASNet-5 mobile, configured with contrib_training.HParams (research/slim style).

research/slim's nets/nasnet/pnasnet.py: NASNet's ImageNet stem (a strided 3x3
convolution, two strided cells), then `num_cells` PNASNet-5 cells
(nasnet_utils.PNasNetNormalCell), strided with the filter count doubled where
a reduction comes, each reading the outputs of the two cells before it; ReLU,
global average pool, dropout and fully connected logits under 'final_layer'.
While training, the auxiliary head (nasnet._build_aux_head) reads a ReLU of
the cell output before the second reduction: that ReLU is made before the
next cell's identical one, which the eval graph alone has.
"""
import copy

import tensorflow.compat.v1 as tf
import tf_slim as slim
from tensorflow.contrib import training as contrib_training

from nets.nasnet import nasnet
from nets.nasnet import nasnet_utils

arg_scope = slim.arg_scope


def mobile_imagenet_config():
  return contrib_training.HParams(
      stem_multiplier=1.0,
      dense_dropout_keep_prob=0.5,
      num_cells=9,
      filter_scaling_rate=2.0,
      num_conv_filters=54,
      drop_path_keep_prob=1.0,
      use_aux_head=1,
      num_reduction_layers=2,
      data_format='NHWC',
      skip_reduction_layer_input=1,
      total_training_steps=250000,
      use_bounded_activation=False,
  )


def pnasnet_mobile_arg_scope(weight_decay=4e-5, batch_norm_decay=0.9997,
                             batch_norm_epsilon=0.001):
  return nasnet.nasnet_mobile_arg_scope(weight_decay, batch_norm_decay,
                                        batch_norm_epsilon)


def _build_pnasnet_base(images, normal_cell, num_classes, hparams,
                        is_training):
  """The stem, the cells and the head; returns (logits, end_points)."""
  end_points = {}
  reduction_indices = nasnet_utils.calc_reduction_layers(
      hparams.num_cells, hparams.num_reduction_layers)
  # pylint: disable=protected-access
  net, cell_outputs = nasnet._imagenet_stem(images, hparams, normal_cell)
  end_points['Stem'] = net
  aux_head_cell_idxes = nasnet.aux_head_cells(reduction_indices)

  filter_scaling = 1.0
  true_cell_num = 2  # After the stem's cells.
  activation_fn = tf.nn.relu6 if hparams.use_bounded_activation else tf.nn.relu
  for cell_num in range(hparams.num_cells):
    is_reduction = cell_num in reduction_indices
    if is_reduction:
      filter_scaling *= hparams.filter_scaling_rate
    if hparams.skip_reduction_layer_input or not is_reduction:
      prev_layer = cell_outputs[-2]
    net = normal_cell(net, scope='cell_{}'.format(cell_num),
                      filter_scaling=filter_scaling,
                      stride=2 if is_reduction else 1, prev_layer=prev_layer,
                      cell_num=true_cell_num)
    end_points['Cell_{}'.format(cell_num)] = net
    true_cell_num += 1
    cell_outputs.append(net)
    if (hparams.use_aux_head and cell_num in aux_head_cell_idxes and
        num_classes and is_training):
      nasnet._build_aux_head(activation_fn(net), end_points, num_classes,
                             hparams, scope='aux_{}'.format(cell_num))
  # pylint: enable=protected-access

  with tf.variable_scope('final_layer'):
    net = activation_fn(net)
    net = nasnet_utils.global_avg_pool(net)
    end_points['global_pool'] = net
    if not num_classes:
      return net, end_points
    net = slim.dropout(net, hparams.dense_dropout_keep_prob, scope='dropout')
    logits = slim.fully_connected(net, num_classes)
    end_points['Logits'] = logits
    end_points['Predictions'] = tf.nn.softmax(logits, name='predictions')
  return logits, end_points


def build_pnasnet_mobile(images, num_classes, is_training=True, config=None):
  """PNASNet-5 mobile on ImageNet-size images; returns (logits, end_points)."""
  hparams = mobile_imagenet_config() if config is None else copy.deepcopy(config)
  nasnet._update_hparams(hparams, is_training)  # pylint: disable=protected-access
  total_num_cells = hparams.num_cells + 2  # And the stem's.
  normal_cell = nasnet_utils.PNasNetNormalCell(
      hparams.num_conv_filters, hparams.drop_path_keep_prob, total_num_cells,
      hparams.total_training_steps, hparams.use_bounded_activation)
  with arg_scope([slim.dropout, nasnet_utils.drop_path, slim.batch_norm],
                 is_training=is_training):
    return _build_pnasnet_base(images, normal_cell=normal_cell,
                               num_classes=num_classes, hparams=hparams,
                               is_training=is_training)

build_pnasnet_mobile.default_image_size = 224
