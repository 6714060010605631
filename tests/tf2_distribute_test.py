"""qat.quantize_model under tf.distribute.MirroredStrategy: one range per tensor.

Issue #32's rule for TF 2 (as issue #27 made it for graph mode): the
replicas' ranges are one range per tensor, mirrored on every device; each
step updates it with the min of the replicas' batch mins and the max of
their batch maxes, then one moving-average step (weights: last value), so
the mirrors stay equal; weights are quantized once per device; a checkpoint
of the replicated training restores strictly into the single-device
quantized model, which exports. Issue #36: the statistics of a step are
all-reduced in one collective per replica trace, whatever the model's
depth, and each replica's forward reads the range moved by its own batch
(what one device training on that batch reads). A Keras 3 CNN (conv + BN +
ReLU, pool, dense) trains 3 `strategy.run` GradientTape steps on two
logical CPU devices and its ranges are recomputed in numpy from each
replica's quantized tensors (recorded by a probe the test adds to qat's
training trace); Keras 3 `fit` and a plain `tf.Module` train under the
strategy too.

The two logical CPU devices are configured at import, before TensorFlow
initialises (it refuses afterwards): run this file in a process of its own
(Bazel does; with pytest, on its own), or the tests are skipped.
"""
import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

_CPUS = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:  # TensorFlow was initialised by an earlier test file.
    pass

from absl.testing import absltest  # pylint: disable=g-import-not-at-top,wrong-import-position
import keras  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top,wrong-import-position

import qat  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat import export  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat.engine import marks  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat.quantize.emit import quantizer_spec  # pylint: disable=g-import-not-at-top,wrong-import-position
from qat.tf2 import rewriter as rewriter_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

DEVICES = ["/cpu:0", "/cpu:1"]
REPLICA_BATCH = 8
GLOBAL_BATCH = 2 * REPLICA_BATCH
STEPS = 3
EMA_DECAY = 0.999   # quantize_model's.
EMPTY_RANGE_WIDTH = 1e-2


def _two_devices() -> bool:
    return len(tf.config.list_logical_devices("CPU")) >= 2


def _cnn(depth: int = 1):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    x = inputs
    for _ in range(depth):
        x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def _collectives(graph):
    """qat's collective ops in a trace."""
    return [op for op in graph.get_operations()
            if op.type.startswith("Collective") and marks.made_by_qat(op)]


class _Net(tf.Module):
    """A plain tf.Module: conv, ReLU, mean, dense."""

    def __init__(self):
        super().__init__(name="net")
        rng = np.random.default_rng(1)
        self.kernel = tf.Variable(rng.normal(0, 0.3, (3, 3, 1, 4)).astype(np.float32))
        self.weights = tf.Variable(rng.normal(0, 0.3, (4, 3)).astype(np.float32))
        self.bias = tf.Variable(np.zeros(3, np.float32))

    def __call__(self, x):
        x = tf.nn.relu(tf.nn.conv2d(x, self.kernel, 1, "SAME"))
        return tf.matmul(tf.reduce_mean(x, [1, 2]), self.weights) + self.bias


