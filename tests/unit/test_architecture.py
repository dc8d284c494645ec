"""The layout of dpmp_lab, read from the source (nothing is imported), so that it stays a house a
new maintainer can read top to bottom.

1. No import cycles among dpmp_lab's modules, counting imports inside functions too: a loop
   held together by an import placed in a function is still a loop. How imports are read:
   - `import dpmp_lab.x` and `from dpmp_lab.x import name` import dpmp_lab.x;
     `from dpmp_lab.x import y` imports dpmp_lab.x.y when that is a module. Relative imports
     are resolved the same way. Imports under `if TYPE_CHECKING:` never run and are skipped.
   - The package itself, dpmp_lab/__init__.py, is the learner's facade `dl`: it binds, on
     first use, what dpmp_lab/api.py imports, so its own imports never count (api.py's do: it
     sits in the top layer). A module that imports the package (`import dpmp_lab as dl`,
     `from dpmp_lab import x`) depends on what it uses it for: `dl.viz` on dpmp_lab.viz, a
     re-exported `dl.ProcessGrid` on dpmp_lab.grid, where api.py gets it; a name the facade
     defines itself (`dl.__version__`, `dl.load`) on nothing.
   - A subpackage (dpmp_lab.tp, ...) is an ordinary module: its __init__ imports its
     submodules, so a submodule that imports a name from its own package closes a loop.
2. A module over MAX_LINES lines says in its docstring why it stays whole, with a sentence
   starting with the marker WHOLE, e.g. "Why it stays whole: the hook and the events it makes
   are one mechanism ...". Otherwise split it where it has a seam.
3. dpmp_lab.render, the drawing primitives every module may use, imports nothing from dpmp_lab.
4. A name with a leading underscore is its module's own: no other module of the package imports
   it (`from dpmp_lab.x import _name`) or reads it from the module (`x._name`); a name that
   several modules use is public.
5. Every module outside launcher/ and instructor/ (what a learner may open, and the grader's
   check/) says what it offers in `__all__`, and every name there is bound in the module.
6. The layers: LAYERS below gives every module its layer, and a module imports only from its own
   layer or below. ARCHITECTURE.md draws the same map: every entry of LAYERS is named on the
   line of its layer there.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE_DIR = ROOT / "dpmp_lab"
ARCHITECTURE = PACKAGE_DIR.parent / "ARCHITECTURE.md"
MAX_LINES = 400
WHOLE = "Why it stays whole:"

# The layers, bottom (0) to top (6): a module or package (all its modules) and its layer. The
# longest entry that a module's name starts with gives its layer.
LAYERS = {
    # 0: imports nothing from dpmp_lab but other layer-0 modules
    "render": 0, "_helpers": 0, "_torch_helpers": 0, "compat": 0, "integrity": 0, "preloaded": 0,
    "launcher.protocol": 0,
    "launcher.lines": 0, "launcher.serialize": 0, "launcher.processes": 0, "launcher.cores": 0,
    "launcher.hints": 0, "launcher.flight": 0,
    "instructor.scan": 0, "instructor.sandbox": 0, "instructor.limits": 0,
    "instructor.nbgrader_steps": 0, "instructor.submitted": 0,
    "instructor.server_paths": 0, "instructor.inert": 0, "instructor.markup": 0,
    "harness.cells": 0, "harness.exchange": 0, "i18n": 0,
    # 1: what a rank knows and records
    "context": 1, "trace": 1, "launcher.audit": 1, "launcher.collective_inputs": 1,
    # 2: launching ranks, and the groups of a grid
    "launcher": 2, "grid": 2,
    # 3: the parallelisms and the measurements, the references learners read
    "models": 3, "collectives": 3, "cost": 3, "dp": 3, "tp": 3, "pp": 3, "hybrid": 3,
    "fsdp": 3, "footprint": 3, "cp": 3, "moe": 3, "profiling": 3, "bench": 3,
    # 4: the grader's checks
    "check": 4,
    # 5: pictures of everything below
    "viz": 5, "harness": 5,
    # 6: the facade and its API, the commands, the notebook magic, grading a class
    "": 6, "api": 6, "cli": 6, "magic": 6, "nbgrader_plugin": 6, "instructor": 6,
}


def layer_of(module: str) -> int | None:
    """The layer of a dotted module name under dpmp_lab (None: LAYERS does not place it)."""
    name = module.removeprefix(PACKAGE_DIR.name).removeprefix(".")
    for entry in sorted(LAYERS, key=len, reverse=True):
        if name == entry or name.startswith(entry + "."):
            return LAYERS[entry]
    return None


@dataclass(frozen=True)
class Edge:
    """`source` imports `target`, at `line` of `path`; `function` names the function it is in."""

    source: str
    target: str
    path: Path
    line: int
    function: str | None

    def __str__(self) -> str:
        where = f" (inside {self.function})" if self.function else ""
        return f"{self.path}:{self.line}{where}"


def find_modules(package_dir: Path) -> dict[str, Path]:
    """{dotted module name: file} for every module of the package, a package being its
    __init__.py."""
    root = package_dir.name
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [root, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, str | None]]:
    """Every import statement with the function it sits in ("Class.method"; None at module
    level), skipping `if TYPE_CHECKING:` blocks."""
    found: list[tuple[ast.Import | ast.ImportFrom, str | None]] = []

    def visit(node: ast.AST, scope: list[str], in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    visit(stmt, scope, in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, ".".join(scope) if in_function else None))
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, [*scope, child.name], True)
            elif isinstance(child, ast.ClassDef):
                visit(child, [*scope, child.name], in_function)
            else:
                visit(child, scope, in_function)

    visit(tree, [], False)
    return found


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The dotted module a `from ... import` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


FACADE_API = "api"   # the module whose names the package's facade binds (dpmp_lab/api.py)


def _facade_names(root: str, modules: dict[str, Path]) -> dict[str, str]:
    """{name: module} for the names the package's facade re-exports from its modules (those
    FACADE_API imports)."""
    names = {}
    api = f"{root}.{FACADE_API}"
    for node, _ in _imports(ast.parse(modules[api].read_text())):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, api, is_package=False)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                names[alias.asname or alias.name] = sub if sub in modules else source
    return {name: module for name, module in names.items() if module in modules}


def _via_facade(parts: list[str], root: str, modules: dict[str, Path],
                facade: dict[str, str]) -> str | None:
    """The module that `dl.a.b...` (parts ["a", "b", ...]) stands for: the deepest submodule
    it names, or the module the facade took the name `a` from; None for a name the facade
    defines itself. The facade's own binding wins, as it does at run time (`dl.launch` is the
    function, though dpmp_lab.launcher.launch is a module too)."""
    bound = facade.get(parts[0])
    if bound is not None and bound != f"{root}.{parts[0]}":
        return bound
    return _deepest_module(root, parts, modules)


def _deepest_module(root: str, parts: list[str], modules: dict[str, Path]) -> str | None:
    """The deepest module among root.a, root.a.b, ... for parts ["a", "b", ...]."""
    for n in range(len(parts), 0, -1):
        name = ".".join([root, *parts[:n]])
        if name in modules:
            return name
    return None


def _attribute_chains(tree: ast.AST, alias: str) -> list[tuple[list[str], int]]:
    """Every outermost `alias.a.b...` in the module, as (["a", "b", ...], line)."""
    chains = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == alias:
                chains.append((parts[::-1], node.lineno))
                return
            node = inner   # e.g. dl.f(x).y: look inside the call
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return chains


def import_edges(package_dir: Path) -> list[Edge]:
    """Every import of one of the package's modules by another, as the module docstring says."""
    modules = find_modules(package_dir)
    root = package_dir.name
    facade = _facade_names(root, modules)
    edges = []
    for module, path in modules.items():
        if module == root:
            continue   # the facade's imports are re-exports
        tree = ast.parse(path.read_text())
        for node, function in _imports(tree):
            for target, line in _targets(node, tree, module, path.name == "__init__.py",
                                         modules, facade):
                if target is not None and target != module:
                    edges.append(Edge(module, target, path.relative_to(package_dir.parent),
                                      line, function))
    return edges


