"""Tests of qat.compat: tensorflow.contrib imports and tf-slim on TF 2.21.

What install() provides: tensorflow.contrib.quantize as qat, the real
graph_editor and tf_slim, the contrib parts scripts import, TF 1's defaults,
contrib_training.HParams and slim without Keras 3. The TF 1.x scripts that
use it run in tests/compat_scripts_test.py.
"""
import copy
import importlib
import os
import sys
from unittest import mock

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import qat  # pylint: disable=g-import-not-at-top
from qat import compat  # pylint: disable=g-import-not-at-top
from qat.compat import hparams as compat_hparams  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


class InstallTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        compat.install()
        self.addCleanup(compat.uninstall)

    def test_contrib_quantize_is_qat(self):
        from tensorflow.contrib import quantize as contrib_quantize  # pylint: disable=g-import-not-at-top
        for name in ("create_training_graph", "create_eval_graph",
                     "experimental_create_training_graph", "experimental_create_eval_graph"):
            self.assertIs(getattr(contrib_quantize, name), getattr(qat, name))
            self.assertIs(getattr(tf.contrib.quantize, name), getattr(qat, name))
            self.assertIs(getattr(tf1.contrib.quantize, name), getattr(qat, name))

    def test_graph_editor_and_slim_are_the_real_modules(self):
        import tensorflow.contrib.graph_editor as ge  # pylint: disable=g-import-not-at-top
        import tensorflow.contrib.graph_editor.transform as ge_transform  # pylint: disable=g-import-not-at-top
        from tensorflow.contrib import slim  # pylint: disable=g-import-not-at-top
        from tensorflow.contrib.slim.nets import resnet_v1  # pylint: disable=g-import-not-at-top
        import tf_slim  # pylint: disable=g-import-not-at-top
        # tf_slim's package attributes shadow these modules' names.
        slim_training = importlib.import_module("tf_slim.training.training")
        slim_evaluation = importlib.import_module("tf_slim.training.evaluation")
        import tf_slim.nets.resnet_v1  # pylint: disable=g-import-not-at-top
        self.assertIs(ge, qat.graph_editor)
        self.assertIs(tf.contrib.graph_editor, qat.graph_editor)
        self.assertIs(ge_transform, qat.graph_editor.transform)
        self.assertIs(slim, tf_slim)
        self.assertIs(tf.contrib.slim, tf_slim)
        self.assertIs(resnet_v1, tf_slim.nets.resnet_v1)
        # The aliased modules keep their own identity.
        self.assertEqual(tf_slim.__name__, "tf_slim")
        self.assertEqual(tf_slim.__spec__.name, "tf_slim")
        self.assertEqual(qat.graph_editor.transform.__spec__.name, "qat.graph_editor.transform")
        self.assertFalse(hasattr(tf_slim.nets.resnet_v1, "__path__"))

    def test_idempotent(self):
        contrib = tf.contrib
        meta_path = list(sys.meta_path)
        compat.install()
        self.assertIs(tf.contrib, contrib)
        self.assertEqual(sys.meta_path, meta_path)
        self.assertTrue(compat.installed())

    def test_other_contrib_modules_are_refused(self):
        expected = "qat.compat provides only tensorflow.contrib.quantize"
        with self.assertRaisesRegex(ImportError, expected):
            from tensorflow.contrib import rnn  # pylint: disable=g-import-not-at-top,unused-import
        with self.assertRaisesRegex(ImportError, expected):
            import tensorflow.contrib.learn  # pylint: disable=g-import-not-at-top,unused-import
        with self.assertRaisesRegex(ImportError, expected):
            import tensorflow.contrib.training.python.training.hparam  # pylint: disable=g-import-not-at-top,unused-import
        with self.assertRaisesRegex(AttributeError, expected):
            _ = tf.contrib.rnn
        with self.assertRaisesRegex(AttributeError, expected):
            _ = tf1.contrib.metrics
        with self.assertRaisesRegex(ModuleNotFoundError, "qat.graph_editor.nothing"):
            import tensorflow.contrib.graph_editor.nothing  # pylint: disable=g-import-not-at-top,unused-import

    def test_uninstall(self):
        compat.uninstall()
        self.assertFalse(hasattr(tf, "contrib"))
        self.assertFalse(hasattr(tf1, "contrib"))
        self.assertFalse(compat.installed())
        with self.assertRaises(ImportError):
            import tensorflow.contrib.quantize  # pylint: disable=g-import-not-at-top,unused-import
        compat.install()  # An install after an uninstall works again.
        self.assertIs(tf.contrib.quantize.create_eval_graph, qat.create_eval_graph)


