"""Every Python block of docs/coming_from_contrib.md runs as written."""
import contextlib
import io
import os
import re

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top

from qat import compat  # pylint: disable=g-import-not-at-top

_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs",
                    "coming_from_contrib.md")


def _python_blocks():
    with open(_DOC, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)


class ComingFromContribDocsTest(absltest.TestCase):

    def tearDown(self):
        compat.uninstall()
        super().tearDown()

    def test_has_blocks(self):
        self.assertGreaterEqual(len(_python_blocks()), 4)

    def test_every_python_block_runs(self):
        for i, code in enumerate(_python_blocks()):
            with self.subTest(block=i):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(code, f"coming_from_contrib.md:block{i}", "exec"),  # pylint: disable=exec-used
                         {"__name__": f"docs_block{i}"})

    def test_refusals_are_printed(self):
        code = [block for block in _python_blocks() if "contrib.learn" in block][0]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "coming_from_contrib.md", "exec"), {})  # pylint: disable=exec-used
        self.assertEqual(out.getvalue().count("qat.compat provides only"), 2)


if __name__ == "__main__":
    absltest.main()
