"""The layout of qat/ (docs/architecture.md, "Layout"), checked from the code.

Rooms. Every module of qat/ belongs to one room (`ROOMS`: packages and the
modules below them, or single modules). The rooms are ranked in the order a
graph passes through them, the ground first:

  0 graph_editor, 1 engine, 2 matching   the ground: what every stage uses
  3 prepare      graph normalisations every later pass relies on
  4 fold         batch norms folded into their layers
  5 plan         the quantize pass's decisions (qat.quantize.plan)
  6 emit         the quantizers built from a plan (qat.quantize.emit)
  7 distribute   replicas and workers share ranges (fills the plan's hook)
  8 api          the graph frontend: wires prepare -> fold -> plan -> emit
  9 tflite       reading what qat built and the converter's names
  10 export, 11 report
  12 frontends and faces: compat, clients, tf2, the package face qat

Imports (every `import` and `from ... import` in a module, at any depth,
function-level ones included; an import names the module it imports, or for
`from package import name` the submodule `name` when there is one):

  * a module may import modules of its own room and of rooms ranked below,
    never of a room ranked above ("an arrow back up"); rooms of one rank (the
    frontends) may import each other;
  * no two modules import each other, directly or through others (no cycle);
  * the house has at most 11 floors: a room's floor is one above the highest
    room it imports (1 for one that imports no other);
  * no module of qat/ is over 400 lines, nor of tools/;
  * docs/architecture.md names every module of qat/, and a package's
    `__init__` docstring that lists its modules lists them all;
  * no class of qat/ is over 600 lines counting its bases: the lines of the
    class and of every base class defined in qat/, transitively (mixins
    sharing state through `self` are one class);
  * the plan (qat/quantize/plan/) keeps at most 5 modules at its root, the
    rest in sub-packages, one per question (docs/architecture.md); the
    sub-packages import each other without a cycle and never import a
    module of the plan's root (the driver above them), and each package's
    `__init__` docstring names all its modules and sub-packages.

The walk. `experimental_create_training_graph` runs on a small conv + batch
norm + ReLU network with a loss while `sys.setprofile` records every call
into a qat function that passes the graph: a `tf.Graph`, an op or tensor, or
a list, tuple, set, dict or object (its instance attributes, one level) that
holds one, as an argument (`self` included). The pipeline stages are ranked
prepare < fold < plan < emit < distribute. A call is made *from* the stage of
the innermost calling frame that is in a stage or in api (frames of the
ground, of TensorFlow and of this test are passed over), and goes *to* the
stage of the called function.

A climb is such a call (never a return) that goes back to an earlier stage:

  * from a stage S to a stage ranked below S (fold calling prepare, emit
    calling plan, distribute calling plan); or
  * from api, to a stage ranked below the highest stage api has already
    handed the graph to (api running the stages out of order).

Calls into the ground, calls within a room and calls from a lower stage up
into a higher one (the planner calling the hook distribute fills) are not
climbs. Each climbing call site (calling function, called function) counts
once, however often it runs. `MAX_CLIMBS` bounds the count.
"""
import ast
import collections
import os
import re
import sys
import tempfile
import types
from typing import Dict, List, Optional, Set, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
QAT_DIR = os.path.join(ROOT, "qat")
MAX_LINES = 400
MAX_CLASS_LINES = 600
MAX_CLIMBS = 3
MAX_FLOORS = 11
PLAN = "qat.quantize.plan"
MAX_PLAN_ROOT_MODULES = 5