class ContribPartsTest(absltest.TestCase):
    """tensorflow.contrib.{training,framework,layers}: their pure-Python names."""

    def setUp(self):
        super().setUp()
        compat.install()
        self.addCleanup(compat.uninstall)

    def test_provided_names(self):
        from tensorflow.contrib import framework as contrib_framework  # pylint: disable=g-import-not-at-top
        from tensorflow.contrib import layers as contrib_layers  # pylint: disable=g-import-not-at-top
        from tensorflow.contrib import training as contrib_training  # pylint: disable=g-import-not-at-top
        from tensorflow.contrib.training import HParams  # pylint: disable=g-import-not-at-top
        import tf_slim  # pylint: disable=g-import-not-at-top
        # tf_slim's package attributes shadow these modules' names.
        slim_training = importlib.import_module("tf_slim.training.training")
        slim_evaluation = importlib.import_module("tf_slim.training.evaluation")
        self.assertIs(HParams, compat_hparams.HParams)
        self.assertIs(tf.contrib.training.HParams, HParams)
        self.assertIs(contrib_training.create_train_op, slim_training.create_train_op)
        self.assertIs(contrib_training.evaluate_repeatedly,
                      slim_evaluation.evaluate_repeatedly)
        self.assertIs(contrib_framework.arg_scope, tf_slim.arg_scope)
        self.assertIs(contrib_framework.get_variables_to_restore, tf_slim.get_variables_to_restore)
        self.assertIs(contrib_layers.l2_regularizer, tf_slim.l2_regularizer)
        self.assertIs(contrib_layers.variance_scaling_initializer,
                      tf_slim.variance_scaling_initializer)
        self.assertIs(tf1.contrib.layers.conv2d, tf_slim.conv2d)
        self.assertIs(tf.contrib.framework.add_arg_scope, tf_slim.add_arg_scope)  # 2019 NASNet's use
        self.assertIn("HParams", dir(contrib_training))

    def test_missing_names_say_so(self):
        from tensorflow.contrib import layers as contrib_layers  # pylint: disable=g-import-not-at-top
        expected = "tensorflow.contrib.layers.feature_column is not available.*provides only"
        with self.assertRaisesRegex(AttributeError, expected):
            _ = contrib_layers.feature_column
        self.assertFalse(hasattr(contrib_layers, "feature_column"))
        with self.assertRaisesRegex(ImportError, "contrib.training.bucket_by_sequence_length is "
                                    "not available.*provides only"):
            from tensorflow.contrib.training import bucket_by_sequence_length  # pylint: disable=g-import-not-at-top,unused-import


