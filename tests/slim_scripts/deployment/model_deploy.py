"""Deploys a slim model as clones, in the style of research/slim's deployment/model_deploy.py.

research/slim's train_image_classifier.py trains `--num_clones` copies of the
network ("clones") in one graph, one per GPU (or all on the CPU with
`--clone_on_cpu`): `create_clones` calls the model function once per clone
under the name scope `clone_<i>` (no scope for a single clone) and the
clone's device, reusing the first clone's variables, which live on the
variables device; `optimize_clones` adds each clone's losses (scaled by
1 / num_clones, the regularization losses on the first clone only), computes
each clone's gradients on its device and sums them per variable.

tf_slim 1.1.0 ships no `deployment` package; this module gives the scripts
the part of its interface they use.
"""
import collections

import tensorflow.compat.v1 as tf
import tf_slim as slim

__all__ = ['create_clones', 'optimize_clones', 'deploy', 'Clone',
           'DeployedModel', 'DeploymentConfig']

# What one call of the model function returned, under which scope and device.
Clone = collections.namedtuple('Clone', ['outputs', 'scope', 'device'])

# What deploy() returns.
DeployedModel = collections.namedtuple(
    'DeployedModel', ['train_op', 'summary_op', 'total_loss', 'clones'])


class DeploymentConfig(object):
  """Where the clones, the variables, the inputs and the optimizer go.

  Args:
    num_clones: clones per replica.
    clone_on_cpu: put every clone on the CPU (else clone i on GPU i).
    replica_id: this worker's index (0 is the chief).
    num_replicas: number of workers.
    num_ps_tasks: parameter servers (0: the variables stay on this worker).
    worker_job_name: the job name of the workers.
    ps_job_name: the job name of the parameter servers.
  """

  def __init__(self, num_clones=1, clone_on_cpu=False, replica_id=0,
               num_replicas=1, num_ps_tasks=0, worker_job_name='worker',
               ps_job_name='ps'):
    if num_replicas > 1 and num_ps_tasks < 1:
      raise ValueError('When using replicas num_ps_tasks must be positive')
    if num_replicas > 1 or num_ps_tasks > 0:
      if not worker_job_name or not ps_job_name:
        raise ValueError('Must specify worker_job_name and ps_job_name when '
                         'using parameter server')
    if replica_id >= num_replicas:
      raise ValueError('replica_id must be less than num_replicas')
    self._num_clones = num_clones
    self._clone_on_cpu = clone_on_cpu
    self._replica_id = replica_id
    self._num_replicas = num_replicas
    self._num_ps_tasks = num_ps_tasks
    self._ps_device = '/job:' + ps_job_name if num_ps_tasks > 0 else ''
    self._worker_device = ('/job:' + worker_job_name
                           if num_ps_tasks > 0 else '')

  @property
  def num_clones(self):
    return self._num_clones

  @property
  def clone_on_cpu(self):
    return self._clone_on_cpu

  @property
  def replica_id(self):
    return self._replica_id

  @property
  def num_replicas(self):
    return self._num_replicas

  @property
  def num_ps_tasks(self):
    return self._num_ps_tasks

  def clone_device(self, clone_index):
    """The device of clone `clone_index`."""
    if clone_index >= self._num_clones:
      raise ValueError('clone_index must be less than num_clones')
    if self._clone_on_cpu:
      return self._worker_device + '/device:CPU:0'
    return self._worker_device + '/device:GPU:%d' % clone_index

  def clone_scope(self, clone_index):
    """The name scope of clone `clone_index` ('' when there is one clone)."""
    if clone_index >= self._num_clones:
      raise ValueError('clone_index must be less than num_clones')
    return 'clone_%d' % clone_index if self._num_clones > 1 else ''

  def optimizer_device(self):
    return self._worker_device + '/device:CPU:0' if self._num_ps_tasks else ''

  def inputs_device(self):
    return self._worker_device + '/device:CPU:0'

  def variables_device(self):
    """The variables' device: a function spreading them over the ps tasks."""
    device = self._ps_device + '/device:CPU:0'
    if not self._num_ps_tasks:
      return device
    tasks = self._num_ps_tasks
    counter = [0]

    def choose(op):
      current = op.device or ''
      if op.type not in ('Variable', 'VariableV2', 'VarHandleOp'):
        return current
      spec = tf.DeviceSpec.from_string(current)
      spec = spec.replace(job=self._ps_device[len('/job:'):],
                          task=counter[0] % tasks, device_type='CPU')
      counter[0] += 1
      return spec.to_string()
    return choose


