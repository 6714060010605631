"""MobileNet v3, written the way research/slim's nets/mobilenet/mobilenet_v3.py specifies it.

V3_SMALL: a 3x3 stride-2 convolution with hard-swish, 11 inverted residual
blocks (ReLU or hard-swish inside, squeeze-excite with a hard-sigmoid gate on
most), a 1x1 convolution of 576, an average pool to 1x1 and a 1x1
convolution of 1024 without batch norm, both hard-swish. `small` builds it
with mobilenet.mobilenet's classification head.

Like research/slim's, this module derives detection variants of the specs at
import time with `np.int(np.round(...))`, NumPy's alias that NumPy 1.24
removed.
"""
import copy
import functools

import numpy as np
import tensorflow.compat.v1 as tf
import tf_slim as slim

from nets.mobilenet import conv_blocks as ops
from nets.mobilenet import mobilenet as lib

op = lib.op
expand_input = ops.expand_input_by_factor


def hard_swish(x):
  with tf.name_scope('hard_swish'):
    return x * tf.nn.relu6(x + np.float32(3)) * np.float32(1. / 6.)


def hard_sigmoid(x):
  with tf.name_scope('hard_sigmoid'):
    return tf.nn.relu6(x + np.float32(3)) * np.float32(1. / 6.)


def reduce_to_1x1(input_tensor, default_size=7, **kwargs):
  """Average pools the map to 1x1 (a VALID pool of the map's size)."""
  h, w = input_tensor.shape.as_list()[1:3]
  if h is not None and w is not None:
    kernel_size = [h, w]
  else:
    kernel_size = [default_size, default_size]
  return slim.avg_pool2d(input_tensor, kernel_size=kernel_size, **kwargs)


_se4 = functools.partial(ops.squeeze_excite, squeeze_factor=4,
                         inner_activation_fn=tf.nn.relu,
                         gating_fn=hard_sigmoid)


def _squeeze_excite(expansion_tensor, input_tensor):
  del input_tensor
  return _se4(expansion_tensor)


def mbv3_op(ef, n, k, s=1, act=tf.nn.relu, se=None, **kwargs):
  """An inverted residual block of MobileNet v3.

  Args:
    ef: expansion factor.
    n: output depth.
    k: depthwise kernel size.
    s: stride.
    act: the activation inside the block.
    se: the transform after the depthwise convolution (squeeze-excite).
    **kwargs: more of expanded_conv's arguments.
  """
  return op(ops.expanded_conv, expansion_size=expand_input(ef),
            kernel_size=(k, k), stride=s, num_outputs=n,
            inner_activation_fn=act, expansion_transform=se, **kwargs)


mbv3_op_se = functools.partial(mbv3_op, se=_squeeze_excite)


DEFAULTS = {
    (ops.expanded_conv,): dict(
        normalizer_fn=slim.batch_norm,
        residual=True),
    (slim.conv2d, slim.fully_connected, slim.separable_conv2d): {
        'normalizer_fn': slim.batch_norm,
        'activation_fn': tf.nn.relu,
    },
    (slim.batch_norm,): {
        'center': True,
        'scale': True
    },
}

V3_SMALL = dict(
    defaults=dict(DEFAULTS),
    spec=([
        op(slim.conv2d, stride=2, num_outputs=16, kernel_size=(3, 3),
           activation_fn=hard_swish),
        mbv3_op_se(ef=1, n=16, k=3, s=2),
        mbv3_op(ef=72. / 16, n=24, k=3, s=2),
        mbv3_op(ef=(88. / 24), n=24, k=3, s=1),
        mbv3_op_se(ef=4, n=40, k=5, s=2, act=hard_swish),
        mbv3_op_se(ef=6, n=40, k=5, s=1, act=hard_swish),
        mbv3_op_se(ef=6, n=40, k=5, s=1, act=hard_swish),
        mbv3_op_se(ef=3, n=48, k=5, s=1, act=hard_swish),
        mbv3_op_se(ef=3, n=48, k=5, s=1, act=hard_swish),
        mbv3_op_se(ef=6, n=96, k=5, s=2, act=hard_swish),
        mbv3_op_se(ef=6, n=96, k=5, s=1, act=hard_swish),
        mbv3_op_se(ef=6, n=96, k=5, s=1, act=hard_swish),
        op(slim.conv2d, stride=1, kernel_size=[1, 1], num_outputs=576,
           activation_fn=hard_swish),
        op(reduce_to_1x1, default_size=7, stride=1, padding='VALID'),
        op(slim.conv2d, stride=1, kernel_size=[1, 1], num_outputs=1024,
           normalizer_fn=None, activation_fn=hard_swish),
    ]))


def _reduce_consecutive_layers(conv_defs, start_id, end_id, multiplier=0.5):
  """A copy of conv_defs with layers start_id..end_id narrowed by multiplier."""
  defs = copy.deepcopy(conv_defs)
  for d in defs['spec'][start_id:end_id + 1]:
    d.params.update({
        'num_outputs': np.int(np.round(d.params['num_outputs'] * multiplier))
    })
  return defs


V3_SMALL_DETECTION = _reduce_consecutive_layers(V3_SMALL, 9, 12)


@slim.add_arg_scope
def mobilenet(input_tensor,
              num_classes=1001,
              depth_multiplier=1.0,
              scope='MobilenetV3',
              conv_defs=None,
              finegrain_classification_mode=False,
              **kwargs):
  """MobileNet v3 with the classification head; returns (logits, end_points).

  Args:
    input_tensor: [batch, height, width, 3] images.
    num_classes: the number of classes.
    depth_multiplier: scales every layer's depth.
    scope: the variable scope.
    conv_defs: the spec (default V3_SMALL here).
    finegrain_classification_mode: keep the last layer's depth below
      multiplier 1.
    **kwargs: for mobilenet.mobilenet (prediction_fn, is_training, ...).
  """
  if conv_defs is None:
    conv_defs = V3_SMALL
  if 'multiplier' in kwargs:
    raise ValueError('mobilenetv2 doesn\'t support generic '
                     'multiplier parameter use "depth_multiplier" instead.')
  if finegrain_classification_mode:
    conv_defs = copy.deepcopy(conv_defs)
    conv_defs['spec'][-1] = conv_defs['spec'][-1]._replace(
        multiplier_func=lambda params, multiplier, **kw: None)
  return lib.mobilenet(
      input_tensor,
      num_classes=num_classes,
      conv_defs=conv_defs,
      scope=scope,
      multiplier=depth_multiplier,
      **kwargs)

mobilenet.default_image_size = 224


def training_scope(**kwargs):
  """The arg scope MobileNet v3 trains under (lib.training_scope's arguments)."""
  return lib.training_scope(**kwargs)


def wrapped_partial(func, new_defaults=None, **kwargs):
  """func with new default arguments, keeping its name and attributes."""
  partial_func = functools.partial(func, **dict(new_defaults or {}, **kwargs))
  functools.update_wrapper(partial_func, func)
  return partial_func


small = wrapped_partial(mobilenet, conv_defs=V3_SMALL)
