"""NASNet-A and PNASNet-5 cells, in the style of research/slim's nets/nasnet/nasnet_utils.py.

A cell reads the outputs of the two cells before it (hidden states 0 and 1),
brings both to its filter count (a factorized reduction when the older one is
twice as large, a 1x1 convolution when only the depth differs), and combines
them in five blocks: each block applies an operation to each of two hidden
states (two stacked separable convolutions, a 3x3 average or max pool, or
the identity) and adds the two results, giving a new hidden state. The
hidden states are concatenated as the cell's output, but for those the
cell type leaves out (the previous cell's output; for a reduction cell also its
input and first block). During
training, drop path zeroes an operation's output for whole examples, more
often in later cells and later steps. The scope names are research/slim's,
so its checkpoints' names are these.
"""
import re

import tensorflow.compat.v1 as tf
import tf_slim as slim

DATA_FORMAT_NHWC = 'NHWC'

# NASNet-A: per block (left operation, right operation, left input, right
# input), and the hidden states left out of the cell's output.
_NORMAL_BLOCKS = (
    ('separable_5x5_2', 'separable_3x3_2', 0, 1),
    ('separable_5x5_2', 'separable_3x3_2', 1, 1),
    ('avg_pool_3x3', 'none', 0, 1),
    ('avg_pool_3x3', 'avg_pool_3x3', 1, 1),
    ('separable_3x3_2', 'none', 0, 0),
)
_NORMAL_LEFT_OUT = (0,)
_REDUCTION_BLOCKS = (
    ('separable_5x5_2', 'separable_7x7_2', 0, 1),
    ('max_pool_3x3', 'separable_7x7_2', 0, 1),
    ('avg_pool_3x3', 'separable_5x5_2', 0, 1),
    ('none', 'avg_pool_3x3', 3, 2),
    ('separable_3x3_2', 'max_pool_3x3', 2, 0),
)
_REDUCTION_LEFT_OUT = (0, 1, 2)
# PNASNet-5: one cell type, strided where a reduction comes; both input
# states are left out of its output.
_PNASNET_BLOCKS = (
    ('separable_5x5_2', 'max_pool_3x3', 0, 0),
    ('separable_7x7_2', 'max_pool_3x3', 1, 1),
    ('separable_5x5_2', 'separable_3x3_2', 1, 1),
    ('separable_3x3_2', 'max_pool_3x3', 4, 1),
    ('separable_3x3_2', 'none', 0, 1),
)
_PNASNET_LEFT_OUT = (0, 1)


def calc_reduction_layers(num_cells, num_reduction_layers):
  """The cell numbers before which a reduction cell comes, evenly spread."""
  return [int(num_cells * k / (num_reduction_layers + 1))
          for k in range(1, num_reduction_layers + 1)]


def global_avg_pool(x, data_format=DATA_FORMAT_NHWC):
  if data_format != DATA_FORMAT_NHWC:
    raise ValueError('only NHWC here')
  return tf.reduce_mean(x, [1, 2])


def factorized_reduction(net, output_filters, stride,
                         data_format=DATA_FORMAT_NHWC):
  """Halves the map: two strided 1x1 paths, the second shifted one pixel."""
  if data_format != DATA_FORMAT_NHWC:
    raise ValueError('only NHWC here')
  if stride == 1:
    net = slim.conv2d(net, output_filters, 1, scope='path_conv')
    return slim.batch_norm(net, scope='path_bn')
  half = int(output_filters / 2)
  strides = [1, stride, stride, 1]
  path1 = slim.conv2d(tf.nn.avg_pool2d(net, 1, strides, 'VALID'), half, 1,
                      scope='path1_conv')
  shifted = tf.pad(net, [[0, 0], [0, 1], [0, 1], [0, 0]])[:, 1:, 1:, :]
  path2 = slim.conv2d(tf.nn.avg_pool2d(shifted, 1, strides, 'VALID'), half, 1,
                      scope='path2_conv')
  return slim.batch_norm(tf.concat([path1, path2], axis=3),
                         scope='final_path_bn')


@slim.add_arg_scope
def drop_path(net, keep_prob, is_training=True):
  """Keeps each example's `net` with probability keep_prob, scaled by 1/keep_prob."""
  if not is_training:
    return net
  mask_shape = [tf.shape(net)[0], 1, 1, 1]
  kept = tf.floor(keep_prob + tf.random_uniform(mask_shape, dtype=tf.float32))
  return net * tf.cast(1.0 / keep_prob, net.dtype) * tf.cast(kept, net.dtype)


def _kernel_size(operation):
  """'separable_5x5_2' -> 5; 'avg_pool_3x3' -> 3."""
  return int(re.search(r'(\d+)x\d+', operation).group(1))


def _activation(use_bounded_activation):
  return tf.nn.relu6 if use_bounded_activation else tf.nn.relu


