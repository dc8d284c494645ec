"""The scan of a submission's own cells, read without running them: the lines that write into
the library's code, and the escape hatches a learner's cell has no reason to touch.

The tests that decide a grade run in a harness of their own (dpmp_lab/harness), so nothing in
the learner's kernel can reach them. What the learner's code still runs beside is the library
in the ranks the tests launch: its tracer, its collectives, the references a test switches off
(dl.check.references_off). The scan looks for what would change those. nbgrader's autograde
runs it (nbgrader_plugin.GuardedExecute): a finding sets every graded cell of the notebook to
zero with the findings as its error and flags the submission for the instructor, so neither the
grade nor the feedback is silent about it. What it finds:

- writes into the library: an assignment, `setattr`/`delattr`, a namespace write
  (`vars(dl.check)[...] = ...`) or `integrity.swapped` aimed at a name imported from
  dpmp_lab, torch.distributed or nbgrader, or at an alias of one (`c = dl.check`); and a
  write into any object's namespace itself (`m.__dict__.update(...)`, `vars(m)[...] = ...`)
  but the learner's own instance's (`self`), since `m` may be a module reached by a call
  (`inspect.getmodule(dl.launch)`, red-teamed) that no alias reading follows;
- the escape hatches: stack frames (`sys._getframe`, `f_back`, `inspect.stack`), trace
  functions, `exec`/`eval`/`compile`/`__import__` (code no scan can read), the builtins every
  module shares, `sys.modules` (and `inspect.getmodule`, `pkgutil.resolve_name`), functions'
  internals (`__code__`, `__globals__`, which reach a reference past its switch),
  `gc.get_referrers`, importlib and ctypes, unpickling (`pickle.loads(b"cdpmp_lab..."` imports
  any module by a name in bytes; red-teamed), and the library's integrity records; also any of
  those names spelled in a string.

A scan reads code, it does not run it: a learner who builds these names at run time gets
past it, and changes what their own ranks report (docs/instructor-guide.md says so); the tests
themselves stay out of reach.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from dataclasses import dataclass

# names a scan treats as the grader's when a cell imports them
SCANNED_PACKAGES = ("dpmp_lab", "torch.distributed", "nbgrader")

WRITES = "writes into the library's code, which grades the ranks"
FRAMES = "walks the call stack into the callers' variables"
BUILTINS = "changes the builtins every module shares, the library's in the ranks too"
DYNAMIC = "runs code that cannot be read before it runs"
TRACING = "installs a trace function, which sees every line the tests run"
INTERNALS = "reaches into the internals of functions or classes"
MODULES = "reaches modules behind their names"
NAMESPACE = ("writes into an object's namespace itself (__dict__, vars()), which reaches a "
             "module's names past any name a scan reads")
RECORDS = "reaches the grader's integrity records"
UNPICKLE = ("unpickles bytes, which imports any module and calls any of its names, past every "
            "name a scan reads")

HATCH_NAMES = {"exec": DYNAMIC, "eval": DYNAMIC, "compile": DYNAMIC, "__import__": DYNAMIC,
               "__builtins__": BUILTINS, "breakpoint": TRACING}
HATCH_ATTRS = {"_getframe": FRAMES, "_current_frames": FRAMES, "f_back": FRAMES,
               "f_locals": FRAMES, "f_globals": FRAMES, "f_builtins": FRAMES,
               "tb_frame": FRAMES, "gi_frame": FRAMES, "cr_frame": FRAMES, "ag_frame": FRAMES,
               "settrace": TRACING, "setprofile": TRACING, "__globals__": INTERNALS,
               "__code__": INTERNALS, "__closure__": INTERNALS, "__subclasses__": INTERNALS,
               "__builtins__": BUILTINS, "_snapshot": RECORDS}
HATCH_PAIRS = {("sys", "modules"): MODULES, ("sys", "monitoring"): TRACING,
               ("inspect", "stack"): FRAMES, ("inspect", "trace"): FRAMES,
               ("inspect", "currentframe"): FRAMES, ("inspect", "getouterframes"): FRAMES,
               ("inspect", "getinnerframes"): FRAMES, ("inspect", "getframeinfo"): FRAMES,
               ("inspect", "getmodule"): MODULES, ("pkgutil", "resolve_name"): MODULES,
               ("gc", "get_referrers"): INTERNALS, ("gc", "get_referents"): INTERNALS,
               ("gc", "get_objects"): INTERNALS, ("gc", "freeze"): INTERNALS,
               ("threading", "settrace"): TRACING,
               ("threading", "setprofile"): TRACING}
HATCH_MODULES = {"builtins": BUILTINS, "importlib": DYNAMIC, "ctypes": INTERNALS,
                 "runpy": DYNAMIC, "atexit": DYNAMIC, "nbgrader": RECORDS,
                 "pickle": UNPICKLE, "_pickle": UNPICKLE, "marshal": UNPICKLE,
                 "copyreg": UNPICKLE, "shelve": UNPICKLE, "dill": UNPICKLE,
                 "cloudpickle": UNPICKLE,
                 "dpmp_lab.integrity": RECORDS, "dpmp_lab.instructor": RECORDS,
                 "dpmp_lab.harness": RECORDS}
RECORD_ATTRS = ("integrity",)   # dl.integrity


def scan(sources: Iterable[str], context: Iterable[str] = ()) -> list[str]:
    """What in `sources` (the learner's cells) writes into the library or opens an escape
    hatch, as "`line` (why)" strings, each once, in the order found.

    `context`: the notebook's other cells, read for their imports (`import dpmp_lab as dl` in
    a locked cell makes `dl` the library's in every cell).
    """
    sources, context = list(sources), list(context)
    facts = [_facts(text) for text in [*context, *sources]]
    roots = set().union(*(f.imported for f in facts))
    aliases = [pair for f in facts for pair in f.aliases]
    for _ in range(8):   # an alias of an alias: to a fixed point
        before = len(roots)
        roots |= {target for target, root in aliases if root in roots}
        if len(roots) == before:
            break
    modules = {name: module for f in facts for name, module in f.modules}
    found: list[str] = []
    for text in sources:
        tree = _facts(text).tree
        if tree is None:
            continue
        lines = text.splitlines()

        def report(node: ast.AST, why: str, lines: list[str] = lines) -> None:
            line = lines[node.lineno - 1].strip() if 0 < node.lineno <= len(lines) else "?"
            found.append(f"`{line}` ({why})")

        for node in ast.walk(tree):
            for target in _written(node):
                if _root(target) in roots:
                    report(node, WRITES)
                elif _is_namespace(target) and _root(target) not in (None, "self", "cls"):
                    report(node, NAMESPACE)   # a module reached some other way, say
            why = _hatch(node, roots, modules)
            if why:
                report(node, why)
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class _Facts:
    """What one cell says, read once: a notebook's given cells recur in every scan of it."""

    tree: ast.Module | None
    imported: frozenset[str]                  # names imported from the grader's packages
    aliases: tuple[tuple[str, str | None], ...]   # (name, the name its value starts from)
    modules: tuple[tuple[str, str], ...]      # (local name, module) of `import m as n`


@functools.lru_cache(maxsize=4096)
def _facts(text: str) -> _Facts:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return _Facts(None, frozenset(), (), ())
    imported, modules = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                modules.append((local, alias.name if alias.asname else local))
                if alias.name.startswith(SCANNED_PACKAGES):
                    imported.add(local)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                SCANNED_PACKAGES + ("torch",)):
            for alias in node.names:
                if f"{node.module}.{alias.name}".startswith(SCANNED_PACKAGES):
                    imported.add(alias.asname or alias.name)
    return _Facts(tree, frozenset(imported),
                  tuple((target, _root(value)) for target, value in _aliases(tree)),
                  tuple(modules))