# (room, rank, packages: these and every module below them, modules: just these).
ROOMS = [
    ("graph_editor", 0, ["qat.graph_editor"], []),
    ("engine", 1, ["qat.engine"], []),
    ("matching", 2, ["qat.matching"], []),
    ("prepare", 3, ["qat.prepare"], []),
    ("fold", 4, ["qat.fold"], []),
    # qat.quantize's own __init__ and the old path of control_flow belong to plan.
    ("plan", 5, ["qat.quantize.plan"], ["qat.quantize", "qat.quantize.control_flow"]),
    ("emit", 6, ["qat.quantize.emit"], []),
    ("distribute", 7, ["qat.distribute"], []),
    ("api", 8, [], ["qat.api"]),
    ("tflite", 9, ["qat.tflite"], []),
    ("export", 10, ["qat.export"], []),
    ("report", 11, ["qat.report"], []),
    # Old paths of qat.compat's modules, kept for one release, are compat's.
    ("compat", 12, ["qat.compat"], ["qat.compat_hparams", "qat.compat_tf1"]),
    ("clients", 12, ["qat.clients"], []),
    ("tf2", 12, ["qat.tf2"], []),
    ("face", 12, [], ["qat"]),
]
RANK = {room: rank for room, rank, _, _ in ROOMS}
# The stages a graph passes through, in order (the walk's rooms).
STAGES = ("prepare", "fold", "plan", "emit", "distribute")


TOOLS_DIR = os.path.join(ROOT, "tools")
def tools_line_counts() -> Dict[str, int]:
    """{file: lines} of every .py file under tools/."""
    counts = {}
    for dirpath, _, files in os.walk(TOOLS_DIR):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    counts[path] = sum(1 for _ in f)
    return counts


def room_of(module: str) -> Optional[str]:
    """The room a qat module belongs to (None: none declared)."""
    best, best_len = None, -1
    for room, _, packages, modules in ROOMS:
        for name in modules:
            if module == name and len(name) > best_len:
                best, best_len = room, len(name)
        for name in packages:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = room, len(name)
    return best


def qat_modules() -> Dict[str, str]:
    """{module name: file} for every .py file under qat/."""
    found = {}
    for dirpath, _, files in os.walk(QAT_DIR):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            module = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
            if module.endswith(".__init__"):
                module = module[:-len(".__init__")]
            found[module] = path
    return found


