"""Which names each cell of a notebook reads and binds, and which cells a change can reach:
what the one-kernel grading of tests/end_to_end/test_course.py re-runs after a variant's cells,
instead of the whole rest of the notebook.

A static reading of each cell's names, conservative where it can be: a cell re-runs when it
reads a name that a re-run cell bound or may have changed (any name a re-run cell reads may
have been mutated, unless it is only ever bound by import, def or class); reading a function
reads the names its body reads; a loop's target, a `with`'s name and an `except`'s name are
bound where their block reads them. A cell that reaches the whole namespace (globals(), exec,
eval, vars, `global`, the shell's user_ns), itself or through a function it calls, re-runs
always, and one that may write it spoils every name, unless the function is a swap that puts
back what it replaced (the caller names those); a cell does not read a name it uses only while
such a swap holds another value under it (the caller names those cells and names). Skipped
cells are assumed to do again what they did in the solution's run; a cell that must re-run and
reads a name a skipped cell between bound or changed makes that cell run too.

What no reading of names sees (state outside the namespace: files, torch's global settings,
an object that keeps a callback) can make a skipping run differ from a full one. The grading
that uses this checks every variant's result against the cells it should lose and re-runs the
whole rest of the notebook when the two differ, so a skipping run that fails too much is
repaired, and nbgrader grades the variant that skips the most in full.

Why it stays whole: a cell's names (`cell_names`) and a notebook's (`read_cells`) are one reading
of Python's scopes, with one set of rules for what counts as a read and a bind.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import symtable
from collections.abc import Mapping

from IPython.core.inputtransformer2 import TransformerManager

EVERYTHING = "*"   # a read or a bind of the whole namespace
WRITES = "*="      # in a function's reads: when called, it may bind any name
_WHOLE_NAMESPACE = {"globals", "vars", "locals", "eval", "exec", "__import__", "user_ns",
                    "user_global_ns"}
_WHOLE_NAMESPACE_MAGICS = {"run", "store", "reset", "who", "whos", "load", "macro"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclasses.dataclass(frozen=True)
class CellNames:
    reads: frozenset[str]              # every name the cell mentions; EVERYTHING in it: all
    binds: frozenset[str]              # names bound at the top level; EVERYTHING in it: all
    inside: dict[str, frozenset[str]]  # a def/class/lambda bound here -> names its body reads
    definitions: frozenset[str]        # names bound only by import, def or class here


def _python(source: str) -> list[str]:
    """The cell as Python (IPython's magics turned into calls), and the body of a cell magic,
    which runs elsewhere (%%distributed's ranks) but reads the notebook's names."""
    code = TransformerManager().transform_cell(source)
    bodies = [code]
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return bodies
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("run_cell_magic", "run_line_magic")):
            magic = node.args[0].value if node.args and isinstance(node.args[0],
                                                                   ast.Constant) else None
            if magic in _WHOLE_NAMESPACE_MAGICS or not isinstance(magic, str):
                bodies.append("exec('')")   # it may read and bind any name
            body = node.args[-1] if node.func.attr == "run_cell_magic" else None
            if isinstance(body, ast.Constant) and isinstance(body.value, str):
                bodies.append(body.value)
    return bodies


def _global_reads(table: symtable.SymbolTable) -> set[str]:
    """Module names that the function or class of `table` (and the scopes inside it) reads
    when it runs: its globals, not its parameters or locals; "globals" for one that binds
    module names (`global x`)."""
    out: set[str] = set()
    for sym in table.get_symbols():
        if sym.is_global() and sym.is_referenced():
            out.add(sym.get_name())
        if sym.is_declared_global() and sym.is_assigned():
            out.add("globals")
    for child in table.get_children():
        out |= _global_reads(child)
    return out


def _loads_now(node: ast.AST) -> set[str]:
    """Names `node` reads from the namespace when it runs now: a def's decorators and
    defaults (its body runs later), a lambda's or a comprehension's body less its own names,
    a class's body."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                  node.args.vararg, node.args.kwarg]
        now = [*node.decorator_list, *node.args.defaults,
               *[d for d in node.args.kw_defaults if d],
               *[p.annotation for p in params if p is not None and p.annotation is not None],
               *([node.returns] if node.returns else [])]
        return set().union(*(_loads_now(n) for n in now))
    if isinstance(node, ast.Lambda):
        params = {a.arg for a in [*node.args.posonlyargs, *node.args.args,
                                  *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]
                  if a is not None}
        return _loads_now(node.body) - params
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        own = {n.id for g in node.generators for n in ast.walk(g.target)
               if isinstance(n, ast.Name)}
        out = set().union(*(_loads_now(c) for c in ast.iter_child_nodes(node)))
        return (out - own) | _loads_now(node.generators[0].iter)
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        return {node.target.id} | _loads_now(node.value)
    return set().union(*(_loads_now(c) for c in ast.iter_child_nodes(node)))


def _stored(target: ast.AST) -> set[str]:
    """The plain names an assignment target binds: `a`, `a, (b, *c)`; not `a.x` or `a[i]`."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _stored(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_stored(t) for t in target.elts))
    return set()


def _reads_in_block(body: list[ast.stmt], bound: set[str]) -> tuple[set[str], set[str]]:
    """(names the statements read before they bind them, names bound once they all ran).
    A loop's target is bound in its body; names bound in one branch of an if, a loop's body or
    a try count as bound inside it only, since the branch may not run (a name bound in both
    branches of an if is bound after it)."""
    reads: set[str] = set()
    bound = set(bound)
    for stmt in body:
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            reads |= (_loads_now(stmt.iter) | _loads_now(stmt.target)) - bound
            reads |= _reads_in_block(stmt.body, bound | _stored(stmt.target))[0]
            reads |= _reads_in_block(stmt.orelse, bound)[0]
        elif isinstance(stmt, ast.While):
            reads |= _loads_now(stmt.test) - bound
            reads |= _reads_in_block(stmt.body, bound)[0] | _reads_in_block(stmt.orelse, bound)[0]
        elif isinstance(stmt, ast.If):
            reads |= _loads_now(stmt.test) - bound
            then, then_bound = _reads_in_block(stmt.body, bound)
            other, other_bound = _reads_in_block(stmt.orelse, bound)
            reads |= then | other
            bound |= then_bound & other_bound
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            inner = set(bound)
            for item in stmt.items:
                reads |= _loads_now(item.context_expr) - inner
                if item.optional_vars is not None:
                    reads |= _loads_now(item.optional_vars) - inner
                    inner |= _stored(item.optional_vars)
            reads |= _reads_in_block(stmt.body, inner)[0]   # a context may swallow an error
            bound = inner
        elif isinstance(stmt, ast.Try):
            tried, tried_bound = _reads_in_block(stmt.body, bound)
            reads |= tried | _reads_in_block(stmt.orelse, tried_bound)[0]
            for handler in stmt.handlers:
                caught = {handler.name} if handler.name else set()
                if handler.type is not None:
                    reads |= _loads_now(handler.type) - bound
                reads |= _reads_in_block(handler.body, bound | caught)[0]
            reads |= _reads_in_block(stmt.finalbody, bound)[0]
        else:
            reads |= _loads_now(stmt) - bound
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                sides = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                bound |= set().union(*(_stored(side) for side in sides))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(stmt.name)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return reads, bound


def _reads_in_order(tree: ast.Module) -> set[str]:
    """Names the cell reads before binding them itself: `res = f(); g(res)` does not read the
    res of an earlier cell, nor `for tp in (2, 4): check(tp)` the tp of one."""
    return _reads_in_block(tree.body, set())[0]


def _scopes_named(table: symtable.SymbolTable, name: str) -> list[symtable.SymbolTable]:
    return [c for c in table.get_children() if c.get_name() == name]


_READ_ONLY = {"get", "keys", "items", "values", "copy", "__contains__", "__getitem__"}


def _namespace_writes(tree: ast.AST) -> bool:
    """Whether the cell may bind names through the namespace itself: exec, eval, `global`,
    or globals()/vars() used other than read (`globals()[name]`, `.get`, `in globals()`)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in ("exec", "eval", "__import__"):
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return True
        if isinstance(node, ast.Attribute) and node.attr in ("user_ns", "user_global_ns"):
            return True
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("globals", "vars", "locals")):
            continue
        up = parents.get(node)
        if isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Load):
            continue
        if isinstance(up, ast.Attribute) and up.attr in _READ_ONLY:
            continue
        if isinstance(up, ast.Compare) and node in up.comparators:
            continue
        if isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id in (
                "sorted", "list", "len", "set", "dict", "print", "repr"):
            continue
        return True
    return False


