"""The MobileNet v2/v3 network builder, in the style of research/slim's nets/mobilenet/mobilenet.py.

A network is a conv_defs dict: 'defaults' (an arg scope, {(functions,): kwargs})
and 'spec', a list of `op(function, **params)`. `mobilenet_base` applies the
spec in order under the defaults, scaling each op's `num_outputs` by the depth
multiplier (rounded to a multiple of 8); `mobilenet` adds the classification
head (global average pool, dropout, a 1x1 convolution as the logits layer,
squeeze, softmax) under the scope 'Logits'. `training_scope` sets batch norm's
training mode, dropout, weight decay and initializers.
"""
import collections
import contextlib
import copy

import tensorflow.compat.v1 as tf
import tf_slim as slim


_Op = collections.namedtuple('Op', ['op', 'params', 'multiplier_func'])


def _make_divisible(v, divisor, min_value=None):
  if min_value is None:
    min_value = divisor
  new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
  if new_v < 0.9 * v:
    new_v += divisor
  return new_v


def depth_multiplier(output_params, multiplier, divisible_by=8, min_depth=8,
                     **unused_kwargs):
  """Scales output_params['num_outputs'] in place."""
  if 'num_outputs' not in output_params:
    return
  d = output_params['num_outputs']
  output_params['num_outputs'] = _make_divisible(d * multiplier, divisible_by,
                                                 min_depth)


def op(opfunc, multiplier_func=depth_multiplier, **params):
  """One layer of a spec: `opfunc(net, **params)`."""
  return _Op(opfunc, params=params, multiplier_func=multiplier_func)


@contextlib.contextmanager
def _set_arg_scope_defaults(defaults):
  """An arg scope from {(functions,): kwargs}."""
  with contextlib.ExitStack() as stack:
    for functions, kwargs in defaults.items():
      stack.enter_context(slim.arg_scope(list(functions), **kwargs))
    yield


def mobilenet_base(inputs, conv_defs, multiplier=1.0, final_endpoint=None,
                   min_depth=8, divisible_by=8, scope=None, is_training=False):
  """The convolutional part; returns (net, end_points).

  Args:
    inputs: [batch, height, width, channels] images.
    conv_defs: {'defaults': ..., 'spec': [op(...), ...]}.
    multiplier: the depth multiplier of every op with num_outputs.
    final_endpoint: stop after this 'layer_<n>' end point.
    min_depth: no layer gets fewer channels.
    divisible_by: channel counts are multiples of this.
    scope: the variable scope (default 'Mobilenet').
    is_training: batch norm's mode when the caller set no training_scope.
  """
  if multiplier <= 0:
    raise ValueError('multiplier is not greater than zero.')
  end_points = {}
  with tf.variable_scope(scope, default_name='Mobilenet', values=[inputs]):
    with _set_arg_scope_defaults(conv_defs.get('defaults', {})), \
         slim.arg_scope([slim.batch_norm], is_training=is_training):
      net = inputs
      for i, layer in enumerate(conv_defs['spec']):
        params = dict(layer.params)
        layer.multiplier_func(params, multiplier, divisible_by=divisible_by,
                              min_depth=min_depth)
        end_point = 'layer_%d' % (i + 1)
        try:
          net = layer.op(net, **params)
        except Exception:
          print('Failed to create op %s with params %s' % (end_point, params))
          raise
        end_points[end_point] = net
        if final_endpoint is not None and end_point == final_endpoint:
          break
  return net, end_points


def global_pool(input_tensor, pool_op=tf.nn.avg_pool2d):
  """Average pools the whole map (a VALID pool with the map's size)."""
  shape = input_tensor.get_shape().as_list()
  if shape[1] is None or shape[2] is None:
    return tf.reduce_mean(input_tensor, [1, 2], keepdims=True,
                          name='global_pool')
  return pool_op(input_tensor, ksize=[1, shape[1], shape[2], 1],
                 strides=[1, 1, 1, 1], padding='VALID')


def mobilenet(inputs,
              num_classes=1001,
              prediction_fn=slim.softmax,
              reuse=None,
              scope='Mobilenet',
              base_only=False,
              **mobilenet_args):
  """The classification network; returns (logits, end_points).

  Args:
    inputs: [batch, height, width, channels] images.
    num_classes: the number of classes (0 or None: the pooled features).
    prediction_fn: turns the logits into predictions.
    reuse: reuse the variables of scope.
    scope: the variable scope.
    base_only: return mobilenet_base's output.
    **mobilenet_args: for mobilenet_base (conv_defs, multiplier, ...).
  """
  is_training = mobilenet_args.get('is_training', False)
  with tf.variable_scope(scope, 'Mobilenet', reuse=reuse) as scope:
    inputs = tf.identity(inputs, 'input')
    net, end_points = mobilenet_base(inputs, scope=scope, **mobilenet_args)
    if base_only:
      return net, end_points

    net = tf.identity(net, name='embedding')

    with tf.variable_scope('Logits'):
      net = global_pool(net)
      end_points['global_pool'] = net
      if not num_classes:
        return net, end_points
      net = slim.dropout(net, scope='Dropout', is_training=is_training)
      logits = slim.conv2d(net, num_classes, [1, 1], activation_fn=None,
                           normalizer_fn=None,
                           biases_initializer=tf.zeros_initializer(),
                           scope='Conv2d_1c_1x1')
      logits = tf.squeeze(logits, [1, 2])
      logits = tf.identity(logits, name='output')
    end_points['Logits'] = logits
    if prediction_fn:
      end_points['Predictions'] = prediction_fn(logits, 'Predictions')
  return logits, end_points


def training_scope(is_training=True,
                   weight_decay=0.00004,
                   stddev=0.09,
                   dropout_keep_prob=0.8,
                   bn_decay=0.997):
  """The arg scope MobileNets train (and evaluate, is_training=False) under."""
  batch_norm_params = {'decay': bn_decay, 'is_training': is_training}
  if stddev < 0:
    weight_initializer = slim.initializers.xavier_initializer()
  else:
    weight_initializer = tf.truncated_normal_initializer(stddev=stddev)

  with slim.arg_scope(
      [slim.conv2d, slim.fully_connected, slim.separable_conv2d],
      weights_initializer=weight_initializer,
      normalizer_fn=slim.batch_norm), \
      slim.arg_scope([mobilenet_base, mobilenet], is_training=is_training), \
      slim.arg_scope([slim.batch_norm], **batch_norm_params), \
      slim.arg_scope([slim.dropout], is_training=is_training,
                     keep_prob=dropout_keep_prob), \
      slim.arg_scope([slim.conv2d],
                     weights_regularizer=slim.l2_regularizer(weight_decay)), \
      slim.arg_scope([slim.separable_conv2d], weights_regularizer=None) as s:
    return s


mobilenet_base = slim.add_arg_scope(mobilenet_base)
mobilenet = slim.add_arg_scope(mobilenet)


def safe_arg_scope(funcs, **kwargs):
  """arg_scope that drops the kwargs whose value is None."""
  filtered = {k: v for k, v in kwargs.items() if v is not None}
  if filtered:
    return slim.arg_scope(funcs, **filtered)
  return contextlib.nullcontext()


def copy_defs(conv_defs):
  return copy.deepcopy(conv_defs)
