"""Contains a factory for building various models (research/slim style).

The nets tf_slim 1.1.0 ships (AlexNet, Inception, OverFeat, ResNet, VGG) come
from tf_slim.nets, as research/slim imports its own copies; the others are
this directory's. tf_slim's ResNets return 4-D logits ([batch, 1, 1,
classes]; research/slim's later ResNets squeeze them, `spatial_squeeze`), so
their entries here squeeze the logits the loss reads and keep tf_slim's end
points ('<scope>/predictions', the export's output, as it was).
"""
import functools

import tensorflow.compat.v1 as tf
import tf_slim as slim
from tf_slim.nets import alexnet
from tf_slim.nets import inception
from tf_slim.nets import overfeat
from tf_slim.nets import resnet_v1
from tf_slim.nets import resnet_v2
from tf_slim.nets import vgg

from nets import cifarnet
from nets import lenet
from nets import mobilenet_v1
from nets.mobilenet import mobilenet_v2
from nets.mobilenet import mobilenet_v3
from nets.nasnet import nasnet
from nets.nasnet import pnasnet


def _squeezed(resnet_fn):
  """tf_slim's ResNet with the logits squeezed to [batch, classes]."""

  @functools.wraps(resnet_fn)
  def network(images, num_classes=None, is_training=True, **kwargs):
    net, end_points = resnet_fn(images, num_classes, is_training=is_training,
                                **kwargs)
    return tf.squeeze(net, [1, 2], name='SpatialSqueeze'), end_points
  network.default_image_size = 224
  return network


networks_map = {
    'alexnet_v2': alexnet.alexnet_v2,
    'cifarnet': cifarnet.cifarnet,
    'overfeat': overfeat.overfeat,
    'vgg_a': vgg.vgg_a,
    'vgg_16': vgg.vgg_16,
    'inception_v1': inception.inception_v1,
    'inception_v2': inception.inception_v2,
    'inception_v3': inception.inception_v3,
    'lenet': lenet.lenet,
    'resnet_v1_50': _squeezed(resnet_v1.resnet_v1_50),
    'resnet_v2_50': _squeezed(resnet_v2.resnet_v2_50),
    'mobilenet_v1': mobilenet_v1.mobilenet_v1,
    'mobilenet_v1_025': mobilenet_v1.mobilenet_v1_025,
    'mobilenet_v2': mobilenet_v2.mobilenet,
    'mobilenet_v2_035': mobilenet_v2.mobilenet_v2_035,
    'mobilenet_v3_small': mobilenet_v3.small,
    'nasnet_cifar': nasnet.build_nasnet_cifar,
    'nasnet_mobile': nasnet.build_nasnet_mobile,
    'pnasnet_mobile': pnasnet.build_pnasnet_mobile,
}

arg_scopes_map = {
    'alexnet_v2': alexnet.alexnet_v2_arg_scope,
    'cifarnet': cifarnet.cifarnet_arg_scope,
    'overfeat': overfeat.overfeat_arg_scope,
    'vgg_a': vgg.vgg_arg_scope,
    'vgg_16': vgg.vgg_arg_scope,
    'inception_v1': inception.inception_v3_arg_scope,
    'inception_v2': inception.inception_v3_arg_scope,
    'inception_v3': inception.inception_v3_arg_scope,
    'lenet': lenet.lenet_arg_scope,
    'resnet_v1_50': resnet_v1.resnet_utils.resnet_arg_scope,
    'resnet_v2_50': resnet_v2.resnet_utils.resnet_arg_scope,
    'mobilenet_v1': mobilenet_v1.mobilenet_v1_arg_scope,
    'mobilenet_v1_025': mobilenet_v1.mobilenet_v1_arg_scope,
    'mobilenet_v2': mobilenet_v2.training_scope,
    'mobilenet_v2_035': mobilenet_v2.training_scope,
    'mobilenet_v3_small': mobilenet_v3.training_scope,
    'nasnet_cifar': nasnet.nasnet_cifar_arg_scope,
    'nasnet_mobile': nasnet.nasnet_mobile_arg_scope,
    'pnasnet_mobile': pnasnet.pnasnet_mobile_arg_scope,
}


def get_network_fn(name, num_classes, weight_decay=0.0, is_training=False):
  """Returns network_fn(images) -> (logits, end_points) under the net's arg scope.

  Args:
    name: a key of networks_map.
    num_classes: the logits' width (0 or None: the features before them).
    weight_decay: L2 weight decay, passed to the net's arg scope.
    is_training: batch norm and dropout in training mode.

  Raises:
    ValueError: for an unknown name.
  """
  if name not in networks_map:
    raise ValueError('Name of network unknown %s' % name)
  func = networks_map[name]

  @functools.wraps(func)
  def network_fn(images, **kwargs):
    arg_scope = arg_scopes_map[name](weight_decay=weight_decay)
    with slim.arg_scope(arg_scope):
      return func(images, num_classes=num_classes, is_training=is_training,
                  **kwargs)
  if hasattr(func, 'default_image_size'):
    network_fn.default_image_size = func.default_image_size

  return network_fn
