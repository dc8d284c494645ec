"""The library's references, switched off while the learner's own code is graded.

An exercise that builds a piece the library also has (dl.tp.ColumnParallelLinear, dl.ProcessGrid)
is graded with the library's version off, in the visible and the hidden tests alike:

    with dl.check.references_off("dl.tp", "ProcessGrid"):                # in the notebook
        ...
    dl.launch(dl.check.with_references_off(my_fn, "dp"), world_size=4)  # in the ranks

A switched-off function or class raises ReferenceSwitchedOff when called or when any attribute
of it is read. It is off wherever the library binds it: on the module learners reach (dl.tp), in
the module that defines it, and in every dpmp_lab module that imported it (the submodules of a
split package, hybrid's DataParallel), so library code calling it by its global name meets the
switch too. The grader's own modules, dl.check, keep their references. Every swap goes through
integrity.swapped, the one change the tamper guard accepts. A switched-off function is off in
itself too (its code is a refusal while inside), unless dl.check holds it: a learner's default
argument, alias or table that holds the function object meets the switch as a call by name does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import dpmp_lab
import dpmp_lab.integrity as integrity
from dpmp_lab.i18n.messages import _

__all__ = ["ReferenceSwitchedOff", "TP_COLLECTIVES", "read_library", "references_off",
           "stand_ins", "standing_in", "switched_off", "with_references_off"]

# dl.tp's plain collectives (tp.mappings, not re-exported): a shortcut around the f and g its
# exercises build, so they go off with the rest of dl.tp
TP_COLLECTIVES = ("tp_all_reduce", "tp_all_gather", "tp_reduce_scatter")
_GRADER = "dpmp_lab.check"   # its modules keep their references, whatever is switched off
_ACTIVE: list[tuple[str, ...]] = []   # the targets of the references_off blocks we are inside
_STANDING: list[dict[str, Any]] = []  # the pieces of the stand_ins blocks we are inside


class ReferenceSwitchedOff(RuntimeError):
    """The exercise is graded on the learner's code: the library's version is off."""


@contextlib.contextmanager
def references_off(*targets: str) -> Iterator[None]:
    """While inside, the library's own versions of what an exercise builds raise a clear error.

    targets: names under dpmp_lab, with or without "dl.": a module, "tp" (every public function
    and class of dl.tp, and its plain collectives), a name in one, "tp.copy_to_tp_region",
    "dp.DataParallel", "ProcessGrid", or an attribute of a class, "GridLayout.groups". Use it
    the same way in the visible and the hidden tests (in the notebook, or in the ranks through
    `with_references_off`), and say so in the exercise.
    """
    stand_ins: dict[int, _SwitchedOff] = {}   # id(reference) -> its one stand-in
    references: dict[int, tuple[types.FunctionType, str]] = {}   # the functions themselves
    swaps: dict[tuple[int, str], tuple[Any, str, _SwitchedOff]] = {}
    held = _holders()
    for target in targets:
        for label, owner, name in _resolve(target):
            reference = vars(owner)[name]
            if type(reference) is types.FunctionType and id(reference) not in held.by_grader:
                references.setdefault(id(reference), (reference, label))
            stand_in = stand_ins.setdefault(id(reference), _SwitchedOff(label))
            for holder, as_name in _bindings(owner, name, reference, held):
                swaps.setdefault((id(holder), as_name), (holder, as_name, stand_in))
    with contextlib.ExitStack() as stack:
        for holder, name, stand_in in swaps.values():
            stack.enter_context(integrity.swapped(holder, name, stand_in))
        for held in references.values():
            stack.enter_context(_code_off(held))
        _ACTIVE.append(targets)
        try:
            yield
        finally:
            _ACTIVE.pop()


def switched_off() -> tuple[str, ...]:
    """The targets switched off here now: what a call into the learner's kernel switches off
    there too, when the tests run in a harness of their own (dpmp_lab/harness)."""
    return tuple(dict.fromkeys(t for targets in _ACTIVE for t in targets))


@contextlib.contextmanager
def stand_ins(namespace: dict[str, Any], **pieces: Any) -> Iterator[None]:
    """While inside, the notebook's names `pieces` (the learner's answers to earlier exercises)
    are the library's versions given, and afterwards what they were: a later exercise is graded
    on its own, whatever the earlier answers. A launch sends the ranks what the names are when
    it starts. `namespace` is the notebook's, `globals()`."""
    missing = object()
    saved = {name: namespace.get(name, missing) for name in pieces}
    namespace.update(pieces)
    _STANDING.append(pieces)
    try:
        yield
    finally:
        _STANDING.pop()
        for name, old in saved.items():
            if old is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = old


