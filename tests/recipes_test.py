"""Recipes (issue #42): JSON in and out, and the rewrites of the graph path under one.

The Keras 3 path (quantize_model, `.keras` files, the export of a mixed
model) is in recipe_models_test.py.
"""
import os
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

import qat
from qat import export

_RECIPE = [{"layers": ".*", "weight_bits": 4, "per_channel": True},
           {"kind": "depthwise", "weight_bits": 8},
           {"position": "first", "weight_bits": 8},
           {"layers": "logits", "float": True}]


def _net(x):
    """conv1 (first) -> depthwise -> pointwise -> pool -> fc -> logits (last)."""
    v1 = tf.compat.v1

    def weights(name, shape):
        return v1.get_variable(name, shape, initializer=v1.initializers.glorot_uniform(seed=1))

    with v1.variable_scope("net"):
        with v1.variable_scope("conv1"):
            x = tf.nn.relu(tf.nn.conv2d(x, weights("w", [3, 3, 1, 8]), 1, "SAME")
                           + v1.get_variable("b", [8], initializer=v1.zeros_initializer()))
        with v1.variable_scope("dw"):
            x = tf.nn.relu(tf.nn.depthwise_conv2d(x, weights("w", [3, 3, 8, 1]), [1, 1, 1, 1],
                                                  "SAME"))
        with v1.variable_scope("pw"):
            x = tf.nn.relu(tf.nn.conv2d(x, weights("w", [1, 1, 8, 16]), 1, "SAME"))
        x = tf.reduce_mean(x, [1, 2], name="pool")
        with v1.variable_scope("fc"):
            x = tf.nn.relu(tf.matmul(x, weights("w", [16, 16])))
        with v1.variable_scope("logits"):
            x = tf.matmul(x, weights("w", [16, 10]))
    return tf.identity(x, name="output")


def _fake_quants(graph):
    """{quantizer scope: (num_bits, per channel)} of the graph's FakeQuant ops."""
    found = {}
    for op in graph.get_operations():
        if op.type.startswith("FakeQuantWithMinMaxVars") and "Gradient" not in op.type:
            found[op.name.rsplit("/", 1)[0]] = (op.get_attr("num_bits"),
                                                op.type.endswith("PerChannel"))
    return found


def _graph(recipe, training, **options):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1], name="input")
        labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
        logits = _net(x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        if training:
            qat.experimental_create_training_graph(graph, per_channel_weights=True,
                                                   recipe=recipe, **options)
            train = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss)
        else:
            qat.experimental_create_eval_graph(graph, per_channel_weights=True, recipe=recipe,
                                               **options)
            train = None
    return graph, train


class RecipeJsonTest(absltest.TestCase):

    def test_round_trip(self):
        recipe = qat.Recipe(_RECIPE)
        self.assertEqual(qat.Recipe.from_json(recipe.to_json()), recipe)
        path = recipe.save(os.path.join(tempfile.mkdtemp(), "recipe.json"))
        for form in (recipe, _RECIPE, recipe.to_json(), path):
            self.assertEqual(qat.engine.recipes.as_recipe(form), recipe)
        self.assertEqual(recipe.to_config(), _RECIPE)

    def test_bad_rules_name_the_rule(self):
        for rule, message in (({"layer": "conv"}, "unknown key"),
                              ({"float": True, "weight_bits": 4}, "conflicting settings"),
                              ({"weight_bits": 2}, "'weight_bits' must be one of"),
                              ({"kind": "lstm"}, "'kind' must be one of")):
            with self.subTest(rule=rule):
                with self.assertRaisesRegex(qat.RecipeError, "recipe rule 1 .*" + message):
                    qat.Recipe([{"layers": ".*"}, rule])