def _targets(node: ast.Import | ast.ImportFrom, tree: ast.AST, module: str, is_package: bool,
             modules: dict[str, Path], facade: dict[str, str]) -> list[tuple[str | None, int]]:
    """(module of the package, line) for what one import statement brings in."""
    root = module.split(".")[0]
    if isinstance(node, ast.Import):
        found = []
        for alias in node.names:
            if alias.name == root:   # the facade itself: what is it used for?
                found += [(_via_facade(parts, root, modules, facade), line)
                          for parts, line in _attribute_chains(tree, alias.asname or root)]
            elif alias.name.startswith(root + "."):
                found.append((_deepest_module(root, alias.name.split(".")[1:], modules),
                              node.lineno))
        return found
    source = _absolute(node, module, is_package)
    if source != root and not source.startswith(root + "."):
        return []
    found = []
    for alias in node.names:
        if f"{source}.{alias.name}" in modules:
            found.append((f"{source}.{alias.name}", node.lineno))
        elif source == root:
            found.append((_via_facade([alias.name], root, modules, facade), node.lineno))
        else:
            found.append((source, node.lineno))
    return found


def import_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """The import cycles, as the edges that close them: for every import that lies on a cycle,
    the shortest cycle through it (each cycle once), so every loop there is gets named."""
    graph: dict[str, dict[str, Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
    cycles: dict[frozenset[tuple[str, str]], list[Edge]] = {}
    for group in _strongly_connected(graph):
        for source in sorted(group):
            for target, edge in sorted(graph.get(source, {}).items()):
                if target in group:
                    cycle = [edge] + _shortest_path(graph, group, target, source)
                    cycles.setdefault(frozenset((e.source, e.target) for e in cycle),
                                      _rotated(cycle))
    return sorted(cycles.values(), key=lambda c: (len(c), [e.source for e in c]))


def _strongly_connected(graph: dict[str, dict[str, Edge]]) -> list[set[str]]:
    """Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _shortest_path(graph: dict[str, dict[str, Edge]], group: set[str], start: str,
                   end: str) -> list[Edge]:
    """The edges of a shortest path start -> ... -> end inside the group (breadth first)."""
    paths: dict[str, list[Edge]] = {start: []}
    frontier = [start]
    while end not in paths:
        following = []
        for v in frontier:
            for w, edge in sorted(graph.get(v, {}).items()):
                if w in group and w not in paths:
                    paths[w] = paths[v] + [edge]
                    following.append(w)
        if not following:
            raise AssertionError(f"no path {start} -> {end} in {sorted(group)}")
        frontier = following
    return paths[end]


def _rotated(cycle: list[Edge]) -> list[Edge]:
    """The cycle starting at its alphabetically first module, so it reads the same each run."""
    first = min(range(len(cycle)), key=lambda i: cycle[i].source)
    return cycle[first:] + cycle[:first]


def describe_cycle(cycle: list[Edge]) -> str:
    names = " -> ".join([cycle[0].source] + [e.target for e in cycle])
    return f"{names}\n    " + "\n    ".join(
        f"{e.source} imports {e.target} at {e}" for e in cycle)


def module_docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


# -- the rules, on dpmp_lab ----------------------------------------------------------------------


def test_no_import_cycles_among_dpmp_lab_modules():
    cycles = import_cycles(import_edges(PACKAGE_DIR))
    assert not cycles, ("import cycles among dpmp_lab modules (imports inside functions count "
                        "too); make one side not need the other, e.g. move what both need "
                        "into a lower module:\n" + "\n".join(map(describe_cycle, cycles)))


def test_long_modules_say_why_they_stay_whole():
    long = []
    for module, path in find_modules(PACKAGE_DIR).items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and WHOLE not in module_docstring(path):
            long.append(f"{module} ({path.relative_to(PACKAGE_DIR.parent)}, {lines} lines)")
    assert not long, (f"modules over {MAX_LINES} lines whose docstring does not say why they "
                      f"stay whole (a sentence starting {WHOLE!r}); split them where they "
                      "have a seam, or say why not:\n  " + "\n  ".join(long))


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_ones():
    modules = find_modules(PACKAGE_DIR)
    unplaced = sorted(m for m in modules if layer_of(m) is None)
    assert not unplaced, f"give these modules a layer in LAYERS: {unplaced}"
    stale = sorted(e for e in LAYERS if e and not any(
        m == f"dpmp_lab.{e}" or m.startswith(f"dpmp_lab.{e}.") for m in modules))
    assert not stale, f"LAYERS names modules that do not exist: {stale}"
    upward = [f"{e.source} (layer {layer_of(e.source)}) imports {e.target} (layer "
              f"{layer_of(e.target)}) at {e}" for e in import_edges(PACKAGE_DIR)
              if layer_of(e.target) > layer_of(e.source)]
    assert not upward, ("imports that run upward; move what both need down, or the importer "
                        "up:\n  " + "\n  ".join(upward))


def architecture_layers(text: str) -> dict[int, str]:
    """{layer: the text of its lines} from ARCHITECTURE.md's drawing: a line that starts with a
    digit opens a layer, the indented lines after it continue it."""
    block = text.split("```")[1]
    layers: dict[int, str] = {}
    current = None
    for line in block.splitlines():
        head = line[:1]
        if head.isdigit():
            current = int(head)
            layers[current] = line[1:]
        elif current is not None and line.strip():
            layers[current] += "\n" + line
    return layers


def test_architecture_md_draws_the_layers_of_the_code():
    drawn = architecture_layers(ARCHITECTURE.read_text())
    assert sorted(drawn) == sorted(set(LAYERS.values())), sorted(drawn)
    missing = []
    for entry, layer in LAYERS.items():
        name = entry.rpartition(".")[2] or "__init__"
        package = (PACKAGE_DIR / entry.replace(".", "/")).is_dir()
        words = drawn[layer].replace(",", " ").split()
        if not any(w.strip("()") in (name, f"{name}/", f"{name}.py") for w in words):
            missing.append(f"{entry or 'dpmp_lab/__init__.py'} (layer {layer}"
                           f"{', a package' if package else ''})")
    assert not missing, ("ARCHITECTURE.md does not name these on the line of their layer:\n  "
                         + "\n  ".join(missing))


# gettext's names for "translate this" and "mark this", which every translator's tool knows:
# public by convention, however they are spelled (dpmp_lab/i18n/messages.py)
GETTEXT = {"_", "N_"}


def private_names_used_elsewhere(package_dir: Path) -> list[str]:
    """`module: what` for every private name of one module that another module imports or
    reads as module._name (an instance's private attributes are not counted)."""
    modules = find_modules(package_dir)
    root = package_dir.name
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}
        for node, _ in _imports(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, module, path.name == "__init__.py")
                if source.split(".")[0] != root:
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif (alias.name.startswith("_") and not alias.name.startswith("__")
                          and alias.name not in GETTEXT):
                        found.append(f"{module}: from {source} import {alias.name} "
                                     f"(line {node.lineno})")
            else:
                aliases.update({a.asname or a.name: a.name for a in node.names
                                if a.name.split(".")[0] == root and a.asname})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases.get(node.value.id, module) != module):
                found.append(f"{module}: {node.value.id}.{node.attr} (line {node.lineno})")
    return sorted(set(found))


def test_no_private_name_is_used_outside_its_module():
    found = private_names_used_elsewhere(PACKAGE_DIR)
    assert not found, ("private names used outside their module; make the name public (no "
                       "leading underscore) or keep its use inside:\n  " + "\n  ".join(found))


# a dotted name of the package inside a string: a module or a module's attribute
DOTTED = re.compile(r"(?<![\w/.])dpmp_lab(?:\.[A-Za-z_]\w*)+")


def unresolved_names(package: Path) -> list[str]:
    """The package's names kept in strings (for `python -m`, `__import__` in another kernel, a
    class the hub loads, a module guarded by name, a docstring) that name nothing: each is
    imported, and its attributes looked up, as the code that reads it would."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            for match in DOTTED.finditer(node.value):
                parts = match.group(0).split(".")
                for k in range(len(parts), 0, -1):   # the longest prefix that is a module
                    try:
                        obj: object = importlib.import_module(".".join(parts[:k]))
                        break
                    except ImportError:
                        continue
                rest = parts[k:]
                while rest and hasattr(obj, rest[0]):
                    obj, rest = getattr(obj, rest[0]), rest[1:]
                if rest:
                    found.append((str(path.relative_to(package.parent)), node.lineno,
                                  match.group(0)))
    return [f"{where}:{line}: {name}" for where, line, name in sorted(found)]


def test_every_name_of_the_package_kept_in_a_string_names_something():
    """A rename must fail here, not where a grading job or the hub first reads the string."""
    import dpmp_lab

    dpmp_lab.load()
    missing = unresolved_names(PACKAGE_DIR)
    assert not missing, "strings name what is not there (renamed?):\n  " + "\n  ".join(missing)


def test_a_name_in_a_string_that_names_nothing_is_found(tmp_path):
    (tmp_path / "dpmp_lab").mkdir()
    (tmp_path / "dpmp_lab" / "a.py").write_text(
        'RUN = "dpmp_lab.instructor.hub_roster"\nGONE = ("dpmp_lab.instructor.no_such_module",)\n'
        'ATTR = "dpmp_lab.trace.NoSuchClass"\n')
    assert unresolved_names(tmp_path / "dpmp_lab") == [
        "dpmp_lab/a.py:2: dpmp_lab.instructor.no_such_module",
        "dpmp_lab/a.py:3: dpmp_lab.trace.NoSuchClass"]


def test_a_private_name_imported_elsewhere_is_found(tmp_path):
    root = _package(tmp_path, {"a.py": "def _mine():\n    pass\n",
                               "b.py": "from pkg.a import _mine\nfrom pkg import a\n"
                                       "x = a._mine\n",
                               "c.py": "class C:\n    _own = 1\n    def f(self):\n"
                                       "        return self._own\n"})
    assert private_names_used_elsewhere(root) == [
        "pkg.b: a._mine (line 3)", "pkg.b: from pkg.a import _mine (line 1)"]


MACHINERY = ("launcher", "instructor", "_helpers", "_torch_helpers", "cli", "preloaded")   # no learner reads these


def exported_names(path: Path) -> tuple[list[str] | None, set[str]]:
    """(the module's __all__, or None, and the names its top level binds)."""
    tree = ast.parse(path.read_text())
    listed, bound = None, set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Name):
                    bound.add(target.id)
                    if target.id == "__all__":
                        listed = [e.value for e in node.value.elts]
    return listed, bound


def test_the_facade_binds_what_api_offers_and_the_package_never_asks_it_for_a_module():
    """The package's __all__ is api.py's and what __init__ defines itself. Inside the package a
    module of the API is imported by its own name (`import dpmp_lab.models as models`), never
    `from dpmp_lab import models`: that asks the facade, which loads the whole API at its first
    name, from inside an import that the API may itself be in the middle of (a cycle at run
    time: a spawned rank importing the launcher met one)."""
    modules = find_modules(PACKAGE_DIR)
    root = PACKAGE_DIR.name
    facade, own = exported_names(modules[root])
    api, _ = exported_names(modules[f"{root}.{FACADE_API}"])
    assert set(facade) == set(api) | (own & set(facade)), \
        f"the facade's __all__ and api.py's differ: {sorted(set(facade) ^ set(api))}"
    asked = []
    for module, path in modules.items():
        if module in (root, f"{root}.{FACADE_API}"):
            continue
        for node, _ in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and \
                    _absolute(node, module, path.name == "__init__.py") == root:
                asked += [f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno} {a.name}"
                          for a in node.names if a.name in facade]
    assert not asked, f"import these by their module's own name: {asked}"


