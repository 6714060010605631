"""The end-to-end demo (tools/qat_demo.py) with a short run, as a subprocess."""
import json
import os
import re
import subprocess
import sys
import tempfile

from absl.testing import absltest

_DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "tools", "qat_demo.py")
_ROW = re.compile(r"^(float \(eval graph\)|QAT eval graph|TFLite uint8|TFLite int8)\s+"
                  r"([\d.]+)%\s+[-+][\d.]+\s+(?:([\d.]+)%|-)", re.MULTILINE)


_QAT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "qat")
# An absl log line: "I1127 07:12:55.313896 140663670422400 qat_demo.py:226] ...".
_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ ([A-Za-z0-9_]+\.py):\d+\] ")


def _not_own(stderr):
    """The stderr lines that are neither the demo's nor qat's own log lines."""
    own = {"qat_demo.py"} | {name for _, _, files in os.walk(_QAT_DIR) for name in files}
    found = []
    for line in stderr.splitlines():
        match = _LOG_LINE.match(line)
        if line.strip() and not (match and match.group(1) in own):
            found.append(line)
    return found


def run_demo(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1")
    proc = subprocess.run([sys.executable, _DEMO, *args], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)) if m.group(3) else None)
            for m in _ROW.finditer(proc.stdout)}
    return proc, rows


class DemoTest(absltest.TestCase):

    def test_short_run_writes_both_models(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc, rows = run_demo("--epochs=4", "--qat_epochs=3", f"--output_dir={tmp}")
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr[-3000:])
            for flavour in ("uint8", "int8"):
                path = os.path.join(tmp, f"model_{flavour}.tflite")
                self.assertTrue(os.path.exists(path), path)
                self.assertGreater(os.path.getsize(path), 5000)
            self.assertTrue(os.path.exists(os.path.join(tmp, "checkpoints", "qat",
                                                        "model.ckpt.index")))
            # The qat.report: text, JSON, plots and TensorBoard events, paths printed.
            report_dir = os.path.join(tmp, "report")
            for name in ("report.txt", "report.json", "sqnr.png", "ranges.png"):
                path = os.path.join(report_dir, name)
                self.assertTrue(os.path.exists(path), path)
                self.assertIn(path, proc.stdout)
            with open(os.path.join(report_dir, "sqnr.png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            with open(os.path.join(report_dir, "report.json"), encoding="utf-8") as f:
                data = json.load(f)
            self.assertLen(data["coverage"]["layers"], 3)
            self.assertEqual(data["coverage"]["float_tensors"], [])
            events = os.listdir(os.path.join(tmp, "tensorboard", "qat"))
            self.assertTrue(any(e.startswith("events.out.tfevents.") for e in events), events)
        self.assertEqual(set(rows), {"float (eval graph)", "QAT eval graph", "TFLite uint8",
                                     "TFLite int8"}, proc.stdout)
        # Default: int8-ready symmetric weights, asymmetric activations.
        self.assertIn("ranges: symmetric weights, asymmetric activations", proc.stdout)
        qat_accuracy = rows["QAT eval graph"][0]
        for flavour in ("uint8", "int8"):
            accuracy, agreement = rows[f"TFLite {flavour}"]
            self.assertGreaterEqual(agreement, 99.0, flavour)
            # Same argmax on >= 99% of 450 images: the accuracies differ by <= 1 point.
            self.assertLessEqual(abs(accuracy - qat_accuracy), 1.0, flavour)
        self.assertRegex(proc.stdout, r"wall times: float training [\d.]+ s, QAT fine-tuning")
        self.assertIn("float epoch 4/4", proc.stderr)  # Progress per epoch.
        self.assertIn("qat epoch 3/3", proc.stderr)
        self.assertIn("layers: 3, weights quantized: 3, batch norms folded: 2 of 2", proc.stdout)
        self.assertRegex(proc.stdout, r"numerics \(int8, 450 examples, 5 tensors\): lowest SQNR")
        self.assertIn("first layer where TFLite drifts by more than 1 step:", proc.stdout)
        self.assertIn("tensorboard --logdir", proc.stdout)
        self.assertTrue(proc.stdout.rstrip().endswith("PASS"))
        # Quiet: stderr holds the demo's and qat's own log lines only (no TensorFlow
        # start-up logs, no converter INFO lines, no Python warnings).
        self.assertEqual(_not_own(proc.stderr), [])

    def test_contrib_default_api_and_failing_threshold(self):
        # --nosymmetric: create_training_graph/create_eval_graph, uint8 only. An
        # agreement threshold above 100% cannot be met: the demo must exit 1.
        with tempfile.TemporaryDirectory() as tmp:
            proc, rows = run_demo("--epochs=2", "--qat_epochs=1", "--nosymmetric",
                                  "--min_agreement=100.5", f"--output_dir={tmp}")
            self.assertTrue(os.path.exists(os.path.join(tmp, "model_uint8.tflite")))
            self.assertFalse(os.path.exists(os.path.join(tmp, "model_int8.tflite")))
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr[-3000:])
        self.assertIn("TFLite uint8", rows)
        self.assertNotIn("TFLite int8", rows)
        self.assertIn("ranges: contrib default (asymmetric)", proc.stdout)
        self.assertIn("FAIL: TFLite uint8 agrees with the eval graph on", proc.stdout)


if __name__ == "__main__":
    absltest.main()
