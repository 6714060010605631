"""Data-parallel replicas in one graph share one set of ranges (issue #27).

On two logical CPU devices: TF1 multi-GPU towers, TF-Slim model_deploy-style
clones, and MirroredStrategy in graph mode with the rewrite called after the
replicas or inside the replica function. Each trains 3 steps, saves with a
plain Saver, restores strictly into the single-replica eval graph, and
converts to uint8 and int8 with TensorFlow's plain converter, fully integer
and within the zoo's parity bounds. The shared ranges after the 3 steps are
recomputed in numpy from the replicas' batches (min of mins, max of maxes,
then one moving-average step). MultiWorkerMirroredStrategy: 2 worker
processes on 127.0.0.1 (free ports, tests/multi_worker_util.py), ranges equal
on both after every step, the chief's checkpoint restored strictly and
exported likewise.
"""
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tools"))
sys.path.insert(0, os.path.join(_ROOT, "tests"))
import qat  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat import export  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat.engine import marks  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat.engine import placement  # pylint: disable=g-import-not-at-top,wrong-import-position
import _replica_models as replicas_util  # pylint: disable=g-import-not-at-top,wrong-import-position
import zoo_util  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
tf1.disable_eager_execution()
BATCH = 4           # Per replica.
STEPS = 3
EMA_DECAY = 0.999   # create_training_graph's.
PARITY_EXAMPLES = 16
WORKER_TIMEOUT_S = 240   # Both worker processes, start to end.


def _build(style: str):
    if style == "towers":
        return replicas_util.build_towers(BATCH)
    if style == "slim_clones":
        return replicas_util.build_towers(BATCH, slim=True)
    return replicas_util.build_mirrored(BATCH, style.split("_")[1])


def _quantizers_by_range(graph: tf.Graph, names):
    """{range variable scope: [qat FakeQuant ops of it]}: each replica's quantizer
    is named as the range, under its replica scope (a replica's FakeQuant reads
    its own step of the range, which may read no variable: weights)."""
    prefixes = {n[:-len("/min")] for n in names if n.endswith("/min")}
    found = collections.defaultdict(list)
    for op in graph.get_operations():
        if op.type.startswith("FakeQuant") and marks.made_by_qat(op):
            scope = op.name.rsplit("/", 1)[0]
            owner = [p for p in prefixes if scope == p or scope.endswith("/" + p)]
            found[max(owner, key=len)].append(op)
    return found


