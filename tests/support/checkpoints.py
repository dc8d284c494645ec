"""Kernel side of the one-kernel grading of tests/end_to_end/test_course.py: the notebook's
namespace saved before each cell of the solution's run, put back before a variant's cells, and
compared with the variant's after each cell the variant re-runs.

The grading sends this file's source into the grading kernel (it runs in the sandbox, where the
tests cannot be imported) and calls it there as `__dpmp_checkpoints`; the tests import it too.

A name is dirty when its value differs from the solution's at the same point of the notebook,
and only a cell that reads a dirty name needs to run again. `same` decides "differs" the way a
later cell could tell: values, shapes and dtypes of tensors, the code, defaults and closures of
functions, the state of objects as pickling and deepcopy see it (their reduction). What it cannot
read (an object with state in C and no reduction, a generator) counts as different, and so does
a class or module that is not the very same object.
"""

from __future__ import annotations

import copy
import random
import re
import types
from typing import Any

import torch

_SKIP = re.compile(r"_+|_i+|_i?\d+|_oh|_ih|_dh|In|Out|__\w+__|__dpmp_\w+")
_SHARED = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
_ATOMS = (int, bool, str, bytes, complex, type(None), range, slice, type(Ellipsis),
          torch.dtype, torch.device, torch.layout, torch.memory_format)


def skipped(key: str) -> bool:
    """The shell's own names and the grading's: never saved, put back or compared."""
    return bool(_SKIP.fullmatch(key))


def copy_namespace(namespace: dict) -> dict:
    """The notebook's names, deep-copied with aliases kept; functions, classes and modules
    shared with the kernel, and what cannot be copied kept as is."""
    memo: dict = {}
    out = {}
    for key, value in namespace.items():
        if skipped(key):
            continue
        if key in ("get_ipython", "exit", "quit") or isinstance(value, _SHARED):
            out[key] = value
            continue
        try:
            out[key] = copy.deepcopy(value, memo)
        except Exception:   # noqa: BLE001 - a live handle (a lock, a process): kept
            out[key] = value
    return out


def same(a: Any, b: Any) -> bool:
    """Whether no later cell could tell `a` from `b` by what they hold."""
    try:
        return _same(a, b, {})
    except Exception:   # noqa: BLE001 - what cannot be compared differs (RecursionError too)
        return False


def _same(a: Any, b: Any, seen: dict) -> bool:
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is float:
        return a == b or (a != a and b != b)
    if kind in _ATOMS:
        return a == b
    key = (id(a), id(b))
    if key in seen:   # met again inside itself: decided by the comparison under way
        return True
    seen[key] = (a, b)   # kept alive, so that no later object takes these ids
    if isinstance(a, _SHARED):   # redefined by a cell: the same only if it is the same code
        return kind is types.FunctionType and _same_function(a, b, seen)
    if isinstance(a, torch.Tensor):
        return _same_tensor(a, b, seen)
    if kind in (list, tuple):
        return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b, strict=True))
    if kind is dict:
        return (len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b, strict=True))
                and all(_same(a[x], b[y], seen) for x, y in zip(a, b, strict=True)))
    if kind in (set, frozenset):
        return all(type(x) in _ATOMS for x in a) and a == b
    if kind is types.MethodType:
        return _same(a.__func__, b.__func__, seen) and _same(a.__self__, b.__self__, seen)
    return _same_state(a, b, seen)


def _same_function(a: types.FunctionType, b: types.FunctionType, seen: dict) -> bool:
    if (a.__code__ != b.__code__ or a.__globals__ is not b.__globals__
            or a.__qualname__ != b.__qualname__ or a.__module__ != b.__module__):
        return False
    closures = (a.__closure__ or (), b.__closure__ or ())
    return (len(closures[0]) == len(closures[1])
            and all(_same(_contents(x), _contents(y), seen) for x, y in zip(*closures, strict=True))
            and _same(a.__defaults__, b.__defaults__, seen)
            and _same(a.__kwdefaults__, b.__kwdefaults__, seen)
            and _same(vars(a), vars(b), seen))


