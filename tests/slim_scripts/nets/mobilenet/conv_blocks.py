"""Building blocks of MobileNet v2 and v3, in the style of research/slim's nets/mobilenet/conv_blocks.py.

`expanded_conv` is the inverted residual: a 1x1 expansion (skipped when it
would not widen the input), a depthwise convolution, an optional transform
of the expanded tensor (MobileNet v3's squeeze-excite), a linear 1x1
projection, and the residual add when the shapes allow it.
`squeeze_excite` pools the tensor to 1x1, squeezes and excites it with two
1x1 convolutions and scales the tensor by the result.
"""
import functools

import tensorflow.compat.v1 as tf
import tf_slim as slim


def _make_divisible(v, divisor, min_value=None):
  """v rounded to a multiple of divisor, never 10% below v."""
  if min_value is None:
    min_value = divisor
  new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
  if new_v < 0.9 * v:
    new_v += divisor
  return new_v


def _expand_input_by_factor(n, divisible_by=8, num_inputs=None):
  return _make_divisible(num_inputs * n, divisible_by)


def expand_input_by_factor(n, divisible_by=8):
  """An expansion_size for expanded_conv: n times the input depth."""
  return functools.partial(_expand_input_by_factor, n, divisible_by)


def _depth(tensor):
  return tensor.get_shape().as_list()[3]


@slim.add_arg_scope
def expanded_conv(input_tensor,
                  num_outputs,
                  expansion_size=expand_input_by_factor(6),
                  stride=1,
                  kernel_size=(3, 3),
                  residual=True,
                  normalizer_fn=None,
                  split_expansion=1,
                  expansion_transform=None,
                  inner_activation_fn=None,
                  depthwise_activation_fn=None,
                  project_activation_fn=tf.identity,
                  padding='SAME',
                  endpoints=None,
                  scope=None):
  """The inverted residual block; returns its output tensor.

  Args:
    input_tensor: [batch, height, width, depth].
    num_outputs: the projection's depth.
    expansion_size: the expanded depth, or a function of the input depth.
    stride: the depthwise convolution's stride.
    kernel_size: the depthwise convolution's kernel.
    residual: add the input when stride is 1 and the depths match.
    normalizer_fn: the three convolutions' normalizer.
    split_expansion: accepted for the spec's sake; must be 1.
    expansion_transform: fn(expansion_tensor=, input_tensor=) applied after
      the depthwise convolution.
    inner_activation_fn: the expansion's activation (default: the arg scope's).
    depthwise_activation_fn: the depthwise's (default: inner_activation_fn).
    project_activation_fn: the projection's (linear by default).
    padding: the depthwise convolution's padding.
    endpoints: a dict that receives 'expansion_output' and 'depthwise_output'.
    scope: the variable scope (default 'expanded_conv', numbered).
  """
  if split_expansion != 1:
    raise ValueError('split_expansion is not supported here')
  conv_kwargs = {}
  if inner_activation_fn is not None:
    conv_kwargs['activation_fn'] = inner_activation_fn
  depthwise_kwargs = dict(conv_kwargs)
  if depthwise_activation_fn is not None:
    depthwise_kwargs['activation_fn'] = depthwise_activation_fn
  with tf.variable_scope(scope, default_name='expanded_conv') as s, \
       tf.name_scope(s.original_name_scope):
    input_tensor = tf.identity(input_tensor, 'input')
    input_depth = _depth(input_tensor)
    inner_size = (expansion_size(num_inputs=input_depth)
                  if callable(expansion_size) else expansion_size)
    net = input_tensor
    if inner_size > input_depth:
      net = slim.conv2d(net, inner_size, 1, normalizer_fn=normalizer_fn,
                        scope='expand', **conv_kwargs)
      net = tf.identity(net, name='expansion_output')
    if endpoints is not None:
      endpoints['expansion_output'] = net
    net = slim.separable_conv2d(
        net, num_outputs=None, kernel_size=kernel_size, depth_multiplier=1,
        stride=stride, padding=padding, normalizer_fn=normalizer_fn,
        scope='depthwise', **depthwise_kwargs)
    net = tf.identity(net, name='depthwise_output')
    if endpoints is not None:
      endpoints['depthwise_output'] = net
    if expansion_transform:
      net = expansion_transform(expansion_tensor=net, input_tensor=input_tensor)
    net = slim.conv2d(net, num_outputs, 1, normalizer_fn=normalizer_fn,
                      activation_fn=project_activation_fn, scope='project')
    if endpoints is not None:
      endpoints['projection_output'] = net
    if (residual and stride == 1 and _depth(net) == input_depth):
      net += input_tensor
    return tf.identity(net, name='output')


@slim.add_arg_scope
def squeeze_excite(input_tensor,
                   divisible_by=8,
                   squeeze_factor=3,
                   inner_activation_fn=tf.nn.relu,
                   gating_fn=tf.sigmoid):
  """Scales input_tensor's channels by a gate computed from its mean."""
  with tf.variable_scope('squeeze_excite'):
    height, width, depth = input_tensor.get_shape().as_list()[1:4]
    squeeze_depth = _make_divisible(depth / squeeze_factor, divisible_by)
    pooled = tf.nn.avg_pool(input_tensor, (1, height, width, 1),
                            strides=(1, 1, 1, 1), padding='VALID')
    squeeze = slim.conv2d(pooled, squeeze_depth, [1, 1], normalizer_fn=None,
                          activation_fn=inner_activation_fn, scope='Conv')
    excite = slim.conv2d(squeeze, depth, [1, 1], normalizer_fn=None,
                         activation_fn=gating_fn, scope='Conv_1')
    return input_tensor * excite