class Tf1DefaultsTest(absltest.TestCase):
    """What install() gives back of TF1 and NumPy 1, and what uninstall() takes back."""

    def test_graph_mode_as_tf1(self):
        self.assertTrue(tf.executing_eagerly())
        compat.install()
        try:
            self.assertFalse(tf.executing_eagerly())
            with tf.Graph().as_default() as graph:
                ref = tf1.get_variable("ref", [2])
                resource = tf.Variable([1.0, 2.0])  # TF 2's tf.Variable keeps its kind.
                x = tf1.placeholder(tf.float32, [])
                tf.cond(x > 0, lambda: x + 1, lambda: x - 1)
            self.assertEqual(ref.op.type, "VariableV2")
            self.assertEqual(resource.op.type, "VarHandleOp")
            self.assertIn("Switch", {op.type for op in graph.get_operations()})
            # Ops outside any `with graph.as_default()` go to the global graph, as in TF1.
            self.assertIsInstance(tf.constant(1.0), tf.Tensor)
            self.assertFalse(hasattr(tf.constant(1.0), "numpy"))
        finally:
            compat.uninstall()
        self.assertTrue(tf.executing_eagerly())
        self.assertTrue(tf1.resource_variables_enabled())
        self.assertTrue(tf1.control_flow_v2_enabled())
        self.assertEqual(float(tf.constant(1.0) + 1.0), 2.0)

    def test_keras_batch_norm_behind_a_tf1_cond_says_what_to_do(self):
        compat.install()
        try:
            with tf.Graph().as_default() as graph:
                inputs = tf1.keras.Input((8, 8, 1))
                net = tf1.keras.layers.Conv2D(4, 3)(inputs)
                tf1.keras.layers.BatchNormalization()(net)  # Learning phase: a tensor.
                result = qat.fold_batch_norms(graph, is_training=True)
        finally:
            compat.uninstall()
        self.assertNotEmpty(result.skipped)
        for skipped in result.skipped:
            self.assertIn("set_learning_phase(1)", skipped.reason)

    def test_graph_mode_can_be_left_out(self):
        compat.install(graph_mode=False, numpy_aliases=False)
        self.addCleanup(compat.uninstall)
        self.assertTrue(tf.executing_eagerly())
        self.assertNotIn("float_", vars(np))

    def test_numpy_aliases(self):
        bool_before = np.bool
        compat.install(graph_mode=False)
        try:
            self.assertIs(np.int, int)
            self.assertIs(np.float, float)
            self.assertIs(np.object, object)
            self.assertIs(np.float_, np.float64)
            self.assertIs(np.bool, bool_before)  # NumPy 2 has it: kept.
            self.assertEqual(np.int(np.round(2.6)), 3)
        finally:
            compat.uninstall()
        self.assertFalse(hasattr(np, "float_"))
        self.assertFalse(hasattr(np, "int"))

    def test_operation_outputs(self):
        compat.install(graph_mode=False)
        try:
            with tf.Graph().as_default():
                split = tf.split(tf1.placeholder(tf.float32, [4]), 2)
            self.assertEqual(split[0].op._outputs, split)  # pylint: disable=protected-access
        finally:
            compat.uninstall()
        self.assertFalse(hasattr(split[0].op, "_outputs"))


