"""The rewrite engine: checked before applied, unique names, marks, refusals.

Covers the defects the engine fixes (names colliding with the user's ops and
variables, mixed dtypes half-rewriting a graph, eager calls doing nothing),
a fault-injection run that makes each stage of each pass fail and checks the
graph is unchanged, and every refusal docs/getting_started.md lists.
"""
import gc
import os
import subprocess
import sys
from unittest import mock
import weakref

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat.engine import graph_import  # pylint: disable=g-import-not-at-top
from qat.engine import marks  # pylint: disable=g-import-not-at-top
from qat.engine import node_batch  # pylint: disable=g-import-not-at-top
from qat.engine import rewrite as rewrite_lib  # pylint: disable=g-import-not-at-top
from qat.fold import fold_batch_norms as fold_lib  # pylint: disable=g-import-not-at-top
from qat.fold import plan as fold_plan  # pylint: disable=g-import-not-at-top
from qat.quantize.plan import planner as quantize_plan  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def _model(x, name="conv", dtype=tf.float32, training=True):
    """conv -> batch norm -> relu, in `dtype`."""
    with tf1.variable_scope(name):
        w = tf1.get_variable("weights", [3, 3, int(x.shape[-1]), 4], dtype=dtype)
        y = tf.nn.conv2d(x, w, 1, "SAME")
        y = tf1.layers.batch_normalization(y, training=training, fused=True)
        return tf.nn.relu(y)


def _standalone_model(x, training):
    """input batch norm -> conv -> batch norm -> relu -> dense."""
    x = tf1.layers.batch_normalization(x, training=training, fused=True, name="in_bn")
    y = _model(x, training=training)
    y = tf1.layers.dense(tf1.layers.flatten(y), 3, name="logits")
    return tf.identity(y, name="output")


def _snapshot(graph):
    """Everything a failed or refused call must leave as it was."""
    collections = {}
    for key in graph.get_all_collection_keys():
        collections[key] = [getattr(v, "name", repr(v)) for v in graph.get_collection(key)]
    return (graph.as_graph_def().SerializeToString(deterministic=True), collections)


def _training_graph(standalone=False):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 6, 6, 3], name="x")
        out = _standalone_model(x, True) if standalone else _model(x)
        tf.reduce_mean(tf.square(out), name="loss")
    return g


def _eval_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 6, 6, 3], name="x")
        _standalone_model(x, False)
    return g