def _data(steps: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(0.2, 1.0, (steps * GLOBAL_BATCH, 8, 8, 1)).astype(np.float32)
    return x, rng.integers(0, 3, steps * GLOBAL_BATCH)


class _Probe(object):
    """Records, in every replica's training trace, each qat FakeQuant's input
    batch min and max, and the range the FakeQuant read, into variables of
    that replica's device."""

    def __init__(self):
        # (replica, quantizer prefix) -> variables (batch min, batch max, the
        # FakeQuant's min, max).
        self.values = {}
        self.graphs = {}    # replica -> its training trace's graph

    @contextlib.contextmanager
    def installed(self):
        original = rewriter_lib.FunctionRewriter._rewrite  # pylint: disable=protected-access
        probe = self

        def rewrite(rewriter, outputs, training):
            result = original(rewriter, outputs, training)
            if training and not rewriter.store.planning and tf.distribute.has_strategy():
                probe.record(tf.compat.v1.get_default_graph())
            return result

        rewriter_lib.FunctionRewriter._rewrite = rewrite  # pylint: disable=protected-access
        try:
            yield self
        finally:
            rewriter_lib.FunctionRewriter._rewrite = original  # pylint: disable=protected-access

    def record(self, graph):
        context = tf.distribute.get_replica_context()
        replica = int(tf.get_static_value(context.replica_id_in_sync_group))
        self.graphs[replica] = graph
        for op in graph.get_operations():
            if op.type not in quantizer_spec.FAKE_QUANT_TYPES or not marks.made_by_qat(op):
                continue
            prefix = op.name.rsplit("/", 1)[0]
            key = (replica, prefix)
            if key not in self.values:
                with tf.init_scope(), tf.device(DEVICES[replica]):
                    self.values[key] = tuple(
                        resource_variable_ops.ResourceVariable(0.0, trainable=False)
                        for _ in range(4))
            probes = self.values[key]
            with graph.as_default():
                probes[0].assign(tf.reduce_min(op.inputs[0]))
                probes[1].assign(tf.reduce_max(op.inputs[0]))
                probes[2].assign(op.inputs[1])
                probes[3].assign(op.inputs[2])

    def batch_ranges(self):
        """{prefix: [(min, max) of each replica]} of the latest step."""
        return self._read(0)

    def fake_quant_ranges(self):
        """{prefix: [the (min, max) each replica's FakeQuant read]} of the latest step."""
        return self._read(2)

    def _read(self, first: int):
        found = {}
        for (_, prefix), probes in sorted(self.values.items()):
            found.setdefault(prefix, []).append(
                (probes[first].numpy(), probes[first + 1].numpy()))
        return found


def _rule(previous, replica_ranges, weights: bool, step: int):
    """The range after a step, in float32 numpy as qat computes it: the min of
    the replicas' mins and max of their maxes (with 0), then the weights' last
    value (symmetric, narrow) or one bias-corrected moving-average step at
    quantization step `step` from `previous`."""
    f32 = np.float32
    lo = min(f32(0.0), min(f32(r[0]) for r in replica_ranges))
    hi = max(f32(0.0), max(f32(r[1]) for r in replica_ranges))
    if weights:
        return min(lo, -hi), max(hi, -lo)
    if not hi > lo:
        hi = f32(lo + f32(EMPTY_RANGE_WIDTH))
    decay = f32(EMA_DECAY)
    rate = f32(f32(1.0) - decay) / f32(f32(1.0) - decay ** f32(step))
    return (f32(previous[0] - f32(f32(previous[0] - lo) * rate)),
            f32(previous[1] - f32(f32(previous[1] - hi) * rate)))


def _ranges(qm):
    """{qat's variable name: the variable}, of qm's store."""
    store = qm.rewriter.store
    return dict(zip(store.names(), store.ordered))


def _components(variable):
    return [c.numpy() for c in variable.values]


class MirroredStrategyTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # One strategy for every test: each MirroredStrategy numbers its
        # collectives from the same keys, and a second one in the process
        # would meet the first one's gradient all-reduces (TensorFlow's
        # "Shape mismatch in the collective instance 100").
        cls.strategy = tf.distribute.MirroredStrategy(DEVICES) if _two_devices() else None

    def setUp(self):
        super().setUp()
        if self.strategy is None:
            self.skipTest("needs the two logical CPU devices configured at import")

    def _train(self, qm, optimizer, steps: int, seed: int, probe=None):
        """`steps` strategy.run GradientTape steps; checks the rule after each."""
        strategy = self.strategy
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

        @tf.function
        def train_step(dist_x, dist_y):
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, qm(x, training=True)) / GLOBAL_BATCH
                variables = qm.trainable_variables
                grads = tape.gradient(loss, variables)
                optimizer.apply_gradients(zip(grads, variables))
            strategy.run(step, args=(dist_x, dist_y))

        x, y = _data(steps, seed)
        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
        ranges = _ranges(qm)
        prefixes = [name[:-len("/min")] for name in ranges if name.endswith("/min")]
        expected = {p: (_components(ranges[p + "/min"])[0], _components(ranges[p + "/max"])[0])
                    for p in prefixes}
        for step, (bx, by) in enumerate(dataset):
            train_step(bx, by)
            # The mirrors of every qat variable are equal on both devices.
            for name, v in ranges.items():
                values = _components(v)
                self.assertLen(values, 2, name)
                np.testing.assert_array_equal(values[0], values[1], err_msg=name)
            self.assertEqual(_components(ranges["fake_quantization_step"]), [step + 1] * 2)
            if probe is None:
                continue
            batch = probe.batch_ranges()
            self.assertEqual(sorted(batch), sorted(expected))
            reads = probe.fake_quant_ranges()
            for prefix, replica_ranges in batch.items():
                self.assertLen(replica_ranges, 2, prefix)
                weights = prefix.rsplit("/", 1)[-1].startswith("weights_quant")
                before = expected[prefix]
                expected[prefix] = _rule(before, replica_ranges, weights=weights, step=step + 1)
                got = (_components(ranges[prefix + "/min"])[0],
                       _components(ranges[prefix + "/max"])[0])
                np.testing.assert_allclose(got, expected[prefix], rtol=1e-6, atol=1e-7,
                                           err_msg=f"{prefix} after step {step + 1}")
                # Each replica's training FakeQuant read the range moved by
                # its own batch alone from the range before the step (issue
                # #36: no replica's forward waits for another's statistics).
                for own, read in zip(replica_ranges, reads[prefix]):
                    np.testing.assert_allclose(
                        read, _rule(before, [own], weights=weights, step=step + 1),
                        rtol=1e-6, atol=1e-7, err_msg=f"{prefix} read at step {step + 1}")
        return expected

    def test_keras_gradient_tape_steps_restore_into_single_device(self):
        with self.strategy.scope():
            model = _cnn()
            optimizer = keras.optimizers.SGD(0.1)
            qm = qat.quantize_model(model)
        ranges = _ranges(qm)
        self.assertEqual(type(ranges["fake_quantization_step"]).__name__, "MirroredVariable")
        with _Probe().installed() as probe:
            expected = self._train(qm, optimizer, STEPS, seed=0, probe=probe)
        # A range per weight, activation, pool and input, each checked.
        kinds = sorted(p.rsplit("/", 1)[1] for p in expected)
        self.assertEqual(kinds, ["act_quant", "act_quant", "input_quant", "mean_quant",
                                 "weights_quant", "weights_quant"])
        # The replicas' batch ranges differ (else the all-reduce went untested).
        batch = probe.batch_ranges()
        self.assertTrue(any(r[0] != r[1] for r in batch.values()))

        # One collective per replica's training step, for every range.
        self.assertEqual(sorted(probe.graphs), [0, 1])
        for graph in probe.graphs.values():
            self.assertLen(_collectives(graph), 1)
        # Weights quantized once per device: each replica's trace has its own
        # weight FakeQuants and reads only its own device's variables.
        for replica, graph in probe.graphs.items():
            weight_quants = [op for op in graph.get_operations()
                             if op.type in quantizer_spec.FAKE_QUANT_TYPES
                             and "weights_quant" in op.name]
            self.assertLen(weight_quants, 2)
            devices = {tf.DeviceSpec.from_string(external.device).device_index
                       for external, _ in graph.captures if external.dtype == tf.resource}
            self.assertEqual(devices, {replica})

        # The checkpoint restores strictly into the single-device model.
        path = tf.train.Checkpoint(model=qm).save(
            os.path.join(absltest.get_default_test_tmpdir(), "mirrored", "ckpt"))
        single = qat.quantize_model(_cnn())
        tf.train.Checkpoint(model=single).restore(path).assert_consumed()
        # (Keras names the layers of the second model apart: the store's order
        # is what matches, as the checkpoint's.)
        restored = single.rewriter.store.ordered
        self.assertLen(restored, len(ranges))
        for v, mirrored in zip(restored, ranges.values()):
            self.assertNotIsInstance(v, tf.distribute.DistributedValues)
            np.testing.assert_array_equal(v.numpy(), _components(mirrored)[0], err_msg=v.name)
        x, _ = _data(1, seed=7)
        np.testing.assert_allclose(single(x, training=False).numpy(),
                                   qm(x, training=False).numpy(), rtol=0, atol=1e-6)
        # And exports, fully integer.
        exported = export.export_model(
            single, os.path.join(absltest.get_default_test_tmpdir(), "mirrored_export"),
            parity_inputs=x)
        self.assertGreaterEqual(exported.parity.top1_agreement, 0.99)

    def test_one_collective_per_step_whatever_the_depth(self):
        for depth in (1, 4):
            with self.strategy.scope():
                qm = qat.quantize_model(_cnn(depth))

            @tf.function
            def step(dist_x, qm=qm):
                self.strategy.run(lambda x: qm(x, training=True), args=(dist_x,))

            x, _ = _data(1, seed=2)
            dataset = self.strategy.experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH))
            with _Probe().installed() as probe:
                step(next(iter(dataset)))
            ranges = [n for n in qm.rewriter.store.names() if n.endswith("/min")]
            self.assertGreaterEqual(len(ranges), 2 * depth + 3, ranges)
            self.assertEqual(sorted(probe.graphs), [0, 1])
            for graph in probe.graphs.values():
                self.assertLen(_collectives(graph), 1, f"depth {depth}")
            for name, v in _ranges(qm).items():
                values = _components(v)
                np.testing.assert_array_equal(values[0], values[1], err_msg=name)

    def test_a_non_finite_batch_on_one_replica_is_skipped_by_both(self):
        # One NaN pixel in replica 1's half: the combined statistics of every
        # range it reaches are not finite on both replicas, so both keep the
        # range and count the batch (issue #37's guard, decided alike).
        with self.strategy.scope():
            qm = qat.quantize_model(_cnn())
            optimizer = keras.optimizers.SGD(0.1)
        self._train(qm, optimizer, 1, seed=4)
        ranges = _ranges(qm)
        before = {name: _components(v)[0] for name, v in ranges.items()}
        x, y = _data(1, seed=6)
        x[REPLICA_BATCH + 1, 3, 3, 0] = np.nan

        @tf.function
        def step(dist_x, dist_y):
            def replica_step(t, labels):
                loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
                with tf.GradientTape() as tape:
                    loss = loss_fn(labels, qm(t, training=True))
                grads = tape.gradient(loss, qm.trainable_variables)
                optimizer.apply_gradients(zip(grads, qm.trainable_variables))
            self.strategy.run(replica_step, args=(dist_x, dist_y))

        dataset = self.strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
        step(*next(iter(dataset)))
        counters = qm.rewriter.store.statistics
        self.assertNotEmpty(counters)
        activations = [n for n in ranges if n.endswith("/min") and "weights_quant" not in n]
        for name in activations:
            prefix = name[:-len("/min")]
            for side in ("/min", "/max"):
                values = _components(ranges[prefix + side])
                np.testing.assert_array_equal(values[0], values[1], err_msg=prefix)
                np.testing.assert_array_equal(values[0], before[prefix + side], err_msg=prefix)
            self.assertEqual(_components(counters[prefix + "/skipped_batches"]), [1, 1], prefix)

    def test_keras_fit(self):
        with self.strategy.scope():
            qm = qat.quantize_model(_cnn())
            qm.compile(optimizer=keras.optimizers.SGD(0.1),
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ranges = _ranges(qm)
        prefix = [p[:-len("/min")] for p in ranges if p.endswith("input_quant/min")][0]
        previous = (_components(ranges[prefix + "/min"])[0], _components(ranges[prefix + "/max"])[0])
        x, y = _data(2, seed=3)
        qm.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        for name, v in ranges.items():
            values = _components(v)
            np.testing.assert_array_equal(values[0], values[1], err_msg=name)
        self.assertEqual(_components(ranges["fake_quantization_step"]), [2, 2])
        # The input's range follows the global batches, however fit split them.
        for step in range(2):
            batch = x[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
            previous = _rule(previous, [(batch.min(), batch.max())], weights=False, step=step + 1)
        np.testing.assert_allclose(
            (_components(ranges[prefix + "/min"])[0], _components(ranges[prefix + "/max"])[0]),
            previous, rtol=1e-6)
        # The eval function in the replicas (evaluate runs it in strategy.run).
        loss = qm.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
        self.assertTrue(np.isfinite(loss))

    def test_tf_module_quantized_outside_the_scope(self):
        with self.strategy.scope():
            net = _Net()
            optimizer = keras.optimizers.SGD(0.1)
        # Quantized outside the scope: qat makes its variables under the
        # strategy of the module's.
        qm = qat.quantize_model(net, [tf.TensorSpec([None, 8, 8, 1])])
        ranges = _ranges(qm)
        self.assertTrue(all(isinstance(v, tf.distribute.DistributedValues) for v in ranges.values()))
        with _Probe().installed() as probe:
            self._train(qm, optimizer, 2, seed=5, probe=probe)

    def test_plain_ranges_refused_in_replica_context(self):
        qm = qat.quantize_model(_Net(), [tf.TensorSpec([None, 8, 8, 1])])
        x, _ = _data(1, seed=0)
        dataset = self.strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH))
        # (A NotMirroredError, which autograph reports as a StagingError.)
        with self.assertRaisesRegex(Exception, "is not mirrored, but 2 replicas read it"):
            self.strategy.run(tf.function(lambda t: qm(t, training=True)),
                              args=(next(iter(dataset)),))


if __name__ == "__main__":
    absltest.main()
