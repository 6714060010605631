"""MobileNet v2, written the way research/slim's nets/mobilenet/mobilenet_v2.py specifies it.

V2_DEF: a 3x3 stride-2 convolution, 17 inverted residual blocks (expansion 6,
the first 1) and a 1x1 convolution of 1280, with ReLU6 and batch norm;
`mobilenet` builds it with the classification head, `mobilenet_v2_035` at
depth multiplier 0.35.
"""
import copy
import functools

import tensorflow.compat.v1 as tf
import tf_slim as slim

from nets.mobilenet import conv_blocks as ops
from nets.mobilenet import mobilenet as lib

op = lib.op
expand_input = ops.expand_input_by_factor

V2_DEF = dict(
    defaults={
        (slim.batch_norm,): {'center': True, 'scale': True},
        (slim.conv2d, slim.fully_connected, slim.separable_conv2d): {
            'normalizer_fn': slim.batch_norm, 'activation_fn': tf.nn.relu6
        },
        (ops.expanded_conv,): {
            'expansion_size': expand_input(6),
            'split_expansion': 1,
            'normalizer_fn': slim.batch_norm,
            'residual': True
        },
        (slim.conv2d, slim.separable_conv2d): {'padding': 'SAME'}
    },
    spec=[
        op(slim.conv2d, stride=2, num_outputs=32, kernel_size=[3, 3]),
        op(ops.expanded_conv,
           expansion_size=expand_input(1, divisible_by=1),
           num_outputs=16),
    ] + [op(ops.expanded_conv, stride=s, num_outputs=n) for s, n in (
        (2, 24), (1, 24),
        (2, 32), (1, 32), (1, 32),
        (2, 64), (1, 64), (1, 64), (1, 64),
        (1, 96), (1, 96), (1, 96),
        (2, 160), (1, 160), (1, 160),
        (1, 320))] + [
            op(slim.conv2d, stride=1, kernel_size=[1, 1], num_outputs=1280)
        ],
)


@slim.add_arg_scope
def mobilenet(input_tensor,
              num_classes=1001,
              depth_multiplier=1.0,
              scope='MobilenetV2',
              conv_defs=None,
              finegrain_classification_mode=False,
              min_depth=None,
              divisible_by=None,
              activation_fn=None,
              **kwargs):
  """MobileNet v2 with its classification head; returns (logits, end_points).

  Args:
    input_tensor: [batch, height, width, 3] images.
    num_classes: the number of classes.
    depth_multiplier: scales every layer's depth.
    scope: the variable scope.
    conv_defs: the spec (default V2_DEF).
    finegrain_classification_mode: keep the last layer's 1280 channels
      below multiplier 1.
    min_depth: the smallest depth of a layer.
    divisible_by: layer depths are multiples of this.
    activation_fn: replaces ReLU6 everywhere.
    **kwargs: for mobilenet.mobilenet (prediction_fn, is_training, ...).
  """
  if conv_defs is None:
    conv_defs = V2_DEF
  if 'multiplier' in kwargs:
    raise ValueError('mobilenetv2 doesn\'t support generic '
                     'multiplier parameter use "depth_multiplier" instead.')
  if finegrain_classification_mode:
    conv_defs = copy.deepcopy(conv_defs)
    if depth_multiplier < 1:
      conv_defs['spec'][-1].params['num_outputs'] /= depth_multiplier
  if activation_fn:
    conv_defs = copy.deepcopy(conv_defs)
    defaults = conv_defs['defaults']
    conv_defaults = (
        defaults[(slim.conv2d, slim.fully_connected, slim.separable_conv2d)])
    conv_defaults['activation_fn'] = activation_fn

  depth_args = {}
  if min_depth is not None:
    depth_args['min_depth'] = min_depth
  if divisible_by is not None:
    depth_args['divisible_by'] = divisible_by

  return lib.mobilenet(
      input_tensor,
      num_classes=num_classes,
      conv_defs=conv_defs,
      scope=scope,
      multiplier=depth_multiplier,
      **depth_args,
      **kwargs)

mobilenet.default_image_size = 224


def wrapped_partial(func, *args, **kwargs):
  partial_func = functools.partial(func, *args, **kwargs)
  functools.update_wrapper(partial_func, func)
  return partial_func


mobilenet_v2_100 = wrapped_partial(mobilenet, depth_multiplier=1.00)
mobilenet_v2_140 = wrapped_partial(mobilenet, depth_multiplier=1.40)
mobilenet_v2_035 = wrapped_partial(mobilenet, depth_multiplier=0.35)


@slim.add_arg_scope
def mobilenet_base(input_tensor, depth_multiplier=1.0, **kwargs):
  """The convolutional part of MobileNet v2."""
  return mobilenet(input_tensor, depth_multiplier=depth_multiplier,
                   base_only=True, **kwargs)


def training_scope(**kwargs):
  """The arg scope MobileNet v2 trains under (lib.training_scope's arguments)."""
  return lib.training_scope(**kwargs)