class EngineDefectTest(tf.test.TestCase):

    def test_user_op_named_like_a_quantizer(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [2, 6, 6, 3], name="x")
            out = _model(x)
            user = tf.constant(1.0, name="conv/act_quant/FakeQuantWithMinMaxVars")
            tf.reduce_mean(out, name="loss")
        qat.create_training_graph(g)
        self.assertEqual(g.get_operation_by_name(user.op.name).type, "Const")
        fake_quants = {op.name for op in g.get_operations()
                       if op.type == "FakeQuantWithMinMaxVars"}
        self.assertIn("conv/act_quant_1/FakeQuantWithMinMaxVars", fake_quants)
        self.assertNotIn(user.op.name, fake_quants)

    def test_user_variable_named_like_a_range(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [2, 6, 6, 3], name="x")
            out = _model(x)
            user = tf1.get_variable("conv/act_quant/max", initializer=123.0)
            loss = tf.reduce_mean(out, name="loss")
        qat.create_training_graph(g)
        with g.as_default():
            names = [v.op.name for v in tf1.global_variables()]
            self.assertLen(names, len(set(names)))
            saver = tf1.train.Saver()  # Fails on duplicate variable names.
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                sess.run(loss, {x: np.ones([2, 6, 6, 3], np.float32)})
                self.assertEqual(sess.run(user), 123.0)
                path = saver.save(sess, os.path.join(self.get_temp_dir(), "ckpt"))
        stored = dict(tf.train.list_variables(path))
        self.assertIn("conv/act_quant/max", stored)
        self.assertIn("conv/act_quant_1/max", stored)

    def test_float16_layer_beside_float32_layer(self):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [2, 6, 6, 3], name="x")
            a = _model(x, "f32")
            b = _model(tf.cast(x, tf.float16), "f16", dtype=tf.float16)
            tf.reduce_mean(a + tf.cast(b, tf.float32), name="loss")
        qat.create_training_graph(g)
        with g.as_default(), tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            value = sess.run("loss:0", {"x:0": np.ones([2, 6, 6, 3], np.float32)})
        self.assertTrue(np.isfinite(value))
        conv = g.get_operation_by_name("f32/Conv2D")
        self.assertTrue(marks.made_by_qat(conv.inputs[1].op))

    def test_eager_calls_without_graph_are_refused(self):
        # A fresh process: other test files in a pytest run disable eager mode.
        code = ("import tensorflow as tf, qat\n"
                "assert tf.executing_eagerly()\n"
                "for call in (qat.fold_batch_norms, qat.insert_quant_ops,\n"
                "             qat.create_training_graph, qat.create_eval_graph):\n"
                "    try:\n"
                "        call()\n"
                "    except RuntimeError as e:\n"
                "        print(call.__name__, 'refused:', e)\n")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, env=env, timeout=300, check=True).stdout
        for name in ("fold_batch_norms", "insert_quant_ops", "create_training_graph",
                     "create_eval_graph"):
            self.assertIn(f"{name} refused: qat.{name}() was called in eager mode", out)

    def test_second_call_with_other_settings_is_refused(self):
        g = _eval_graph()
        qat.experimental_create_eval_graph(g, symmetric_weights=True)
        before = _snapshot(g)
        qat.experimental_create_eval_graph(g, symmetric_weights=True)
        self.assertEqual(_snapshot(g), before)
        with self.assertRaisesRegex(ValueError, "already rewritten"):
            qat.experimental_create_eval_graph(g, weight_bits=4)
        with self.assertRaisesRegex(ValueError, "already rewritten"):
            qat.create_training_graph(g)
        self.assertEqual(_snapshot(g), before)

    def test_new_ops_carry_the_mark(self):
        g = _training_graph(standalone=True)
        before = {op.name for op in g.get_operations()}
        qat.experimental_create_training_graph(g, freeze_bn_delay=3, quant_delay=2)
        new = [op for op in g.get_operations() if op.name not in before]
        self.assertNotEmpty(new)
        unmarked = [op.name for op in new if not marks.made_by_qat(op)]
        self.assertEqual(unmarked, [])
        self.assertFalse(any(marks.made_by_qat(g.get_operation_by_name(n)) for n in before))

    def test_typed_quantize_result(self):
        g = _training_graph()
        qat.fold_batch_norms(g, is_training=True)
        result = qat.insert_quant_ops(g, is_training=True, weight_bits=4,
                                      symmetric_weights=True, scope="conv")
        kinds = {q.name: (q.kind, q.bits, q.symmetric) for q in result.quantizers}
        self.assertEqual(kinds["conv/weights_quant"], ("weights_quant", 4, True))
        self.assertEqual(kinds["conv/act_quant"], ("act_quant", 8, False))
        for q in result.quantizers:
            self.assertEqual(marks.quantizer_of(q.tensor), q.output)


def _raise(*unused_args, **unused_kwargs):
    raise RuntimeError("injected fault")


def _fail_on_call(n):
    """A side effect that raises on its n-th call only (0-based)."""
    state = {"calls": 0}

    def wrap(original):
        def call(*args, **kwargs):
            state["calls"] += 1
            if state["calls"] == n + 1:
                raise RuntimeError("injected fault")
            return original(*args, **kwargs)
        return call
    return wrap


_PASSES = {
    "fold_training": lambda g: qat.fold_batch_norms(g, is_training=True),
    "fold_training_freeze": lambda g: qat.fold_batch_norms(
        g, is_training=True, freeze_batch_norm_delay=5, use_cond=True),
    "quantize_training": lambda g: qat.insert_quant_ops(g, is_training=True, quant_delay=3),
    "quantize_eval": lambda g: qat.insert_quant_ops(g, is_training=False, per_channel=True),
}

