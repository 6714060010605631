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
- every relative link of a file points to a file that exists;
- every `qat.<name>` a file writes (prose, code spans, any block; in python
  blocks also through `from qat import export`-style aliases) is documented
  in docs/api.md: a section (`qat.export`) or an entry of one
  (`qat.export.export_model`); a guide points to internals by file path
  (`qat/prepare/loops.py`), not by a dotted name a reader would import;
- no file names one of the project's own issues (`#12`, "issue 33"): readers
  do not see the tracker (TensorFlow's, `tensorflow#26664`, are theirs);
- each ```python block of README.md runs on its own: it uses no name that
  only an earlier block defines.

docs/architecture.md (for contributors, who use the internal names and the
tracker) and docs/api.md (generated) are left out of the name and issue
checks.

One test method per Markdown file, so Bazel shards split them.
"""
import ast
import functools
import glob
import json
import os
import re
import subprocess
import symtable
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
        assert keras_int8.path == "qat_keras_example/model_int8.tflite", keras_int8.path
        assert not export.find_float_ops(keras_int8.report), keras_int8.path
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
        assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync   # the prologue's two CPUs
        assert [id(v) for v in qnet.trainable_variables] == [id(v) for v in net.trainable_variables]
    """,
    "docs/recurrent_models.md": """
        assert not export.find_float_ops(kws_int8.report), kws_int8.path
        assert not export.find_float_ops(kws_io.report), kws_io.path
        assert [io.tensors[i].dtype for i in io.inputs + io.outputs] == [np.int8, np.int8]
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

# Run before a file's blocks, in the same process.
_PROLOGUES = {
    # The MirroredStrategy section trains on every GPU, or on every logical CPU device of a machine
    # without one: two here, made before TensorFlow starts (it refuses afterwards), so the test
    # trains two replicas.
    "docs/tf2_models.md": """
        import tensorflow as _tf
        _tf.config.set_logical_device_configuration(
            _tf.config.list_physical_devices("CPU")[0], [_tf.config.LogicalDeviceConfiguration()] * 2)
    """,
}

# Timeout of one file's blocks, in seconds.
_TIMEOUT_S = 900

# `qat.<dotted name>` anywhere in a file.
_QAT_NAME = re.compile(r"(?<![\w./>-])qat(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
# One of the project's own issues: `#12`, "issue 33", "issue #33" (not `tensorflow#26664`,
# not a link to a heading such as `#16-bit-activations-168`).
_ISSUE_REFERENCE = re.compile(r"(?<![\w/#-])#\d+\b(?!-)|\b[Ii]ssues? #?\d+\b")
# Files for contributors or generated, left out of the name and issue checks.
_INTERNAL_FILES = ("docs/architecture.md", "docs/api.md")


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
    prologue = textwrap.dedent(_PROLOGUES.get(relpath, ""))
    epilogue = textwrap.dedent(_EPILOGUES.get(relpath, ""))
    return ("import os\n" + prologue + "".join(parts) + epilogue
            + "\nprint('docs_test: all blocks ran')\n")


def documented_names(api_text: str):
    """({section}, {entry}) of docs/api.md: `qat.export`, `qat.export.export_model`, ..."""
    sections = set(re.findall(r"^## `(qat[\w.]*)`", api_text, re.MULTILINE))
    entries = set(re.findall(r"^### (?:class )?`(qat[\w.]*)`", api_text, re.MULTILINE))
    return sections, entries


def is_documented(name: str, sections, entries) -> bool:
    """Whether `name` is a section or entry of api.md, or an attribute of one
    (`qat.export.ExportedModel.parity`): its longest section prefix followed by
    the next part must be documented."""
    if name in sections or name in entries:
        return True
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:k]) in sections:
            head = ".".join(parts[:k + 1])
            return head in entries or head in sections
    return False


def _dotted(node: ast.AST):
    """`a.b.c` of an Attribute chain on a Name, as a list; None otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def qat_names_in_code(code: str):
    """The `qat.<name>`s a python block uses, aliases resolved
    (`from qat import export` ... `export.find_float_ops` is `qat.export.find_float_ops`)."""
    tree = ast.parse(code)
    aliases, names = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "qat":
                    names.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "qat":
            for alias in node.names:
                names.add(f"{node.module}.{alias.name}")
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts = _dotted(node)
            if parts and parts[0] in aliases:
                names.add(".".join([aliases[parts[0]]] + parts[1:]))
            elif parts and parts[0] == "qat":
                names.add(".".join(parts))
    return names


def undocumented_names(relpath: str, api_text: str):
    """(line, name) of each `qat.<name>` of a file that docs/api.md does not document."""
    sections, entries = documented_names(api_text)
    text = read(relpath)
    found = [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in _QAT_NAME.finditer(text)]
    for line, code in blocks(text, ("python", "py")):
        found += [(line, name) for name in sorted(qat_names_in_code(code))]
    return sorted({(line, name) for line, name in found
                   if not is_documented(name, sections, entries)})


def issue_references(text: str):
    """(line, text) of each reference to one of the project's issues."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in _ISSUE_REFERENCE.finditer(text)]