def standing_in() -> dict[str, Any]:
    """The pieces standing in now: what a call into the learner's kernel binds there too, when
    the tests run in a harness of their own (dpmp_lab/harness)."""
    return {name: value for pieces in _STANDING for name, value in pieces.items()}


def with_references_off(fn: Callable[..., Any], *targets: str) -> Callable[..., Any]:
    """`fn`, run with `references_off(*targets)` around it: a function to launch on the ranks."""
    def graded(*args: Any, **kwargs: Any) -> Any:
        with references_off(*targets):
            return fn(*args, **kwargs)
    graded.__name__ = getattr(fn, "__name__", "graded")
    return graded


class _Holders:
    """What dpmp_lab's modules hold: by the library's modules, {id(value): [(module, name),
    ...]}; by dl.check's, the ids it holds (those keep working)."""

    def __init__(self, modules: list[types.ModuleType]) -> None:
        self.by_library: dict[int, list[tuple[types.ModuleType, str]]] = {}
        self.by_grader: set[int] = set()
        for module in modules:
            key = module.__name__
            if key == _GRADER or key.startswith(_GRADER + "."):
                self.by_grader.update(id(v) for v in list(vars(module).values()))
                continue
            for n, v in list(vars(module).items()):
                self.by_library.setdefault(id(v), []).append((module, n))


# The library's modules and what they hold, read again only when a library module was imported
# or one of them bound a name more or less, or while a switch is on (references_off runs in every
# rank of a graded launch, several times: reading them each time was most of a rank's own work).
# A binding read here that is no longer there is dropped by _bindings, which looks again.
_modules_seen: tuple[int, list[types.ModuleType]] = (0, [])
_holders_seen: tuple[tuple[int, ...], _Holders] | None = None
_SLACK = 64   # entries read back past the new ones, for modules removed from sys.modules meanwhile


def _is_library(key: str, module: Any) -> bool:
    return module is not None and (key == "dpmp_lab" or key.startswith("dpmp_lab."))


def _library_modules() -> list[types.ModuleType]:
    """dpmp_lab and its submodules imported in this process. sys.modules keeps the order its
    entries came in: after imports, only the newest are read (a rank forked from the forkserver
    imports a few modules of its own; reading every entry again touches thousands of objects
    the fork shares, each a page copied)."""
    global _modules_seen
    seen, found = _modules_seen
    now = len(sys.modules)
    if now == seen:
        return found
    if now < seen or not found:
        found = [m for k, m in list(sys.modules.items()) if _is_library(k, m)]
    else:
        newest = itertools.islice(reversed(sys.modules.items()), now - seen + _SLACK)
        known = {id(m) for m in found}
        found = found + [m for k, m in newest if _is_library(k, m) and id(m) not in known][::-1]
    _modules_seen = (now, found)
    return found


def read_library() -> None:
    """Read what the library's modules hold now: every process that loads the API does
    (dpmp_lab.load), and every rank forked from the forkserver starts with the server's read."""
    _holders()


def _holders() -> _Holders:
    global _holders_seen
    modules = _library_modules()
    if _ACTIVE:   # switches on: their stand-ins are bound where the references were
        return _Holders(modules)
    key = (len(modules), *(len(vars(m)) for m in modules))
    if _holders_seen is None or _holders_seen[0] != key:
        _holders_seen = (key, _Holders(modules))
    return _holders_seen[1]


def _refusal(label: str) -> str:
    """The refusal's words, in the language of the moment it is switched off."""
    return _("{label} is switched off here: this exercise is graded on your own code, so write "
             "it yourself (the library's version is there to compare with afterwards)"
             ).format(label=label)


@contextlib.contextmanager
def _code_off(held: tuple[types.FunctionType, str]) -> Iterator[None]:
    """While inside, calling the function object itself raises: its code is a refusal with the
    same free variables (a function's code can only be swapped for code that has them)."""
    fn, label = held
    free = fn.__code__.co_freevars
    code = _refusal_code(label, _refusal(label), free)
    if code.co_freevars != free:
        yield   # not this one: the switches on its names still hold
        return
    original = fn.__code__
    fn.__code__ = code
    try:
        yield
    finally:
        fn.__code__ = original