# Where each stage can fail: (object, attribute) patched to raise.
_STAGES = {
    "plan_fold": (fold_plan, "plan_fold"),
    "find_batch_norms": (fold_lib.bn_lib, "find_batch_norms"),
    "plan_quantizers": (quantize_plan.Planner, "run"),
    "build_node": (node_batch.NodeBatch, "node"),
    "build_python_ops": (node_batch.NodeBatch, "python_ops"),
    "check_in_scratch": (node_batch.NodeBatch, "check"),
    "import": (graph_import, "import_nodes"),
    "import_into_graph": (node_batch.NodeBatch, "build"),
    "check_reroutes": (rewrite_lib.Rewrite, "_check"),
}

_FOLD_STAGES = ["find_batch_norms", "plan_fold"]
_COMMON_STAGES = ["build_node", "check_in_scratch", "import", "import_into_graph",
                  "check_reroutes"]
# The stages each pass goes through (asserted: no combination passes vacuously).
_PASS_STAGES = {
    "fold_training": _FOLD_STAGES + _COMMON_STAGES,
    "fold_training_freeze": _FOLD_STAGES + _COMMON_STAGES + ["build_python_ops"],
    # Nudged ranges (training) and standalone batch norms (eval) are built
    # with python_ops.
    "quantize_training": ["plan_quantizers", "build_python_ops"] + _COMMON_STAGES,
    "quantize_eval": ["plan_quantizers", "build_python_ops"] + _COMMON_STAGES,
}
_CASES = [(f"{p}_{s}", p, s) for p, stages in sorted(_PASS_STAGES.items()) for s in stages]


class FaultInjectionTest(parameterized.TestCase):

    @parameterized.named_parameters(*_CASES)
    def test_failing_stage_leaves_graph_unchanged(self, pass_name, stage):
        """Each pass is atomic (create_*_graph runs two: fold, then quantize)."""
        if pass_name == "quantize_eval":
            graph = _eval_graph()
            qat.fold_batch_norms(graph, is_training=False)
        else:
            graph = _training_graph(True)
            if pass_name.startswith("quantize"):
                qat.fold_batch_norms(graph, is_training=True)
        before = _snapshot(graph)
        target, attribute = _STAGES[stage]
        with mock.patch.object(target, attribute, side_effect=_raise,
                               autospec=True) as patched:
            with self.assertRaises((RuntimeError, ValueError)):
                _PASSES[pass_name](graph)
        self.assertTrue(patched.called)
        self.assertEqual(_snapshot(graph), before)

    @parameterized.parameters(0, 1, 2)
    def test_reroute_failing_midway_moves_inputs_back(self, fail_after):
        """The one stage after the import: moved inputs are moved back.

        (The imported ops stay in the graph, unconnected: TensorFlow cannot
        delete ops. The checks before the import make this path unreachable
        for a valid rewrite.)
        """
        graph = _training_graph()
        qat.fold_batch_norms(graph, is_training=True)

        def inputs_of():
            return {op.name: [t.name for t in op.inputs] for op in graph.get_operations()}

        before = inputs_of()
        original = tf.Operation._update_input  # pylint: disable=protected-access
        with mock.patch.object(tf.Operation, "_update_input", autospec=True,
                               side_effect=_fail_on_call(fail_after)(original)):
            with self.assertRaisesRegex(RuntimeError, "injected"):
                qat.insert_quant_ops(graph, is_training=True)
        after = inputs_of()
        for name, inputs in before.items():
            self.assertEqual(after[name], inputs, name)

    def test_checks_catch_a_bad_reroute(self):
        graph = _training_graph()
        before = _snapshot(graph)
        rewrite = rewrite_lib.Rewrite(graph, marks.QUANTIZER)
        nodes = rewrite.nodes
        relu = graph.get_operation_by_name("conv/Relu")
        wrong = nodes.const(nodes.unique_name("wrong"), np.zeros([5]), tf.float32)
        rewrite.reroute(relu, 0, wrong)
        with self.assertRaisesRegex(rewrite_lib.RewriteError, "shape"):
            rewrite_lib.apply(rewrite)
        self.assertEqual(_snapshot(graph), before)