class HParamsTest(absltest.TestCase):
    """compat_hparams.HParams keeps contrib's rules."""

    def test_attributes_and_parse(self):
        hparams = compat_hparams.HParams(learning_rate=0.1, num_layers=2, name="net",
                                         use_bn=True, sizes=[1, 2], rates=[0.5])
        self.assertEqual(hparams.num_layers, 2)
        hparams.parse("learning_rate=1,num_layers=3,name=other,use_bn=false,sizes=[4,5,6],"
                      "rates[0]=0.25")
        self.assertEqual(hparams.values(), {"learning_rate": 1.0, "num_layers": 3,
                                            "name": "other", "use_bn": False,
                                            "sizes": [4, 5, 6], "rates": [0.25]})
        self.assertIsInstance(hparams.learning_rate, float)  # An int becomes a float.
        self.assertIn("sizes", hparams)
        self.assertNotIn("depth", hparams)
        self.assertEqual(hparams.get("depth", 7), 7)

    def test_type_changes_refused(self):
        hparams = compat_hparams.HParams(num_layers=2, name="net", use_bn=True)
        for text in ("num_layers=2.5", "num_layers=abc", "use_bn=3", "unknown=1", "num_layers"):
            with self.assertRaises(ValueError, msg=text):
                hparams.parse(text)
        with self.assertRaises(ValueError):
            hparams.set_hparam("name", 3)
        with self.assertRaises(ValueError):
            hparams.set_hparam("use_bn", 1)
        with self.assertRaises(KeyError):
            hparams.set_hparam("depth", 1)
        with self.assertRaises(ValueError):
            hparams.add_hparam("num_layers", 1)
        with self.assertRaises(ValueError):
            hparams.get("num_layers", "text")
        self.assertEqual(hparams.values(), {"num_layers": 2, "name": "net", "use_bn": True})

    def test_json_copy_and_delete(self):
        hparams = compat_hparams.HParams(a=1, b=[1.5, 2.5])
        copied = copy.deepcopy(hparams)
        copied.set_hparam("a", 5)
        self.assertEqual(hparams.a, 1)
        restored = compat_hparams.HParams(a=0, b=[0.0]).parse_json(copied.to_json())
        self.assertEqual(restored.values(), {"a": 5, "b": [1.5, 2.5]})
        restored.del_hparam("a")
        self.assertFalse(hasattr(restored, "a"))
        restored.add_hparam("a", "now a string")
        self.assertEqual(restored.a, "now a string")
        with self.assertRaisesRegex(NotImplementedError, "HParamDef"):
            compat_hparams.HParams(hparam_def=object())


class EnableSlimTest(absltest.TestCase):

    def test_slim_batch_norm_builds(self):
        compat.enable_slim()
        compat.enable_slim()  # Idempotent.
        import tf_slim as slim  # pylint: disable=g-import-not-at-top
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [None, 8, 8, 3])
            net = slim.conv2d(x, 4, 3, normalizer_fn=slim.batch_norm,
                              normalizer_params={"is_training": True})
            net = slim.fully_connected(slim.flatten(net), 4, normalizer_fn=slim.batch_norm)
        self.assertIn("FusedBatchNormV3", {op.type for op in g.get_operations()})
        self.assertLen(g.get_collection(tf1.GraphKeys.UPDATE_OPS), 4)
        self.assertIn("tf_keras.legacy_tf_layers.normalization", sys.modules)

    def test_refused_without_legacy_keras(self):
        with mock.patch.dict(os.environ, {"TF_USE_LEGACY_KERAS": "0"}):
            self.assertFalse(compat.legacy_keras_enabled())
            with self.assertRaisesRegex(RuntimeError, "TF_USE_LEGACY_KERAS=1 before"):
                compat.enable_slim()

    def test_slim_import_refused_without_legacy_keras(self):
        compat.install()
        self.addCleanup(compat.uninstall)
        sys.modules.pop("tensorflow.contrib.slim", None)
        with mock.patch.dict(os.environ, {"TF_USE_LEGACY_KERAS": "0"}):
            with self.assertRaisesRegex(RuntimeError, "TF_USE_LEGACY_KERAS=1"):
                from tensorflow.contrib import slim  # pylint: disable=g-import-not-at-top,unused-import

    def test_contrib_parts_without_legacy_keras(self):
        compat.install(graph_mode=False)
        self.addCleanup(compat.uninstall)
        with mock.patch.dict(os.environ, {"TF_USE_LEGACY_KERAS": "0"}):
            with self.assertRaisesRegex(RuntimeError, "TF_USE_LEGACY_KERAS=1"):
                from tensorflow.contrib import layers  # pylint: disable=g-import-not-at-top,unused-import
            # HParams needs no tf_keras; tf_slim's training functions say what they need.
            from tensorflow.contrib import training  # pylint: disable=g-import-not-at-top
            self.assertIs(training.HParams, compat_hparams.HParams)
            with self.assertRaisesRegex(AttributeError, "need TF_USE_LEGACY_KERAS=1"):
                _ = training.create_train_op


if __name__ == "__main__":
    absltest.main()