@functools.lru_cache(maxsize=512)
def _refusal_code(label: str, refusal: str, free: tuple[str, ...]) -> types.CodeType:
    """Code that raises `refusal`, with the free variables `free` (compiled once for each)."""
    lines = ["def outer():", *(f"    {v} = None" for v in free), "    def off(*args, **kwargs):"]
    if free:
        lines.append(f"        ({', '.join(free)},)")
    lines += [f"        raise __import__({__name__!r}, fromlist=['_']).ReferenceSwitchedOff("
              f"{refusal!r})", "    return off"]
    made: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<{label}: switched off>", "exec"), made)   # noqa: S102
    return made["outer"]().__code__


class _SwitchedOff:
    """Stands in for a switched-off function or class: calling it, or reaching any attribute
    of it (`ColumnParallelLinear.from_dense`), raises ReferenceSwitchedOff."""

    def __init__(self, label: str) -> None:
        object.__setattr__(self, "_label", label)

    def _refuse(self) -> ReferenceSwitchedOff:
        return ReferenceSwitchedOff(_refusal(self._label))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __getattr__(self, name: str) -> Any:
        raise self._refuse()

    def __repr__(self) -> str:
        return f"<{self._label}: switched off>"


# -- from a target to the places that hold it ------------------------------------------------------


def _resolve(target: str) -> list[tuple[str, Any, str]]:
    """(label, owner, name) for each reference `target` names; the label is how the learner
    reaches it ("dl.tp.copy_to_tp_region")."""
    path = target.removeprefix("dl.").removeprefix("dpmp_lab.")
    parts = path.split(".")
    if not all(p.isidentifier() for p in parts):
        raise ValueError(f"references_off: {target!r} is not a name under dpmp_lab")
    module, depth = _longest_module(parts)
    if depth == len(parts):
        return [(f"dl.{path}.{name}", owner, name) for owner, name in _public(module)]
    owner: Any = module
    for part in parts[depth:-1]:
        owner = getattr(owner, part, None)
    if parts[-1] not in getattr(owner, "__dict__", {}):
        raise ValueError(f"references_off: dpmp_lab has no {target!r} to switch off")
    return [(f"dl.{path}", owner, parts[-1])]


def _longest_module(parts: list[str]) -> tuple[types.ModuleType, int]:
    """The dpmp_lab module named by the longest prefix of `parts`, and that prefix's length
    (dpmp_lab itself and 0 when no prefix names a module)."""
    for depth in range(len(parts), 0, -1):
        name = "dpmp_lab." + ".".join(parts[:depth])
        try:
            return importlib.import_module(name), depth
        except ModuleNotFoundError as err:
            if not (err.name and (name == err.name or name.startswith(err.name + "."))):
                raise   # the module exists but failed to import: not ours to hide
    return dpmp_lab, 0


def _public(module: types.ModuleType) -> list[tuple[Any, str]]:
    """A whole module's references: its public functions and classes (its __all__, or, for a
    package without one, what it and its submodules define), and its plain collectives."""
    inside = [m for m in _library_modules() if m.__name__.startswith(module.__name__ + ".")]
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_") and (
            getattr(v, "__module__", None) in {module.__name__, *(m.__name__ for m in inside)})]
    found = [(module, n) for n in names if callable(getattr(module, n))]
    for m in (module, *inside):
        found += [(m, n) for n in TP_COLLECTIVES if n in vars(m)]
    return found


def _bindings(owner: Any, name: str, reference: Any, held: _Holders) -> list[tuple[Any, str]]:
    """Every place library code reads `reference` from: `owner.name`, and for a function or
    class held by a module, every dpmp_lab module that holds it, under any name."""
    found = [(owner, name)]
    if not isinstance(owner, types.ModuleType) or not isinstance(
            reference, (types.FunctionType, type, _SwitchedOff)):
        return found   # a class attribute, or a value a module may share by chance (a number)
    return found + [(module, n) for module, n in held.by_library.get(id(reference), [])
                    if (module, n) != (owner, name) and vars(module).get(n) is reference]
