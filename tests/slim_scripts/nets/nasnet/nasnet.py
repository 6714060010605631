"""NASNet-A, configured with contrib_training.HParams (research/slim style).

research/slim's nets/nasnet/nasnet.py builds its configurations as
`contrib_training.HParams(...)`, copies them per call and updates them
(`set_hparam`) for evaluation. This one does the same, with the NASNet-A
cells of nasnet_utils. CIFAR: a 3x3 stem convolution, `num_cells` normal
cells with two reduction cells among them (filter count doubling at each),
ReLU, global average pool, dropout and a fully connected logits layer, under
the scopes 'cifar' (the network) and 'final_layer'; the configuration is
small (3 normal cells of 8 filters; research/slim's has 18 of 32), the cells
are NASNet-A's. Mobile (ImageNet): research/slim's configuration, a strided
3x3 convolution and two reduction cells as the stem. While training, both
build the auxiliary head (`_build_aux_head`: a ReLU of the cell output before
the second reduction, pooling, two convolutions, logits) that the eval graph
lacks, and CIFAR's drops paths.
"""
import copy

import tensorflow.compat.v1 as tf
import tf_slim as slim
from tensorflow.contrib import training as contrib_training

from nets.nasnet import nasnet_utils

arg_scope = slim.arg_scope


def cifar_config():
  return contrib_training.HParams(
      stem_multiplier=3.0,
      drop_path_keep_prob=0.6,
      num_cells=3,
      use_aux_head=1,
      num_conv_filters=8,
      dense_dropout_keep_prob=1.0,
      filter_scaling_rate=2.0,
      num_reduction_layers=2,
      data_format='NHWC',
      skip_reduction_layer_input=0,
      # 600 epochs with a batch size of 32.
      total_training_steps=937500,
      use_bounded_activation=False,
  )


def mobile_imagenet_config():
  return contrib_training.HParams(
      stem_multiplier=1.0,
      dense_dropout_keep_prob=0.5,
      num_cells=12,
      filter_scaling_rate=2.0,
      drop_path_keep_prob=1.0,
      num_conv_filters=44,
      use_aux_head=1,
      num_reduction_layers=2,
      data_format='NHWC',
      skip_reduction_layer_input=0,
      total_training_steps=250000,
      use_bounded_activation=False,
  )


def _update_hparams(hparams, is_training):
  """Evaluation drops no paths."""
  if not is_training:
    hparams.set_hparam('drop_path_keep_prob', 1.0)


def nasnet_cifar_arg_scope(weight_decay=5e-4, batch_norm_decay=0.9,
                           batch_norm_epsilon=1e-5):
  """NASNet's defaults on CIFAR: fused batch norm, L2, He initialization."""
  batch_norm_params = {
      'decay': batch_norm_decay,
      'epsilon': batch_norm_epsilon,
      'scale': True,
      'fused': True,
  }
  weights_regularizer = slim.l2_regularizer(weight_decay)
  weights_initializer = slim.variance_scaling_initializer(mode='FAN_OUT')
  with arg_scope([slim.fully_connected, slim.conv2d, slim.separable_conv2d],
                 weights_regularizer=weights_regularizer,
                 weights_initializer=weights_initializer):
    with arg_scope([slim.fully_connected], activation_fn=None, scope='FC'):
      with arg_scope([slim.conv2d, slim.separable_conv2d],
                     activation_fn=None, biases_initializer=None):
        with arg_scope([slim.batch_norm], **batch_norm_params) as sc:
          return sc


def nasnet_mobile_arg_scope(weight_decay=4e-5, batch_norm_decay=0.9997,
                            batch_norm_epsilon=1e-3):
  """NASNet's defaults on ImageNet (mobile): as CIFAR's, other decays."""
  return nasnet_cifar_arg_scope(weight_decay, batch_norm_decay,
                                batch_norm_epsilon)