class NasNetABaseCell(object):
  """A NASNet-A cell: five (left op, right op, left, right) blocks, and the
  hidden states its output leaves out."""

  def __init__(self, num_conv_filters, blocks, left_out, drop_path_keep_prob,
               total_num_cells, total_training_steps,
               use_bounded_activation=False):
    self._num_conv_filters = num_conv_filters
    self._blocks = blocks
    self._left_out = set(left_out)
    self._drop_path_keep_prob = drop_path_keep_prob
    self._total_num_cells = total_num_cells
    self._total_training_steps = total_training_steps
    self._act = _activation(use_bounded_activation)
    self._bounded = use_bounded_activation

  def __call__(self, net, scope=None, filter_scaling=1, stride=1,
               prev_layer=None, cell_num=-1, current_step=None):
    """The cell's output: its hidden states but those left out, concatenated."""
    self._filters = int(self._num_conv_filters * filter_scaling)
    self._cell_num = cell_num
    with tf.variable_scope(scope):
      states = self._starting_states(net, prev_layer)
      for i, (left_op, right_op, left, right) in enumerate(self._blocks):
        with tf.variable_scope('comb_iter_{}'.format(i)):
          with tf.variable_scope('left'):
            h1 = self._operation(states[left], left_op,
                                 stride if left < 2 else 1, current_step)
          with tf.variable_scope('right'):
            h2 = self._operation(states[right], right_op,
                                 stride if right < 2 else 1, current_step)
          with tf.variable_scope('combine'):
            h = h1 + h2
            states.append(tf.nn.relu6(h) if self._bounded else h)
      with tf.variable_scope('cell_output'):
        return self._concat_unread(states)

  def _starting_states(self, net, prev_layer):
    """[previous cell's output, this cell's input], both at the cell's size and depth."""
    if prev_layer is None:
      prev_layer = net
    elif prev_layer.shape[2] != net.shape[2]:
      prev_layer = factorized_reduction(self._act(prev_layer), self._filters, 2)
    elif prev_layer.shape[3] != self._filters:
      prev_layer = slim.conv2d(self._act(prev_layer), self._filters, 1,
                               scope='prev_1x1')
      prev_layer = slim.batch_norm(prev_layer, scope='prev_bn')
    net = slim.conv2d(self._act(net), self._filters, 1, scope='1x1')
    net = slim.batch_norm(net, scope='beginning_bn')
    return [prev_layer, net]

  def _operation(self, net, operation, stride, current_step):
    """One of a block's two operations; drop path on all but the identity."""
    if operation.startswith('separable'):
      kernel = _kernel_size(operation)
      for layer in range(int(operation.rsplit('_', 1)[1])):
        net = slim.separable_conv2d(
            self._act(net), self._filters, kernel, depth_multiplier=1,
            stride=stride if layer == 0 else 1,
            scope='separable_{0}x{0}_{1}'.format(kernel, layer + 1))
        net = slim.batch_norm(
            net, scope='bn_sep_{0}x{0}_{1}'.format(kernel, layer + 1))
    elif operation == 'none':
      if stride > 1 or net.shape[3] != self._filters:
        net = slim.conv2d(self._act(net), self._filters, 1, stride=stride,
                          scope='1x1')
        net = slim.batch_norm(net, scope='bn_1')
      return net
    elif 'pool' in operation:
      pool = slim.avg_pool2d if operation.startswith('avg') else slim.max_pool2d
      if self._bounded:
        net = tf.nn.relu6(net)
      net = pool(net, _kernel_size(operation), stride=stride, padding='SAME')
      if net.shape[3] != self._filters:
        net = slim.conv2d(net, self._filters, 1, scope='1x1')
        net = slim.batch_norm(net, scope='bn_1')
    else:
      raise ValueError('Unimplemented operation', operation)
    if self._bounded:
      net = tf.clip_by_value(net, -6.0, 6.0)
    return self._drop_path(net, current_step)

  def _drop_path(self, net, current_step):
    """drop_path with a keep probability falling with depth and with the step."""
    if self._drop_path_keep_prob >= 1.0:
      return net
    depth_ratio = (self._cell_num + 1) / float(self._total_num_cells)
    if current_step is None:
      current_step = tf.train.get_or_create_global_step()
    step_ratio = tf.minimum(
        1.0, tf.cast(current_step, tf.float32) / self._total_training_steps)
    keep_prob = 1 - depth_ratio * step_ratio * (1 - self._drop_path_keep_prob)
    return drop_path(net, keep_prob)

  def _concat_unread(self, states):
    """The states not left out, each at the last one's size, concatenated."""
    height, depth = int(states[-1].shape[2]), int(states[-1].shape[3])
    outputs = []
    for i, state in enumerate(states):
      if i in self._left_out:
        continue
      if int(state.shape[2]) != height or int(state.shape[3]) != depth:
        with tf.variable_scope('reduction_{}'.format(i)):
          state = factorized_reduction(
              state, depth, 2 if int(state.shape[2]) != height else 1)
      outputs.append(state)
    return tf.concat(outputs, axis=3)


class NasNetANormalCell(NasNetABaseCell):
  """NASNet-A's normal cell."""

  def __init__(self, num_conv_filters, drop_path_keep_prob, total_num_cells,
               total_training_steps, use_bounded_activation=False):
    super(NasNetANormalCell, self).__init__(
        num_conv_filters, _NORMAL_BLOCKS, _NORMAL_LEFT_OUT, drop_path_keep_prob,
        total_num_cells, total_training_steps, use_bounded_activation)


class NasNetAReductionCell(NasNetABaseCell):
  """NASNet-A's reduction cell (its operations on the inputs have stride 2)."""

  def __init__(self, num_conv_filters, drop_path_keep_prob, total_num_cells,
               total_training_steps, use_bounded_activation=False):
    super(NasNetAReductionCell, self).__init__(
        num_conv_filters, _REDUCTION_BLOCKS, _REDUCTION_LEFT_OUT,
        drop_path_keep_prob,
        total_num_cells, total_training_steps, use_bounded_activation)


class PNasNetNormalCell(NasNetABaseCell):
  """PNASNet-5's cell (stride 2 where a reduction comes)."""

  def __init__(self, num_conv_filters, drop_path_keep_prob, total_num_cells,
               total_training_steps, use_bounded_activation=False):
    super(PNasNetNormalCell, self).__init__(
        num_conv_filters, _PNASNET_BLOCKS, _PNASNET_LEFT_OUT,
        drop_path_keep_prob, total_num_cells, total_training_steps,
        use_bounded_activation)
