"""The README's worked example runs as written and exports agreeing models."""
import io
import os
import re
import contextlib

from absl.testing import absltest


def _readme_path() -> str:
    # Source tree and Bazel runfiles both keep README.md one level above tests/.
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "README.md")


def _worked_example() -> str:
    with open(_readme_path(), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Worked example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    if match is None:
        raise AssertionError("README.md: no python block under 'Worked example'")
    return match.group(1)


class ReadmeExampleTest(absltest.TestCase):

    def test_worked_example_runs_and_exports_both_flavours(self):
        code = _worked_example()
        self.assertIn("experimental_create_training_graph", code)
        self.assertIn("export.export_tflite", code)
        scope = {"__name__": "readme_example"}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md:worked-example", "exec"), scope)  # pylint: disable=exec-used
        models = scope["models"]
        self.assertEqual(sorted(models), ["int8", "uint8"])
        for flavour, exported in models.items():
            self.assertTrue(os.path.getsize(exported.path) > 0, flavour)
            self.assertGreaterEqual(exported.parity.top1_agreement, 0.99, flavour)
        self.assertIn("top-1 agreement", out.getvalue())


if __name__ == "__main__":
    absltest.main()
