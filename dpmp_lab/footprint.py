"""Memory measured, not computed: bytes of parameters, gradients and optimizer state one rank
holds at each moment of a training step, sampled from hooks.

    with dl.footprint.record(model, opt) as fp:      # inside a rank
        loss_fn(model(x), y).backward(); model.finish_gradient_sync(); opt.step()
        fp.mark("after step")
    fp.peak("params"); fp.table(); fp.picture(formula=dl.cost.memory(n, dp=2, zero=3))

Moments: as the forward of every module holding parameters directly begins and ends (inside
FSDP's gather and free, so a gathered unit shows), and after backward produces each leaf
gradient (for FSDP one per unit: its shard's gradient), plus whatever the caller marks. Bytes are counted per storage, each once: a gathered FSDP unit
counts while gathered and not after it is freed; ZeRO's flat buffers count where they live.
This is model state only, as in dl.cost.memory: activations are not counted (on a GPU,
torch.cuda.max_memory_allocated tells the whole story; fp.cuda_peak holds it there).

    with dl.footprint.held() as mem:                 # inside a rank
        out = model(x); mem.mark("after forward")
    mem.at("after forward"), mem.end

`held()` counts every tensor instead, wherever it is kept: each storage once, behind every
tensor Python can reach (a module's global, an attribute, a closure, a container, a pool, a
send's handle) and every tensor autograd saved for backward, less what the rank held when the
window opened. `reads()` says which storages the code in its window reads, so that what is
held can be weighed against what is used. `Followed` follows chosen storages by weak
reference: how many are still allocated, whoever holds them. (torch.profiler's record of allocations was tried first: while
it runs, gloo's finished collectives keep their tensors for a while, so it counts them.)
"""

from __future__ import annotations

import contextlib
import html
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dpmp_lab._torch_helpers import every_object
from dpmp_lab.context import device
from dpmp_lab.i18n.messages import _
from dpmp_lab.render import PALETTE, Picture, Table, human_bytes, svg_start

MEMORY_KINDS = ("params", "grads", "optimizer")
# held()'s pause before each of its two walks: what is still on its way out (a finished
# collective's tensors, released by gloo's worker thread) is gone by the second
_SETTLE_S = 0.05


@dataclass(frozen=True)
class Sample:
    """Bytes held at one moment of the step."""

    moment: str
    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


class Footprint:
    """A memory timeline: one Sample per moment, in order (see record())."""

    def __init__(self, model: nn.Module, optimizer: Any = None):
        self.samples: list[Sample] = []
        self.cuda_peak: int | None = None
        self._model, self._optimizer, self._handles = model, optimizer, []

    def __enter__(self) -> Footprint:
        if torch.cuda.device_count() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        root = getattr(self._model, "module", self._model)     # inside a wrapper
        gathers = getattr(self._model, "gathering_modules", [])  # FSDP moved these weights
        for name, mod in root.named_modules():
            if any(True for _ in mod.parameters(recurse=False)) or mod in gathers:
                label = name or type(mod).__name__
                # after FSDP's pre-hook (gathered) and before its post-hook (not yet freed)
                self._handles.append(mod.register_forward_pre_hook(
                    lambda m, a, label=label: self.mark(f"{label} forward begins")))
                self._handles.append(mod.register_forward_hook(
                    lambda m, a, o, label=label: self.mark(f"{label} forward ends"), prepend=True))
        for name, p in self._model.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda p, name=name: self.mark(f"grad of {name}")))
        self.mark("start")
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if torch.cuda.device_count() and torch.cuda.is_initialized():
            self.cuda_peak = torch.cuda.max_memory_allocated()
        self._model = self._optimizer = None      # a Footprint travels back: keep no model

    def mark(self, moment: str) -> None:
        """Sample now, under the name `moment`."""
        params, grads, state = _state_tensors(self._model, self._optimizer)
        self.samples.append(Sample(moment, _bytes(params), _bytes(grads), _bytes(state)))

    def peak(self, kind: str = "total") -> int:
        """The largest number of bytes of one kind ("params", "grads", "optimizer", "total")."""
        if kind not in (*MEMORY_KINDS, "total"):
            raise ValueError(_("kind must be one of {kinds} or 'total', not {kind!r}").format(
                kinds=", ".join(MEMORY_KINDS), kind=kind))
        return max(getattr(s, kind) for s in self.samples)

    def table(self) -> Table:
        return Table([_("moment"), _("params"), _("grads"), _("optimizer"), _("total")],
                     [[s.moment, *(human_bytes(getattr(s, k)) for k in (*MEMORY_KINDS, "total"))]
                      for s in self.samples], title=_("model state held by this rank"))

    def picture(self, formula: Any = None, title: str = "") -> FootprintPicture:
        """Bytes over the moments of the step, one line per kind; `formula` (a
        dl.cost.Memory) drawn as dashed lines at the values it predicts."""
        return FootprintPicture(self.samples, formula, title)