def _aliases(tree: ast.Module) -> Iterable[tuple[str, ast.AST]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    yield t.id, node.value
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                and isinstance(node.target, ast.Name):
            yield node.target.id, node.value
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            yield node.optional_vars.id, node.context_expr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            for arg, default in zip(positional[len(positional) - len(args.defaults):],
                                    args.defaults, strict=True):
                yield arg.arg, default
            for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if default is not None:
                    yield arg.arg, default


def _hatch(node: ast.AST, roots: set[str], modules: dict[str, str]) -> str | None:
    """Why `node` opens an escape hatch, or None."""
    if isinstance(node, ast.Name) and node.id in HATCH_NAMES:
        return HATCH_NAMES[node.id]
    if isinstance(node, ast.Attribute):
        if node.attr in HATCH_ATTRS:
            return HATCH_ATTRS[node.attr]
        if isinstance(node.value, ast.Name):
            pair = (modules.get(node.value.id, node.value.id), node.attr)
            if pair in HATCH_PAIRS:
                return HATCH_PAIRS[pair]
        if node.attr in RECORD_ATTRS and _root(node.value) in roots:
            return RECORDS
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""])
        for name in names:
            for module, why in HATCH_MODULES.items():
                if name == module or name.startswith(module + "."):
                    return why
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (node.module, alias.name) in HATCH_PAIRS:
                    return HATCH_PAIRS[(node.module, alias.name)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "load" and isinstance(node.func.value, ast.Name) and \
            modules.get(node.func.value.id, node.func.value.id) == "torch" and not any(
                k.arg == "weights_only" and isinstance(k.value, ast.Constant)
                and k.value.value is True for k in node.keywords):
        return UNPICKLE   # torch.load unpickles anything unless weights_only (torch < 2.6)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
            node.value in HATCH_NAMES or node.value in HATCH_ATTRS):
        why = HATCH_NAMES.get(node.value) or HATCH_ATTRS[node.value]
        return f"names `{node.value}` in a string: {why}"
    return None


def _written(node: ast.AST) -> list[ast.AST]:
    """The objects whose attributes or items this statement writes or deletes."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        out = []
        for t in targets:
            for leaf in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                if isinstance(leaf, (ast.Attribute, ast.Subscript)):
                    out.append(leaf.value)
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
        if node.func.id in ("setattr", "delattr"):
            return [node.args[0]]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("update", "setdefault", "pop", "popitem", "clear",
                               "__setitem__", "__delitem__") and _is_namespace(node.func.value):
        return [node.func.value]   # vars(dl.check).update(...), dl.check.__dict__.pop(...)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "swapped":
        return [node.func.value]   # dl.integrity.swapped(...): the grader's own door
    return []


def _is_namespace(node: ast.AST) -> bool:
    """`x.__dict__` or `vars(x)`: a module's or class's namespace itself."""
    return (isinstance(node, ast.Attribute) and node.attr == "__dict__") or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "vars")


def _root(node: ast.AST) -> str | None:
    """The name an expression starts from: `dl` for dl.check.__dict__ or vars(dl.check)."""
    while True:
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("vars", "getattr") and node.args:
            node = node.args[0]
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


__all__ = ["SCANNED_PACKAGES", "scan"]
