"""The documentation does not lie: README.md and docs/*.md are checked here.

- docs/api.md is what tools/gen_api_docs.py generates from the public names
  (a public signature or docstring changed without it fails);
- every ```python block of a file runs: a file's blocks in order, in one
  namespace, in a fresh subprocess (TF_USE_LEGACY_KERAS=1, a temporary working
  directory); some files get a few assertions after their blocks (_EPILOGUES);
- every `tools/<name>`, `tools/property/<name>` or `bench/<name>` command
  line in a ```sh / ```bash block names a tool that exists and passes only
  flags that tool defines (absl flags, read by importing the tool in a
  subprocess); tools/test takes Bazel targets, which must be test files of
  tests/, and Bazel flags, which are not checked;
- every relative link of a file points to a file that exists.

One test method per Markdown file, so Bazel shards split them.
"""
import functools
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

from absl.testing import absltest

# Source tree and Bazel runfiles both keep README.md, docs/, tools/ and bench/ one level above tests/.
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_INLINE = re.compile(r"`([^`\n]+)`")
# A tool's path: tools/<name>, tools/property/<name>.py, bench/<name>.py.
_TOOL_PATH = r"(?:tools/property|tools|bench)/[A-Za-z0-9_]+"
_TOOL = re.compile(r"(?:^|\s|/)" + _TOOL_PATH + r"(?:\.py)?(?:\s|$)")

# Checks appended to a file's blocks, in the same namespace: what the old
# readme_example_test asserted, and what each guide says its reader can check.
_EPILOGUES = {
    "README.md": """
        assert int8.path == "qat_example/model_int8.tflite", int8.path
        assert os.path.getsize(int8.path) > 0
        assert int8.parity.top1_agreement >= 0.99, int8.parity.format()
        assert int8.report.op_counts()["CONV_2D"] == 1, int8.report.op_counts()
    """,
    "docs/getting_started.md": """
        assert sorted(models) == ["int8", "uint8"], sorted(models)
        for flavour, exported in models.items():
            assert exported.parity.top1_agreement >= 0.99, (flavour, exported.parity.format())
    """,
    "docs/reports.md": """
        assert sorted(paths) == ["json", "ranges_plot", "sqnr_plot", "text"], sorted(paths)
        for path in paths.values():
            assert os.path.getsize(path) > 0, path
        assert "tensors left float: 0" in coverage.format()
    """,
    "docs/coming_from_contrib.md": """
        import tensorflow as _tf
        for _name in ("tensorflow.contrib.rnn", "tensorflow.contrib.learn"):
            try:
                if _name.endswith("learn"):
                    _tf.contrib.learn
                else:
                    __import__(_name)
                raise AssertionError(_name + " was not refused")
            except (ImportError, AttributeError) as _e:
                assert "qat.compat provides only" in str(_e), str(_e)
    """,
    "docs/tf2_models.md": """
        for _exported in (keras_int8, loop_int8, module_int8, replicated_int8, resumed_int8):
            assert _exported.parity.top1_agreement >= 0.99, _exported.parity.format()
            assert not export.find_float_ops(_exported.report), _exported.path
        assert isinstance(qm, keras.Model) and isinstance(qtiny, qat.tf2.QuantizedModule)
        assert [id(v) for v in qnet.trainable_variables] == [id(v) for v in net.trainable_variables]
    """,
    "docs/recurrent_models.md": """
        assert not export.find_float_ops(kws_int8.report), kws_int8.path
        assert sorted(exported) == ["int8", "uint8"], sorted(exported)
        for _flavour, _result in exported.items():
            assert not export.find_float_ops(_result.report), _flavour
        assert steps == [str(k) for k in range(8)], steps
    """,
    "docs/distributed_training.md": """
        qat_variables = [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                         if "quant" in v.op.name or v.op.name == "fake_quantization_step"]
        assert len(qat_variables) > 2, qat_variables
        assert {v.device for v in qat_variables} == {"/job:ps/task:0"}, qat_variables
        assert {op.device for op in fake_quant} == {"/job:worker/task:0"}
        # Replicas: one range per tensor, named as the single-tower eval graph names it.
        tower_ranges = sorted(v.op.name for v in towers.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                              if v.op.name.endswith("/max"))
        assert tower_ranges == sorted("model/%s/max" % r for r in (
            "conv1/input_quant", "conv1/weights_quant", "conv1/act_quant",
            "logits/weights_quant", "logits/act_quant")), tower_ranges
        assert {op.device for op in towers.get_operations() if op.type.startswith("FakeQuant")
                } >= {"/device:CPU:0", "/device:CPU:1"}
    """,
}

# Timeout of one file's blocks, in seconds.
_TIMEOUT_S = 900


