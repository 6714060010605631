"""Device placement of what the passes create, under replica_device_setter (graph only)."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
from absl.testing import parameterized
import tensorflow as tf

import qat
from qat.engine import placement
from qat.engine import step_counter

tf1 = tf.compat.v1
_WORKER = "/job:worker/task:0"
_CLUSTER = {"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]}
_QAT_KINDS = ("weights_quant", "act_quant", "input_quant")
_COMPUTE_TYPES = frozenset(["FakeQuantWithMinMaxVars", "Min", "Max", "Minimum", "Maximum",
                            "Sub", "Mul", "RealDiv", "Select"])


def _model(images, use_resource):
    with tf1.variable_scope("net", use_resource=use_resource):
        kernel = tf1.get_variable("conv/kernel", [3, 3, 1, 8])
        net = tf.nn.conv2d(images, kernel, 1, "SAME", name="conv/Conv2D")
        net = tf1.layers.batch_normalization(net, training=True, fused=True, name="conv/bn")
        net = tf.nn.relu(net, name="conv/relu")
        net = tf.reshape(net, [-1, 8 * 8 * 8])
        weights = tf1.get_variable("dense/kernel", [8 * 8 * 8, 10])
        return tf.matmul(net, weights, name="dense/MatMul")


def _build(inside: bool, use_resource: bool, devices: bool = True):
    graph = tf.Graph()
    with graph.as_default():
        cluster = tf1.train.ClusterSpec(_CLUSTER)
        setter = (tf1.train.replica_device_setter(cluster=cluster, worker_device=_WORKER)
                  if devices else None)
        with tf1.device(setter):
            tf1.train.get_or_create_global_step()
            images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
            labels = tf1.placeholder(tf.int64, [None])
            logits = _model(images, use_resource)
            tf1.losses.sparse_softmax_cross_entropy(labels, logits)
            if inside:
                qat.experimental_create_training_graph(graph, quant_delay=5, freeze_bn_delay=10,
                                                       symmetric_weights=True)
        if not inside:
            qat.experimental_create_training_graph(graph, quant_delay=5, freeze_bn_delay=10,
                                                   symmetric_weights=True)
    return graph


def _qat_variables(graph):
    return [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
            if any(k in v.op.name for k in _QAT_KINDS)
            or v.op.name == step_counter.QUANTIZATION_STEP_NAME]


class PlacementTest(parameterized.TestCase):

    @parameterized.product(inside=[True, False], use_resource=[True, False])
    def test_variables_on_ps_compute_on_worker(self, inside, use_resource):
        graph = _build(inside, use_resource)
        kernel = graph.get_operation_by_name("net/conv/kernel")
        self.assertEqual(kernel.type, "VarHandleOp" if use_resource else "VariableV2")
        variables = _qat_variables(graph)
        # 2 weights, 2 activations, the graph input: min, max and the count of
        # skipped batches each; the step counter.
        self.assertLen(variables, 16)
        for v in variables:
            self.assertTrue(v.op.device.startswith("/job:ps/task:"), (v.op.name, v.op.device))
            self.assertEqual(v.op.type, "VarHandleOp")
        if not inside:
            # Copied from the layer's own variables (2 ps tasks, round robin).
            for layer in ("conv", "dense"):
                own = graph.get_operation_by_name(f"net/{layer}/kernel").device
                for end in ("min", "max", "skipped_batches"):
                    self.assertEqual(
                        graph.get_operation_by_name(f"net/{layer}/weights_quant/{end}").device,
                        own)
            step = tf1.train.get_global_step(graph)
            self.assertEqual(step_counter.get_quantization_step_variable(graph).op.device,
                             step.op.device)
        compute = [op for op in graph.get_operations()
                   if any(f"/{k}/" in op.name for k in _QAT_KINDS) and op.type in _COMPUTE_TYPES]
        compute += [graph.get_operation_by_name(f"net/conv/{name}")
                    for name in ("mul_fold", "unscale_fold")]
        self.assertGreater(len(compute), 20)
        for op in compute:
            self.assertEqual(op.device, _WORKER, op.name)

    def test_active_device_function_decides_for_variables(self):
        # Model built under the setter; the rewrite under another device function:
        # that function places the new variables, as it would the user's.
        graph = tf.Graph()
        with graph.as_default():
            cluster = tf1.train.ClusterSpec(_CLUSTER)
            with tf1.device(tf1.train.replica_device_setter(cluster=cluster,
                                                            worker_device=_WORKER)):
                images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
                tf.identity(_model(images, True), name="output")
            # Both model kernels are on ps/task:0 or 1; this function picks task 1 and,
            # like replica_device_setter, keeps the device an op already has.
            with tf1.device(lambda op: "/job:ps/task:1" if op.type == "VarHandleOp"
                            else op.device):
                self.assertTrue(placement.device_function_active(graph))
                self.assertEqual(placement.shared_variable_device(graph), "")
                qat.experimental_create_training_graph(graph, quant_delay=3)
        for v in _qat_variables(graph):
            self.assertEqual(v.op.device, "/job:ps/task:1", v.op.name)
        fake_quants = [op for op in graph.get_operations()
                       if op.type == "FakeQuantWithMinMaxVars"]
        self.assertLen(fake_quants, 5)
        for op in fake_quants:
            self.assertEqual(op.device, _WORKER, op.name)

    def test_single_process_graph_gets_no_devices(self):
        graph = _build(inside=True, use_resource=True, devices=False)
        for op in graph.get_operations():
            self.assertEqual(op.device, "", op.name)

    def test_shared_variable_device_of_distributed_variables(self):
        # MirroredStrategy's variables in GLOBAL_VARIABLES have no op device of
        # their own: the primary copy's device is used.
        tf1.disable_eager_execution()
        graph = tf.Graph()
        with graph.as_default():
            strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
            with strategy.scope():
                tf1.get_variable("w", [2], use_resource=True)
        self.assertIn("CPU:0", placement.shared_variable_device(graph))


if __name__ == "__main__":
    absltest.main()
