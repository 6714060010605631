"""Trains a nets_factory classifier on a slim dataset, with model_deploy clones.

Written the way research/slim's train_image_classifier.py of mid-2020 (the
last version on tf.contrib.quantize) works, with its flags: a model_deploy
DeploymentConfig of `--num_clones` clones (`--clone_on_cpu` on a machine
without GPUs), queue-based input (DatasetDataProvider, tf.train.batch, a
prefetch queue each clone dequeues its batch from), the network from
nets_factory, summaries of the first clone's end points and losses and of
the model variables, then
`contrib_quantize.create_training_graph(quant_delay=FLAGS.quantize_delay)`
when `--quantize_delay` >= 0 (after the clones' losses, before the
optimizer), model_deploy.optimize_clones and slim.learning.train. The
install line is the only one added for TF 2.
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import qat.compat; qat.compat.install()

import tensorflow.compat.v1 as tf
import tf_slim as slim

from tensorflow.contrib import quantize as contrib_quantize

from datasets import dataset_factory
from deployment import model_deploy
from nets import nets_factory
from preprocessing import preprocessing_factory

flags = tf.app.flags

# Where and how the training runs.
flags.DEFINE_string('master', '', 'TensorFlow master address ("" is local).')
flags.DEFINE_string('train_dir', '/tmp/tfmodel/',
                    'Checkpoints and event files go here.')
flags.DEFINE_integer('num_clones', 1,
                     'How many copies of the model train side by side '
                     '(their losses are averaged).')
flags.DEFINE_boolean('clone_on_cpu', False,
                     'Put every clone on the CPU instead of one per GPU.')
flags.DEFINE_integer('worker_replicas', 1, 'How many worker replicas train.')
flags.DEFINE_integer('num_ps_tasks', 0,
                     'Parameter server tasks; 0 keeps the variables on the '
                     'worker.')
flags.DEFINE_integer('num_readers', 4, 'Parallel readers of the dataset files.')
flags.DEFINE_integer('num_preprocessing_threads', 4,
                     'Threads that preprocess and batch the images.')
flags.DEFINE_integer('log_every_n_steps', 10, 'Steps between log lines.')
flags.DEFINE_integer('save_summaries_secs', 600,
                     'Seconds between summary writes.')
flags.DEFINE_integer('save_interval_secs', 600,
                     'Seconds between checkpoints.')
flags.DEFINE_integer('task', 0, 'This replica\'s task id (0 is the chief).')

# The optimizer.
flags.DEFINE_float('weight_decay', 0.00004, 'L2 weight decay of the model.')
flags.DEFINE_string('optimizer', 'rmsprop',
                    'adadelta, adagrad, adam, ftrl, momentum, sgd or '
                    'rmsprop.')
flags.DEFINE_float('adadelta_rho', 0.95, 'Adadelta\'s decay rate.')
flags.DEFINE_float('adagrad_initial_accumulator_value', 0.1,
                   'Adagrad\'s initial accumulator value.')
flags.DEFINE_float('adam_beta1', 0.9, 'Adam\'s first-moment decay.')
flags.DEFINE_float('adam_beta2', 0.999, 'Adam\'s second-moment decay.')
flags.DEFINE_float('opt_epsilon', 1.0, 'The optimizer\'s epsilon.')
flags.DEFINE_float('ftrl_learning_rate_power', -0.5,
                   'FTRL\'s learning rate power.')
flags.DEFINE_float('ftrl_initial_accumulator_value', 0.1,
                   'FTRL\'s initial accumulator value.')
flags.DEFINE_float('ftrl_l1', 0.0, 'FTRL\'s L1 strength.')
flags.DEFINE_float('ftrl_l2', 0.0, 'FTRL\'s L2 strength.')
flags.DEFINE_float('momentum', 0.9, 'Momentum of momentum and RMSProp.')
flags.DEFINE_float('rmsprop_momentum', 0.9, 'RMSProp\'s momentum.')
flags.DEFINE_float('rmsprop_decay', 0.9, 'RMSProp\'s decay.')
flags.DEFINE_integer('quantize_delay', -1,
                     'Quantized training starts after this many steps; -1 '
                     'trains in float.')

# The learning rate.
flags.DEFINE_string('learning_rate_decay_type', 'exponential',
                    'fixed, exponential or polynomial.')
flags.DEFINE_float('learning_rate', 0.01, 'The initial learning rate.')
flags.DEFINE_float('end_learning_rate', 0.0001,
                   'Where the polynomial decay ends.')
flags.DEFINE_float('label_smoothing', 0.0, 'Label smoothing of the loss.')
flags.DEFINE_float('learning_rate_decay_factor', 0.94,
                   'Factor of each learning rate decay.')
flags.DEFINE_float('num_epochs_per_decay', 2.0,
                   'Epochs (of one clone) between learning rate decays.')
flags.DEFINE_bool('sync_replicas', False,
                  'Aggregate the replicas\' gradients synchronously.')
flags.DEFINE_integer('replicas_to_aggregate', 1,
                     'Gradients gathered before each update.')
flags.DEFINE_float('moving_average_decay', None,
                   'Decay of the variables\' moving averages (None: none).')

# The data and the model.
flags.DEFINE_string('dataset_name', 'imagenet', 'dataset_factory\'s name.')
flags.DEFINE_string('dataset_split_name', 'train', 'The split to train on.')
flags.DEFINE_string('dataset_dir', None, 'Where the dataset files are.')
flags.DEFINE_integer('labels_offset', 0,
                     'Subtracted from the labels (1 for nets trained '
                     'without ImageNet\'s background class, VGG and ResNet).')
flags.DEFINE_string('model_name', 'inception_v3', 'nets_factory\'s name.')
flags.DEFINE_string('preprocessing_name', None,
                    'preprocessing_factory\'s name (default: model_name).')
flags.DEFINE_integer('batch_size', 32, 'Images per batch (per clone).')
flags.DEFINE_integer('train_image_size', None,
                     'Image size (default: the net\'s default_image_size).')
flags.DEFINE_integer('max_number_of_steps', None, 'Steps to train.')
flags.DEFINE_bool('use_grayscale', False, 'Train on grayscale images.')

# Fine-tuning.
flags.DEFINE_string('checkpoint_path', None,
                    'A checkpoint (or directory) to start from.')
flags.DEFINE_string('checkpoint_exclude_scopes', None,
                    'Comma-separated scopes not restored from it.')
flags.DEFINE_string('trainable_scopes', None,
                    'Comma-separated scopes to train (default: all).')
flags.DEFINE_boolean('ignore_missing_vars', False,
                     'Skip variables the checkpoint lacks.')

FLAGS = flags.FLAGS


def _configure_learning_rate(num_samples_per_epoch, global_step):
  """The learning rate tensor that --learning_rate_decay_type asks for."""
  steps_per_epoch = num_samples_per_epoch / FLAGS.batch_size
  if FLAGS.sync_replicas:
    steps_per_epoch /= FLAGS.replicas_to_aggregate
  decay_steps = int(steps_per_epoch * FLAGS.num_epochs_per_decay)

  kind = FLAGS.learning_rate_decay_type
  if kind == 'fixed':
    return tf.constant(FLAGS.learning_rate, name='fixed_learning_rate')
  if kind == 'exponential':
    return tf.train.exponential_decay(
        FLAGS.learning_rate, global_step, decay_steps,
        FLAGS.learning_rate_decay_factor, staircase=True,
        name='exponential_decay_learning_rate')
  if kind == 'polynomial':
    return tf.train.polynomial_decay(
        FLAGS.learning_rate, global_step, decay_steps,
        FLAGS.end_learning_rate, power=1.0, cycle=False,
        name='polynomial_decay_learning_rate')
  raise ValueError('learning_rate_decay_type [%s] was not recognized' % kind)


def _configure_optimizer(learning_rate):
  """The tf.train optimizer that --optimizer names."""
  makers = {
      'adadelta': lambda: tf.train.AdadeltaOptimizer(
          learning_rate, rho=FLAGS.adadelta_rho, epsilon=FLAGS.opt_epsilon),
      'adagrad': lambda: tf.train.AdagradOptimizer(
          learning_rate,
          initial_accumulator_value=FLAGS.adagrad_initial_accumulator_value),
      'adam': lambda: tf.train.AdamOptimizer(
          learning_rate, beta1=FLAGS.adam_beta1, beta2=FLAGS.adam_beta2,
          epsilon=FLAGS.opt_epsilon),
      'ftrl': lambda: tf.train.FtrlOptimizer(
          learning_rate, learning_rate_power=FLAGS.ftrl_learning_rate_power,
          initial_accumulator_value=FLAGS.ftrl_initial_accumulator_value,
          l1_regularization_strength=FLAGS.ftrl_l1,
          l2_regularization_strength=FLAGS.ftrl_l2),
      'momentum': lambda: tf.train.MomentumOptimizer(
          learning_rate, momentum=FLAGS.momentum, name='Momentum'),
      'rmsprop': lambda: tf.train.RMSPropOptimizer(
          learning_rate, decay=FLAGS.rmsprop_decay,
          momentum=FLAGS.rmsprop_momentum, epsilon=FLAGS.opt_epsilon),
      'sgd': lambda: tf.train.GradientDescentOptimizer(learning_rate),
  }
  if FLAGS.optimizer not in makers:
    raise ValueError('Optimizer [%s] was not recognized' % FLAGS.optimizer)
  return makers[FLAGS.optimizer]()


def _get_init_fn():
  """The supervisor's init_fn: restores --checkpoint_path on the first step."""
  if FLAGS.checkpoint_path is None:
    return None
  if tf.train.latest_checkpoint(FLAGS.train_dir):
    tf.logging.info('Ignoring --checkpoint_path: %s has a checkpoint to '
                    'resume from' % FLAGS.train_dir)
    return None

  excluded = [s.strip() for s in (FLAGS.checkpoint_exclude_scopes or '').split(',')
              if s.strip()]
  variables_to_restore = [
      v for v in slim.get_model_variables()
      if not any(v.op.name.startswith(scope) for scope in excluded)]
  checkpoint_path = FLAGS.checkpoint_path
  if tf.gfile.IsDirectory(checkpoint_path):
    checkpoint_path = tf.train.latest_checkpoint(checkpoint_path)
  tf.logging.info('Fine-tuning from %s' % checkpoint_path)
  return slim.assign_from_checkpoint_fn(
      checkpoint_path, variables_to_restore,
      ignore_missing_vars=FLAGS.ignore_missing_vars)