_EMPTY = object()


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:   # a name of the enclosing function not bound yet
        return _EMPTY


def _same_tensor(a: torch.Tensor, b: torch.Tensor, seen: dict) -> bool:
    if (a.dtype, a.shape, a.device, a.layout, a.requires_grad) != (
            b.dtype, b.shape, b.device, b.layout, b.requires_grad):
        return False
    if a.layout != torch.strided or a.grad_fn is not None or b.grad_fn is not None:
        return False   # a graph to differentiate through: no value says what it holds
    if (a.stride(), a.storage_offset()) != (b.stride(), b.storage_offset()):
        return False
    equal = torch.equal(a, b)
    if not equal and (a.is_floating_point() or a.is_complex()):
        equal = bool(((a == b) | (a.isnan() & b.isnan())).all())
    return (equal and _same(a.grad, b.grad, seen)
            and _same(getattr(a, "__dict__", {}), getattr(b, "__dict__", {}), seen))


def _same_state(a: Any, b: Any, seen: dict) -> bool:
    """Objects by their reduction (what deepcopy and pickle rebuild them from)."""
    reduced = []
    for x in (a, b):
        r = x.__reduce_ex__(4)
        if isinstance(r, str):   # a global by name: only the very same object is the same
            return False
        r = list(r) + [None] * (6 - len(r))
        r[3] = None if r[3] is None else list(r[3])   # list items
        r[4] = None if r[4] is None else list(r[4])   # dict items
        reduced.append(r)
    return _same(reduced[0], reduced[1], seen)


class Checkpoints:
    """The solution run's namespace and random states before each cell, by cell index.
    `ignored`: names never saved, put back or compared (the harness asks the learner's kernel
    for the learner's names before every cell)."""

    def __init__(self, ignored: tuple[str, ...] | list[str] = ()) -> None:
        self.saved: dict[int, tuple[dict, torch.Tensor, object]] = {}
        self.ignored = frozenset(ignored)

    def _own(self, namespace: dict) -> dict:
        return {k: v for k, v in namespace.items() if k not in self.ignored}

    def save(self, namespace: dict, at: int) -> None:
        self.saved[at] = (copy_namespace(self._own(namespace)), torch.random.get_rng_state(),
                          random.getstate())

    def restore(self, namespace: dict, at: int, keep: tuple[str, ...] = (),
                only: Any = None) -> None:
        """The namespace and random states saved at `at`, except the names in `keep` (the
        variant's own values, which differ from the solution's); only the names in `only`
        when given (those the cells from `at` on read: the others cannot change what runs)."""
        names, torch_rng, rng = self.saved[at]
        wanted = (lambda k: True) if only is None else set(only).__contains__
        for key in [k for k in namespace if not skipped(k) and k not in names
                    and k not in keep and k not in self.ignored and wanted(k)]:
            del namespace[key]
        # a name that holds the saved value already keeps its object, and with it what the
        # kept names share with it (an optimizer and the model whose parameters it steps)
        stale = {k: v for k, v in names.items() if k not in keep and wanted(k)
                 and not (k in namespace and same(namespace[k], v))}
        namespace.update(copy_namespace(stale))
        torch.random.set_rng_state(torch_rng)
        random.setstate(rng)

    def differs(self, namespace: dict, at: int, only: Any = None) -> list[str]:
        """The names whose values differ from the solution's saved at `at` (or that only one
        of the two holds); among `only` when given (the names a later cell reads: a value no
        later cell reads cannot change what one does, and comparing is most of the cost)."""
        names = self.saved[at][0]
        keys = {k for k in namespace if not skipped(k) and k not in self.ignored} | set(names)
        if only is not None:
            keys &= set(only)
        return sorted(k for k in keys
                      if k not in namespace or k not in names or not same(namespace[k], names[k]))
