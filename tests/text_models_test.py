"""Issue #26: BERT-style encoders from int32 token ids to fully integer int8.

Both encoders of tools/_text_models.py (BERT's modeling.py style with
`tf.gather`, and tf_keras layers), at issue #26's size (4 blocks, hidden 128,
4 heads, FFN 512, seq 32, vocab 1000): three QAT training steps, a plain
strict `Saver().restore` into a separately built eval graph, int8 through
`qat.export` and through TF's plain converter with zero float compute ops,
every layer within one step of the eval graph given TFLite's inputs
(`qat.report.layer_numerics` on the ids). A text model the issue does not
name, a 1-D conv classifier over embeddings with global max and average
pooling (`conv_text`), goes through the same checks. The planner-level checks cover
the other lookups (`tf.nn.embedding_lookup`, `ResourceGather`), an int32
attention mask (named in `left_float`) and a dropout of a tensor that is no
model data (train / eval symmetry).
"""
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import export  # pylint: disable=g-import-not-at-top
from qat.report import numerics  # pylint: disable=g-import-not-at-top
from qat import report  # pylint: disable=g-import-not-at-top
from qat.prepare import resource_gathers  # pylint: disable=g-import-not-at-top
from qat.prepare import layer_norm  # pylint: disable=g-import-not-at-top
from qat.quantize.plan.planner import Planner  # pylint: disable=g-import-not-at-top
from tools import _text_models as text  # pylint: disable=g-import-not-at-top
import zoo_util  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1

_CFG = text.TextConfig()
_SMALL = text.TextConfig(blocks=1, hidden=32, heads=2, ffn=64)
_EXAMPLES = 8


def _train(style, checkpoint, cfg=_CFG, steps=3):
    g, ids, _, logits = text.build_graph(style, True, cfg)
    with g.as_default():
        labels = tf1.placeholder(tf.int32, [None])
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        qat.experimental_create_training_graph(g, symmetric_weights=True)
        train = tf1.train.AdamOptimizer(1e-3).minimize(loss)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            losses = []
            for step in range(steps):
                x, y = text.token_task(16, cfg, seed=step)
                losses.append(sess.run([train, loss], {ids: x, labels: y})[1])
            tf1.train.Saver().save(sess, checkpoint)
    return losses


def _float_output(graph, ids, logits):
    """The name of `logits` computed with every FakeQuant bypassed (in `graph`)."""
    with graph.as_default():
        float_path = numerics.bypass_fake_quants(graph.as_graph_def())
        out, = tf.import_graph_def(float_path, input_map={ids.name: ids},
                                   return_elements=[logits.name], name="float_path")
    return out.name


def _planned(style, training, **kwargs):
    """(planner, graph) of a rewrite's plan, on a new graph (not rewritten)."""
    g, _, _, _ = text.build_graph(style, training, _SMALL, **kwargs)
    with g.as_default():
        layer_norm.unfuse_layer_norms(g)
        resource_gathers.split_resource_gathers(g)
        planner = Planner(g, training, None, False)
        planner.run()
    return planner, g