def _get_variables_to_train():
  """The trainable variables under --trainable_scopes (all by default)."""
  if FLAGS.trainable_scopes is None:
    return tf.trainable_variables()
  found = []
  for scope in FLAGS.trainable_scopes.split(','):
    found.extend(tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES,
                                   scope.strip()))
  return found


def _batch_queue(dataset, deploy_config, image_size_fn):
  """Reads, preprocesses and batches the images on the inputs device."""
  preprocessing_fn = preprocessing_factory.get_preprocessing(
      FLAGS.preprocessing_name or FLAGS.model_name, is_training=True,
      use_grayscale=FLAGS.use_grayscale)
  with tf.device(deploy_config.inputs_device()):
    provider = slim.dataset_data_provider.DatasetDataProvider(
        dataset, num_readers=FLAGS.num_readers,
        common_queue_capacity=20 * FLAGS.batch_size,
        common_queue_min=10 * FLAGS.batch_size)
    image, label = provider.get(['image', 'label'])
    label -= FLAGS.labels_offset
    size = image_size_fn()
    image = preprocessing_fn(image, size, size)
    images, labels = tf.train.batch(
        [image, label], batch_size=FLAGS.batch_size,
        num_threads=FLAGS.num_preprocessing_threads,
        capacity=5 * FLAGS.batch_size)
    labels = slim.one_hot_encoding(
        labels, dataset.num_classes - FLAGS.labels_offset)
    return slim.prefetch_queue.prefetch_queue(
        [images, labels], capacity=2 * deploy_config.num_clones)


