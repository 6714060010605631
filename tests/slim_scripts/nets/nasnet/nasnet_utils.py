"""NASNet-A cells, in the style of research/slim's nets/nasnet/nasnet_utils.py.

A cell reads the two previous cells' outputs, brings both to its filter
count (a factorized reduction when the older one is larger), and combines
them in five blocks: each block applies an operation to each of two hidden
states (stacked separable convolutions, 3x3 average or max pools, the
identity) and adds the results. The outputs no block used are concatenated
as the cell's output. Drop path scales each operation's output by a random
0/1 per example during training.
"""
import re

import tensorflow.compat.v1 as tf
import tf_slim as slim

DATA_FORMAT_NHWC = 'NHWC'


def calc_reduction_layers(num_cells, num_reduction_layers):
  """The cell indices after which a reduction cell comes."""
  return [int(float(i) / (num_reduction_layers + 1) * num_cells)
          for i in range(1, num_reduction_layers + 1)]


def global_avg_pool(x, data_format=DATA_FORMAT_NHWC):
  assert data_format == DATA_FORMAT_NHWC
  return tf.reduce_mean(x, [1, 2])


def factorized_reduction(net, output_filters, stride,
                         data_format=DATA_FORMAT_NHWC):
  """Halves the map with two 1x1 paths on offset pixels, concatenated."""
  assert data_format == DATA_FORMAT_NHWC
  if stride == 1:
    net = slim.conv2d(net, output_filters, 1, scope='path_conv')
    return slim.batch_norm(net, scope='path_bn')
  stride_spec = [1, stride, stride, 1]
  path1 = tf.nn.avg_pool2d(net, [1, 1, 1, 1], stride_spec, 'VALID')
  path1 = slim.conv2d(path1, int(output_filters / 2), 1, scope='path1_conv')
  # The second path reads the pixels one down and one right.
  path2 = tf.pad(net, [[0, 0], [0, 1], [0, 1], [0, 0]])[:, 1:, 1:, :]
  path2 = tf.nn.avg_pool2d(path2, [1, 1, 1, 1], stride_spec, 'VALID')
  path2 = slim.conv2d(path2, int(output_filters / 2), 1, scope='path2_conv')
  net = tf.concat(values=[path1, path2], axis=3)
  return slim.batch_norm(net, scope='final_path_bn')


@slim.add_arg_scope
def drop_path(net, keep_prob, is_training=True):
  """Zeroes whole examples with probability 1 - keep_prob (training only)."""
  if is_training:
    batch_size = tf.shape(net)[0]
    noise_shape = [batch_size, 1, 1, 1]
    random_tensor = keep_prob
    random_tensor += tf.random_uniform(noise_shape, dtype=tf.float32)
    binary_tensor = tf.cast(tf.floor(random_tensor), net.dtype)
    keep_prob_inv = tf.cast(1.0 / keep_prob, net.dtype)
    net = net * keep_prob_inv * binary_tensor
  return net


def _operation_to_filter_shape(operation):
  """'separable_5x5_2' and 'avg_pool_3x3' -> 5 and 3."""
  return int(re.search(r'(\d+)x\d+', operation).group(1))


def _operation_to_num_layers(operation):
  """'separable_5x5_2' -> 2."""
  parts = operation.split('_')
  return int(parts[-1]) if parts[-1].isdigit() and len(parts) > 2 else 1


def _stacked_separable_conv(net, stride, operation, filter_size,
                            use_bounded_activation):
  """ReLU, separable conv, batch norm; num_layers times (stride on the first)."""
  activation_fn = tf.nn.relu6 if use_bounded_activation else tf.nn.relu
  num_layers = _operation_to_num_layers(operation)
  kernel_size = _operation_to_filter_shape(operation)
  for layer_num in range(num_layers):
    net = activation_fn(net)
    net = slim.separable_conv2d(
        net, filter_size, kernel_size, depth_multiplier=1,
        scope='separable_{0}x{0}_{1}'.format(kernel_size, layer_num + 1),
        stride=stride)
    net = slim.batch_norm(
        net, scope='bn_sep_{0}x{0}_{1}'.format(kernel_size, layer_num + 1))
    stride = 1
  return net


def _pooling(net, stride, operation, use_bounded_activation):
  """A 3x3 average or max pool, SAME."""
  if use_bounded_activation:
    net = tf.nn.relu6(net)
  kernel = _operation_to_filter_shape(operation)
  if operation.startswith('avg_pool'):
    return slim.avg_pool2d(net, kernel, stride=stride, padding='SAME')
  if operation.startswith('max_pool'):
    return slim.max_pool2d(net, kernel, stride=stride, padding='SAME')
  raise NotImplementedError('Unimplemented pooling type: ', operation)