def _build_aux_head(net, end_points, num_classes, hparams, scope):
  """The auxiliary logits (training only): pool, 1x1 and full-map convolutions."""
  activation_fn = tf.nn.relu6 if hparams.use_bounded_activation else tf.nn.relu
  with tf.variable_scope(scope):
    aux_logits = tf.identity(net)
    with tf.variable_scope('aux_logits'):
      aux_logits = slim.avg_pool2d(aux_logits, [5, 5], stride=3,
                                   padding='VALID')
      aux_logits = slim.conv2d(aux_logits, 128, [1, 1], scope='proj')
      aux_logits = slim.batch_norm(aux_logits, scope='aux_bn0')
      aux_logits = activation_fn(aux_logits)
      aux_logits = slim.conv2d(aux_logits, 768, aux_logits.shape[1:3].as_list(),
                               padding='VALID')
      aux_logits = slim.batch_norm(aux_logits, scope='aux_bn1')
      aux_logits = activation_fn(aux_logits)
      aux_logits = slim.flatten(aux_logits)
      end_points['AuxLogits'] = slim.fully_connected(aux_logits, num_classes)


def _imagenet_stem(inputs, hparams, stem_cell, current_step=None):
  """A strided 3x3 convolution, then two strided cells."""
  num_stem_cells = 2
  net = slim.conv2d(inputs, int(32 * hparams.stem_multiplier), [3, 3],
                    stride=2, scope='conv0', padding='VALID')
  net = slim.batch_norm(net, scope='conv0_bn')
  cell_outputs = [None, net]
  filter_scaling = 1.0 / (hparams.filter_scaling_rate**num_stem_cells)
  for cell_num in range(num_stem_cells):
    net = stem_cell(net, scope='cell_stem_{}'.format(cell_num),
                    filter_scaling=filter_scaling, stride=2,
                    prev_layer=cell_outputs[-2], cell_num=cell_num,
                    current_step=current_step)
    cell_outputs.append(net)
    filter_scaling *= hparams.filter_scaling_rate
  return net, cell_outputs


def aux_head_cells(reduction_indices):
  """The cells the auxiliary head reads: the one before the second reduction."""
  return [reduction_indices[1] - 1] if len(reduction_indices) >= 2 else []


def _cifar_stem(inputs, hparams):
  """A 3x3 convolution and batch norm."""
  num_stem_filters = int(hparams.num_conv_filters * hparams.stem_multiplier)
  net = slim.conv2d(inputs, num_stem_filters, 3, scope='l1_stem_3x3')
  net = slim.batch_norm(net, scope='l1_stem_bn')
  return net, [None, net]


