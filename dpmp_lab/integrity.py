"""Tamper evidence in the ranks: what a rank records for grading (its trace, its collectives)
comes from the library's own functions, not ones the learner's code swapped in.

The tests that decide a grade run in a harness of their own (dpmp_lab/harness), where no code
of the submission runs; the ranks they launch run the learner's code beside the library's
tracer, so a rank is where the library's functions could still be changed under the grader:
three lines that replace `dl.trace.tensors_in` or `dist.all_reduce` in a rank would change what
its trace reports. So:

1. A snapshot. At import, every function and class of the library's grading modules and of
   torch.distributed, and the methods of the classes the grader reads (Trace, CommEvent,
   LaunchResult), is remembered (`remember`); `verify()` compares, and fails naming what
   changed. Every rank launched under nbgrader calls it after the rank's code ran.
2. A scan of the submitted source (dpmp_lab/instructor/scan.py) reads the learner's cells
   without running them: a write into the library's code zeroes the notebook and flags it.

What it does not stop: a learner who reads this file and works around both (rebuilding the
functions with their original identity, say) changes what their own ranks report; the instructor
guide (docs/instructor-guide.md) says so. The learner's own kernel is not guarded at all: the tests do not run there.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import pkgutil
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["GRADER_MODULES", "GRADER_PACKAGES", "GUARDED_CLASSES", "GUARDED_MODULES",
           "TORCH_MODULES", "TamperingDetected", "changes", "grading", "guarded_count",
           "remember", "swapped", "verify"]

# The grader's modules, whose functions and classes are guarded: the package's facade (with all
# it re-exports), these modules, and every module of these packages, found on disk, so that a
# module added to check/ or launcher/ is guarded without a word here, and a renamed one fails
# at import instead of going unguarded.
GRADER_MODULES = ("dpmp_lab", "dpmp_lab.context", "dpmp_lab.trace", "dpmp_lab.integrity")
GRADER_PACKAGES = ("dpmp_lab.check", "dpmp_lab.launcher")
TORCH_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")


def _grader_modules() -> tuple[str, ...]:
    found = list(GRADER_MODULES)
    for package in GRADER_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(f"integrity: the grader's package {package} is gone (renamed?): "
                              "name its new place in GRADER_PACKAGES")
        found += [package, *(f"{package}.{m.name}"
                             for m in pkgutil.iter_modules(spec.submodule_search_locations))]
    return (*found, *TORCH_MODULES)


GUARDED_MODULES = _grader_modules()
GUARDED_CLASSES = ("dpmp_lab.trace.Trace", "dpmp_lab.trace.CommEvent",
                   "dpmp_lab.trace._Recorder", "dpmp_lab.launcher.launch.LaunchResult",
                   "dpmp_lab.check.CheckFailed")

_snapshot: dict[tuple[str, str], Any] = {}


class TamperingDetected(AssertionError):
    """The grader's own functions were changed from inside the notebook or a rank."""

    def _render_traceback_(self) -> list[str]:
        return ["TamperingDetected: " + str(self)]


def _guardable(value: Any) -> bool:
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type,
                              types.ModuleType))


_MISSING = object()


def remember() -> None:
    """Take the snapshot (once, when the process loads the learner's API: dpmp_lab.load)."""
    if _snapshot:
        return
    with warnings.catch_warnings():   # torch's deprecated aliases warn when looked at
        warnings.simplefilter("ignore")
        _take_snapshot()


def _take_snapshot() -> None:
    for name in GUARDED_MODULES:
        module = importlib.import_module(name)   # a name that is gone fails here, loudly
        ours = name.startswith("dpmp_lab")
        for attr, value in vars(module).items():
            # torch's private globals may change at run time; its public API does not
            if (ours and not attr.startswith("__") or not attr.startswith("_")) \
                    and _guardable(value):
                _snapshot[(name, attr)] = value
    for path in GUARDED_CLASSES:
        module_name, _, cls_name = path.rpartition(".")
        cls = getattr(sys.modules[module_name], cls_name)
        for attr, value in vars(cls).items():
            if not attr.startswith("__") or attr in ("__init__", "__eq__", "__repr__"):
                _snapshot[(path, attr)] = value


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """The one sanctioned change: `owner.name` is `value` while inside, snapshot included, so
    verify() accepts it (dl.check.references_off switches references off so)."""
    key = (getattr(owner, "__name__", ""), name)
    if isinstance(owner, type):
        key = (f"{owner.__module__}.{owner.__qualname__}", name)
    guarded = key in _snapshot
    old = vars(owner)[name]
    try:
        if guarded:
            _snapshot[key] = value
        if isinstance(owner, types.ModuleType):
            vars(owner)[name] = value
        else:
            setattr(owner, name, value)
        yield
    finally:
        if isinstance(owner, types.ModuleType):
            vars(owner)[name] = old
        else:
            setattr(owner, name, old)
        if guarded:
            _snapshot[key] = old


def changes() -> list[str]:
    """What differs from the snapshot: 'dpmp_lab.check.comm was replaced', ..."""
    found = []
    for (owner, attr), value in _snapshot.items():
        holder = sys.modules.get(owner)
        if holder is None:   # a class
            module_name, _, cls_name = owner.rpartition(".")
            holder = getattr(sys.modules.get(module_name), cls_name, None)
            now = vars(holder).get(attr, _MISSING) if holder is not None else _MISSING
        else:
            now = vars(holder).get(attr, _MISSING)
        if now is _MISSING:
            found.append(f"{owner}.{attr} was deleted")
        elif now is not value:
            found.append(f"{owner}.{attr} was replaced")
    return found


def verify() -> None:
    """Fail, saying what changed, if the grader's functions are not the ones imported."""
    changed = changes()
    if changed:
        raise TamperingDetected(
            "the grader's own code was changed in this notebook, so no check can be trusted: "
            + "; ".join(changed[:8]) + (" ..." if len(changed) > 8 else "")
            + ". Restart the kernel and run the notebook without those changes.")


def guarded_count() -> int:
    """How many functions and classes the snapshot holds (0: never taken, or emptied)."""
    return len(_snapshot)


def grading() -> bool:
    """True while nbgrader autogrades or validates this notebook."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))
