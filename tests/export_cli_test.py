"""Tests of tools/export_tflite.py, run as a subprocess like a user would."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf
from absl.testing import absltest

import export_util

_TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "tools", "export_tflite.py")


def run_tool(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, _TOOL, *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    return proc.returncode, proc.stdout, proc.stderr


class ExportCliTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()
        graph, sess, saver = export_util.build_model()
        with graph.as_default():
            cls.prefix = saver.save(sess, os.path.join(cls.tmp, "ckpt", "model.ckpt"))
        tf.io.write_graph(graph.as_graph_def(), cls.tmp, "graph.pb", as_text=False)
        sess.close()
        cls.meta = cls.prefix + ".meta"

    def test_help(self):
        rc, out, _ = run_tool("--help")
        self.assertEqual(rc, 1)  # absl's --help: usage on stdout, then exit(1).
        self.assertIn("Exports a qat eval graph to fully integer TFLite models", out)
        for flag in ("--graph", "--checkpoint", "--flavour", "--fail_on_parity", "--parity"):
            self.assertIn(flag, out)

    def test_missing_checkpoint(self):
        missing = os.path.join(self.tmp, "ckpt", "model.ckpt-999")
        rc, _, err = run_tool(f"--graph={self.meta}", f"--checkpoint={missing}",
                              "--outputs=output", "--input_range=0,1")
        self.assertEqual(rc, 1)
        self.assertIn(f"checkpoint {missing!r} not found", err)
        self.assertNotIn("Traceback", err)

    def test_unknown_tensor_names(self):
        rc, _, err = run_tool(f"--graph={self.meta}", f"--checkpoint={self.prefix}",
                              "--outputs=logitz", "--input_range=0,1")
        self.assertEqual(rc, 1)
        self.assertIn("output tensor 'logitz': no op named 'logitz'", err)
        rc, _, err = run_tool(f"--graph={os.path.join(self.tmp, 'graph.pb')}",
                              f"--checkpoint={self.prefix}", "--inputs=images",
                              "--outputs=output", "--input_range=0,1")
        self.assertEqual(rc, 1)
        self.assertIn("input tensor 'images': no op named 'images'", err)
        self.assertIn("Placeholders in the graph: ['input']", err)

    def test_malformed_graph_file(self):
        bad = os.path.join(self.tmp, "bad.meta")
        with open(bad, "wb") as f:
            f.write(b"\x08\x96\x01 garbage \xff\xfe")
        rc, _, err = run_tool(f"--graph={bad}", f"--checkpoint={self.prefix}",
                              "--outputs=output")
        self.assertEqual(rc, 1)
        self.assertIn("is not a GraphDef or MetaGraphDef", err)
        self.assertNotIn("Traceback", err)

    def test_export_parity_and_fatal_threshold(self):
        out_dir = os.path.join(self.tmp, "models")
        inputs = os.path.join(self.tmp, "inputs.npy")
        np.save(inputs, np.random.RandomState(0).uniform(0, 1, (50, 8, 8, 1)))
        # An impossible threshold is reported, but fatal only with --fail_on_parity.
        args = [f"--graph={self.meta}", f"--checkpoint={self.prefix}", "--outputs=output",
                "--input_range=0,1", f"--output_dir={out_dir}", f"--parity={inputs}",
                "--min_agreement=0", "--max_diff_steps=-1"]
        rc, out, err = run_tool(*args)
        self.assertEqual(rc, 0, err)
        for flavour in ("uint8", "int8"):
            self.assertTrue(os.path.exists(os.path.join(out_dir, f"model_{flavour}.tflite")))
            self.assertRegex(out, flavour + r": .* fully integer")
        self.assertRegex(out, r"parity: top-1 agreement [\d.]+% over 50 examples")
        self.assertIn("FAILED: max difference", out)
        rc, _, err = run_tool(*args, "--flavour=uint8", "--fail_on_parity")
        self.assertEqual(rc, 3)
        self.assertIn("parity thresholds missed by: uint8", err)


class IntegerInputsCliTest(absltest.TestCase):
    """int32 ids and mask beside a float input: no --input_range, parity fed as they are."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()
        graph, sess, saver = export_util.build_int_input_model()
        with graph.as_default():
            cls.prefix = saver.save(sess, os.path.join(cls.tmp, "ckpt", "model.ckpt"))
        sess.close()

    def _export(self, parity, *extra):
        out_dir = os.path.join(self.tmp, "models")
        return run_tool(f"--graph={self.prefix}.meta", f"--checkpoint={self.prefix}",
                        "--inputs=ids,mask,x", "--outputs=output", f"--output_dir={out_dir}",
                        f"--parity={parity}", "--max_diff_steps=1.01", "--fail_on_parity",
                        *extra)

    def test_npz_parity_inputs(self):
        inputs = os.path.join(self.tmp, "inputs.npz")
        np.savez(inputs, **export_util.make_int_inputs(40))
        rc, out, err = self._export(inputs)
        self.assertEqual(rc, 0, err)
        for flavour in ("uint8", "int8"):
            self.assertRegex(out, flavour + r": .* fully integer")
        self.assertRegex(out, r"parity: top-1 agreement 100.00% over 40 examples.*ok")

    def test_random_parity_inputs_and_a_range_for_float_inputs_only(self):
        # Random ids and mask values in [0, 2): valid indices of both tables.
        rc, out, err = self._export("random", "--parity_examples=20", "--input_range=0,1")
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"parity: top-1 agreement [\d.]+% over 20 examples.*ok")
        self.assertNotIn("gather index out of bounds", err)

    def test_npz_without_an_input_is_named(self):
        inputs = os.path.join(self.tmp, "partial.npz")
        partial = export_util.make_int_inputs(4)
        del partial["mask"]
        np.savez(inputs, **partial)
        rc, _, err = self._export(inputs)
        self.assertEqual(rc, 1)
        self.assertIn("has no array for input(s) ['mask']", err)
        self.assertNotIn("Traceback", err)


if __name__ == "__main__":
    absltest.main()