class NasNetABaseCell(object):
  """A NASNet cell: five blocks of two operations each, then a concatenation."""

  def __init__(self, num_conv_filters, operations, used_hiddenstates,
               hiddenstate_indices, drop_path_keep_prob, total_num_cells,
               total_training_steps, use_bounded_activation=False):
    self._num_conv_filters = num_conv_filters
    self._operations = operations
    self._used_hiddenstates = used_hiddenstates
    self._hiddenstate_indices = hiddenstate_indices
    self._drop_path_keep_prob = drop_path_keep_prob
    self._total_num_cells = total_num_cells
    self._total_training_steps = total_training_steps
    self._use_bounded_activation = use_bounded_activation

  def _reduce_prev_layer(self, prev_layer, curr_layer):
    """Brings prev_layer to curr_layer's size and the cell's filter count."""
    if prev_layer is None:
      return curr_layer
    curr_num_filters = self._filter_size
    prev_num_filters = prev_layer.shape[3]
    curr_size = curr_layer.shape[2]
    prev_size = prev_layer.shape[2]
    activation_fn = tf.nn.relu6 if self._use_bounded_activation else tf.nn.relu
    if curr_size != prev_size:
      prev_layer = activation_fn(prev_layer)
      prev_layer = factorized_reduction(prev_layer, curr_num_filters, stride=2)
    elif curr_num_filters != prev_num_filters:
      prev_layer = activation_fn(prev_layer)
      prev_layer = slim.conv2d(prev_layer, curr_num_filters, 1,
                               scope='prev_1x1')
      prev_layer = slim.batch_norm(prev_layer, scope='prev_bn')
    return prev_layer

  def _cell_base(self, net, prev_layer):
    """The two hidden states the blocks start from: [prev, current]."""
    num_filters = self._filter_size
    prev_layer = self._reduce_prev_layer(prev_layer, net)
    net = tf.nn.relu6(net) if self._use_bounded_activation else tf.nn.relu(net)
    net = slim.conv2d(net, num_filters, 1, scope='1x1')
    net = slim.batch_norm(net, scope='beginning_bn')
    return [prev_layer, net]

  def __call__(self, net, scope=None, filter_scaling=1, stride=1,
               prev_layer=None, cell_num=-1, current_step=None):
    """Runs the cell; returns its output."""
    self._filter_scaling = filter_scaling
    self._filter_size = int(self._num_conv_filters * filter_scaling)
    self._cell_num = cell_num
    with tf.variable_scope(scope):
      net = self._cell_base(net, prev_layer)
      for i in range(5):
        with tf.variable_scope('comb_iter_{}'.format(i)):
          left_hiddenstate_idx, right_hiddenstate_idx = (
              self._hiddenstate_indices[i * 2],
              self._hiddenstate_indices[i * 2 + 1])
          original_input_left = left_hiddenstate_idx < 2
          original_input_right = right_hiddenstate_idx < 2
          h1 = net[left_hiddenstate_idx]
          h2 = net[right_hiddenstate_idx]
          with tf.variable_scope('left'):
            h1 = self._apply_conv_operation(
                h1, self._operations[i * 2], stride, original_input_left,
                current_step)
          with tf.variable_scope('right'):
            h2 = self._apply_conv_operation(
                h2, self._operations[i * 2 + 1], stride, original_input_right,
                current_step)
          with tf.variable_scope('combine'):
            h = h1 + h2
            if self._use_bounded_activation:
              h = tf.nn.relu6(h)
          net.append(h)
      with tf.variable_scope('cell_output'):
        net = self._combine_unused_states(net)
      return net

  def _apply_conv_operation(self, net, operation, stride,
                            is_from_original_input, current_step):
    """One block input's operation (stride only on the cell's inputs)."""
    if stride > 1 and not is_from_original_input:
      stride = 1
    input_filters = net.shape[3]
    filter_size = self._filter_size
    if 'separable' in operation:
      net = _stacked_separable_conv(net, stride, operation, filter_size,
                                    self._use_bounded_activation)
      if self._use_bounded_activation:
        net = tf.clip_by_value(net, -6.0, 6.0)
    elif operation == 'none':
      if stride > 1 or input_filters != filter_size:
        net = tf.nn.relu6(net) if self._use_bounded_activation else \
            tf.nn.relu(net)
        net = slim.conv2d(net, filter_size, 1, stride=stride, scope='1x1')
        net = slim.batch_norm(net, scope='bn_1')
        if self._use_bounded_activation:
          net = tf.clip_by_value(net, -6.0, 6.0)
    elif 'pool' in operation:
      net = _pooling(net, stride, operation, self._use_bounded_activation)
      if input_filters != filter_size:
        net = slim.conv2d(net, filter_size, 1, stride=1, scope='1x1')
        net = slim.batch_norm(net, scope='bn_1')
      if self._use_bounded_activation:
        net = tf.clip_by_value(net, -6.0, 6.0)
    else:
      raise ValueError('Unimplemented operation', operation)

    if operation != 'none':
      net = self._apply_drop_path(net, current_step=current_step)
    return net

  def _combine_unused_states(self, net):
    """Concatenates the hidden states no block read, at the smallest size."""
    used_hiddenstates = self._used_hiddenstates
    final_height = int(net[-1].shape[2])
    final_num_filters = int(net[-1].shape[3])
    assert len(used_hiddenstates) == len(net)
    for idx, used_h in enumerate(used_hiddenstates):
      curr_height = int(net[idx].shape[2])
      curr_num_filters = int(net[idx].shape[3])
      # A larger unused state (the previous cell's, next to a reduction)
      # is reduced to the final size.
      should_reduce = final_num_filters != curr_num_filters
      should_reduce = (final_height != curr_height) or should_reduce
      should_reduce = should_reduce and not used_h
      if should_reduce:
        stride = 2 if final_height != curr_height else 1
        with tf.variable_scope('reduction_{}'.format(idx)):
          net[idx] = factorized_reduction(net[idx], final_num_filters, stride)
    states_to_combine = [h for h, is_used in zip(net, used_hiddenstates)
                         if not is_used]
    return tf.concat(values=states_to_combine, axis=3)

  @slim.add_arg_scope
  def _apply_drop_path(self, net, current_step=None,
                       use_summaries=False, drop_connect_version='v3'):
    """Drop path, its rate growing with the cell's depth and the step."""
    drop_path_keep_prob = self._drop_path_keep_prob
    if drop_path_keep_prob < 1.0:
      assert drop_connect_version in ['v1', 'v2', 'v3']
      if drop_connect_version in ['v2', 'v3']:
        layer_ratio = (self._cell_num + 1) / float(self._total_num_cells)
        drop_path_keep_prob = 1 - layer_ratio * (1 - drop_path_keep_prob)
      if drop_connect_version in ['v1', 'v3']:
        if current_step is None:
          current_step = tf.train.get_or_create_global_step()
        current_ratio = tf.minimum(
            1.0, tf.cast(current_step, tf.float32) /
            self._total_training_steps)
        drop_path_keep_prob = 1 - current_ratio * (1 - drop_path_keep_prob)
      net = drop_path(net, drop_path_keep_prob)
    return net