def record(model: nn.Module, optimizer: Any = None) -> Footprint:
    """Sample `model`'s (and `optimizer`'s) memory at each moment of what runs inside."""
    if not isinstance(model, nn.Module):
        raise TypeError(_("model must be an nn.Module, not {kind}").format(
            kind=type(model).__name__))
    return Footprint(model, optimizer)


def _state_tensors(model: nn.Module, optimizer: Any):
    """(parameters, gradients, optimizer state) tensors held now; FSDP and ZeRO add what they
    hold outside the model's parameters through their held_tensors()."""
    params = list(model.parameters())
    grads = [p.grad for p in params]
    state: list[torch.Tensor] = []
    inner = getattr(optimizer, "optimizer", optimizer)  # ZeRO wraps a torch optimizer
    if inner is not None:
        for s in inner.state.values():
            state += [t for t in s.values() if isinstance(t, torch.Tensor)]
    for holder in (model, optimizer):
        if hasattr(holder, "held_tensors"):
            held = holder.held_tensors()
            params += held["params"]
            grads += held["grads"]
    return params, grads, state


def _bytes(tensors: list[torch.Tensor | None]) -> int:
    seen: dict[tuple[int, int], int] = {}
    for t in tensors:
        if t is not None:
            st = t.untyped_storage()
            if st.nbytes():
                seen[(st.data_ptr(), st.nbytes())] = st.nbytes()
    return sum(seen.values())


class Held:
    """Bytes of tensor storage the rank holds at moments of a `held()` window, beyond what it
    held when the window opened: at each mark (`at`) and when the window closed (`end`)."""

    def __init__(self, on: torch.device) -> None:
        self.device = str(on)
        self.marks: dict[str, int] = {}
        self.storages: dict[str, dict[int, int]] = {}   # per mark: {data pointer: bytes}
        self.end = 0
        self._on, self._before = on, _storages(on)

    def mark(self, moment: str) -> None:
        """The bytes held now, kept under the name `moment` (and which storages they are)."""
        if not isinstance(moment, str) or moment in self.marks:
            raise ValueError(_("a mark is a new name, not {moment!r}").format(moment=moment))
        self.storages[moment] = self._held_now()
        self.marks[moment] = sum(self.storages[moment].values())

    def at(self, moment: str) -> int:
        if moment not in self.marks:
            raise KeyError(_("no mark {moment!r}; the marks are {marks}").format(
                moment=moment, marks=list(self.marks)))
        return self.marks[moment]

    def now(self) -> int:
        """Bytes of the storages held now that the window did not start with."""
        return sum(self._held_now().values())

    def _held_now(self) -> dict[int, int]:
        """{data pointer: bytes} of those storages: found by two walks in a row (what only the
        first finds was on its way out)."""
        time.sleep(_SETTLE_S)     # a finished gloo collective lets go of its tensors from its
        first = _storages(self._on)   # worker thread, a moment after wait() has returned
        time.sleep(_SETTLE_S)
        second = _storages(self._on)
        return {ptr: size for ptr, (size, ref) in second.items()
                if ptr in first and not first[ptr][1].expired()
                and (ptr not in self._before or self._before[ptr][1].expired())}