def _names_looked_up(tree: ast.AST) -> set[str] | None:
    """The names a cell reads through globals() by a string: `globals()[name]` or
    `globals().get(name)` with a constant or a variable, where the strings the cell holds are
    the names it can look up (every identifier-like string constant of the cell); None when
    a lookup's key is built some other way (an f-string, a call) or globals() is used whole."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("globals", "vars", "locals")):
            continue
        up = parents.get(node)
        if isinstance(up, ast.Subscript):
            key = up.slice
        elif isinstance(up, ast.Attribute) and up.attr == "get":
            call = parents.get(up)
            key = call.args[0] if isinstance(call, ast.Call) and call.args else None
        else:
            return None
        if not isinstance(key, (ast.Constant, ast.Name)):
            return None
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value.isidentifier()}


def _top_level_binds(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound outside any function or class body, those bound only by import/def/class)."""
    binds: set[str] = set()
    plain: set[str] = set()   # bound by something else than import/def/class

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
            for d in node.decorator_list:
                visit(d)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                binds.add((alias.asname or alias.name).split(".")[0])
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            binds.add(node.id)
            plain.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            binds.add(node.name)
            plain.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            binds.add(node.name)
            plain.add(node.name)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return binds, binds - plain


@functools.cache   # every variant of a notebook shares most of its cells
def cell_names(source: str) -> CellNames:
    reads: set[str] = set()
    binds: set[str] = set()
    definitions: set[str] = set()
    inside: dict[str, frozenset[str]] = {}
    codes = []
    for code in _python(source):
        try:
            tree = ast.parse(code)
        except SyntaxError:   # not Python (a magic's own language): it may touch anything
            reads.add(EVERYTHING)
            binds.add(EVERYTHING)
            continue
        codes.append(code)
        table = symtable.symtable(code, "<cell>", "exec")
        reads |= _reads_in_order(tree)
        reads |= {n.attr for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in _WHOLE_NAMESPACE}
        bound, only_defined = _top_level_binds(tree)
        binds |= bound
        definitions |= only_defined
        for node in tree.body:   # what a function or class bound here reads when it is used
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                scopes, targets = _scopes_named(table, node.name), [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(n, _SCOPES) for n in ast.walk(node.value or ast.Pass())):
                sides = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [n.id for t in sides for n in ast.walk(t) if isinstance(n, ast.Name)]
                scopes = _scopes_named(table, "lambda")
            else:
                continue
            used = set().union(*(_global_reads(c) for c in scopes))
            if _namespace_writes(node if not isinstance(node, (ast.Assign, ast.AnnAssign))
                                 else node.value):
                used.add(WRITES)
            for name in targets:
                inside[name] = inside.get(name, frozenset()) | frozenset(used)
        # a function this cell defines and then calls (or hands to dl.launch) reads what its
        # body reads (cells_to_rerun follows the name), although the ordered reading sees the
        # name bound first; named only inside another function's body, it is read when that
        # one is called, through that one's reads
        reads |= set(inside) & set().union(*(_loads_now(stmt) for stmt in tree.body))
    if reads & _WHOLE_NAMESPACE:   # now; a function's body that does it does so when called
        trees = [ast.parse(code) for code in codes]
        if any(_namespace_writes(tree) for tree in trees):
            reads.add(EVERYTHING)
            binds.add(EVERYTHING)
        else:
            looked_up = [_names_looked_up(tree) for tree in trees]
            if any(names is None for names in looked_up):
                reads.add(EVERYTHING)
            else:
                reads |= set().union(*looked_up)
                reads -= _WHOLE_NAMESPACE
    return CellNames(frozenset(reads), frozenset(binds), inside, frozenset(definitions))