def markdown_files():
    """README.md and docs/*.md, relative to the root."""
    files = ["README.md"] + sorted(
        os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [path.replace(os.sep, "/") for path in files]


def read(relpath: str) -> str:
    with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
        return f.read()


def blocks(text: str, languages):
    """(line number, code) of each fenced block in one of `languages`."""
    found = []
    for match in _FENCE.finditer(text):
        if match.group(1).lower() in languages:
            found.append((text.count("\n", 0, match.start()) + 1, match.group(2)))
    return found


def python_program(relpath: str) -> str:
    """A file's python blocks as one program; line numbers point into the Markdown file."""
    text = read(relpath)
    parts = []
    for line, code in blocks(text, ("python", "py")):
        parts.append(f"# --- {relpath}:{line}\n"
                     f"exec(compile({code!r}, {relpath + ':' + str(line + 1)!r}, 'exec'))\n")
    if not parts:
        return ""
    epilogue = textwrap.dedent(_EPILOGUES.get(relpath, ""))
    return "import os\n" + "".join(parts) + epilogue + "\nprint('docs_test: all blocks ran')\n"


def command_lines(text: str):
    """(line number, command) of each command in ```sh / ```bash blocks, continuations joined,
    and of each inline code span that runs a tools/ or bench/ command."""
    found = []
    for line, code in blocks(text, ("sh", "bash", "shell", "console")):
        pending, start = "", None
        for offset, raw in enumerate(code.split("\n")):
            if start is None:
                start = line + 1 + offset
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            command = (pending + raw).split(" #", 1)[0].strip()
            if command.startswith("#"):
                command = ""
            pending = ""
            if command:
                found.append((start, command))
            start = None
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for match in _INLINE.finditer(prose):
        if _TOOL.search(match.group(1)):
            found.append((prose.count("\n", 0, match.start()) + 1, match.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    heading = heading.strip().lower().replace("`", "")
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def anchors(text: str):
    prose = _FENCE.sub("", text)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *$", prose, re.MULTILINE)}


@functools.lru_cache(maxsize=None)
def tool_flags(tool: str):
    """{flag name: is boolean} that <tool>.py defines (with absl's own flags).

    `tool`: the path without .py from the checkout's root ("tools/qat_report").
    """
    program = textwrap.dedent(f"""
        import importlib.util, json, sys
        sys.path.insert(0, {ROOT!r})
        spec = importlib.util.spec_from_file_location("doc_tool", {os.path.join(ROOT, tool + '.py')!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        from absl import flags
        import absl.app
        absl.app.define_help_flags()  # --help, --helpfull, ...
        print("FLAGS=" + json.dumps({{name: isinstance(flags.FLAGS[name], flags.BooleanFlag)
                                      for name in flags.FLAGS}}))
    """)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT] + sys.path))
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            env=env, timeout=300, check=False)
    for line in result.stdout.splitlines():
        if line.startswith("FLAGS="):
            return json.loads(line[len("FLAGS="):])
    raise AssertionError(f"could not read the flags of {tool}.py:\n{result.stderr[-3000:]}")


def check_command(command: str):
    """Problems (strings) with one documented command line; [] when it is fine."""
    problems = []
    tokens = command.replace("[", " ").replace("]", " ").split()
    for index, token in enumerate(tokens):
        match = re.match(r"^(?:\S*/)?(" + _TOOL_PATH + r")(\.py)?$", token)
        if not match:
            continue
        tool, is_py = match.group(1), bool(match.group(2))
        path = os.path.join(ROOT, tool + (".py" if is_py else ""))
        if os.path.isdir(path):
            continue  # A package (`//tools/property`), not a command.
        if not os.path.exists(path):
            problems.append(f"{tool}{'.py' if is_py else ''} does not exist")
            continue
        args = []
        for arg in tokens[index + 1:]:
            if arg in ("|", "&&", ";", "||"):
                break
            args.append(arg)
        if not is_py and tool == "tools/test":
            for arg in args:
                if arg.startswith("//tests:"):
                    target = arg[len("//tests:"):]
                    if not os.path.exists(os.path.join(ROOT, "tests", target + ".py")):
                        problems.append(f"tools/test {arg}: no tests/{target}.py")
            continue
        if not is_py:
            script = read(os.path.relpath(path, ROOT))
            launched = re.search(r"(" + _TOOL_PATH + r")\.py", script)
            if not launched:
                if any(a.startswith("--") for a in args):
                    problems.append(f"{tool} is given flags but runs no tools/*.py")
                continue
            tool = launched.group(1)
        if not any(arg.startswith("--") for arg in args):
            continue
        flags = tool_flags(tool)
        for arg in args:
            if not arg.startswith("--"):
                continue
            flag = arg[2:].split("=", 1)[0]
            if flag in flags:
                continue
            if flag.startswith("no") and flags.get(flag[2:]) is True:
                continue
            problems.append(f"{arg}: {tool}.py defines no flag --{flag}")
    return problems


class ApiReferenceTest(absltest.TestCase):

    def test_api_md_is_current(self):
        from tools import gen_api_docs  # pylint: disable=g-import-not-at-top
        diff = gen_api_docs.stale_diff(os.path.join(ROOT, "docs", "api.md"))
        self.assertEqual(diff, "", "docs/api.md is stale: run .venv/bin/python "
                         "tools/gen_api_docs.py\n" + diff[:20000])