@contextlib.contextmanager
def held(on: torch.device | str | None = None) -> Iterator[Held]:
    """Measure the tensor storage that what runs inside leaves held (default device: dl.device()
    in a rank, the CPU outside one)."""
    if on is None:
        on = device() if torch.distributed.is_initialized() else torch.device("cpu")
    result = Held(torch.device(on))
    yield result
    result.end = result.now()


class Reads(TorchDispatchMode):
    """The storages the tensor operations read while the window is open ({data pointer:
    bytes} in `storages`): which of what a rank holds some later step actually uses."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for t in tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                st = t.untyped_storage()
                self.storages[st.data_ptr()] = st.nbytes()
        return func(*args, **(kwargs or {}))


class Made(TorchDispatchMode):
    """The storages the tensor operations in its window make (0-d results too, unless
    `scalars=False`), and with `written` those they fill (a workspace made before), followed by
    weak reference: `alive()`, the bytes still allocated, whoever keeps them; cheap to ask."""

    def __init__(self, written: bool = False, scalars: bool = True) -> None:
        super().__init__()
        self.written, self.scalars = written, scalars
        self._refs: dict[int, tuple[int, StorageWeakRef]] = {}

    def _follow(self, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            st = t.untyped_storage()
            known = self._refs.get(st.data_ptr())
            if known is None or known[1].expired():
                self._refs[st.data_ptr()] = (st.nbytes(), StorageWeakRef(st))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out, kwargs = func(*args, **(kwargs or {})), kwargs or {}
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        fresh = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)
                 and t.untyped_storage().data_ptr() not in given and (self.scalars or t.dim())]
        if self.written:
            # what an operator writes is in its `_schema` (no public name; torch's modes read it),
            # but c10d's declare nothing: their first argument is what they fill
            schema = func._schema.arguments
            names = {a.name for a in schema if a.alias_info is not None and a.alias_info.is_write}
            fresh += tree_leaves([a for i, (a, arg) in enumerate(zip(args, schema, strict=False))
                                  if arg.name in names or (func.namespace == "c10d" and i == 0)]
                                 + [v for k, v in kwargs.items() if k in names])
        for t in fresh:
            self._follow(t)
        return out

    def alive(self) -> int:
        return sum(size for size, ref in self._refs.values() if not ref.expired())


def made(written: bool = False, scalars: bool = True) -> Made:
    """`with dl.footprint.made() as m:`: `m.alive()`, the bytes left of what the code made."""
    return Made(written, scalars)


def reads() -> Reads:
    """`with dl.footprint.reads() as r:`: which storages the code inside reads, by any tensor
    operation, wherever the tensors come from (a container, a global, a closure)."""
    return Reads()


class Followed:
    """Storages followed by weak reference: how many are still allocated, whoever keeps them (a
    view, a send's handle, autograd, a list), and nothing kept alive by the following."""

    def __init__(self) -> None:
        self._refs: list[StorageWeakRef] = []

    def __call__(self, tensor: torch.Tensor) -> None:
        self._refs.append(StorageWeakRef(tensor.untyped_storage()))

    def alive(self) -> int:
        return sum(not ref.expired() for ref in self._refs)


def _storages(on: torch.device) -> dict[int, tuple[int, StorageWeakRef]]:
    """{data pointer: (bytes, weak reference)} of every storage on device `on` behind a tensor
    that Python can reach (gc finds every tensor object: in a global, an attribute, a closure,
    a container, a handle) or that autograd saved for backward in a graph those reach."""
    found: dict[int, tuple[int, StorageWeakRef]] = {}
    nodes, seen = [], set()

    def add(t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):   # a wrapper without storage of its own
            return
        if _on(t.device, on) and st.nbytes() and st.data_ptr() not in found:
            found[st.data_ptr()] = (st.nbytes(), StorageWeakRef(st))
        if t.grad_fn is not None:
            nodes.append(t.grad_fn)

    for obj in every_object():   # after a collection: a tensor only a cycle keeps is not held
        if issubclass(type(obj), torch.Tensor):
            add(obj)
            if obj.is_leaf or obj.retains_grad:   # a non-leaf's .grad warns and is None
                add(obj.grad)
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes += [next_node for next_node, _ in node.next_functions]
        for value in _saved(node):
            add(value)
    return found


def _on(where: torch.device, on: torch.device) -> bool:
    """Whether a tensor on `where` lives on device `on` (the device audit's "cpu:0" is the CPU)."""
    return where.type == on.type and (on.type == "cpu" or where.index == on.index)


def _saved(node: Any) -> list[Any]:
    """What autograd node `node` keeps for backward: a built-in node's _saved_* fields, a
    custom Function's saved tensors and its ctx attributes."""
    out: list[Any] = []
    for name in [n for n in dir(node) if n.startswith("_saved_")] + ["saved_tensors"]:
        try:
            value = getattr(node, name)
        except (AttributeError, RuntimeError):   # none, or freed by a backward that has run
            continue
        out += list(value) if isinstance(value, (list, tuple)) else [value]
    for value in vars(node).values() if hasattr(node, "__dict__") else ():
        out += list(value) if isinstance(value, (list, tuple)) else [value]
    return out


class FootprintPicture(Picture):
    """Model-state bytes per moment of a step: text in a terminal, SVG lines in a notebook."""

    def __init__(self, samples: list[Sample], formula: Any, title: str):
        self.samples, self.formula = samples, formula
        self.title = title or "model state held by this rank over one step"

    def __str__(self) -> str:
        lines = [self.title]
        top = max(max(s.total for s in self.samples), 1)
        for s in self.samples:
            bar = "#" * round(30 * s.total / top)
            lines.append(f"{s.moment[:28]:<28} {bar:<30} {human_bytes(s.total)}")
        if self.formula is not None:
            lines.append("formula: " + ", ".join(f"{k} {human_bytes(getattr(self.formula, k))}"
                                                 for k in MEMORY_KINDS))
        return "\n".join(lines)

    def _repr_svg_(self) -> str:
        w, h, left, top, bottom = 640, 260, 60, 28, 60
        n = max(len(self.samples) - 1, 1)
        kinds = [*MEMORY_KINDS, "total"]
        peak = max([getattr(s, k) for s in self.samples for k in kinds]
                   + ([self.formula.total] if self.formula is not None else []) + [1])
        x = lambda i: left + (w - left - 10) * i / n  # noqa: E731
        y = lambda b: top + (h - top - bottom) * (1 - b / peak)  # noqa: E731
        out = [svg_start(w, h), f'<text x="4" y="16">{html.escape(self.title)}</text>',
               f'<text x="4" y="{y(peak) + 4:.0f}">{human_bytes(peak)}</text>',
               f'<text x="4" y="{y(0) + 4:.0f}">0</text>']
        for colour, kind in zip(PALETTE, kinds, strict=False):
            pts = " ".join(f"{x(i):.1f},{y(getattr(s, kind)):.1f}"
                           for i, s in enumerate(self.samples))
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                       f'stroke-width="2"><title>{kind}</title></polyline>')
            if self.formula is not None:
                v = y(getattr(self.formula, kind))
                out.append(f'<line x1="{left}" x2="{w - 10}" y1="{v:.1f}" y2="{v:.1f}" '
                           f'stroke="{colour}" stroke-dasharray="4 3"/>')
        for j, kind in enumerate(kinds):
            out.append(f'<rect x="{left + 120 * j}" y="{h - 22}" width="12" height="12" '
                       f'fill="{PALETTE[j]}"/><text x="{left + 120 * j + 16}" y="{h - 12}">'
                       f"{kind}</text>")
        out.append(f'<text x="{left}" y="{h - 34}">moments of the step: forward, backward, '
                   "step (dashed: the formula)</text></svg>")
        return "".join(out)


__all__ = ["Followed", "Footprint", "FootprintPicture", "Held", "Made", "Sample", "held", "made",
           "record"]
