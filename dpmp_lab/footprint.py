"""Memory measured, not computed: bytes of parameters, gradients and optimizer state one rank
holds at each moment of a training step, sampled from hooks.

    with dl.footprint.record(model, opt) as fp:      # inside a rank
        loss_fn(model(x), y).backward(); model.finish_gradient_sync(); opt.step()
        fp.mark("after step")
    fp.peak("params"); fp.table(); fp.picture(formula=dl.cost.memory(n, dp=2, zero=3))

Moments: as the forward of every module holding parameters directly begins and ends (inside
FSDP's gather and free, so a gathered unit shows), and
after backward produces each leaf gradient (for FSDP one per unit: its shard's gradient), plus
whatever the caller marks. Bytes are counted per storage, each once: a gathered FSDP unit
counts while gathered and not after it is freed; ZeRO's flat buffers count where they live.
This is model state only, as in dl.cost.memory: activations are not counted (on a GPU,
torch.cuda.max_memory_allocated tells the whole story; fp.cuda_peak holds it there).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpmp_lab.render import PALETTE, Picture, Table, human_bytes, svg_start

MEMORY_KINDS = ("params", "grads", "optimizer")


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
                    lambda m, a, o, label=label: self.mark(f"{label} forward ends"),
                    prepend=True))
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
            raise ValueError(f"kind must be one of {', '.join(MEMORY_KINDS)} or 'total', not {kind!r}")
        return max(getattr(s, kind) for s in self.samples)

    def table(self) -> Table:
        return Table(["moment", "params", "grads", "optimizer", "total"],
                     [[s.moment, *(human_bytes(getattr(s, k)) for k in (*MEMORY_KINDS, "total"))]
                      for s in self.samples], title="model state held by this rank")

    def picture(self, formula: Any = None, title: str = "") -> FootprintPicture:
        """Bytes over the moments of the step, one line per kind; `formula` (a
        dl.cost.Memory) drawn as dashed lines at the values it predicts."""
        return FootprintPicture(self.samples, formula, title)


def record(model: nn.Module, optimizer: Any = None) -> Footprint:
    """Sample `model`'s (and `optimizer`'s) memory at each moment of what runs inside."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, not {type(model).__name__}")
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


__all__ = ["Footprint", "FootprintPicture", "Sample", "record"]