class NasNetANormalCell(NasNetABaseCell):
  """NASNet-A's normal cell."""

  def __init__(self, num_conv_filters, drop_path_keep_prob, total_num_cells,
               total_training_steps, use_bounded_activation=False):
    operations = ['separable_5x5_2', 'separable_3x3_2', 'separable_5x5_2',
                  'separable_3x3_2', 'avg_pool_3x3', 'none', 'avg_pool_3x3',
                  'avg_pool_3x3', 'separable_3x3_2', 'none']
    used_hiddenstates = [1, 0, 0, 0, 0, 0, 0]
    hiddenstate_indices = [0, 1, 1, 1, 0, 1, 1, 1, 0, 0]
    super(NasNetANormalCell, self).__init__(
        num_conv_filters, operations, used_hiddenstates, hiddenstate_indices,
        drop_path_keep_prob, total_num_cells, total_training_steps,
        use_bounded_activation)


class NasNetAReductionCell(NasNetABaseCell):
  """NASNet-A's reduction cell (stride 2)."""

  def __init__(self, num_conv_filters, drop_path_keep_prob, total_num_cells,
               total_training_steps, use_bounded_activation=False):
    operations = ['separable_5x5_2', 'separable_7x7_2', 'max_pool_3x3',
                  'separable_7x7_2', 'avg_pool_3x3', 'separable_5x5_2',
                  'none', 'avg_pool_3x3', 'separable_3x3_2', 'max_pool_3x3']
    used_hiddenstates = [1, 1, 1, 0, 0, 0, 0]
    hiddenstate_indices = [0, 1, 0, 1, 0, 1, 3, 2, 2, 0]
    super(NasNetAReductionCell, self).__init__(
        num_conv_filters, operations, used_hiddenstates, hiddenstate_indices,
        drop_path_keep_prob, total_num_cells, total_training_steps,
        use_bounded_activation)
