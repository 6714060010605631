"""LeNet, written the way research/slim's nets/lenet.py builds it.

Two 5x5 convolutions (32 and 64 filters) each followed by a 2x2 max pool, a
fully connected layer of 1024 units, dropout and the logits layer.
"""
import tensorflow.compat.v1 as tf
import tf_slim as slim


def lenet(images, num_classes=10, is_training=False,
          dropout_keep_prob=0.5,
          prediction_fn=slim.softmax,
          scope='LeNet'):
  """LeNet on 28x28 images; returns (logits, end_points).

  Args:
    images: [batch, height, width, channels] float images.
    num_classes: the number of classes (0 or None returns the 1024-unit
      features as the logits).
    is_training: whether dropout is active.
    dropout_keep_prob: dropout's keep probability before the logits.
    prediction_fn: turns the logits into predictions.
    scope: the variable scope.
  """
  end_points = {}

  with tf.variable_scope(scope, 'LeNet', [images]):
    net = end_points['conv1'] = slim.conv2d(images, 32, [5, 5], scope='conv1')
    net = end_points['pool1'] = slim.max_pool2d(net, [2, 2], 2, scope='pool1')
    net = end_points['conv2'] = slim.conv2d(net, 64, [5, 5], scope='conv2')
    net = end_points['pool2'] = slim.max_pool2d(net, [2, 2], 2, scope='pool2')
    net = slim.flatten(net)
    end_points['Flatten'] = net

    net = end_points['fc3'] = slim.fully_connected(net, 1024, scope='fc3')
    if not num_classes:
      return net, end_points
    net = end_points['dropout3'] = slim.dropout(
        net, dropout_keep_prob, is_training=is_training, scope='dropout3')
    logits = end_points['Logits'] = slim.fully_connected(
        net, num_classes, activation_fn=None, scope='fc4')

  end_points['Predictions'] = prediction_fn(logits, scope='Predictions')

  return logits, end_points

lenet.default_image_size = 28


def lenet_arg_scope(weight_decay=0.0):
  """LeNet's defaults: ReLU, truncated-normal weights, L2 weight decay."""
  with slim.arg_scope(
      [slim.conv2d, slim.fully_connected],
      weights_regularizer=slim.l2_regularizer(weight_decay),
      weights_initializer=tf.truncated_normal_initializer(stddev=0.1),
      activation_fn=tf.nn.relu) as sc:
    return sc