class TextModelsTest(zoo_util.ZooAssertions, parameterized.TestCase):

    @parameterized.named_parameters(("bert_nn", "bert_nn"), ("bert_keras", "bert_keras"),
                                    ("conv_text", "conv_text"))
    def test_train_restore_export(self, style):
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        checkpoint = os.path.join(workdir, "ckpt", "model")
        losses = _train(style, checkpoint)
        self.assertTrue(np.all(np.isfinite(losses)), losses)
        g, ids, _, logits = text.build_graph(style, False, _CFG)
        inputs, _ = text.token_task(_EXAMPLES, _CFG, seed=9)
        with g.as_default():
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            coverage = report.coverage_report(g, [logits.op.name])
            self.assertEqual(coverage.float_tensors, [])
            sess = tf1.Session(graph=g)
            tf1.train.Saver().restore(sess, checkpoint)  # Plain and strict.
            with sess:
                reference = export.run_graph(sess, ids.name, logits.name, inputs)
                if style == "bert_keras":
                    # Three steps in, the pooled first token of the tf_keras
                    # encoder varies by less than one step of the softmax's and
                    # tanh's fixed grids (1/256, 1/128), which TFLite's kernels
                    # round to as the eval graph does: every example gets the
                    # same logits in both. Its float graph's outputs vary.
                    self.assert_outputs_vary(
                        export.run_graph(sess, ids.name, _float_output(g, ids, logits), inputs),
                        "float path of the eval graph")
                else:
                    self.assert_outputs_vary(reference, "eval graph")
                models = export.export_tflite(
                    [ids.name], [logits.name], workdir, sess=sess, flavours=("int8",),
                    parity_inputs=inputs, max_diff_steps=zoo_util.MAX_DIFF_STEPS)
                frozen = export.freeze_session(sess, [logits.op.name])
                tf_model = _convert_with_tf(sess, ids, logits)
            for label, model in (("qat.export", models["int8"].model), ("TF", tf_model)):
                export.check_fully_integer(model, frozen, label=f"{style} int8 ({label})")
                details = _input_details(model)
                self.assertEqual(details["dtype"], np.int32, label)
                check = export.check_parity(model, frozen, ids.name, logits.name, inputs,
                                            max_diff_steps=zoo_util.MAX_DIFF_STEPS)
                print(f"{style} {label}: max output steps {check.max_diff_steps:.3f}")
                worst = self.assert_each_layer_agrees(frozen, ids, logits, inputs, "int8",
                                                      model)
                print(f"{style} {label}: worst own steps {worst:.3f}")

    @parameterized.named_parameters(("gather", "gather"),
                                    ("embedding_lookup", "embedding_lookup"),
                                    ("resource", "resource"))
    def test_every_lookup_quantizes_its_table(self, lookup):
        planner, g = _planned("bert_nn", False, lookup=lookup)
        self.assertEqual(planner.left_float, [])
        prefixes = {p.prefix: p for p in planner.book.plans.values()}
        table = prefixes["bert/embeddings/word_embeddings/weights_quant"]
        self.assertTrue(table.is_weight)
        self.assertFalse(table.per_channel)
        self.assertEqual(table.tensor.shape.as_list(), [_SMALL.vocab, _SMALL.hidden])
        for name in ("bert/embeddings/add_quant", "bert/embeddings/LayerNorm/add_quant",
                     "bert/embeddings/LayerNorm/rsqrt_quant"):
            self.assertIn(name, prefixes)
        if lookup == "resource":
            self.assertFalse([op for op in g.get_operations() if op.type == "ResourceGather"
                              and op.outputs[0].consumers()])

    def test_split_resource_lookup_trains_its_table(self):
        """ResourceGather, split into read + gather, still trains the rows it reads."""
        g, ids, _, logits = text.build_graph("bert_nn", True, _SMALL, lookup="resource")
        with g.as_default():
            labels = tf1.placeholder(tf.int32, [None])
            loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
            qat.experimental_create_training_graph(g, symmetric_weights=True)
            train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
            table = [v for v in tf1.global_variables() if v.op.name.endswith("word_embeddings")][0]
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                before = sess.run(table)
                x, y = text.token_task(4, _SMALL, seed=0)
                sess.run(train, {ids: x, labels: y})
                changed = np.any(sess.run(table) != before, axis=1)
        self.assertCountEqual(np.nonzero(changed)[0], np.unique(x))

    @parameterized.named_parameters(("bert_nn", "bert_nn"), ("bert_keras", "bert_keras"))
    def test_second_rewrite_changes_nothing(self, style):
        g, _, _, _ = text.build_graph(style, False, _SMALL)
        with g.as_default():
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            first = len(g.get_operations())
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            self.assertEqual(len(g.get_operations()), first)

    def test_keras_embeddings_quantize_tables(self):
        planner, _ = _planned("bert_keras", False)
        self.assertEqual(planner.left_float, [])
        prefixes = {p.prefix for p in planner.book.plans.values()}
        self.assertIn("word_embeddings/embeddings/weights_quant", prefixes)
        self.assertIn("position_embeddings/embeddings/weights_quant", prefixes)
        self.assertIn("add/add_quant", prefixes)  # Words + positions.

    @parameterized.named_parameters(("bert_nn", "bert_nn"), ("bert_keras", "bert_keras"))
    def test_training_and_eval_plan_the_same_ranges(self, style):
        names = []
        for training in (True, False):
            planner, _ = _planned(style, training)
            names.append(sorted(p.prefix for p in planner.book.plans.values()))
        self.assertEqual(names[0], names[1])

    @parameterized.named_parameters(("bert_nn", "bert_nn"), ("bert_keras", "bert_keras"))
    def test_attention_mask_is_named_left_float(self, style):
        planner, g = _planned(style, False, with_mask=True)
        casts = [op.name for op in g.get_operations() if op.type == "Cast"
                 and (op.inputs[0].dtype.is_integer or op.inputs[0].dtype == tf.bool)
                 and op.outputs[0].dtype == tf.float32]
        left = dict(planner.left_float)
        named = [c for c in casts if c in left]
        self.assertTrue(named, planner.left_float)
        self.assertIn("-10000", left[named[0]])
        with g.as_default():
            qat.experimental_create_eval_graph(g, symmetric_weights=True)
            coverage = report.coverage_report(g)
        self.assertIn(named[0] + ":0", [f.tensor for f in coverage.float_tensors])

    def test_dropout_of_a_parameter_plans_as_its_eval_identity(self):
        """A learned query (no model data) through dropout into a layer."""
        names = []
        for training in (True, False):
            g = tf.Graph()
            with g.as_default():
                x = tf1.placeholder(tf.float32, [None, 8])
                query = tf1.get_variable("query", [1, 8])
                if training:
                    query = tf.nn.dropout(query, rate=0.1)
                else:
                    query = tf.identity(query)
                h = tf1.layers.dense(query, 8, name="proj") + tf1.layers.dense(x, 8, name="fc")
                tf1.layers.dense(h, 2, name="logits")
                planner = Planner(g, training, None, False)
                planner.run()
            names.append(sorted(p.prefix for p in planner.book.plans.values()))
        self.assertEqual(names[0], names[1])
        self.assertIn("proj/input_quant", names[1])