def names_from_earlier_blocks(code: str):
    """The global names a python block reads but neither binds nor imports
    itself (builtins aside): what it needs from an earlier block."""
    import builtins  # pylint: disable=g-import-not-at-top
    top = symtable.symtable(code, "<block>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    wanted = set()

    def visit(table, is_top):
        for symbol in table.get_symbols():
            if not symbol.is_referenced():
                continue
            if is_top and not (symbol.is_assigned() or symbol.is_imported()):
                wanted.add(symbol.get_name())
            elif not is_top and symbol.is_global() and not symbol.is_declared_global():
                wanted.add(symbol.get_name())
        for child in table.get_children():
            visit(child, False)

    visit(top, True)
    return sorted(name for name in wanted
                  if name not in bound and not hasattr(builtins, name))


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

    def test_undocumented_qat_names_are_found(self):
        api = "## `qat`\n### `qat.quantize_model`\n## `qat.report`\n### class `qat.report.Plot`\n"
        sections, entries = documented_names(api)
        self.assertTrue(is_documented("qat.quantize_model", sections, entries))
        self.assertTrue(is_documented("qat.report.Plot.path", sections, entries))
        self.assertFalse(is_documented("qat.report.tf2_models", sections, entries))
        self.assertFalse(is_documented("qat.prepare.loops.UnknownStepsError", sections, entries))
        self.assertEqual(
            qat_names_in_code("import qat\nfrom qat.report import tf2_models\n"
                              "from qat import export as e\n"
                              "tf2_models.layer_numerics_of_model(m)\ne.find_float_ops(r)\n"
                              "qat.tf2.ranges.UnplannedRangeError\n"),
            {"qat", "qat.report.tf2_models", "qat.report.tf2_models.layer_numerics_of_model",
             "qat.export", "qat.export.find_float_ops", "qat.tf2.ranges.UnplannedRangeError"})

    def test_issue_references_are_found(self):
        text = ("Fixed in issue #33 (see #38, Issue 12).\n"
                "TensorFlow's tensorflow#26664; [16x8](x.md#16-bit-activations-168); `a#1b`.\n")
        self.assertEqual([ref for _, ref in issue_references(text)],
                         ["issue #33", "#38", "Issue 12"])

    def test_names_from_earlier_blocks_are_found(self):
        code = ("import numpy as np\nx = np.ones(3)\n"
                "def f(a):\n    return a + y + x\n"
                "for k in range(2):\n    print(k, digits)\n")
        self.assertEqual(names_from_earlier_blocks(code), ["digits", "y"])

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

    def check_api_names(self, relpath: str):
        if relpath in _INTERNAL_FILES:
            return
        problems = [f"{relpath}:{line}: `{name}` is not in docs/api.md: use a public name, or "
                    "point to the file (qat/...py)"
                    for line, name in undocumented_names(relpath, read("docs/api.md"))]
        self.assertEqual(problems, [])

    def check_issue_references(self, relpath: str):
        if relpath in _INTERNAL_FILES:
            return
        problems = [f"{relpath}:{line}: {ref!r}: readers do not see the project's issues; "
                    "say what the issue was about" for line, ref in issue_references(read(relpath))]
        self.assertEqual(problems, [])

    def check_blocks_run_alone(self, relpath: str):
        """README's blocks: each a program of its own (the guides' build on each other)."""
        if relpath != "README.md":
            return
        problems = []
        for line, code in blocks(read(relpath), ("python", "py")):
            missing = names_from_earlier_blocks(code)
            if missing:
                problems.append(f"{relpath}:{line}: the block uses {missing} without defining them")
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
            self.check_api_names(relpath)
            self.check_issue_references(relpath)
            self.check_blocks_run_alone(relpath)
            self.run_python(relpath)
        name = "test_" + re.sub(r"[^A-Za-z0-9]+", "_", relpath[:-len(".md")]).strip("_").lower()
        setattr(MarkdownTest, name, test)


_add_markdown_tests()


if __name__ == "__main__":
    absltest.main()
