"""The scan of a submission's own cells, read without running them: lines that write into the
grader's modules.

nbgrader's autograde runs it (nbgrader_plugin.TamperScan): a finding sets every graded cell of
the notebook to zero with the finding as its error, so the grade says so.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

# names a scan treats as the grader's when a cell imports them
SCANNED_PACKAGES = ("dpmp_lab", "torch.distributed", "nbgrader")


def scan(sources: Iterable[str], context: Iterable[str] = ()) -> list[str]:
    """Lines of `sources` (the learner's cells) that write into the grader's modules.

    `context`: the notebook's other cells, read only for their imports (`import dpmp_lab as
    dl` in a locked cell makes `dl` the grader's in every cell). A write counts when its
    target is reached from such a name: `dl.check.comm = ...`, `dist.all_reduce = ...`,
    `setattr(dl.check, ...)`, `vars(dl.check)[...] = ...`, `dl.check.__dict__[...] = ...`,
    `vars(dl.check).update(...)`, `dl.integrity.swapped(...)`.
    """
    sources = list(sources)
    roots: set[str] = set()
    for text in [*context, *sources]:
        roots |= _grader_names(text)
    found = []
    for text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        roots_here = roots | _grader_names(text)
        for node in ast.walk(tree):
            for target in _written(node):
                if _root(target) in roots_here:
                    line = text.splitlines()[node.lineno - 1].strip()
                    found.append(f"`{line}`")
    return list(dict.fromkeys(found))


def _grader_names(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(SCANNED_PACKAGES):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                SCANNED_PACKAGES + ("torch",)):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full.startswith(SCANNED_PACKAGES):
                    names.add(alias.asname or alias.name)
    return names


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