def main(_):
  if not FLAGS.dataset_dir:
    raise ValueError('You must supply the dataset directory with --dataset_dir')

  tf.logging.set_verbosity(tf.logging.INFO)
  with tf.Graph().as_default():
    deploy_config = model_deploy.DeploymentConfig(
        num_clones=FLAGS.num_clones, clone_on_cpu=FLAGS.clone_on_cpu,
        replica_id=FLAGS.task, num_replicas=FLAGS.worker_replicas,
        num_ps_tasks=FLAGS.num_ps_tasks)
    with tf.device(deploy_config.variables_device()):
      global_step = slim.create_global_step()

    dataset = dataset_factory.get_dataset(
        FLAGS.dataset_name, FLAGS.dataset_split_name, FLAGS.dataset_dir)
    network_fn = nets_factory.get_network_fn(
        FLAGS.model_name,
        num_classes=dataset.num_classes - FLAGS.labels_offset,
        weight_decay=FLAGS.weight_decay, is_training=True)
    batch_queue = _batch_queue(
        dataset, deploy_config,
        lambda: FLAGS.train_image_size or network_fn.default_image_size)

    def clone_fn(batch_queue):
      """One clone: a batch from the queue, the network, its losses."""
      images, labels = batch_queue.dequeue()
      logits, end_points = network_fn(images)
      if 'AuxLogits' in end_points:  # Inception's auxiliary head.
        tf.losses.softmax_cross_entropy(
            labels, end_points['AuxLogits'], weights=0.4,
            label_smoothing=FLAGS.label_smoothing, scope='aux_loss')
      tf.losses.softmax_cross_entropy(
          labels, logits, weights=1.0, label_smoothing=FLAGS.label_smoothing)
      return end_points

    summaries = set(tf.get_collection(tf.GraphKeys.SUMMARIES))
    clones = model_deploy.create_clones(deploy_config, clone_fn, [batch_queue])
    first_clone_scope = deploy_config.clone_scope(0)
    # The first clone's update ops (batch norm statistics) only.
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, first_clone_scope)

    for name, tensor in clones[0].outputs.items():
      summaries.add(tf.summary.histogram('activations/' + name, tensor))
      summaries.add(tf.summary.scalar('sparsity/' + name,
                                      tf.nn.zero_fraction(tensor)))
    for loss in tf.get_collection(tf.GraphKeys.LOSSES, first_clone_scope):
      summaries.add(tf.summary.scalar('losses/%s' % loss.op.name, loss))
    for variable in slim.get_model_variables():
      summaries.add(tf.summary.histogram(variable.op.name, variable))

    moving_average_variables, variable_averages = None, None
    if FLAGS.moving_average_decay:
      moving_average_variables = slim.get_model_variables()
      variable_averages = tf.train.ExponentialMovingAverage(
          FLAGS.moving_average_decay, global_step)

    # Fake quantization, after the losses and before the optimizer.
    if FLAGS.quantize_delay >= 0:
      contrib_quantize.create_training_graph(quant_delay=FLAGS.quantize_delay)

    with tf.device(deploy_config.optimizer_device()):
      learning_rate = _configure_learning_rate(dataset.num_samples, global_step)
      optimizer = _configure_optimizer(learning_rate)
      summaries.add(tf.summary.scalar('learning_rate', learning_rate))

    if FLAGS.sync_replicas:
      optimizer = tf.train.SyncReplicasOptimizer(
          opt=optimizer, replicas_to_aggregate=FLAGS.replicas_to_aggregate,
          total_num_replicas=FLAGS.worker_replicas,
          variable_averages=variable_averages,
          variables_to_average=moving_average_variables)
    elif FLAGS.moving_average_decay:
      update_ops.append(variable_averages.apply(moving_average_variables))

    total_loss, clones_gradients = model_deploy.optimize_clones(
        clones, optimizer, var_list=_get_variables_to_train())
    summaries.add(tf.summary.scalar('total_loss', total_loss))

    update_ops.append(optimizer.apply_gradients(clones_gradients,
                                                global_step=global_step))
    with tf.control_dependencies([tf.group(*update_ops)]):
      train_tensor = tf.identity(total_loss, name='train_op')

    summaries |= set(tf.get_collection(tf.GraphKeys.SUMMARIES,
                                       first_clone_scope))
    summary_op = tf.summary.merge(list(summaries), name='summary_op')

    slim.learning.train(
        train_tensor,
        logdir=FLAGS.train_dir,
        master=FLAGS.master,
        is_chief=(FLAGS.task == 0),
        init_fn=_get_init_fn(),
        summary_op=summary_op,
        number_of_steps=FLAGS.max_number_of_steps,
        log_every_n_steps=FLAGS.log_every_n_steps,
        save_summaries_secs=FLAGS.save_summaries_secs,
        save_interval_secs=FLAGS.save_interval_secs,
        sync_optimizer=optimizer if FLAGS.sync_replicas else None)


if __name__ == '__main__':
  tf.app.run()