def imports_of(module: str, path: str, modules) -> Set[str]:
    """The qat modules `module` imports, at any depth of its code."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]

    def nearest(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(nearest(a.name) for a in node.names if a.name.split(".")[0] == "qat")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = base + ("." + node.module if node.module else "")
            else:
                source = node.module or ""
            if source.split(".")[0] != "qat":
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else nearest(source))
    found.discard(module)
    found.discard("")
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = qat_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    """'a (room, rank) -> b (room, rank)' for each import of a higher room."""
    found = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            low, high = room_of(module), room_of(other)
            if low is None or high is None:
                continue  # Reported by the room check.
            if RANK[high] > RANK[low]:
                found.append(f"{module} ({low}, {RANK[low]}) -> {other} ({high}, {RANK[high]})")
    return found


def room_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """The import graph by room (a folder of qat/, or the modules `ROOMS`
    gives one): room -> the other rooms its modules import."""
    rooms: Dict[str, Set[str]] = {}
    for module, imported in graph.items():
        room = room_of(module)
        rooms.setdefault(room, set()).update(
            room_of(o) for o in imported if room_of(o) not in (room, None))
    rooms.pop(None, None)
    return rooms


def floors(rooms: Dict[str, Set[str]]) -> Dict[str, int]:
    """{room: its floor}: 1 for a room that imports no other, else one above
    the highest room it imports (the rooms must have no cycle)."""
    found: Dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in found:
            found[room] = 1 + max((floor(o) for o in rooms.get(room, ())), default=0)
        return found[room]

    for room in rooms:
        floor(room)
    return found


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _imported_names(module: str, tree: ast.Module, modules) -> Dict[str, Tuple[str, Optional[str]]]:
    """{local name: (qat module, None) or (qat module, attribute)} of `module`'s imports."""
    package = module.rpartition(".")[0]
    names: Dict[str, Tuple[str, Optional[str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "qat":
                    names[a.asname or a.name] = (a.name, None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base += "." + node.module if node.module else ""
            if base.split(".")[0] != "qat":
                continue
            for a in node.names:
                submodule = f"{base}.{a.name}"
                names[a.asname or a.name] = ((submodule, None) if submodule in modules
                                             else (base, a.name))
    return names


def _dotted(expr) -> Optional[str]:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return head + "." + expr.attr if head else None
    return None


def class_sizes(sources: Dict[str, str]) -> Dict[str, int]:
    """{module.class: lines of the class and of all its bases defined in `sources`}.

    `sources`: {module name: its source text}. A base is found through the
    module's imports (`from qat.x import y` then `y.Base`, `from qat.x.y
    import Base`, re-exports followed) or in the module itself; it counts
    once however many paths lead to it. Bases outside `sources` (object,
    tf.Module) count 0.
    """
    lines: Dict[Tuple[str, str], int] = {}
    named: Dict[Tuple[str, str], List[str]] = {}  # class -> its bases, as written
    imports = {}
    for module, text in sources.items():
        tree = ast.parse(text)
        imports[module] = _imported_names(module, tree, sources)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                lines[(module, node.name)] = node.end_lineno - node.lineno + 1
                named[(module, node.name)] = [n for n in map(_dotted, node.bases) if n]

    def resolve(module: str, name: str) -> Optional[Tuple[str, str]]:
        """The class `name` (as written in `module`) is, if defined in `sources`."""
        parts = name.split(".")
        for _ in range(20):  # Through re-exports.
            if len(parts) == 1 and (module, parts[0]) in lines:
                return module, parts[0]
            for k in range(len(parts), 0, -1):
                prefix, rest = ".".join(parts[:k]), parts[k:]
                if prefix in imports.get(module, {}):
                    target, attribute = imports[module][prefix]
                    break
            else:
                return None
            if attribute is not None and not rest:
                module, parts = target, [attribute]
            elif attribute is None and len(rest) == 1:
                module, parts = target, rest
            else:
                return None
        return None

    sizes = {}
    for key in lines:
        seen, stack = {key}, [key]
        while stack:
            top = stack.pop()
            for name in named[top]:
                base = resolve(top[0], name)
                if base is not None and base not in seen:
                    seen.add(base)
                    stack.append(base)
        sizes[f"{key[0]}.{key[1]}"] = sum(lines[k] for k in seen)
    return sizes


def plan_room(module: str, packages: Set[str]) -> str:
    """The part of the plan a module of qat.quantize.plan belongs to: its
    sub-package (`ops`, `model`, ...), or `<root>.<name>` for a module at the
    plan's root (`<root>.__init__` for the plan's own `__init__`).

    `packages`: the modules that are packages (an `__init__.py`).
    """
    if module == PLAN:
        return "<root>.__init__"
    first = module[len(PLAN) + 1:].split(".")[0]
    return first if PLAN + "." + first in packages else "<root>." + first


def plan_room_graph(graph: Dict[str, Set[str]], packages: Set[str]) -> Dict[str, Set[str]]:
    """The plan's import graph by sub-package (`plan_room`): room -> rooms it imports."""
    def in_plan(m):
        return m == PLAN or m.startswith(PLAN + ".")

    rooms: Dict[str, Set[str]] = {}
    for module, imported in graph.items():
        if not in_plan(module):
            continue
        room = plan_room(module, packages)
        rooms.setdefault(room, set()).update(
            plan_room(o, packages) for o in imported
            if in_plan(o) and plan_room(o, packages) != room)
    return rooms


def plan_room_problems(rooms: Dict[str, Set[str]]) -> List[str]:
    """Sub-packages importing a root module of the plan, and import cycles."""
    found = [f"{room} -> {other}" for room, imported in sorted(rooms.items())
             if not room.startswith("<root>.")
             for other in sorted(imported) if other.startswith("<root>.")]
    found += ["cycle: " + " ".join(group) for group in cycles(rooms)]
    return found


def plan_root_modules() -> List[str]:
    """The .py files directly in qat/quantize/plan/."""
    directory = os.path.join(QAT_DIR, "quantize", "plan")
    return sorted(f for f in os.listdir(directory) if f.endswith(".py"))


def unnamed_modules(package_dir: str) -> List[str]:
    """The modules and sub-packages of a package its `__init__` docstring does not name."""
    with open(os.path.join(package_dir, "__init__.py"), encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", doc))
    parts = [f[:-len(".py")] for f in os.listdir(package_dir)
             if f.endswith(".py") and f != "__init__.py"]
    parts += [d for d in os.listdir(package_dir)
              if os.path.exists(os.path.join(package_dir, d, "__init__.py"))]
    return sorted(p for p in parts if p not in words)


def listed_modules_missing(package_dir: str) -> List[str]:
    """The public modules and sub-packages an `__init__` docstring that lists
    modules leaves out: [] for one that names none, or one (the package's
    face naming its main module is no list)."""
    parts = [f[:-len(".py")] for f in os.listdir(package_dir)
             if f.endswith(".py") and f != "__init__.py" and not f.startswith("_")]
    parts += [d for d in os.listdir(package_dir)
              if os.path.exists(os.path.join(package_dir, d, "__init__.py"))]
    missing = [p for p in unnamed_modules(package_dir) if p in parts]
    return sorted(missing) if len(parts) - len(missing) > 1 else []


def architecture_layout(text: str) -> Dict[str, str]:
    """{directory under qat/ ("" for qat/ itself): the text of its entry} in
    the layout block of docs/architecture.md (the code block starting `qat/`).

    An entry is a line naming a directory (`  engine/`, `    ops/` below the
    entry above it) and the lines indented under it; a line naming a module
    of qat/ itself (`  api.py`) belongs to "".
    """
    start = text.find("\nqat/ ")
    opening = text.rfind("```", 0, start + 1) if start >= 0 else -1
    block = (re.search(r"^```\n(.*?)^```", text[opening:], re.MULTILINE | re.DOTALL)
             if opening >= 0 else None)
    entries: Dict[str, str] = {}
    stack: List[Tuple[int, str]] = []  # (indent, directory)
    current = None
    for line in (block.group(1) if block else "").splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        head = stripped.split(" ")[0] if stripped else ""
        if indent == 0:
            current = "" if head == "qat/" else None
            stack = []
        elif head.endswith("/") and indent < 8:
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] + "/" if stack else ""
            current = parent + head.rstrip("/")
            stack.append((indent, current))
        elif head.endswith(".py") and indent < 8:
            current, stack = "", []
        if current is not None:
            entries[current] = entries.get(current, "") + " " + stripped
    return entries


def modules_not_in_architecture(text: str, modules: Dict[str, str]) -> List[str]:
    """The modules of qat/ docs/architecture.md does not name.

    A module is named by its name (the file name without `.py`) in the layout
    entry of its directory, or anywhere in the text by its path from qat/
    (`quantize/__init__.py`) or its dotted name in backticks (`qat.compat_tf1`,
    the old paths); a package by its entry (or an entry below it).
    """
    entries = architecture_layout(text)
    missing = []
    for module, path in sorted(modules.items()):
        relative = os.path.relpath(path, QAT_DIR).replace(os.sep, "/")
        directory, _, name = relative.rpartition("/")
        if relative in text or f"`{module}`" in text:
            continue
        if name == "__init__.py":
            if directory and not any(e == directory or e.startswith(directory + "/")
                                     for e in entries):
                missing.append(module)
            continue
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?:\.py)?", entries.get(directory, "")))
        if name[:-len(".py")] not in words and name not in words:
            missing.append(module)
    return missing


# The public packages any tool may import (docs/architecture.md, "What tools/ read of qat").
PUBLIC_PACKAGES = frozenset(["qat", "qat.api", "qat.export", "qat.report", "qat.compat"])


def documented_tool_interfaces(text: str) -> Set[str]:
    """The qat modules the table of "What tools/ read of qat" names (first column)."""
    start = text.find("### What tools/ read of qat")
    if start < 0:
        return set()
    end = text.find("\n### ", start + 1)
    section = text[start:end if end > 0 else len(text)]
    return set(re.findall(r"^\| `(qat[A-Za-z0-9_.]*)` \|", section, re.MULTILINE))


def undocumented_tool_imports(directory: str, documented: Set[str]) -> List[str]:
    """'file: qat module' for each import of qat in `directory`'s .py files
    that is neither a public package nor a documented interface."""
    modules = qat_modules()
    found = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".py"):
            continue
        path = os.path.join(directory, name)
        for module in sorted(imports_of("tools." + name[:-len(".py")], path, modules)):
            if module not in PUBLIC_PACKAGES and module not in documented:
                found.append(f"{os.path.relpath(path, ROOT)}: {module}")
    return found


def packages_of(modules: Dict[str, str]) -> Set[str]:
    """The modules of `qat_modules()` that are packages."""
    return {m for m, path in modules.items() if path.endswith("__init__.py")}


class ImportLayoutTest(absltest.TestCase):
    """The import graph drawn from the code, held to the room order."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.graph = import_graph()

    def test_every_module_belongs_to_a_room(self):
        self.assertEqual([m for m in sorted(self.graph) if room_of(m) is None], [])

    def test_every_declared_room_has_a_place(self):
        present = {room_of(m) for m in self.graph}
        self.assertEqual(sorted(set(RANK) - present), [])

    def test_no_import_runs_back_up(self):
        self.assertEqual(upward_imports(self.graph), [])

    def test_no_import_cycle(self):
        self.assertEqual(cycles(self.graph), [])

    def test_the_house_has_at_most_11_floors(self):
        # A room's floor is one above the highest room it imports: an import
        # that lifts a room (the TF 2 frontend reading report/ for a warning)
        # shows here before the house grows a floor.
        found = floors(room_graph(self.graph))
        print("floors:", max(found.values()), sorted(found.items(), key=lambda kv: kv[1]))
        self.assertLessEqual(max(found.values()), MAX_FLOORS, found)

    def test_no_module_over_400_lines(self):
        long = []
        for module, path in sorted(qat_modules().items()):
            with open(path, encoding="utf-8") as f:
                count = sum(1 for _ in f)
            if count > MAX_LINES:
                long.append(f"{module}: {count} lines")
        self.assertEqual(long, [])

    def test_no_tools_module_over_400_lines(self):
        # tools/ (the commands and the property suites) keep the guideline too.
        long = [f"{os.path.relpath(path, ROOT)}: {count} lines"
                for path, count in sorted(tools_line_counts().items()) if count > MAX_LINES]
        self.assertEqual(long, [], "split these tools modules by responsibility")

    def test_no_class_over_600_lines_with_its_bases(self):
        sources = {}
        for module, path in qat_modules().items():
            with open(path, encoding="utf-8") as f:
                sources[module] = f.read()
        sizes = class_sizes(sources)
        over = [f"{name}: {n} lines with its bases" for name, n in sorted(sizes.items())
                if n > MAX_CLASS_LINES]
        self.assertEqual(over, [])

    def test_plan_keeps_at_most_5_modules_at_its_root(self):
        self.assertLessEqual(len(plan_root_modules()), MAX_PLAN_ROOT_MODULES,
                             plan_root_modules())

    def test_plan_sub_packages_import_no_cycle_and_not_the_root(self):
        rooms = plan_room_graph(self.graph, packages_of(qat_modules()))
        self.assertEqual(plan_room_problems(rooms), [])
        self.assertGreater(len([r for r in rooms if not r.startswith("<root>.")]), 1)

    def test_plan_init_docstrings_name_all_their_modules(self):
        plan_dir = os.path.join(QAT_DIR, "quantize", "plan")
        for directory, _, files in os.walk(plan_dir):
            if "__init__.py" in files:
                self.assertEqual(unnamed_modules(directory), [], directory)

    def test_init_docstrings_that_list_modules_list_them_all(self):
        # qat/__init__.py is the package face: its docstring (api.md's first
        # page) names what users import, not the rooms (docs/architecture.md).
        for directory, _, files in os.walk(QAT_DIR):
            if "__init__.py" in files and directory != QAT_DIR:
                self.assertEqual(listed_modules_missing(directory), [], directory)

    def test_architecture_names_every_module(self):
        with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(modules_not_in_architecture(text, qat_modules()), [],
                         "docs/architecture.md, Layout: name these modules in their room's entry")

    def test_the_architecture_check_can_fail(self):
        text = ("```\nqat/      the library\n  engine/     config (settings), placement\n"
                "    sub/      inner\n  api.py      the frontend\n  __init__.py   the face\n"
                "tools/    commands: rewrite\n```\nOld paths: `compat_tf1.py`.\n")
        entries = architecture_layout(text)
        self.assertEqual(sorted(entries), ["", "engine", "engine/sub"])
        modules = {m: os.path.join(QAT_DIR, *rel.split("/")) for m, rel in (
            ("qat", "__init__.py"), ("qat.api", "api.py"), ("qat.compat_tf1", "compat_tf1.py"),
            ("qat.engine", "engine/__init__.py"), ("qat.engine.config", "engine/config.py"),
            ("qat.engine.rewrite", "engine/rewrite.py"), ("qat.engine.sub.x", "engine/sub/x.py"),
            ("qat.report", "report/__init__.py"))}
        # rewrite is named under tools/, not in engine's entry.
        self.assertEqual(modules_not_in_architecture(text, modules),
                         ["qat.engine.rewrite", "qat.engine.sub.x", "qat.report"])

    def test_property_suites_read_qat_through_documented_interfaces(self):
        with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
            documented = documented_tool_interfaces(f.read())
        self.assertIn("qat.export.kernel_checks", documented)
        self.assertEqual(undocumented_tool_imports(os.path.join(TOOLS_DIR, "property"),
                                                   documented), [])

    def test_the_tool_interface_check_can_fail(self):
        directory = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        with open(os.path.join(directory, "suite.py"), "w", encoding="utf-8") as f:
            f.write("import qat\nfrom qat.export import kernel_checks\n"
                    "from qat.prepare import loops\n")
        self.assertEqual(undocumented_tool_imports(directory, {"qat.export.kernel_checks"}),
                         [os.path.relpath(os.path.join(directory, "suite.py"), ROOT)
                          + ": qat.prepare.loops"])
        self.assertEqual(documented_tool_interfaces(
            "### What tools/ read of qat\n\n| `qat.engine.marks` | x | y |\n\n### Next\n"
            "| `qat.prepare` | x | y |\n"), {"qat.engine.marks"})

    def test_every_package_has_an_init(self):
        # setuptools (`pip install .`) installs only directories with an __init__.py.
        missing = [os.path.relpath(d, ROOT) for d, _, files in os.walk(QAT_DIR)
                   if any(f.endswith(".py") for f in files) and "__init__.py" not in files]
        self.assertEqual(missing, [])

    def test_the_checks_can_fail(self):
        # An arrow back up, a cycle, and modules of no room are caught.
        made_up = {"qat.prepare.x": {"qat.fold.y"}, "qat.fold.y": {"qat.prepare.x"}}
        self.assertLen(upward_imports(made_up), 1)
        self.assertEqual(cycles(made_up), [["qat.fold.y", "qat.prepare.x"]])
        self.assertIsNone(room_of("qat.quantize.new_module"))
        self.assertIsNone(room_of("qat.stray"))
        self.assertEqual(room_of("qat.quantize.plan.ranges.rules"), "plan")
        self.assertEqual(room_of("qat.quantize"), "plan")
        made_up = {"qat.engine.a": set(), "qat.matching.b": {"qat.engine.a"},
                   "qat.prepare.c": {"qat.matching.b", "qat.engine.a"},
                   "qat.report.d": {"qat.prepare.c"}, "qat.tf2.e": {"qat.report.d"}}
        self.assertEqual(floors(room_graph(made_up)),
                         {"engine": 1, "matching": 2, "prepare": 3, "report": 4, "tf2": 5})

    def test_the_plan_checks_can_fail(self):
        # A sub-package importing the planner, two importing each other, a
        # class whose mixins add up, too many root modules, an unnamed module.
        packages = {PLAN, PLAN + ".ops", PLAN + ".ranges"}
        made_up = {PLAN + ".ops.a": {PLAN + ".ranges.b"},
                   PLAN + ".ranges.b": {PLAN + ".ops.a", PLAN + ".planner"},
                   PLAN + ".planner": {PLAN + ".ranges.b"}}
        rooms = plan_room_graph(made_up, packages)
        self.assertEqual(rooms, {"ops": {"ranges"}, "ranges": {"ops", "<root>.planner"},
                                 "<root>.planner": {"ranges"}})
        self.assertEqual(plan_room_problems(rooms),
                         ["ranges -> <root>.planner", "cycle: <root>.planner ops ranges"])
        self.assertEqual(plan_room_problems({"ops": set(), "ranges": {"ops"},
                                             "<root>.planner": {"ranges"}}), [])
        body = "    x = 1\n"
        sources = {"qat.a": "class Base(object):\n" + body * 299,
                   "qat.b": "class Mixin(object):\n" + body * 199,
                   "qat.c": ("from qat import a\nfrom qat.b import Mixin\n"
                             "class Big(a.Base, Mixin):\n" + body * 149),
                   "qat.d": "from qat.c import Mixin\nclass Small(Mixin):\n" + body * 9}
        sizes = class_sizes(sources)
        self.assertEqual(sizes["qat.c.Big"], 300 + 200 + 150)
        self.assertEqual(sizes["qat.d.Small"], 10 + 200)  # Through a re-export.
        self.assertEqual([n for n, k in sizes.items() if k > MAX_CLASS_LINES], ["qat.c.Big"])
        directory = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        for name in ("__init__.py", "listed.py", "forgotten.py"):
            with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
                f.write('"""A package.\n\n  listed -> a module\n"""\n' if name == "__init__.py"
                        else "")
        self.assertEqual(unnamed_modules(directory), ["forgotten"])

    def test_old_paths_give_the_moved_modules(self):
        # docs/architecture.md, "Old paths, kept for one release".
        import importlib  # pylint: disable=g-import-not-at-top
        import warnings  # pylint: disable=g-import-not-at-top
        old_paths = {"qat.compat_hparams": "qat.compat.hparams",
                     "qat.compat_tf1": "qat.compat.tf1",
                     "qat.quantize.control_flow": "qat.quantize.plan.model.control_flow"}
        for old, new in old_paths.items():
            sys.modules.pop(old, None)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            self.assertIs(module, importlib.import_module(new))
            self.assertTrue(any(issubclass(w.category, DeprecationWarning) for w in caught), old)

    def test_function_level_imports_count(self):
        modules = {"qat.report.x": "", "qat.api": ""}
        path = os.path.join(absltest.get_default_test_tmpdir(), "lazy.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write("def f():\n    from qat import api\n    return api\n")
        self.assertEqual(imports_of("qat.report.x", path, modules), {"qat.api"})


# --- The walk ---------------------------------------------------------------


def _carries_graph(value, depth: int = 2) -> bool:
    """Whether `value` is, or holds, a graph, an op or a tensor (see the docstring)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if isinstance(value, (tf.Graph, tf.Operation, tf.Tensor)):
        return True
    if depth == 0 or isinstance(value, (str, bytes, int, float, bool, type(None), type,
                                        types.ModuleType, types.FunctionType)):
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_carries_graph(v, depth - 1) for v in list(value)[:20])
    if isinstance(value, dict):
        items = list(value.items())[:20]
        return any(_carries_graph(k, depth - 1) or _carries_graph(v, depth - 1) for k, v in items)
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):  # Instance attributes only: no property runs.
        return any(_carries_graph(v, depth - 1) for v in list(attributes.values())[:40])
    return False


