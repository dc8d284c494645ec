"""The scan of a submission's own cells, read without running them: the lines that write into
the grader's code, and the escape hatches a learner's cell has no reason to touch.

nbgrader's autograde runs it (nbgrader_plugin.GuardedExecute): a finding sets every graded
cell of the notebook to zero with the findings as its error and flags the submission for the
instructor, so neither the grade nor the feedback is silent about it. What it finds:

- writes into the grader: an assignment, `setattr`/`delattr`, a namespace write
  (`vars(dl.check)[...] = ...`) or `integrity.swapped` aimed at a name imported from
  dpmp_lab, torch.distributed or nbgrader, or at an alias of one (`c = dl.check`);
- rebinding what the notebook's own cells imported or defined (`dl = ...`, `def check(...)`);
- the escape hatches: the kernel's shell and its input/AST transformers, the input history
  (`In`, `_ih`), stack frames (`sys._getframe`, `f_back`, `inspect.stack`), trace functions,
  `globals()`, `exec`/`eval`/`compile`/`__import__`, `builtins`, `sys.modules`, functions'
  internals (`__code__`, `__globals__`), `gc.get_referrers`, importlib and ctypes, and the
  grader's own integrity records; also any of those names spelled in a string.

A scan reads code, it does not run it: a learner who builds these names at run time gets
past it. The receipts (receipts.py) are the check that does not depend on reading the code.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from dataclasses import dataclass

# names a scan treats as the grader's when a cell imports them
SCANNED_PACKAGES = ("dpmp_lab", "torch.distributed", "nbgrader")

WRITES = "writes into the grader's code"
SHELL = "reaches into the kernel's shell, where the cells after it (the tests) can be rewritten"
HISTORY = "reads the kernel's input history, which holds the hidden tests"
FRAMES = "walks the call stack into the grader's variables"
NAMESPACE = "reads or writes the namespace the hidden tests run in"
DYNAMIC = "runs code that cannot be read before it runs"
TRACING = "installs a trace function, which sees every line the tests run"
INTERNALS = "reaches into the internals of functions or classes"
MODULES = "reaches modules behind their names"
RECORDS = "reaches the grader's integrity records"

HATCH_NAMES = {"get_ipython": SHELL, "In": HISTORY, "Out": HISTORY, "_ih": HISTORY,
               "_oh": HISTORY, "_dh": HISTORY, "globals": NAMESPACE, "locals": NAMESPACE,
               "exec": DYNAMIC, "eval": DYNAMIC, "compile": DYNAMIC, "__import__": DYNAMIC,
               "__builtins__": NAMESPACE, "breakpoint": TRACING}
HATCH_ATTRS = {"input_transformers_cleanup": SHELL, "input_transformers_post": SHELL,
               "input_transformer_manager": SHELL, "ast_transformers": SHELL,
               "_getframe": FRAMES, "_current_frames": FRAMES, "f_back": FRAMES,
               "f_locals": FRAMES, "f_globals": FRAMES, "f_builtins": FRAMES,
               "tb_frame": FRAMES, "gi_frame": FRAMES, "cr_frame": FRAMES, "ag_frame": FRAMES,
               "settrace": TRACING, "setprofile": TRACING, "__globals__": INTERNALS,
               "__code__": INTERNALS, "__closure__": INTERNALS, "__subclasses__": INTERNALS,
               "__builtins__": NAMESPACE, "_snapshot": RECORDS}
HATCH_PAIRS = {("sys", "modules"): MODULES, ("sys", "monitoring"): TRACING,
               ("inspect", "stack"): FRAMES, ("inspect", "trace"): FRAMES,
               ("inspect", "currentframe"): FRAMES, ("inspect", "getouterframes"): FRAMES,
               ("inspect", "getinnerframes"): FRAMES, ("inspect", "getframeinfo"): FRAMES,
               ("gc", "get_referrers"): INTERNALS, ("gc", "get_referents"): INTERNALS,
               ("gc", "get_objects"): INTERNALS, ("threading", "settrace"): TRACING,
               ("threading", "setprofile"): TRACING}
HATCH_MODULES = {"builtins": NAMESPACE, "importlib": DYNAMIC, "ctypes": INTERNALS,
                 "runpy": DYNAMIC, "atexit": DYNAMIC, "IPython": SHELL, "ipykernel": SHELL,
                 "nbgrader": RECORDS, "dpmp_lab.integrity": RECORDS,
                 "dpmp_lab.instructor.receipts": RECORDS, "dpmp_lab.instructor.scan": RECORDS}
SAFE_MODULES = ("IPython.display",)   # display() and friends: what a notebook may show
RECORD_ATTRS = ("integrity", "receipts", "scan")   # dl.integrity, dl.receipts


def scan(sources: Iterable[str], context: Iterable[str] = ()) -> list[str]:
    """What in `sources` (the learner's cells) writes into the grader or opens an escape
    hatch, as "`line` (why)" strings, each once, in the order found.

    `context`: the notebook's other cells, read for their imports and definitions
    (`import dpmp_lab as dl` in a locked cell makes `dl` the grader's in every cell).
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
    given = {name: target for f in facts[:len(context)] for name, target in f.bindings}
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
            why = _hatch(node, roots, modules)
            if why:
                report(node, why)
        for node, name in _module_level_bindings(tree):
            if name in given and _same(given[name]) != _same(_import_target(node, name)):
                what = "imported" if given[name] != "def" else "defined"
                report(node, f"rebinds `{name}`, which the notebook {what}")
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class _Facts:
    """What one cell says, read once: a notebook's given cells recur in every scan of it."""

    tree: ast.Module | None
    imported: frozenset[str]                  # names imported from the grader's packages
    aliases: tuple[tuple[str, str | None], ...]   # (name, the name its value starts from)
    modules: tuple[tuple[str, str], ...]      # (local name, module) of `import m as n`
    bindings: tuple[tuple[str, str], ...]     # top-level imports (their target) and defs


@functools.lru_cache(maxsize=4096)
def _facts(text: str) -> _Facts:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return _Facts(None, frozenset(), (), (), ())
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
    bindings = []
    for node, name in _module_level_bindings(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bindings.append((name, _import_target(node, name)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bindings.append((name, "def"))
    return _Facts(tree, frozenset(imported),
                  tuple((target, _root(value)) for target, value in _aliases(tree)),
                  tuple(modules), tuple(bindings))


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
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id == "vars" and not node.args:
        return NAMESPACE
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
            if name.startswith(SAFE_MODULES):
                continue
            for module, why in HATCH_MODULES.items():
                if name == module or name.startswith(module + "."):
                    return why
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (node.module, alias.name) in HATCH_PAIRS:
                    return HATCH_PAIRS[(node.module, alias.name)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
            node.value in HATCH_NAMES or node.value in HATCH_ATTRS):
        why = HATCH_NAMES.get(node.value) or HATCH_ATTRS[node.value]
        return f"names `{node.value}` in a string: {why}"
    return None


def _module_level_bindings(tree: ast.Module) -> Iterable[tuple[ast.AST, str]]:
    """(statement, name) for every name a cell binds at the top level (inside if/for/with/
    try too, not inside functions or classes)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    yield node, alias.asname or alias.name.split(".")[0]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node, node.name
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.For,
                               ast.AsyncFor)):
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                       else [node.target])
            for t in targets:
                for name in _bound_names(t):
                    yield node, name
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With,
                             ast.AsyncWith, ast.Try)):
            for item in getattr(node, "items", []):
                if isinstance(item.optional_vars, ast.Name):
                    yield node, item.optional_vars.id
            for field in ("body", "orelse", "finalbody"):
                stack.extend(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)


def _bound_names(target: ast.AST) -> Iterable[str]:
    """The names an assignment target binds: `a`, `a, (b, *c)`; not `a.x` or `a[0]`."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _bound_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


def _import_target(node: ast.AST, name: str) -> str | None:
    """What `name` is bound to by an import statement ("torch.distributed", "dpmp_lab:check"),
    else None."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if (alias.asname or alias.name.split(".")[0]) == name:
                return alias.name if alias.asname else alias.name.split(".")[0]
    if isinstance(node, ast.ImportFrom):
        for alias in node.names:
            if (alias.asname or alias.name) == name:
                return f"{node.module}:{alias.name}"
    return None


def _same(target: str | None) -> str | None:
    """`from torch import nn` and `import torch.nn as nn` bind the same module."""
    return target.replace(":", ".") if target else target


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
