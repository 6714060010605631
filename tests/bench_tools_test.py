"""The benchmarks under bench/ run and print every figure they promise.

Speed and memory targets live in these benchmarks, not in timed tests; this
only keeps them working (tiny sizes, no figure is judged): each runs as a
user runs it and its output is parsed.
"""
import importlib.util
import os
import re
import subprocess
import sys

from absl.testing import absltest

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def _run(tool, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1")
    proc = subprocess.run([sys.executable, os.path.join(_BENCH, tool), *args],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{tool} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return proc.stdout


def _rows(text, header_word):
    """The whitespace-separated rows under the header line containing `header_word`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if header_word in line.split())
    header = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        fields = line.split()
        if len(fields) != len(header):
            break
        rows.append(dict(zip(header, fields)))
    return rows


class BenchRewriteTest(absltest.TestCase):

    def test_keras_model_and_generated_network(self):
        out = _run("bench_rewrite.py", "--models=mobilenet", "--repeats=1", "--sizes=300")
        model, = _rows(out, "create_s")
        self.assertEqual(model["model"], "mobilenet")
        self.assertGreater(int(model["new_ops"]), 1000)
        self.assertGreater(float(model["add_floor_s"]), 0.0)
        self.assertLess(float(model["add_floor_s"]), float(model["create_s"]))
        network, = _rows(out, "peak_added_MB")
        self.assertGreater(int(network["fakequant"]), 0)
        self.assertGreater(int(network["new_ops"]), int(network["fakequant"]))
        self.assertGreaterEqual(float(network["peak_added_MB"]), 0.0)


class BenchQuantizeModelTest(absltest.TestCase):

    def test_rewrite_and_step_figures(self):
        # --noxla: XLA compiles MobileNetV2's step for minutes on 2 cores, whatever the sizes;
        # --replicas=0: the MirroredStrategy row quantizes and traces the model per replica
        # again (about a minute more here; tests/tf2_distribute_test.py trains under it).
        out = _run("bench_quantize_model.py", "--rewrites=1", "--rounds=2",
                   "--steps_per_round=1", "--batch_size=2", "--noxla", "--replicas=0")
        self.assertRegex(out, r"quantize_model: \d+\.\d{3} s .* its rewrite .*: \d+\.\d{3} s")
        self.assertRegex(out, r"QAT / float \d+\.\d{3} \(quartiles")


class BenchTrainStepTest(absltest.TestCase):

    def test_every_variant_is_timed(self):
        out = _run("bench_train_step.py", "--steps=2", "--warmup=1", "--image_size=32",
                   "--batch_size=2", "--tf_gradient")
        self.assertRegex(out, r"QAT/float = \d+\.\d{3}")
        self.assertRegex(out, r"paired: median of the 2 per-round ratios .* \d+\.\d{3}, "
                              r"quartiles \d+\.\d{3}-\d+\.\d{3}")
        self.assertIn("split: folded (no FakeQuant)", out)
        self.assertRegex(out, r"without the fused ReLU gradient: .* median per round: \d")
        self.assertIn("with TensorFlow's FakeQuant gradient", out)
        self.assertFalse(re.search(r"\bnan\b", out), out)


class BenchReplicasTest(absltest.TestCase):

    def test_both_ratios_are_printed(self):
        for style in ("towers", "mirrored"):
            out = _run("bench_replicas.py", "--steps=2", "--warmup=1", "--image_size=8",
                       "--batch_size=2", f"--style={style}")
            self.assertRegex(out, r"QAT 2 replicas / QAT 1 replica \(same total batch\) = \d+\.\d{3}")
            self.assertRegex(out, r"QAT/float at 2 replicas = \d+\.\d{3}")
            self.assertRegex(out, r"paired: median of the 2 per-round ratios: "
                                  r"2 vs 1 replica \d+\.\d{3}, QAT/float \d+\.\d{3}")
            self.assertFalse(re.search(r"\bnan\b", out), out)


class BenchRecurrentTest(absltest.TestCase):

    def test_forms_and_loops_are_measured(self):
        out = _run("bench_recurrent.py", "--forms=tf1_static_gru,k3_simple_rnn", "--units=4",
                   "--float_steps=2", "--qat_steps=2")
        rows = _rows(out, "flavour")
        self.assertEqual([(r["form"], r["flavour"]) for r in rows], [
            ("tf1_static_gru", "uint8"), ("tf1_static_gru", "int8"), ("k3_simple_rnn", "int8")])
        self.assertEqual({r["float_ops"] for r in rows}, {"0"})
        out = _run("bench_recurrent.py", "--measure=loops", "--steps_per_sequence=2", "--units=4")
        self.assertEqual(len(re.findall(r"^2 steps, (unrolled|while) +batch +\d+: +\d+ bytes", out,
                                        re.MULTILINE)), 4, out)
        self.assertRegex(out, r"unrolled batch +1: .* float ops none")

    @absltest.skipIf(importlib.util.find_spec("ai_edge_quantizer") is None,
                     "ai-edge-quantizer is not installed: pip install ai-edge-quantizer")
    def test_edge_quantizer_exports_are_measured(self):
        out = _run("bench_edge_quantizer.py", "--forms=k3_lstm_unroll", "--units=4",
                   "--float_steps=2", "--qat_steps=2")
        rows = _rows(out, "export")
        self.assertEqual([r["export"] for r in rows], [
            "tf-int8", "aeq-int8", "aeq-c16", "aeq-c16g16", "aeq-r16", "aeq-a16"])
        self.assertEqual({r["float_ops"] for r in rows}, {"0"})


if __name__ == "__main__":
    absltest.main()