class Walk(object):
    """Records the graph-carrying calls between rooms (see the module docstring)."""

    def __init__(self):
        self.transitions: "collections.OrderedDict[tuple, int]" = collections.OrderedDict()
        self.climbs: "collections.OrderedDict[tuple, str]" = collections.OrderedDict()
        self.rooms: Set[str] = set()
        self._api_reached = 0  # The highest stage api has handed the graph to (rank).

    @staticmethod
    def _where(frame) -> Tuple[Optional[str], str]:
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        return (room_of(module) if module.split(".")[0] == "qat" else None), module

    def profile(self, frame, event, arg):  # pylint: disable=unused-argument
        if event != "call":
            return
        callee_room, callee_module = self._where(frame)
        if callee_room is None:
            return
        # The stage (or api) the call comes from: the innermost such calling frame.
        caller, from_room, from_frame = frame.f_back, None, None
        direct_room, _ = self._where(caller)
        while caller is not None:
            room, _ = self._where(caller)
            if room in STAGES or room == "api":
                from_room, from_frame = room, caller
                break
            caller = caller.f_back
        if direct_room == callee_room:
            return  # Within a room.
        code = frame.f_code
        argument_names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount
                                          + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)]
        if not any(_carries_graph(frame.f_locals.get(n)) for n in argument_names):
            return
        callee = f"{callee_module}.{code.co_name}"
        origin = (f"{from_frame.f_globals['__name__']}.{from_frame.f_code.co_name}"
                  if from_frame is not None else "(caller)")
        self.rooms.update(r for r in (direct_room, callee_room) if r)
        key = (direct_room or "-", callee_room, origin, callee)
        self.transitions[key] = self.transitions.get(key, 0) + 1
        if callee_room not in STAGES or from_room is None or from_room == callee_room:
            return
        rank = RANK[callee_room]
        if from_room == "api":
            climbed = rank < self._api_reached
            self._api_reached = max(self._api_reached, rank)
        else:
            climbed = rank < RANK[from_room]
        if climbed and (origin, callee) not in self.climbs:
            self.climbs[(origin, callee)] = f"{from_room} -> {callee_room}: {origin} -> {callee}"

    def format(self) -> str:
        lines = [f"walk: {len(self.transitions)} distinct calls between rooms, "
                 f"{len(self.rooms)} rooms, {len(self.climbs)} climbs"]
        for (src, dst, origin, callee), count in self.transitions.items():
            climb = "  CLIMB" if (origin, callee) in self.climbs else ""
            lines.append(f"  {src:>12} -> {dst:<12} {callee} (from {origin}) x{count}{climb}")
        return "\n".join(lines)


