"""Receipts: evidence, read outside the kernel, that every graded test cell ran its checks.

nbgrader executes the hidden tests in the learner's own kernel, so a learner's cell can make a
test cell do nothing: an IPython input transformer that turns every later cell into `pass`,
an AST transformer, an event hook, a replaced `showtraceback`, a patched check. nbgrader only
sees "no error" and gives full marks. So before execution the grader (nbgrader_plugin, in its
own process) appends one line to every graded test cell:

    __import__("dpmp_lab.instructor.receipts").instructor.receipts.receipt("<nonce>", {"dl": "dpmp_lab", ...})

with a nonce made for that cell of that job. The line runs only if everything above it in the
cell ran without raising; it publishes a receipt (a display output of its own MIME type) with
the nonce and the kernel's state: foreign input/AST transformers and event callbacks, trace
functions, shell methods shadowed on the instance, whether the notebook's imported names are
still the modules they were imported as, integrity's own record, and a digest per namespace
of the grader's functions and classes (module, name, file, line of each). After execution
the grader checks, outside the kernel: a test cell that shows no error must hold its receipt,
with its nonce, a clean state, and digests equal to those of the same code imported in the
grader's own process (`expected_digests`). Anything else is a forgery, reported with what
was found; the receipt line and its output are removed before the notebook is saved.

What this does not stop: a learner who reads this file and writes a transformer that pulls
the nonce out of each test cell and publishes a clean receipt with the expected digests (all
of which it can compute). It turns every "one line and full marks" trick into deliberate
work against this code, and tells the instructor about every trick short of that.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import secrets
import sys
import threading
import types
import warnings
from collections.abc import Iterable
from typing import Any

from IPython import get_ipython
from IPython.display import publish_display_data

from dpmp_lab import integrity

MIME = "application/vnd.dpmp-lab.receipt+json"
LINE_START = '\n__import__("dpmp_lab.instructor.receipts").instructor.receipts.receipt('

# namespaces whose functions and classes the tests rely on: the grader's (integrity's guarded
# modules), the builtins (`abs` in an assert), math and torch.testing
MODULES = (*integrity.GUARDED_MODULES, "dpmp_lab.instructor.receipts", "builtins", "torch.testing", "math")
# torch's top level changes while a notebook runs (importing torch._dynamo wraps
# torch.manual_seed), so only the comparisons an assert uses are covered there
TORCH_NAMES = ("allclose", "isclose", "equal", "all", "any", "abs", "eq", "ne", "max", "min",
               "sum", "norm", "tensor")
# the path a cell takes through IPython and ipykernel
CLASSES = ("IPython.core.interactiveshell.InteractiveShell",
           "ipykernel.zmqshell.ZMQInteractiveShell", "ipykernel.ipkernel.IPythonKernel",
           "ipykernel.kernelbase.Kernel")
SHELL_METHODS = ("run_cell", "run_cell_async", "run_ast_nodes", "run_code", "transform_cell",
                 "transform_ast", "showtraceback", "_showtraceback", "showsyntaxerror",
                 "should_run_async", "ex", "ev", "safe_execfile")
# builtins a kernel legitimately adds or replaces (ipykernel's input, IPython's display,
# debugpy's runfile): outside a kernel they differ, so no digest covers them
KERNEL_BUILTINS = ("input", "raw_input", "display", "execfile", "runfile", "get_ipython",
                   "exit", "quit", "help", "copyright", "credits", "license")
# whose hooks and transformers are the kernel's own
OWN_MODULES = ("IPython", "ipykernel", "ipywidgets", "matplotlib_inline", "matplotlib",
               "comm", "jupyter_client", "dpmp_lab", "traitlets", "debugpy")


# -- the grader's side: add, find, judge ---------------------------------------------------------


def add(cells: Iterable[Any], names: dict[str, str]) -> dict[int, str]:
    """Append the receipt line to every cell given; {index in `cells`: its nonce}."""
    nonces = {}
    for i, cell in enumerate(cells):
        nonce = secrets.token_hex(16)
        nonces[i] = nonce
        cell.source += f"{LINE_START}{nonce!r}, {names!r})\n"   # strip() gives it back whole
    return nonces


def strip(cell: Any) -> list[dict]:
    """Remove the receipt line from a cell and every receipt from its outputs; the receipts
    found (outputs of the receipt MIME type, whoever published them)."""
    at = cell.source.rfind(LINE_START)
    if at >= 0:
        cell.source = cell.source[:at]
    found, kept = [], []
    for out in cell.get("outputs", []):
        data = out.get("data", {}) if out.get("output_type") in ("display_data",
                                                                 "execute_result") else {}
        if MIME in data:
            found.append(data[MIME])
        else:
            kept.append(out)
    cell.outputs = kept
    return found


def expected_digests() -> dict[str, str]:
    """The digests a clean kernel reports, computed from the same code in this process."""
    for name in (*MODULES, *(c.rpartition(".")[0] for c in CLASSES)):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    return digests()


def problems(receipts: list[dict], nonce: str, expected: dict[str, str]) -> list[str]:
    """What is wrong with a passed test cell's receipts: nothing ([]) for an honest one."""
    mine = [r for r in receipts if isinstance(r, dict) and r.get("nonce") == nonce]
    if not mine:
        return ["the cell showed no error but never reached its end (no receipt): something "
                "skipped or rewrote it"]
    state = mine[-1]
    found = [f"{what}: {', '.join(map(str, state[key]))}" for key, what in (
        ("hooks", "hooks installed in the kernel"), ("tracing", "trace functions set"),
        ("shadowed", "the shell's methods replaced"), ("names", "imported names rebound"),
        ("changed", "the grader's functions changed")) if state.get(key)]
    if not state.get("guarded"):
        found.append("integrity's record of the grader's functions was emptied")
    theirs = state.get("digests", {})
    changed = sorted(name for name, digest in expected.items() if theirs.get(name) != digest)
    if changed:
        found.append("functions or classes differ from the installed code in: "
                     + ", ".join(changed))
    return found