class FinetuneTextTest(absltest.TestCase):

    def test_fine_tune_reaches_float_accuracy_in_int8(self):
        """tools/finetune_text.py at a small size: float -> QAT -> int8 TFLite."""
        from tools import finetune_text  # pylint: disable=g-import-not-at-top
        workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        # One block of the width: the int8 / float size is the
        # encoder's, not the flatbuffer overhead of a toy.
        cfg = text.TextConfig(blocks=1)
        results = finetune_text.run_all("bert_nn", cfg, float_steps=60, fine_tune_steps=10,
                                        scratch_steps=0, quant_delay=0, batch=32, rate=1e-3,
                                        test_examples=256, workdir=workdir)
        print(finetune_text.format_results(results, {"float": 60, "fine_tune": 10}))
        self.assertNotIn("scratch", results)
        self.assertGreaterEqual(results["float"].graph_accuracy, 0.95)
        tuned = results["fine_tune"]
        self.assertGreaterEqual(tuned.tflite_accuracy, results["float"].graph_accuracy - 0.01)
        self.assertGreaterEqual(tuned.agreement, 0.99)
        self.assertLessEqual(tuned.tflite_bytes, 0.3 * results["float"].tflite_bytes)


def _input_details(model):
    from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
    return Interpreter(model_content=model).get_input_details()[0]


def _convert_with_tf(sess, ids, logits) -> bytes:
    """TF's plain int8 converter (docs/int8_export.md's flags); ids stay int32."""
    frozen = tf1.graph_util.convert_variables_to_constants(
        sess, sess.graph.as_graph_def(), [logits.op.name])
    g = tf.Graph()
    with g.as_default():
        tf.import_graph_def(frozen, name="")
        with tf1.Session(graph=g) as frozen_sess:
            converter = tf1.lite.TFLiteConverter.from_session(
                frozen_sess, [g.get_tensor_by_name(ids.name)],
                [g.get_tensor_by_name(logits.name)])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.inference_type = tf.int8
    converter.quantized_input_stats = {ids.op.name: (0.0, 1.0)}
    return converter.convert()


if __name__ == "__main__":
    absltest.main()