def _network():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        net = tf1.layers.conv2d(images, 4, 3, use_bias=False, name="conv")
        net = tf.nn.relu(tf1.layers.batch_normalization(net, training=True, name="conv/bn"))
        logits = tf1.layers.dense(tf1.layers.flatten(net), 2, name="logits")
        tf.reduce_mean(tf.square(logits), name="loss")
    return graph


def walk_training_rewrite() -> Walk:
    """The walk of `experimental_create_training_graph` on `_network()`."""
    import qat  # pylint: disable=g-import-not-at-top
    graph = _network()
    walk = Walk()
    sys.setprofile(walk.profile)
    try:
        qat.experimental_create_training_graph(graph, symmetric_weights=True)
    finally:
        sys.setprofile(None)
    return walk


class WalkTest(absltest.TestCase):
    """Following input_graph from experimental_create_training_graph."""

    def test_the_walk_climbs_back_at_most_three_times(self):
        walk = walk_training_rewrite()
        print(walk.format())
        self.assertIn("prepare", walk.rooms)
        self.assertIn("emit", walk.rooms)
        self.assertLessEqual(len(walk.climbs), MAX_CLIMBS, walk.format())

    def test_a_climb_is_counted(self):
        # Put back the fold's old call of the layer-call inlining (fold -> prepare)
        # with a function living in the fold module: the walk counts one climb more.
        from qat.fold import fold_batch_norms as fold_lib  # pylint: disable=g-import-not-at-top
        original = fold_lib.fold_graph
        namespace = dict(vars(fold_lib), _original=original)
        exec("def fold_graph(graph, config, use_cond=False):\n"  # pylint: disable=exec-used
             "    from qat.prepare import layer_calls\n"
             "    layer_calls.inline_layer_calls(graph)\n"
             "    return _original(graph, config, use_cond)\n", namespace)
        baseline = walk_training_rewrite()
        fold_lib.fold_graph = namespace["fold_graph"]
        try:
            changed = walk_training_rewrite()
        finally:
            fold_lib.fold_graph = original
        self.assertLen(changed.climbs, len(baseline.climbs) + 1, changed.format())
        self.assertIn("fold -> prepare", "\n".join(changed.climbs.values()))


if __name__ == "__main__":
    absltest.main()
