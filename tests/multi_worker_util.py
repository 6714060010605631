"""One worker of tests/replicas_test.py's MultiWorkerMirroredStrategy run.

    python multi_worker_util.py <task> <port0,port1> <out_dir>

Sets TF_CONFIG for 2 workers on 127.0.0.1, builds the strategy, a
`tf.distribute.Server` from its cluster spec, and the small conv net of
tools/_replica_models.py with `call_for_each_replica` (the rewrite called
after the forward pass, under the strategy's scope); trains 3 steps on this
worker's half of each batch, writing every range after every step to
`<out_dir>/ranges_<task>.json`. Both workers recalibrate the batch norms and
save (TensorFlow's multi-worker rule: every worker takes part in a save); the
chief's checkpoint is `<out_dir>/chief/model.ckpt`. Bounded by the
collectives' timeout and the parent's kill.
"""
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tools"))
sys.path.insert(0, os.path.join(_ROOT, "tests"))
import qat  # pylint: disable=g-import-not-at-top,wrong-import-position
import _replica_models as models  # pylint: disable=g-import-not-at-top,wrong-import-position
import zoo_util  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
BATCH = 4      # Per worker.
STEPS = 3


def main(task: int, ports, out_dir: str) -> None:
    tf1.disable_eager_execution()
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": task}})
    strategy = tf1.distribute.experimental.MultiWorkerMirroredStrategy()
    config = strategy.update_config_proto(tf1.ConfigProto(operation_timeout_in_ms=120000))
    server = tf.distribute.Server(strategy.cluster_resolver.cluster_spec(), job_name="worker",
                                  task_index=task, config=config, start=True)
    graph = tf1.get_default_graph()
    with strategy.scope():
        images = tf1.placeholder(tf.float32, (BATCH,) + models.SIZE, name="images")
        labels = tf1.placeholder(tf.int64, [BATCH], name="labels")
        optimizer = tf1.train.GradientDescentOptimizer(0.05)

        def forward(x, y):
            return tf1.losses.sparse_softmax_cross_entropy(y, models.model(x, True),
                                                           loss_collection=None)

        def step(loss):
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                return optimizer.apply_gradients(
                    optimizer.compute_gradients(loss / strategy.num_replicas_in_sync))

        losses = strategy.extended.call_for_each_replica(forward, args=(images, labels))
        qat.experimental_create_training_graph(quant_delay=0, symmetric_weights=True)
        train_op = tf.group(strategy.experimental_local_results(
            strategy.extended.call_for_each_replica(step, args=(losses,))))
        recalibrate = zoo_util.recalibrate_batch_norms(graph)
        saver = tf1.train.Saver()
    ranges = models.range_variables(graph)
    history = []
    with tf1.Session(server.target, config=config) as sess:
        sess.run(tf1.global_variables_initializer())
        for s in range(STEPS):
            x, y = models.make_batch(2 * BATCH, seed=s)
            half = slice(task * BATCH, (task + 1) * BATCH)
            sess.run(train_op, {images: x[half], labels: y[half]})
            values = sess.run({v.op.name: v for v in ranges})
            history.append({k: np.asarray(v).tolist() for k, v in values.items()})
        x, _ = models.make_batch(2 * BATCH, seed=STEPS)
        sess.run(recalibrate, {images: x[task * BATCH:(task + 1) * BATCH]})
        where = os.path.join(out_dir, "chief" if task == 0 else f"worker_{task}")
        saver.save(sess, os.path.join(where, "model.ckpt"))
    with open(os.path.join(out_dir, f"ranges_{task}.json"), "w") as f:
        json.dump(history, f)
    print(f"worker {task}: done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3])