class RefusalTest(parameterized.TestCase):
    """Every refusal docs/getting_started.md lists leaves the graph unchanged."""

    def _refused(self, graph, call, error, pattern=""):
        before = _snapshot(graph)
        with self.assertRaisesRegex(error, pattern):
            call(graph)
        self.assertEqual(_snapshot(graph), before)

    def test_optimizer_ops(self):
        g = _training_graph()
        with g.as_default():
            tf1.train.GradientDescentOptimizer(0.1).minimize(g.get_tensor_by_name("loss:0"))
        for call in (qat.create_training_graph, qat.fold_batch_norms, qat.insert_quant_ops):
            self._refused(g, call, ValueError, "optimizer")

    def test_finalized_graph(self):
        g = _training_graph()
        g.finalize()
        for call in (qat.create_training_graph, qat.fold_batch_norms, qat.insert_quant_ops):
            self._refused(g, call, RuntimeError, "finalized")

    def test_function_graph(self):
        @tf.function
        def f(x):
            return x * 2.0
        g = f.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
        for call in (qat.create_training_graph, qat.fold_batch_norms, qat.insert_quant_ops):
            self._refused(g, call, ValueError, "tf.function")

    @parameterized.parameters(
        (dict(weight_bits=1), ValueError), (dict(weight_bits=9), ValueError),
        (dict(activation_bits=16), ValueError), (dict(weight_bits=8.0), ValueError),
        (dict(quant_delay=-1), ValueError), (dict(quant_delay=1.5), ValueError),
        (dict(freeze_bn_delay=-2), ValueError), (dict(freeze_bn_delay=1.5), ValueError),
        (dict(symmetric="yes"), TypeError), (dict(symmetric_weights=1), TypeError),
        (dict(scope=3), TypeError))
    def test_bad_arguments(self, kwargs, error):
        g = _training_graph()
        self._refused(g, lambda g: qat.experimental_create_training_graph(g, **kwargs), error)
        quantize_kwargs = {k: v for k, v in kwargs.items() if k != "freeze_bn_delay"}
        if quantize_kwargs:
            self._refused(g, lambda g: qat.insert_quant_ops(g, **quantize_kwargs), error)

    def test_fold_delay_must_be_an_integer(self):
        self._refused(_training_graph(),
                      lambda g: qat.fold_batch_norms(g, freeze_batch_norm_delay=1.5),
                      ValueError, "freeze_batch_norm_delay")

    def test_eval_rewrite_of_a_training_graph(self):
        g = _training_graph()
        qat.create_training_graph(g)
        self._refused(g, qat.create_eval_graph, ValueError, "already rewritten")


class MemoryTest(parameterized.TestCase):

    @parameterized.named_parameters(("training", True), ("eval", False))
    def test_rewritten_graphs_are_freed(self, is_training):
        """qat's per-graph tables never keep a graph the user dropped alive."""
        refs = []
        for _ in range(3):
            g = _training_graph() if is_training else _eval_graph()
            if is_training:
                qat.create_training_graph(g)
                with g.as_default():
                    tf.gradients(g.get_tensor_by_name("loss:0"),
                                 tf1.trainable_variables())
            else:
                qat.create_eval_graph(g)
            refs.append(weakref.ref(g))
            del g
        gc.collect()
        self.assertEqual([r() for r in refs if r() is not None], [])

    @parameterized.named_parameters(("training", True), ("eval", False))
    def test_scratch_graphs_are_freed_at_once(self, is_training):
        """The check's scratch copy of the new ops is gone before the import.

        A graph and its ops reference each other, so a scratch graph dropped
        without being dismantled lives until a full garbage collection: the
        rewrite's peak memory would hold every new op twice.
        """
        g = _training_graph() if is_training else _eval_graph()
        gc.collect()
        gc.disable()
        try:
            before = _live_graphs()
            if is_training:
                qat.create_training_graph(g)
            else:
                qat.create_eval_graph(g)
            self.assertEqual(_live_graphs() - before, 0)
        finally:
            gc.enable()


def _live_graphs() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, tf.Graph))


if __name__ == "__main__":
    absltest.main()
