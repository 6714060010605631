"""Distributed quantization-aware training on TensorFlow's own TF1 runtime.

Between-graph replication, as TF1's canonical distributed trainer: every task
runs this program; `tf.compat.v1.train.Server` per task, the model built under
`replica_device_setter` (variables on the parameter servers, compute on the
worker), `qat.experimental_create_training_graph(symmetric_weights=True)`,
`MonitoredTrainingSession` (worker 0 is the chief: it initialises and
checkpoints, the others wait for it), optionally `SyncReplicasOptimizer`.
The model and data are the demo's (tools/qat_demo.py: the digits conv net,
QAT from scratch here). After training the chief builds the eval graph from
its last checkpoint (strict Saver) and exports uint8 and int8 TFLite models.

  # one command, on this machine: 1 ps + 2 workers on 127.0.0.1, then stopped
  train_distributed.py --train_dir=/tmp/dist
  # real hosts: the same command on each host with its role
  train_distributed.py --job_name=ps --task_index=0 --ps_hosts=h0:2222 \
      --worker_hosts=h1:2222,h2:2222 --train_dir=/shared/dist
  train_distributed.py --job_name=worker --task_index=0 ...   # chief (exports)
  train_distributed.py --job_name=worker --task_index=1 ...
  # the single-process QAT run with the same settings, for comparison
  train_distributed.py --job_name=single --train_dir=/tmp/single

Each worker writes `<train_dir>/report_worker_<i>.json` (runs, global steps
seen, devices of qat's variables, and for the chief the accuracies); the
single job writes `report_single.json`; TFLite models go to <train_dir>/tflite. Shared with
the demo: --batch_size, --learning_rate, --seed, --symmetric_activations.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qat_demo  # pylint: disable=g-import-not-at-top,wrong-import-position

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-order
from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_enum("job_name", "local", ["local", "ps", "worker", "single"],
                  "local: start 1 ps and --num_workers workers on 127.0.0.1 and stop them; "
                  "ps / worker: one task of a cluster; single: one process, no cluster.")
flags.DEFINE_integer("task_index", 0, "Index of this task in its job.")
flags.DEFINE_list("ps_hosts", [], "host:port of each parameter server.")
flags.DEFINE_list("worker_hosts", [], "host:port of each worker.")
flags.DEFINE_integer("num_workers", 2, "Workers of the local mode.")
flags.DEFINE_string("train_dir", "out/distributed", "Checkpoints, reports and logs.")
flags.DEFINE_integer("steps", 600, "Global steps to train.")
flags.DEFINE_bool("sync_replicas", False,
                  "SyncReplicasOptimizer, aggregating one gradient per worker each step.")
flags.DEFINE_integer("quant_delay", 50, "quant_delay of the training rewrite (runs of the "
                     "shared fake_quantization_step counter).")
flags.DEFINE_integer("freeze_bn_delay", 400, "freeze_bn_delay of the training rewrite.")
flags.DEFINE_bool("cosine_decay", True,
                  "Decay the learning rate to 0 over --steps global steps (cosine).")
flags.DEFINE_bool("rewrite_in_device_scope", True,
                  "Call the rewrite inside the replica_device_setter scope (else after it).")
flags.DEFINE_integer("save_checkpoint_steps", 100, "Chief checkpoint period (and at the end).")
flags.DEFINE_integer("log_every", 50, "Progress line every this many local steps.")
flags.DEFINE_float("step_sleep", 0.0, "Seconds to sleep after each step (tests, demos).")
flags.DEFINE_integer("max_seconds", 0, "Exit with status 3 after this many seconds (0: never).")
flags.DEFINE_bool("export", True, "Chief / single job: export TFLite models after training.")

CHIEF_REPORT = "report_worker_0.json"
_QAT_SCOPES = ("weights_quant/", "act_quant/", "input_quant/", "conv_quant/", "add_quant/")


def is_qat_variable(name: str) -> bool:
    """Whether a variable name is one the qat rewrite creates."""
    return name == "fake_quantization_step" or any(s in name for s in _QAT_SCOPES)


def _tf():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    return tf


def build_training_graph(cluster, task_index: int, num_workers: int):
    """The replicated training graph of one worker (cluster None: one process)."""
    tf = _tf()
    import qat  # pylint: disable=g-import-not-at-top
    tf1 = tf.compat.v1
    graph = tf.Graph()
    setter = None
    if cluster is not None:
        setter = tf1.train.replica_device_setter(
            cluster=cluster, worker_device=f"/job:worker/task:{task_index}")

    def rewrite():
        qat.experimental_create_training_graph(
            graph, symmetric=FLAGS.symmetric_activations, symmetric_weights=True,
            quant_delay=FLAGS.quant_delay or None, freeze_bn_delay=FLAGS.freeze_bn_delay)

    with graph.as_default():
        tf1.set_random_seed(FLAGS.seed)
        with tf1.device(setter):
            global_step = tf1.train.get_or_create_global_step()
            images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name=qat_demo.INPUT_NAME)
            labels = tf1.placeholder(tf.int64, [None], name="labels")
            logits = qat_demo.build_model(images, is_training=True)
            loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
            correct = tf.equal(tf.argmax(logits, 1), labels)
            accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
            if FLAGS.rewrite_in_device_scope:
                rewrite()
        if not FLAGS.rewrite_in_device_scope:
            rewrite()
        with tf1.device(setter):
            rate = FLAGS.learning_rate
            if FLAGS.cosine_decay:
                rate = tf1.train.cosine_decay(rate, global_step, FLAGS.steps)
            optimizer = tf1.train.AdamOptimizer(rate)
            if FLAGS.sync_replicas:
                optimizer = tf1.train.SyncReplicasOptimizer(
                    optimizer, replicas_to_aggregate=num_workers, total_num_replicas=num_workers)
            # The batch-norm updates hang on the loss, not on the update: the chief of
            # SyncReplicasOptimizer applies the aggregated gradients with no input fed.
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                loss = tf.identity(loss, name="loss_with_updates")
            train_op = optimizer.minimize(loss, global_step=global_step)
            extra_tokens = None
            if FLAGS.sync_replicas and task_index == 0:
                # Run by the chief at its end: workers blocked on a token finish their step.
                extra_tokens = optimizer.get_init_tokens_op(num_tokens=num_workers)
    return graph, dict(images=images, labels=labels, loss=loss, accuracy=accuracy,
                       train_op=train_op, global_step=global_step, optimizer=optimizer,
                       extra_tokens=extra_tokens)


def _wait_for_chief(target: str, config, graph, timeout: float) -> None:
    """Polls (bounded) until the chief has initialised the shared variables."""
    tf = _tf()
    with graph.as_default():
        # Global variables only: local ones (SyncReplicasOptimizer's local step) are the
        # worker's own, initialised by MonitoredTrainingSession.
        uninitialized = tf.compat.v1.report_uninitialized_variables(
            tf.compat.v1.global_variables())
    deadline = time.monotonic() + timeout
    with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
        while time.monotonic() < deadline:
            if not len(sess.run(uninitialized)):
                return
            time.sleep(0.5)
    raise TimeoutError(f"the chief did not initialise the variables within {timeout:.0f} s")


def train(cluster, server, task_index: int, num_workers: int, train_dir: str, role: str):
    """Trains until the global step reaches --steps; returns the report dict."""
    tf = _tf()
    tf1 = tf.compat.v1
    graph, t = build_training_graph(cluster, task_index, num_workers)
    is_chief = task_index == 0
    config = tf1.ConfigProto()
    target = ""
    if server is not None:
        config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task_index}"])
        target = server.target
    x_train, y_train, _, _ = qat_demo.load_data(FLAGS.seed)
    rng = np.random.RandomState(FLAGS.seed + 1000 * task_index)
    with graph.as_default():
        hooks = [tf1.train.StopAtStepHook(last_step=FLAGS.steps)]
        if FLAGS.sync_replicas:
            hooks.append(t["optimizer"].make_session_run_hook(is_chief))
        devices = {v.op.name: v.op.device for v in tf1.global_variables()
                   if is_qat_variable(v.op.name)}
        if not is_chief:
            _wait_for_chief(target, config, graph, timeout=600)
        start = time.monotonic()
        runs, global_steps = 0, []
        with tf1.train.MonitoredTrainingSession(
                master=target, is_chief=is_chief, checkpoint_dir=train_dir if is_chief else None,
                hooks=hooks, save_checkpoint_steps=FLAGS.save_checkpoint_steps,
                save_checkpoint_secs=None, save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=None, config=config, stop_grace_period_secs=10) as sess:
            while not sess.should_stop():
                batch = rng.randint(0, len(x_train), FLAGS.batch_size)
                _, loss, acc, step = sess.run(
                    [t["train_op"], t["loss"], t["accuracy"], t["global_step"]],
                    {t["images"]: x_train[batch], t["labels"]: y_train[batch]})
                runs += 1
                global_steps.append(int(step))
                if runs % FLAGS.log_every == 0 or runs == 1:
                    logging.info("%s %d: step %d (global step %d), loss %.4f, batch accuracy "
                                 "%.1f%% (%.1f s)", role, task_index, runs, step, loss,
                                 100 * acc, time.monotonic() - start)
                if FLAGS.step_sleep:
                    time.sleep(FLAGS.step_sleep)
            if t["extra_tokens"] is not None:
                sess.run_step_fn(
                    lambda step_context: step_context.session.run(t["extra_tokens"]))
    seconds = time.monotonic() - start
    logging.info("%s %d: done, %d steps, last global step %d (%.1f s)", role, task_index, runs,
                 global_steps[-1] if global_steps else -1, seconds)
    return dict(task=task_index, runs=runs, global_steps=global_steps, seconds=seconds,
                qat_variable_devices=devices, sync_replicas=FLAGS.sync_replicas)


def export_checkpoint(train_dir: str, output_dir: str) -> dict:
    """Eval graph from the last checkpoint (strict Saver), TFLite export, accuracies."""
    tf = _tf()
    from qat import export  # pylint: disable=g-import-not-at-top
    checkpoint = tf.train.latest_checkpoint(train_dir)
    _, _, x_test, y_test = qat_demo.load_data(FLAGS.seed)
    FLAGS.output_dir = output_dir  # qat_demo.eval_session writes eval_graph.meta there.
    tf.io.gfile.makedirs(output_dir)
    sess = qat_demo.eval_session(checkpoint, quantize=True)
    try:
        probs = export.run_graph(sess, qat_demo.INPUT_NAME, qat_demo.OUTPUT_NAME, x_test)
        results = export.export_tflite(
            [qat_demo.INPUT_NAME], [qat_demo.OUTPUT_NAME], output_dir, sess=sess,
            flavours=("uint8", "int8"), default_input_range=qat_demo.INPUT_RANGE,
            parity_inputs=x_test)
    finally:
        sess.close()
    report = dict(checkpoint=checkpoint, eval_graph_accuracy=qat_demo.accuracy(probs, y_test))
    for flavour, result in results.items():
        report[f"tflite_{flavour}_accuracy"] = qat_demo.accuracy(
            export.run_tflite(result.model, x_test), y_test)
        report[f"tflite_{flavour}_agreement"] = 100 * result.parity.top1_agreement
        report[f"tflite_{flavour}_path"] = result.path
    logging.info("exported %s: %s", checkpoint, json.dumps(report))
    return report


def _write_report(train_dir: str, name: str, report: dict) -> None:
    os.makedirs(train_dir, exist_ok=True)
    path = os.path.join(train_dir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".tmp", path)


def _watchdog(seconds: int) -> None:
    def expire():
        time.sleep(seconds)
        logging.error("--max_seconds=%d reached: exiting", seconds)
        os._exit(3)  # pylint: disable=protected-access
    threading.Thread(target=expire, daemon=True).start()


def free_port() -> int:
    """A port on 127.0.0.1 that was free when asked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _echo_progress(log_dir: str, offsets) -> None:
    """Prints the new progress lines of the workers' logs (local mode)."""
    for name in offsets:
        if not name.startswith("worker"):
            continue
        with open(os.path.join(log_dir, name + ".log"), "rb") as f:
            f.seek(offsets[name])
            chunk = f.read()
        chunk = chunk[:chunk.rfind(b"\n") + 1]  # Whole lines only.
        offsets[name] += len(chunk)
        for line in chunk.decode(errors="replace").splitlines():
            if "train_distributed.py" in line and "] " in line:
                print(f"[{name}] {line.split('] ', 1)[1]}", flush=True)