@dataclasses.dataclass(frozen=True)
class Reading:
    """A notebook read cell by cell: what each code cell reads (through the functions it
    calls) and binds, and the names no cell changes in place."""
    code: list[int]                   # indices of the code cells
    reads: dict[int, set[str]]        # EVERYTHING in it: the cell reaches the whole namespace
    binds: dict[int, frozenset[str]]
    touches: dict[int, set[str]]      # what it binds, and what it may change in place
    fixed: set[str]


def read_cells(sources: list[str | None], immutable: frozenset[str] = frozenset(),
               swaps: frozenset[str] = frozenset(),
               stood_in: Mapping[int, frozenset[str]] | None = None) -> Reading:
    """`sources` read (None marks a cell that is not code). `immutable`: names whose values no
    cell can change in place (ints, strings, modules, as the solution's kernel holds them).
    `swaps`: functions that use the namespace only to put other values under names their
    caller gives while a block runs, and put the old ones back (a notebook's "the library's
    pieces stand in for yours"): calling one reaches no name through the namespace.
    `stood_in`: {cell index: names that cell uses only while a swap puts other values under
    them}: the cell reads neither those names nor, through them, what their bodies read."""
    names = [cell_names(s) if s is not None else None for s in sources]
    code = [i for i, n in enumerate(names) if n is not None]
    # never changed in place by a cell that reads them: names only ever bound by import, def
    # or class, names no cell binds (builtins, the shell's), and immutable values
    bound = {b for n in names if n for b in n.binds}
    rebound = {b for n in names if n for b in n.binds - n.definitions}
    fixed = ({d for n in names if n for d in n.definitions} - rebound) | set(immutable)
    bodies: dict[str, set[str]] = {}
    for n in names:
        for name, inner in (n.inside.items() if n else ()):
            bodies.setdefault(name, set()).update(inner)
    for name in swaps & set(bodies):
        bodies[name] -= _WHOLE_NAMESPACE | {WRITES}
    read_anywhere = {r for n in names if n for r in n.reads}.union(*bodies.values())
    fixed |= read_anywhere - bound - {EVERYTHING, WRITES}

    def deep_reads(i: int) -> set[str]:
        out, todo = set(), list(names[i].reads)
        elsewhere = (stood_in or {}).get(i, frozenset())
        while todo:
            name = todo.pop()
            if name not in out and name not in elsewhere:
                out.add(name)
                todo.extend(bodies.get(name, ()))
        return out | ({EVERYTHING} if out & (_WHOLE_NAMESPACE | {WRITES}) else set())

    reads = {i: deep_reads(i) for i in code}
    # reading the whole namespace changes nothing by itself
    touches = {i: set(names[i].binds) | (reads[i] - fixed - {EVERYTHING, WRITES})
               | ({EVERYTHING} if WRITES in reads[i] else set()) for i in code}
    return Reading(code, reads, {i: names[i].binds for i in code}, touches, fixed)


