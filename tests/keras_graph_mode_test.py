"""tf_keras in graph mode (tensorflow#27880's pattern): rewrite, compile, fit.

Keras's graph-mode session initialises only the variables it tracks; qat's
range variables and step counter are tracked too, so `fit` after the rewrite
needs no `global_variables_initializer()`. The script runs as a subprocess:
`disable_eager_execution` and the learning phase are process-wide.
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import tensorflow as tf
import tf_keras
from absl.testing import absltest

import qat

_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    import qat
    from qat.engine import step_counter

    tf.compat.v1.disable_eager_execution()
    if sys.argv[1] == "fixed":
        tf.compat.v1.keras.backend.set_learning_phase(1)
    model = keras.Sequential([
        keras.layers.Conv2D(4, 3, input_shape=(8, 8, 3)),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(6.0),
        keras.layers.Flatten(),
        keras.layers.Dense(5, activation="softmax")])
    graph = tf.compat.v1.keras.backend.get_session().graph
    qat.create_training_graph(graph, quant_delay=0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    rng = np.random.RandomState(0)
    x = rng.uniform(0, 2, (16, 8, 8, 3)).astype(np.float32)
    y = rng.randint(0, 5, 16)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    sess = tf.compat.v1.keras.backend.get_session()
    ranges = {v.op.name: float(sess.run(v)) for v in tf.compat.v1.global_variables()
              if v.op.name.endswith("quant/max") and not v.shape.rank}
    print(json.dumps({
        "step": int(sess.run(step_counter.get_quantization_step_variable(graph))),
        "ranges": ranges,
        "if_ops": sorted({op.type for op in graph.get_operations()
                          if op.type in ("If", "StatelessIf")})}))
""")


class KerasGraphModeFitTest(absltest.TestCase):

    def _run(self, mode):
        path = os.path.join(tempfile.mkdtemp(), "keras_fit.py")
        with open(path, "w") as f:
            f.write(_SCRIPT)
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=os.pathsep.join(
                       [os.path.dirname(os.path.dirname(os.path.abspath(qat.__file__)))]
                       + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        result = subprocess.run([sys.executable, path, mode], capture_output=True, text=True,
                                env=env, timeout=300, check=False)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr

    def test_fit_without_initializer(self):
        out, stderr = self._run("not_fixed")
        self.assertEqual(out["step"], 2)  # Two batches trained with quantization.
        self.assertTrue(out["ranges"])
        # The activation ranges moved from their initial 6.0.
        moved = [name for name, value in out["ranges"].items()
                 if "act_quant" in name and value != 6.0]
        self.assertTrue(moved, out["ranges"])
        # Without a fixed learning phase the batch norm sits in an If: the
        # rewrite says so and how to fix it.
        self.assertTrue(out["if_ops"])
        self.assertIn("set_learning_phase(1)", stderr)

    def test_fit_with_fixed_learning_phase(self):
        out, stderr = self._run("fixed")
        self.assertEqual(out["step"], 2)
        self.assertEqual(out["if_ops"], [])
        self.assertNotIn("set_learning_phase(1)", stderr)


class KerasTrackingTest(absltest.TestCase):
    """In-process: qat's variables join Keras's tracked variables."""

    def test_variables_tracked(self):
        graph = tf.Graph()
        with graph.as_default():
            inputs = tf_keras.Input((8, 8, 3))
            out = tf_keras.layers.Dense(3)(tf_keras.layers.Flatten()(
                tf_keras.layers.Conv2D(2, 3)(inputs)))
            del out
            qat.create_training_graph(graph, quant_delay=0)
            # pylint: disable=protected-access
            from tf_keras.src import backend  # pylint: disable=g-import-not-at-top
            tracked = {v.op.name for v in backend._get_variables(graph)}
            qat_variables = {v.op.name for v in tf.compat.v1.global_variables()
                             if "quant" in v.op.name}
            self.assertTrue(qat_variables)
            self.assertLessEqual(qat_variables, tracked)


if __name__ == "__main__":
    absltest.main()