def test_every_module_a_learner_reads_says_what_it_offers():
    missing, unbound = [], []
    for module, path in find_modules(PACKAGE_DIR).items():
        name = module.removeprefix(PACKAGE_DIR.name).removeprefix(".")
        if not name or name.split(".")[0] in MACHINERY or path.name == "__init__.py" and \
                not path.read_text().strip().replace('"""', "").strip():
            continue
        listed, bound = exported_names(path)
        if listed is None:
            missing.append(module)
        else:
            unbound += [f"{module}.{n}" for n in listed if n not in bound]
    assert not missing, f"modules a learner reads without __all__: {missing}"
    assert not unbound, f"__all__ names what the module does not bind: {unbound}"


def test_no_test_module_imports_another():
    """A test file is read on its own: what two of them share lives in a helper module
    (tests/support/, tests/conftest.py), never in a test_ file."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node, _ in _imports(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names])
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[-1].startswith("test_")]
    assert not found, "\n".join(found)


# The tests of the references a learner reads, and the helper they compare with
REFERENCE_TESTS = ("test_bench", "test_collectives", "test_cost", "test_cp", "test_dp",
                   "test_footprint", "test_fsdp", "test_grid", "test_hybrid", "test_models",
                   "test_moe", "test_pp", "test_pp_schedules", "test_tp", "test_trace",
                   "plain_checks")


def grader_uses(source: str) -> list[int]:
    """The lines where `source` reaches the grader: dl.check.<...> or an import of
    dpmp_lab.check (or of check from dpmp_lab)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and ast.unparse(node) == "dl.check":
            lines.append(node.lineno)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = ([f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
            lines += [node.lineno for n in names if n.startswith("dpmp_lab.check")]
    return sorted(lines)


def test_the_references_are_tested_without_the_grader():
    """dl.check is held to the references (test_check, the notebooks' round trips); a
    reference tested through it could hide a bug of its own behind one of the grader's, so the
    references' tests compare with torch and single-process runs through plain_checks.py."""
    files = {p.stem: p for p in (ROOT / "tests").rglob("*.py")}
    found = {name: grader_uses(files[name].read_text()) for name in REFERENCE_TESTS}
    assert not {n: lines for n, lines in found.items() if lines}
    assert grader_uses("import dpmp_lab as dl\nx = dl.check.params(m)\n") == [2]
    assert grader_uses("from dpmp_lab.check import numbers\n") == [1]
    assert grader_uses("from dpmp_lab import check\n") == [1]


def test_the_files_of_one_session_fixture_share_a_worker():
    """The test command's workers run a file whole (--dist=loadfile); the tests that use the
    graded class (a session fixture of minutes) must be collected from one file, or it is
    graded twice: one test file, which imports every test of the other modules that use it."""
    files = {p.name: p for p in (ROOT / "tests").rglob("*.py")}
    users = sorted(name for name, p in files.items()
                   if any(isinstance(f, ast.FunctionDef) and "graded_class" in
                          [a.arg for a in f.args.args] for f in ast.walk(ast.parse(p.read_text()))))
    collected = [name for name in users if name.startswith("test_")]
    assert len(collected) == 1, users
    tree = ast.parse(files[collected[0]].read_text())
    imported = {f"{n.module.rsplit('.', 1)[-1]}.py" for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module
                and [a.name for a in n.names] == ["*"]}
    assert set(users) - set(collected) <= imported, (users, imported)


def test_the_long_fixtures_start_first_and_the_rest_go_largest_first():
    """conftest.FIRST names files that exist (a rename would quietly put them back in the
    middle of the run), and the collection hands them out first, then the others by size."""
    from tests.conftest import FIRST, scheduled_order

    assert all((PACKAGE_DIR.parent / name).is_file() for name in FIRST), FIRST
    files = ["tests/b.py", *reversed(FIRST), "tests/c.py", "tests/c.py", FIRST[0]]
    assert scheduled_order(files) == [*FIRST, "tests/c.py", "tests/b.py"]


def test_render_imports_nothing_from_dpmp_lab():
    tree = ast.parse((PACKAGE_DIR / "render.py").read_text())
    found = [f"line {node.lineno}: {ast.unparse(node)}" for node, _ in _imports(tree)
             if (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                       .split(".")[0] == "dpmp_lab"))
             or (isinstance(node, ast.Import)
                 and any(a.name.split(".")[0] == "dpmp_lab" for a in node.names))]
    assert not found, "dpmp_lab.render must stay below every module:\n" + "\n".join(found)


# -- the reading of imports, on small packages made for the purpose -------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, source in {"__init__.py": "", "api.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    return root


def _cycle_names(root: Path) -> list[str]:
    return [" -> ".join([c[0].source] + [e.target for e in c])
            for c in import_cycles(import_edges(root))]


def test_a_loop_through_an_import_inside_a_function_is_found(tmp_path):
    root = _package(tmp_path, {
        "low.py": "def picture():\n    from pkg import high\n    return high\n",
        "high.py": "from pkg.low import picture\n",
        "other.py": "import pkg.low\n",
    })
    assert _cycle_names(root) == ["pkg.high -> pkg.low -> pkg.high"]
    [cycle] = import_cycles(import_edges(root))
    assert "pkg.low imports pkg.high at pkg/low.py:2 (inside picture)" in describe_cycle(cycle)


@pytest.mark.parametrize("files, cycles", [
    # the facade's own imports do not count; using the facade for a module does
    ({"__init__.py": "__version__ = '1'\ndef load():\n    from pkg import api\n",
      "api.py": "from pkg import a, b\n",
      "a.py": "import pkg\nV = pkg.__version__\n", "b.py": ""}, []),
    ({"api.py": "from pkg import a, b\n",
      "a.py": "import pkg as p\ndef f():\n    return p.b.g()\n",
      "b.py": "from pkg.a import f\n"}, ["pkg.a -> pkg.b -> pkg.a"]),
    # a name the facade binds from api.py stands for the module api.py takes it from
    ({"api.py": "from pkg.b import Thing\n",
      "a.py": "from pkg import Thing\n", "b.py": "from pkg import a\n"},
     ["pkg.a -> pkg.b -> pkg.a"]),
    # a submodule that needs its own package's name closes a loop; relative imports resolve
    ({"sub/__init__.py": "from pkg.sub.x import f\n",
      "sub/x.py": "from . import y\ndef f():\n    return y\n",
      "sub/y.py": "from pkg.sub import f\n"},
     ["pkg.sub -> pkg.sub.x -> pkg.sub.y -> pkg.sub"]),
    # two loops through one module are two findings, not one tangle
    ({"a.py": "from pkg import b, c\n", "b.py": "import pkg.a\n", "c.py": "import pkg.a\n"},
     ["pkg.a -> pkg.b -> pkg.a", "pkg.a -> pkg.c -> pkg.a"]),
    # imports for type checking never run
    ({"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
      "b.py": "import pkg.a\n"}, []),
])
def test_how_imports_are_read(tmp_path, files, cycles):
    assert _cycle_names(_package(tmp_path, files)) == cycles