class ReplicasTest(tf.test.TestCase, parameterized.TestCase, zoo_util.ZooAssertions):

    @parameterized.named_parameters(
        ("towers", "towers"), ("slim_clones", "slim_clones"),
        ("mirrored_after", "mirrored_after"), ("mirrored_inside", "mirrored_inside"))
    def test_train_restore_export(self, style):
        graph, images, labels, train_op, _ = _build(style)
        ranges = replicas_util.range_variables(graph)
        names = [v.op.name for v in ranges]
        by_range = _quantizers_by_range(graph, names)
        with graph.as_default():
            recalibrate = zoo_util.recalibrate_batch_norms(graph)
            saver = tf1.train.Saver()
        # One pair per tensor, every replica's FakeQuant on its own device,
        # reading its own replica's tensor.
        self.assertLen(names, len(set(names)))
        devices = set()
        for prefix, quantizers in by_range.items():
            self.assertIn(prefix + "/min", names)
            for op in quantizers:
                devices.add(op.device)
                if op.inputs[0].op.device:
                    self.assertEqual(op.device, op.inputs[0].op.device, op.name)
                for consumer in op.outputs[0].consumers():
                    if consumer.type in ("Conv2D", "MatMul") and op.device:
                        self.assertEqual(consumer.device, op.device, (op.name, consumer.name))
        self.assertGreaterEqual(len([d for d in devices if d]), 2, devices)
        shared = {p: q for p, q in by_range.items() if len(q) == 2}
        self.assertGreaterEqual(len(shared), 5, sorted(by_range))  # 3 weights, 3 activations.

        expected = {}
        checkpoint = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()),
                                  "model.ckpt")
        with tf1.Session(graph=graph, config=replicas_util.session_config()) as sess:
            sess.run(tf1.global_variables_initializer())
            raws = {p: [op.inputs[0] for op in q] for p, q in by_range.items()}
            for step in range(STEPS):
                x, y = replicas_util.make_batch(2 * BATCH, seed=step)
                _, values = sess.run([train_op, raws], {images: x, labels: y})
                for prefix, tensors in values.items():
                    expected[prefix] = _update(expected.get(prefix), tensors,
                                               weights="weights_quant" in prefix,
                                               step=step + 1)
            got = sess.run({v.op.name: v for v in ranges})
            for prefix, (lo, hi) in expected.items():
                self.assertAllClose(got[prefix + "/min"], lo, rtol=1e-5, atol=1e-6, msg=prefix)
                self.assertAllClose(got[prefix + "/max"], hi, rtol=1e-5, atol=1e-6, msg=prefix)
            x, _ = replicas_util.make_batch(2 * BATCH, seed=STEPS)
            sess.run(recalibrate, {images: x})
            saver.save(sess, checkpoint)

        self._check_export(checkpoint, names, slim=style == "slim_clones", label=style)

    def test_layers_feeding_each_other_are_not_replicas(self):
        # Two layers applied twice with shared weights, the second application
        # reading the first's output (an unrolled loop): not replicas, whose
        # combined update would depend on itself, but the steps of a
        # recurrence (issue #38): one range per cell value, named after the
        # first step, whose update reads no quantized value of its own.
        graph = tf.Graph()
        with graph.as_default():
            images = tf1.placeholder(tf.float32, (2,) + replicas_util.SIZE, name="images")
            net = images
            for k in range(2):
                with tf.name_scope("step_%d" % k), tf1.variable_scope("cell", reuse=k > 0):
                    for name in ("a", "b"):
                        net = tf.nn.relu(tf1.layers.conv2d(net, 3, 3, padding="same", name=name))
            loss = tf.reduce_mean(net)
            qat.experimental_create_training_graph(graph, quant_delay=0)
            names = [v.op.name for v in replicas_util.range_variables(graph)]
            self.assertIn("step_0/cell/b/act_quant/max", names)
            self.assertNotIn("step_1/cell/b/act_quant/max", names)
            train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
            with tf1.Session(graph=graph) as sess:
                sess.run(tf1.global_variables_initializer())
                x = replicas_util.make_batch(2, seed=0)[0]
                for _ in range(2):
                    sess.run(train, {images: x})
                self.assertTrue(np.isfinite(sess.run(loss, {images: x})))

    def test_multi_worker_mirrored_strategy(self):
        out_dir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        ports = [_free_port(), _free_port()]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
                   PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]))
        env.pop("TF_CONFIG", None)
        procs, logs = [], []
        for task in range(2):
            log = open(os.path.join(out_dir, f"worker_{task}.log"), "w")
            self.addCleanup(log.close)
            logs.append(log.name)
            proc = subprocess.Popen(
                [sys.executable, os.path.join(_ROOT, "tests", "multi_worker_util.py"), str(task),
                 ",".join(map(str, ports)), out_dir], stdout=log, stderr=subprocess.STDOUT, env=env)
            self.addCleanup(_stop, proc)
            procs.append(proc)
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        for task, proc in enumerate(procs):
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                code = None
            self.assertEqual(code, 0, f"worker {task}: status {code}\n" + _tails(logs))
        histories = []
        for task in range(2):
            with open(os.path.join(out_dir, f"ranges_{task}.json")) as f:
                histories.append(json.load(f))
        self.assertLen(histories[0], 3)
        for step, (chief, other) in enumerate(zip(*histories)):
            self.assertEqual(chief, other, f"ranges differ after step {step + 1}")
        last = histories[0][-1]
        self.assertNotEqual(last["model/conv1/act_quant/max"], 6.0)
        self._check_export(os.path.join(out_dir, "chief", "model.ckpt"), sorted(last),
                           slim=False, label="multi-worker")

    def _check_export(self, checkpoint, names, slim, label):
        """Strict restore into the eval graph; uint8 and int8 through TF's converter."""
        eval_graph, x, y = replicas_util.build_eval(slim=slim)
        self.assertCountEqual([v.op.name for v in replicas_util.range_variables(eval_graph)],
                              names)
        with eval_graph.as_default():
            sess = tf1.Session(graph=eval_graph)
            tf1.train.Saver().restore(sess, checkpoint)   # Strict: every variable.
        inputs = replicas_util.make_batch(PARITY_EXAMPLES, seed=7)[0]
        with sess:
            frozen = export.freeze_session(sess, [y.op.name])
            for flavour in ("uint8", "int8"):
                model = zoo_util.convert_with_tf(sess, x, y, flavour, replicas_util.INPUT_RANGE)
                export.check_fully_integer(model, frozen, label=f"{label} {flavour}")
                parity = export.check_parity(model, frozen, x.name, y.name, inputs,
                                             max_diff_steps=zoo_util.MAX_DIFF_STEPS)
                self.assertLessEqual(parity.max_diff_steps, zoo_util.MAX_DIFF_STEPS)
                self.assert_outputs_vary(export.run_tflite(model, inputs), flavour)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


def _tails(paths) -> str:
    out = []
    for path in paths:
        with open(path, errors="replace") as f:
            lines = [l for l in f if not l.startswith(("W0000", "I0000"))]
        out.append(f"--- {path}\n" + "".join(lines[-30:]))
    return "\n".join(out)


def _update(previous, tensors, weights: bool, step: int):
    """The combination rule in numpy: min of mins, max of maxes, one step of
    the bias-corrected moving average at quantization step `step` (1 on the
    first run; weights: symmetric_weights=True, last value)."""
    lo = np.float32(min(0.0, min(float(np.min(t)) for t in tensors)))
    hi = np.float32(max(0.0, max(float(np.max(t)) for t in tensors)))
    if weights:   # Last value, symmetric and narrow: [-a, a].
        return np.float32(min(lo, -hi)), np.float32(max(hi, -lo))
    if previous is None:   # The first batch's range.
        return lo, hi
    decay = np.float32(EMA_DECAY)
    rate = np.float32(np.float32(1.0) - decay) / np.float32(np.float32(1.0) - decay ** np.float32(step))
    return (np.float32(previous[0] - (previous[0] - lo) * rate),
            np.float32(previous[1] - (previous[1] - hi) * rate))


if __name__ == "__main__":
    absltest.main()