def run_local(argv_flags) -> int:
    """Starts 1 ps and the workers on 127.0.0.1, waits for them, stops them."""
    ps_hosts = [f"127.0.0.1:{free_port()}"]
    worker_hosts = [f"127.0.0.1:{free_port()}" for _ in range(FLAGS.num_workers)]
    log_dir = os.path.join(FLAGS.train_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    limit = FLAGS.max_seconds or 1800
    common = [f"--ps_hosts={','.join(ps_hosts)}", f"--worker_hosts={','.join(worker_hosts)}",
              f"--max_seconds={limit}"] + argv_flags
    procs, logs = {}, {}
    try:
        for job, count in (("ps", 1), ("worker", FLAGS.num_workers)):
            for i in range(count):
                name = f"{job}_{i}"
                logs[name] = open(os.path.join(log_dir, name + ".log"), "w")
                procs[name] = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), f"--job_name={job}",
                     f"--task_index={i}"] + common, stdout=logs[name], stderr=subprocess.STDOUT)
                logging.info("started %s (pid %d), log %s", name, procs[name].pid,
                             logs[name].name)
        deadline = time.monotonic() + limit + 30
        status = {}
        offsets = {name: 0 for name in logs}
        while time.monotonic() < deadline and len(status) < FLAGS.num_workers:
            _echo_progress(log_dir, offsets)
            for i in range(FLAGS.num_workers):
                code = procs[f"worker_{i}"].poll()
                if code is not None and i not in status:
                    status[i] = code
                    logging.info("worker %d exited with status %d", i, code)
            time.sleep(0.5)
        _echo_progress(log_dir, offsets)
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        for f in logs.values():
            f.close()
    if len(status) < FLAGS.num_workers or any(status.values()):
        for name in logs:
            with open(os.path.join(log_dir, name + ".log")) as f:
                print(f"--- {name} (last lines) ---\n" + "".join(f.readlines()[-30:]))
        return 1
    with open(os.path.join(FLAGS.train_dir, CHIEF_REPORT)) as f:
        chief = json.load(f)
    print(f"{FLAGS.num_workers} workers, 1 ps, {FLAGS.steps} global steps"
          f"{' (SyncReplicasOptimizer)' if FLAGS.sync_replicas else ''}: chief checkpoint "
          f"{chief['checkpoint']}")
    for key in ("eval_graph_accuracy", "tflite_uint8_accuracy", "tflite_int8_accuracy"):
        print(f"  {key:<24} {chief[key]:6.2f}%")
    return 0


