"""Tests of qat.engine.node_batch: NodeDefs added with one GraphDef import."""
from absl.testing import absltest
import numpy as np
import tensorflow as tf

from qat.engine import node_batch


class NodeBatchTest(tf.test.TestCase):

    def test_ops_read_existing_tensors_and_compute(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
            w = tf.constant([1.0, 2.0, 3.0], name="w")
        batch = node_batch.NodeBatch(g)
        scaled = batch.node(batch.unique_name("net/scaled"), "Mul",
                            [batch.external(x), batch.external(w)], T=tf.float32)
        two = batch.shared_const("consts/two", 2.0, tf.float32)
        out = batch.node(batch.unique_name("net/out"), "AddV2", [scaled, two],
                         T=tf.float32)
        self.assertLen(batch, 3)
        ops = batch.build()
        self.assertCountEqual(ops, [scaled, two, out])
        result = batch.tensor(ops, out)
        self.assertEqual(result.op.name, "net/out")
        self.assertIs(result.op.inputs[0].op.inputs[0], x)
        self.assertIs(result.op.inputs[0].op.inputs[1], w)
        self.assertEqual(result.shape.as_list(), [2, 3])
        value = np.arange(6, dtype=np.float32).reshape([2, 3])
        with tf.compat.v1.Session(graph=g) as sess:
            self.assertAllClose(sess.run(result, {x: value}), value * [1, 2, 3] + 2)

    def test_names_are_made_unique_like_python_constructors(self):
        g = tf.Graph()
        with g.as_default():
            tf.constant(1.0, name="a/mul_fold")
        batch = node_batch.NodeBatch(g)
        first = batch.unique_name("a/mul_fold")
        second = batch.unique_name("a/mul_fold")
        self.assertEqual([first, second], ["a/mul_fold_1", "a/mul_fold_2"])
        for name in (first, second):
            batch.const(name, 0.0, tf.float32)
        ops = batch.build()
        self.assertEqual(sorted(op.name for op in ops.values()), [first, second])
        with g.as_default():  # Later Python ops do not clash with them.
            self.assertEqual(tf.constant(2.0, name="a/mul_fold").op.name, "a/mul_fold_3")

    def test_shared_constants_device_and_output_index(self):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        batch = node_batch.NodeBatch(g)
        one = batch.shared_const("c/one", 1.0, tf.float32)
        self.assertEqual(batch.shared_const("c/other_name", 1.0, tf.float32), one)
        self.assertNotEqual(batch.shared_const("c/one", 1.0, tf.float64), one)
        split = batch.node(batch.unique_name("s"), "Split",
                           [batch.shared_const("c/axis", 0, tf.int32), batch.external(x)],
                           device="/cpu:0", T=tf.float32, num_split=2)
        ops = batch.build()
        self.assertEqual(ops[split].device, "/device:CPU:0")
        second = batch.tensor(ops, split + ":1")
        self.assertIs(second, ops[split].outputs[1])
        self.assertIsNone(batch.tensor(ops, None))

    def test_empty_batch_adds_nothing(self):
        g = tf.Graph()
        before = len(g.get_operations())
        self.assertEqual(node_batch.NodeBatch(g).build(), {})
        self.assertLen(g.get_operations(), before)

    def test_unique_name_under_an_active_name_scope(self):
        # tf.distribute replica functions run under `replica_1/`: a name taken
        # at the root must be seen as taken (this once looped forever).
        g = tf.Graph()
        with g.as_default():
            tf.constant(1.0, name="conv/act_quant")
            with tf.name_scope("replica_1"):
                batch = node_batch.NodeBatch(g)
                name = batch.unique_name("conv/act_quant")
                self.assertEqual(name, "conv/act_quant_1")
                self.assertEqual(batch.unique_name("fresh"), "fresh")
                batch.node(name, "NoOp")
                batch.build()
            # Marked used at the root, not under the scope.
            self.assertEqual(g.unique_name("conv/act_quant_1", mark_as_used=False),
                             "conv/act_quant_1_1")
            self.assertEqual(g.unique_name("replica_1/conv/act_quant_1", mark_as_used=False),
                             "replica_1/conv/act_quant_1")

    def test_unique_name_is_bounded(self):
        g = tf.Graph()
        with g.as_default():
            for i in range(4):
                tf.constant(1.0, name="a" if i == 0 else "a_%d" % i)
        batch = node_batch.NodeBatch(g)
        limit = node_batch.MAX_NAME_TRIES
        node_batch.MAX_NAME_TRIES = 3
        self.addCleanup(setattr, node_batch, "MAX_NAME_TRIES", limit)
        with self.assertRaisesRegex(RuntimeError, "No free name for 'a' after 3 tries"):
            batch.unique_name("a")


if __name__ == "__main__":
    absltest.main()