class OpTableTest(absltest.TestCase):
    """docs/what_gets_a_range.md lists exactly the op types of qat/quantize/plan/ops/op_table.py."""

    def test_op_table_rows_match_the_module(self):
        from qat.quantize.plan.ops import op_table  # pylint: disable=g-import-not-at-top
        text = read("docs/what_gets_a_range.md")
        for set_name in ("OWN_RANGE_TYPES", "FUSABLE_ACTIVATION_TYPES", "FIXED_RANGE_TYPES",
                         "SAME_SCALE_TYPES", "FUNCTIONAL_TYPES"):
            row = re.search(r"^\| `" + set_name + r"` \|([^|]*)\|", text, re.MULTILINE)
            self.assertIsNotNone(row, f"docs/what_gets_a_range.md: no op-table row for {set_name}")
            documented = set(re.findall(r"`([A-Za-z0-9_]+)`", row.group(1)))
            self.assertEqual(documented, set(getattr(op_table, set_name)),
                             f"docs/what_gets_a_range.md: the {set_name} row differs from op_table.py")


class CheckerTest(absltest.TestCase):
    """The checks below catch what they are meant to."""

    def test_unknown_flag_and_tool_are_reported(self):
        self.assertEqual(check_command("tools/demo --epochs=3 --nosymmetric"), [])
        self.assertEqual(len(check_command("tools/demo --no_such_flag=1")), 1)
        self.assertEqual(len(check_command(".venv/bin/python tools/no_such_tool.py --x")), 1)
        self.assertEqual(len(check_command("tools/test //tests:no_such_test")), 1)
        self.assertEqual(check_command(".venv/bin/python bench/bench_fold.py --repeats=1"), [])
        self.assertEqual(len(check_command(".venv/bin/python bench/bench_fold.py --no_such=1")), 1)
        self.assertEqual(len(check_command(".venv/bin/python tools/bench_fold.py")), 1)
        self.assertEqual(check_command(".venv/bin/python tools/property/check.py --seed=0"), [])
        self.assertEqual(len(check_command("tools/property/check.py --no_such=1")), 1)

    def test_anchors_are_githubs(self):
        self.assertEqual(slug("What `qat.export` checks"), "what-qatexport-checks")
        self.assertEqual(slug("oneDNN drops LeakyReLU's alpha"), "onednn-drops-leakyrelus-alpha")
        self.assertEqual(slug("From a graph to an int8 .tflite"), "from-a-graph-to-an-int8-tflite")

    def test_inline_tool_commands_are_found(self):
        text = ("Run `bench/bench_train_step.py --xla` or `bazel run //bench:bench_rewrite`,\n"
                "then `tools/property/check.py --examples=10`.\n")
        self.assertEqual(command_lines(text), [(1, "bench/bench_train_step.py --xla"),
                                               (2, "tools/property/check.py --examples=10")])

    def test_commands_split_on_continuations_and_comments(self):
        text = "```sh\ntools/demo --epochs=1 \\\n    --qat_epochs=2   # comment --bogus\n```\n"
        self.assertEqual(command_lines(text), [(2, "tools/demo --epochs=1      --qat_epochs=2")])


class MarkdownTest(absltest.TestCase):
    """Filled in below: test_<file> methods, one per Markdown file."""

    def check_links(self, relpath: str):
        base = os.path.dirname(os.path.join(ROOT, relpath))
        for target in _LINK.findall(_FENCE.sub("", read(relpath))):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, relpath)
            self.assertTrue(os.path.exists(full), f"{relpath}: link to {target}: no such file")
            if anchor and full.endswith(".md"):
                with open(full, encoding="utf-8") as f:
                    self.assertIn(anchor, anchors(f.read()),
                                  f"{relpath}: link to {target}: no such heading")

    def check_commands(self, relpath: str):
        problems = []
        for line, command in command_lines(read(relpath)):
            problems += [f"{relpath}:{line}: {problem}" for problem in check_command(command)]
        self.assertEqual(problems, [])

    def run_python(self, relpath: str):
        program = python_program(relpath)
        if not program:
            return
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=os.pathsep.join([ROOT] + sys.path), MPLBACKEND="Agg")
        with tempfile.TemporaryDirectory() as cwd:
            result = subprocess.run([sys.executable, "-c", program], cwd=cwd, env=env,
                                    capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
        self.assertEqual(result.returncode, 0,
                         f"{relpath}: its python blocks failed:\n{result.stdout[-4000:]}\n"
                         f"{result.stderr[-8000:]}")
        self.assertIn("docs_test: all blocks ran", result.stdout)


def _add_markdown_tests():
    for relpath in markdown_files():
        def test(self, relpath=relpath):
            self.check_links(relpath)
            self.check_commands(relpath)
            self.run_python(relpath)
        name = "test_" + re.sub(r"[^A-Za-z0-9]+", "_", relpath[:-len(".md")]).strip("_").lower()
        setattr(MarkdownTest, name, test)


_add_markdown_tests()


if __name__ == "__main__":
    absltest.main()