def _build_nasnet_base(images, normal_cell, reduction_cell, num_classes,
                       hparams, is_training, stem_type='cifar',
                       current_step=None):
  """The stem, the cells and the head; returns (logits, end_points)."""
  end_points = {}

  def add_and_check_endpoint(endpoint_name, net):
    end_points[endpoint_name] = net

  reduction_indices = nasnet_utils.calc_reduction_layers(
      hparams.num_cells, hparams.num_reduction_layers)
  if stem_type == 'imagenet':
    net, cell_outputs = _imagenet_stem(images, hparams, reduction_cell,
                                       current_step)
  else:
    net, cell_outputs = _cifar_stem(images, hparams)
  add_and_check_endpoint('Stem', net)
  aux_head_cell_idxes = aux_head_cells(reduction_indices)

  filter_scaling = 1.0
  true_cell_num = 2 if stem_type == 'imagenet' else 0
  activation_fn = tf.nn.relu6 if hparams.use_bounded_activation else tf.nn.relu
  for cell_num in range(hparams.num_cells):
    stride = 1
    prev_layer = cell_outputs[-2]
    if cell_num in reduction_indices:
      filter_scaling *= hparams.filter_scaling_rate
      net = reduction_cell(
          net, scope='reduction_cell_{}'.format(reduction_indices.index(cell_num)),
          filter_scaling=filter_scaling, stride=2, prev_layer=prev_layer,
          cell_num=true_cell_num, current_step=current_step)
      add_and_check_endpoint(
          'Reduction_Cell_{}'.format(reduction_indices.index(cell_num)), net)
      true_cell_num += 1
      cell_outputs.append(net)
      prev_layer = cell_outputs[-2]
    net = normal_cell(
        net, scope='cell_{}'.format(cell_num), filter_scaling=filter_scaling,
        stride=stride, prev_layer=prev_layer, cell_num=true_cell_num,
        current_step=current_step)
    add_and_check_endpoint('Cell_{}'.format(cell_num), net)
    true_cell_num += 1
    if (hparams.use_aux_head and cell_num in aux_head_cell_idxes and
        num_classes and is_training):
      _build_aux_head(activation_fn(net), end_points, num_classes, hparams,
                      scope='aux_{}'.format(cell_num))
    cell_outputs.append(net)

  with tf.variable_scope('final_layer'):
    net = activation_fn(net)
    net = nasnet_utils.global_avg_pool(net)
    add_and_check_endpoint('global_pool', net)
    if not num_classes:
      return net, end_points
    net = slim.dropout(net, hparams.dense_dropout_keep_prob, scope='dropout')
    logits = slim.fully_connected(net, num_classes)
    add_and_check_endpoint('Logits', logits)
    predictions = tf.nn.softmax(logits, name='predictions')
    add_and_check_endpoint('Predictions', predictions)
  return logits, end_points


def build_nasnet_cifar(images, num_classes, is_training=True, config=None,
                       current_step=None):
  """NASNet-A on 32x32 images; returns (logits, end_points)."""
  hparams = cifar_config() if config is None else copy.deepcopy(config)
  _update_hparams(hparams, is_training)
  total_num_cells = hparams.num_cells + 2

  normal_cell = nasnet_utils.NasNetANormalCell(
      hparams.num_conv_filters, hparams.drop_path_keep_prob, total_num_cells,
      hparams.total_training_steps, hparams.use_bounded_activation)
  reduction_cell = nasnet_utils.NasNetAReductionCell(
      hparams.num_conv_filters, hparams.drop_path_keep_prob, total_num_cells,
      hparams.total_training_steps, hparams.use_bounded_activation)
  with arg_scope([slim.dropout, nasnet_utils.drop_path, slim.batch_norm],
                 is_training=is_training):
    with tf.variable_scope('cifar', [images]):
      return _build_nasnet_base(
          images, normal_cell=normal_cell, reduction_cell=reduction_cell,
          num_classes=num_classes, hparams=hparams,
          is_training=is_training, current_step=current_step)

build_nasnet_cifar.default_image_size = 32


def build_nasnet_mobile(images, num_classes, is_training=True, config=None,
                        current_step=None):
  """NASNet-A mobile on ImageNet-size images; returns (logits, end_points)."""
  hparams = mobile_imagenet_config() if config is None else copy.deepcopy(config)
  _update_hparams(hparams, is_training)
  total_num_cells = hparams.num_cells + 4  # The reduction and the stem cells.
  normal_cell = nasnet_utils.NasNetANormalCell(
      hparams.num_conv_filters, hparams.drop_path_keep_prob, total_num_cells,
      hparams.total_training_steps, hparams.use_bounded_activation)
  reduction_cell = nasnet_utils.NasNetAReductionCell(
      hparams.num_conv_filters, hparams.drop_path_keep_prob, total_num_cells,
      hparams.total_training_steps, hparams.use_bounded_activation)
  with arg_scope([slim.dropout, nasnet_utils.drop_path, slim.batch_norm],
                 is_training=is_training):
    return _build_nasnet_base(
        images, normal_cell=normal_cell, reduction_cell=reduction_cell,
        num_classes=num_classes, hparams=hparams, is_training=is_training,
        stem_type='imagenet', current_step=current_step)

build_nasnet_mobile.default_image_size = 224