def spoils(reads: set[str], dirty: set[str]) -> bool:
    """Whether a cell that reads `reads` must run again when `dirty` names may differ."""
    return EVERYTHING in reads or EVERYTHING in dirty or bool(reads & dirty)


def cells_to_rerun(sources: list[str | None], changed: set[int],
                   immutable: frozenset[str] = frozenset(),
                   swaps: frozenset[str] = frozenset(),
                   stood_in: Mapping[int, frozenset[str]] | None = None) -> set[int]:
    """Indices of the code cells after the first changed one that a run with `changed` cells
    replaced must execute (the changed ones included), read from the sources alone: any name
    a re-run cell reads may have changed (read_cells for `immutable`, `swaps`, `stood_in`)."""
    start = min(changed)
    reading = read_cells(sources, immutable, swaps, stood_in)
    code, reads, touches, fixed = reading.code, reading.reads, reading.touches, reading.fixed
    run: set[int] = set()
    dirty: set[str] = set()
    for i in (i for i in code if i >= start):
        if i in changed or spoils(reads[i], dirty):
            run.add(i)
            dirty |= touches[i]
    # a cell that runs reads what skipped cells since `start` bound or changed: they run too
    # (the namespace put back is the one before `start`)
    grew = True
    while grew:
        grew = False
        for j in sorted(run):
            for i in (i for i in code if start <= i < j and i not in run):
                if (spoils(reads[j], set(reading.binds[i]))
                        or spoils(reads[j] - fixed, touches[i])):
                    run.add(i)
                    grew = True
    return run


__all__ = ["EVERYTHING", "WRITES", "CellNames", "Reading", "cell_names", "cells_to_rerun",
           "read_cells", "spoils"]