def create_clones(config, model_fn, args=None, kwargs=None):
  """Calls `model_fn(*args, **kwargs)` once per clone; returns the Clones.

  The losses `model_fn` adds go to tf.GraphKeys.LOSSES and, like its
  UPDATE_OPS and summaries, are found again under the clone's scope.
  """
  clones = []
  args = args or []
  kwargs = kwargs or {}
  with slim.arg_scope([slim.model_variable, slim.variable],
                      device=config.variables_device()):
    for i in range(config.num_clones):
      with tf.name_scope(config.clone_scope(i)) as clone_scope:
        clone_device = config.clone_device(i)
        with tf.device(clone_device):
          with tf.variable_scope(tf.get_variable_scope(),
                                 reuse=True if i > 0 else None):
            outputs = model_fn(*args, **kwargs)
          clones.append(Clone(outputs, clone_scope, clone_device))
  return clones


def _clone_loss(clone, num_clones, regularization_losses):
  """The clone's losses (divided by num_clones) plus the given regularization."""
  parts = []
  with tf.device(clone.device):
    losses = tf.get_collection(tf.GraphKeys.LOSSES, clone.scope)
    clone_loss = None
    if losses:
      clone_loss = tf.add_n(losses, name='clone_loss')
      if num_clones > 1:
        clone_loss = tf.div(clone_loss, 1.0 * num_clones,
                            name='scaled_clone_loss')
      parts.append(clone_loss)
    regularization_loss = None
    if regularization_losses:
      regularization_loss = tf.add_n(regularization_losses,
                                     name='regularization_loss')
      parts.append(regularization_loss)
    total = tf.add_n(parts) if parts else None
  if clone_loss is not None:
    tf.summary.scalar('/'.join(filter(None, ['Losses', clone.scope,
                                             'clone_loss'])), clone_loss)
  if regularization_loss is not None:
    tf.summary.scalar('Losses/regularization_loss', regularization_loss)
  return total


def _sum_gradients(clone_grads):
  """Sums the gradients of each variable over the clones."""
  summed = []
  for pairs in zip(*clone_grads):
    variable = pairs[0][1]
    grads = [g for g, v in pairs if g is not None]
    if not grads:
      continue
    if len(grads) == 1:
      grad = grads[0]
    else:
      grad = tf.add_n(grads, name=variable.op.name + '/sum_grads')
    summed.append((grad, variable))
  return summed


def optimize_clones(clones, optimizer, regularization_losses=None, **kwargs):
  """Each clone's loss and gradients; returns (total_loss, summed grads_and_vars).

  Args:
    clones: from create_clones.
    optimizer: the tf.train optimizer.
    regularization_losses: added to the first clone's loss; None reads
      tf.GraphKeys.REGULARIZATION_LOSSES, [] adds none.
    **kwargs: passed to `optimizer.compute_gradients` (e.g. var_list).
  """
  if regularization_losses is None:
    regularization_losses = tf.get_collection(
        tf.GraphKeys.REGULARIZATION_LOSSES)
  losses, grads = [], []
  for clone in clones:
    with tf.name_scope(clone.scope):
      loss = _clone_loss(clone, len(clones), regularization_losses)
      if loss is not None:
        with tf.device(clone.device):
          grads.append(optimizer.compute_gradients(loss, **kwargs))
        losses.append(loss)
      regularization_losses = None  # The first clone carries them.
  total_loss = tf.add_n(losses, name='total_loss')
  return total_loss, _sum_gradients(grads)


def deploy(config, model_fn, args=None, kwargs=None, optimizer=None,
           summarize_gradients=False):
  """Clones `model_fn` and, with an optimizer, builds its train op."""
  summaries = set(tf.get_collection(tf.GraphKeys.SUMMARIES))
  clones = create_clones(config, model_fn, args, kwargs)
  update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, clones[0].scope)
  train_op = None
  total_loss = None
  with tf.device(config.optimizer_device()):
    if optimizer:
      with tf.device(config.variables_device()):
        global_step = tf.train.get_or_create_global_step()
      total_loss, grads = optimize_clones(clones, optimizer)
      if grads:
        if summarize_gradients:
          for grad, var in grads:
            summaries.add(tf.summary.histogram(var.op.name + '/gradient', grad))
        update_ops.append(optimizer.apply_gradients(grads,
                                                    global_step=global_step))
        with tf.control_dependencies([tf.group(*update_ops)]):
          train_op = tf.identity(total_loss, name='train_op')
    else:
      regularization_losses = tf.get_collection(
          tf.GraphKeys.REGULARIZATION_LOSSES)
      losses = []
      for clone in clones:
        with tf.name_scope(clone.scope):
          loss = _clone_loss(clone, len(clones), regularization_losses)
          if loss is not None:
            losses.append(loss)
          regularization_losses = None
      if losses:
        total_loss = tf.add_n(losses, name='total_loss')
    summaries |= set(tf.get_collection(tf.GraphKeys.SUMMARIES,
                                       clones[0].scope))
    if total_loss is not None:
      summaries.add(tf.summary.scalar('total_loss', total_loss))
    summary_op = tf.summary.merge(list(summaries), name='summary_op') \
        if summaries else None
  return DeployedModel(train_op, summary_op, total_loss, clones)
