"""CifarNet, written the way research/slim's nets/cifarnet.py builds it.

Two 5x5 convolutions, each with a 2x2 max pool and a local response
normalization (after the pool for the first, before it for the second), then
fully connected layers of 384 and 192 units, dropout, and the logits layer.
"""
import tensorflow.compat.v1 as tf
import tf_slim as slim


def _truncated_normal(stddev):
  return tf.truncated_normal_initializer(stddev=stddev)


def cifarnet(images, num_classes=10, is_training=False,
             dropout_keep_prob=0.5,
             prediction_fn=slim.softmax,
             scope='CifarNet'):
  """CifarNet on 32x32 images; returns (logits, end_points).

  Args:
    images: [batch, height, width, channels] float images.
    num_classes: the number of classes (0 or None returns the 192-unit
      features as the logits).
    is_training: whether dropout is active.
    dropout_keep_prob: dropout's keep probability before the logits.
    prediction_fn: turns the logits into predictions.
    scope: the variable scope.
  """
  end_points = {}

  with tf.variable_scope(scope, 'CifarNet', [images]):
    net = slim.conv2d(images, 64, [5, 5], scope='conv1')
    end_points['conv1'] = net
    net = slim.max_pool2d(net, [2, 2], 2, scope='pool1')
    end_points['pool1'] = net
    net = tf.nn.lrn(net, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75,
                    name='norm1')
    net = slim.conv2d(net, 64, [5, 5], scope='conv2')
    end_points['conv2'] = net
    net = tf.nn.lrn(net, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75,
                    name='norm2')
    net = slim.max_pool2d(net, [2, 2], 2, scope='pool2')
    end_points['pool2'] = net
    net = slim.flatten(net)
    end_points['Flatten'] = net
    net = slim.fully_connected(net, 384, scope='fc3')
    end_points['fc3'] = net
    net = slim.dropout(net, dropout_keep_prob, is_training=is_training,
                       scope='dropout3')
    net = slim.fully_connected(net, 192, scope='fc4')
    end_points['fc4'] = net
    if not num_classes:
      return net, end_points
    logits = slim.fully_connected(
        net, num_classes, biases_initializer=tf.zeros_initializer(),
        weights_initializer=_truncated_normal(1 / 192.0),
        weights_regularizer=None, activation_fn=None, scope='logits')

    end_points['Logits'] = logits
    end_points['Predictions'] = prediction_fn(logits, scope='Predictions')

  return logits, end_points

cifarnet.default_image_size = 32


def cifarnet_arg_scope(weight_decay=0.004):
  """CifarNet's defaults: ReLU, truncated-normal weights, L2 on the dense layers."""
  with slim.arg_scope(
      [slim.conv2d],
      weights_initializer=_truncated_normal(5e-2),
      activation_fn=tf.nn.relu):
    with slim.arg_scope(
        [slim.fully_connected],
        biases_initializer=tf.constant_initializer(0.1),
        weights_initializer=_truncated_normal(0.04),
        weights_regularizer=slim.l2_regularizer(weight_decay),
        activation_fn=tf.nn.relu) as sc:
      return sc