def main(argv):
    del argv
    if FLAGS.max_seconds and FLAGS.job_name != "local":  # Local mode: bounded wait + kill.
        _watchdog(FLAGS.max_seconds)
    output_dir = os.path.join(FLAGS.train_dir, "tflite")
    if FLAGS.job_name == "local":
        passed = [a for a in sys.argv[1:] if not a.startswith(("--job_name", "--task_index",
                                                               "--ps_hosts", "--worker_hosts",
                                                               "--max_seconds"))]
        return run_local(passed)
    if FLAGS.job_name == "single":
        report = train(None, None, 0, 1, FLAGS.train_dir, "single")
        if FLAGS.export:
            report.update(export_checkpoint(FLAGS.train_dir, output_dir))
        _write_report(FLAGS.train_dir, "report_single.json", report)
        return 0
    tf = _tf()
    cluster = tf.compat.v1.train.ClusterSpec({"ps": FLAGS.ps_hosts, "worker": FLAGS.worker_hosts})
    server = tf.compat.v1.train.Server(cluster, job_name=FLAGS.job_name,
                                       task_index=FLAGS.task_index)
    if FLAGS.job_name == "ps":
        logging.info("ps %d serving on %s", FLAGS.task_index, FLAGS.ps_hosts[FLAGS.task_index])
        server.join()
        return 0
    report = train(cluster, server, FLAGS.task_index, len(FLAGS.worker_hosts), FLAGS.train_dir,
                   "worker")
    if FLAGS.task_index == 0 and FLAGS.export:
        report.update(export_checkpoint(FLAGS.train_dir, output_dir))
    _write_report(FLAGS.train_dir, f"report_worker_{FLAGS.task_index}.json", report)
    return 0


if __name__ == "__main__":
    app.run(main)