# -- the kernel's side ----------------------------------------------------------------------------


def receipt(nonce: str, names: dict[str, str]) -> None:
    """Publish this test cell's receipt (called by the line the grader appended)."""
    publish_display_data({MIME: {"nonce": nonce, **state(get_ipython(), names)}})


def state(shell: Any, names: dict[str, str]) -> dict:
    """The kernel's state as a receipt reports it."""
    return {"hooks": foreign_hooks(shell), "tracing": _tracing(),
            "shadowed": [m for m in SHELL_METHODS if shell is not None and m in vars(shell)
                         and not _own(vars(shell)[m])],
            "names": _rebound(shell, names), "changed": integrity.changes(),
            "guarded": integrity.guarded_count(), "digests": digests()}


def foreign_hooks(shell: Any) -> list[str]:
    """Input transformers, AST transformers and event callbacks the kernel did not bring."""
    if shell is None:
        return []
    found = []
    manager = getattr(shell, "input_transformer_manager", None)
    lists = {"input_transformers_cleanup": getattr(shell, "input_transformers_cleanup", []),
             "input_transformers_post": getattr(shell, "input_transformers_post", []),
             "ast_transformers": getattr(shell, "ast_transformers", []),
             "line_transforms": getattr(manager, "line_transforms", []),
             "token_transformers": getattr(manager, "token_transformers", [])}
    for event, callbacks in getattr(getattr(shell, "events", None), "callbacks", {}).items():
        lists[f"events[{event}]"] = callbacks
    for where, items in lists.items():
        for item in items:
            if not _own(item):
                found.append(f"{where}: {_name(item)}")
    return found


def digests() -> dict[str, str]:
    """{namespace: sha256 of the identities of its functions and classes} for every loaded
    module of MODULES and class of CLASSES."""
    with warnings.catch_warnings():   # torch's deprecated aliases warn when looked at, and
        warnings.simplefilter("ignore")   # a test cell's stderr costs it its points
        return _digests()


def _digests() -> dict[str, str]:
    out = {}
    for name in MODULES:
        module = sys.modules.get(name)
        if module is not None:
            members = _members(vars(module), private=name.startswith("dpmp_lab"))
            if name == "builtins":
                members = {k: v for k, v in members.items() if k not in KERNEL_BUILTINS}
            out[name] = _digest(members)
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = _digest(_members({k: getattr(torch, k, None) for k in TORCH_NAMES},
                                        private=False))
    for path in CLASSES:
        module_name, _, cls_name = path.rpartition(".")
        cls = getattr(sys.modules.get(module_name), cls_name, None)
        if isinstance(cls, type):
            out[path] = _digest(_members(vars(cls), private=True))
    return out


def _members(namespace: dict, private: bool) -> dict[str, str]:
    out = {}
    for key, value in list(namespace.items()):
        if key.startswith("__") or (key.startswith("_") and not private):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
            out[key] = _identity(value)
    return out


def _identity(obj: Any, depth: int = 0) -> str:
    """Where an object was defined: a replacement made in a cell names another place."""
    parts = [type(obj).__name__, str(getattr(obj, "__module__", "")),
             str(getattr(obj, "__qualname__", getattr(obj, "__name__", "")))]
    code = getattr(obj, "__code__", None) if isinstance(obj, types.FunctionType) else None
    if code is not None:
        parts += [code.co_filename, str(code.co_firstlineno)]
        wrapped = vars(obj).get("__wrapped__")
        if wrapped is not None and depth < 3:
            parts.append("(" + _identity(wrapped, depth + 1) + ")")
    return ":".join(parts)


def _digest(members: dict[str, str]) -> str:
    text = "\n".join(f"{k}={v}" for k, v in sorted(members.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _tracing() -> list[str]:
    found = [name for name, fn in (("sys.settrace", sys.gettrace()),
                                   ("sys.setprofile", sys.getprofile()),
                                   ("threading.settrace", threading.gettrace()),
                                   ("threading.setprofile", threading.getprofile()))
             if fn is not None and not _own(fn)]
    monitoring = getattr(sys, "monitoring", None)   # Python 3.12+
    if monitoring is not None:
        found += [f"sys.monitoring tool {i}" for i in range(6)
                  if monitoring.get_tool(i) not in (None, "sys.monitoring")]
    return found


def _rebound(shell: Any, names: dict[str, str]) -> list[str]:
    """The notebook's imported names that are no longer what they were imported as."""
    if shell is None:
        return []
    found = []
    for name, where in names.items():
        module_name, _, attr = where.partition(":")
        module = sys.modules.get(module_name)
        expected = getattr(module, attr, None) if attr else module
        # a name not bound yet is one a later cell imports
        if name in shell.user_ns and shell.user_ns[name] is not expected:
            found.append(name)
    return found


def _own(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "")
    return str(module).split(".")[0] in OWN_MODULES


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__qualname__', type(obj).__name__)} from " \
           f"{getattr(obj, '__module__', None) or type(obj).__module__}"


def imported_names(sources: Iterable[str]) -> dict[str, str]:
    """{name: "module" or "module:attr"} bound by the imports of the notebook's own cells."""
    out: dict[str, str] = {}
    for text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        out[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        out[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        out[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return out


__all__ = ["MIME", "add", "digests", "expected_digests", "foreign_hooks", "imported_names",
           "problems", "receipt", "state", "strip"]