class GraphRecipeTest(tf.test.TestCase):

    def test_layers_get_the_recipe(self):
        graph, _ = _graph(_RECIPE, training=True)
        quants = _fake_quants(graph)
        self.assertEqual(quants["net/conv1/weights_quant"], (8, True))   # first
        self.assertEqual(quants["net/dw/weights_quant"], (8, True))      # depthwise
        self.assertEqual(quants["net/pw/weights_quant"], (4, True))
        self.assertEqual(quants["net/fc/weights_quant"], (4, False))     # matmul: per tensor
        # The float layer: no range on its weights nor its output; the
        # integer fc's output keeps its own.
        self.assertEmpty([name for name in quants if name.startswith("net/logits/")])
        self.assertEqual(quants["net/fc/act_quant"], (8, False))

    def test_training_and_eval_graphs_restore_strictly_and_export(self):
        data = np.random.RandomState(0)
        x = data.rand(64, 8, 8, 1).astype(np.float32)
        y = data.randint(0, 10, 64)
        directory = tempfile.mkdtemp()
        graph, train = _graph(_RECIPE, training=True)
        with graph.as_default(), tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(5):
                sess.run(train, {"input:0": x, "labels:0": y})
            path = tf.compat.v1.train.Saver().save(sess, os.path.join(directory, "ckpt"))
            trained = {v.op.name for v in tf.compat.v1.global_variables()}
        eval_graph, _ = _graph(_RECIPE, training=False)
        with eval_graph.as_default(), tf.compat.v1.Session() as sess:
            names = {v.op.name for v in tf.compat.v1.global_variables()}
            ranges = {n for n in names if "_quant/" in n}
            self.assertNotEmpty(ranges)
            self.assertContainsSubset(names, trained)  # Every variable of eval restores.
            # The same ranges (training also counts skipped batches).
            self.assertEqual({n for n in trained if n.endswith(("_quant/min", "_quant/max"))},
                             ranges)
            tf.compat.v1.train.Saver().restore(sess, path)  # Plain, strict.
            results = export.export_tflite(
                ["input"], ["output"], directory, sess=sess, flavours=("int8",),
                parity_inputs=x)
        model = results["int8"]
        floats = export.find_float_ops(model.report)
        print(f"graph recipe: {model.size_bytes} bytes, float ops "
              f"{[f.tflite_op for f in floats]}, {model.parity.format()}")
        self.assertEqual([f.tflite_op for f in floats], ["FULLY_CONNECTED"])
        self.assertTrue(all(part.startswith("net/logits/") or part == "output"
                            for f in floats for part in f.float_tensors[0].split(";")), floats)

    def _eval_session(self, recipe, x, data):
        """(eval graph, a session on it restored from two training steps of `recipe`)."""
        graph, train = _graph(recipe, training=True)
        with graph.as_default(), tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                sess.run(train, {"input:0": x, "labels:0": data.randint(0, 10, 16)})
            path = tf.compat.v1.train.Saver().save(sess, os.path.join(tempfile.mkdtemp(), "c"))
        eval_graph, _ = _graph(recipe, training=False)
        with eval_graph.as_default():
            sess = tf.compat.v1.Session()
            tf.compat.v1.train.Saver().restore(sess, path)
        return eval_graph, sess

    def test_sixteen_bit_layer_exports_beside_eight_bit_ones(self):
        recipe = [{"layers": ".*", "per_channel": False},
                  {"layers": "pw", "activation_bits": 16, "per_channel": False}]
        data = np.random.RandomState(0)
        x = data.rand(16, 8, 8, 1).astype(np.float32)
        graph, sess = self._eval_session(recipe, x, data)
        self.assertEqual(_fake_quants(graph)["net/pw/act_quant"], (16, False))
        self.assertEqual(_fake_quants(graph)["net/dw/act_quant"], (8, False))
        with graph.as_default(), sess:
            lo, hi = sess.run([v for side in ("min", "max") for v in tf.compat.v1.global_variables()
                               if v.op.name == "net/pw/act_quant/" + side])
            self.assertAllClose(hi, -lo * 32767 / 32768, rtol=1e-6)  # LiteRT's int16 grid.
            with self.assertRaisesRegex(export.ExportError, r"pass flavours=\['int8'\]"):
                export.export_tflite(["input"], ["output"], tempfile.mkdtemp(), sess=sess)
            model = export.export_tflite(["input"], ["output"], tempfile.mkdtemp(), sess=sess,
                                         flavours=("int8",), parity_inputs=x)["int8"]
        self.assertEqual(export.find_float_ops(model.report), [])
        types = {np.dtype(t) for op in model.report.ops for t in op.output_types}
        self.assertTrue({np.dtype(np.int16), np.dtype(np.int8)} <= types, types)
        print(f"graph 16-bit recipe: {model.parity.format()}")
        self.assertGreaterEqual(model.parity.top1_agreement, 0.9, model.parity.format())

    def test_sixteen_bit_layer_with_per_channel_weights_is_refused_at_export(self):
        data = np.random.RandomState(0)
        x = data.rand(16, 8, 8, 1).astype(np.float32)
        graph, sess = self._eval_session([{"layers": "pw", "activation_bits": 16}], x, data)
        with graph.as_default(), sess:
            with self.assertRaisesRegex(qat.RecipeError,
                                        r"16-bit activations \(net/pw/act_quant.*per-channel"):
                export.export_tflite(["input"], ["output"], tempfile.mkdtemp(), sess=sess,
                                     flavours=("int8",), parity_inputs=x)

    def test_a_rule_selecting_no_layer_changes_nothing(self):
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1], name="input")
            _net(x)
        before = len(graph.get_operations())
        for recipe, message in (
                ([{"layers": "conv1", "weight_bits": 4}, {"layers": "conv9", "float": True}],
                 r'rule 1 \{"float": true, "layers": "conv9"\} selects no layer.*net/conv1 '
                 r'\(conv\)'),
                ([{"kind": "embedding", "weight_bits": 8}], "rule 0 .* selects no layer"),
                ([{"layers": "conv1", "bits": 4}], "rule 0 .*unknown key")):
            with self.subTest(recipe=recipe):
                with self.assertRaisesRegex(qat.RecipeError, message):
                    qat.create_training_graph(graph, recipe=recipe)
                self.assertLen(graph.get_operations(), before)


if __name__ == "__main__":
    absltest.main()
