"""Pipeline parallelism: cut a model into stages, stream micro-batches through them.

    stages = pp.split_pieces(model.pieces(), n_stages=4)      # [embed, blocks..., head] cut in 4
    print(pp.one_f_one_b(4, 8))                               # who does what when, and the bubble
    stage = pp.PipelineStage(stages[grid.pp_rank], grid.pp_group, activation_shape=(2, 16, 32))
    result = pp.run_schedule("1f1b", stage, idx, targets, n_microbatches=4, loss_fn=lm_loss)

Each pipeline stage (a rank) holds a run of consecutive layers and talks only to its two
neighbours: it receives activations from the previous stage and sends its own to the next
(forward), and the activation gradients go the other way (backward). A batch that went
through the stages in one piece would keep all but one stage idle, so the batch is cut into
m micro-batches: while stage 1 works on micro-batch 0, stage 0 already works on micro-batch 1.

A *schedule* says, for every stage, in which order it runs the forward (F) and backward (B)
of each micro-batch:
- naive: one micro-batch at a time through the whole pipeline; one stage busy at any moment.
- GPipe (all forward, then all backward, "AFAB"): the pipeline fills, drains, fills again.
- 1F1B: after a warm-up of p - stage - 1 forwards each stage alternates one forward and one
  backward, so it frees a micro-batch's activations as soon as it can: a stage holds at most
  p - stage micro-batches of activations instead of GPipe's m, for the same bubble.
The *bubble* is the time stages sit idle while the pipeline fills and drains. With equal
stages it is (p - 1) / (m + p - 1) of the step for GPipe and 1F1B alike: more micro-batches,
smaller bubble.

A Schedule is plain data (per-stage lists of actions), simulated on a time grid here and
executed on real ranks by run_schedule, which sends with isend and receives with blocking
recv: in 1F1B's steady state two neighbours both want to send first (one an activation, the
other a gradient), and with two blocking sends they would wait for each other forever.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab.worker import device as rank_device

# -- splitting a model into stages ------------------------------------------------------------


def split_pieces(pieces: Sequence[nn.Module], n_stages: int,
                 boundaries: Sequence[int] | None = None) -> list[nn.Sequential]:
    """Cut a list of consecutive pieces into n_stages runs, one nn.Sequential per stage.

    Without boundaries the cut is balanced by count (the first stages take one more piece when
    it does not divide). boundaries=[b1, ...] gives the index of the first piece of stage 1, 2,
    ...: for TinyGPT's [embed, block0, block1, head], boundaries=[2] gives [embed, block0] and
    [block1, head]. The stages share the pieces' parameters (nothing is copied), so gradients
    land in the original model.
    """
    pieces = list(pieces)
    _check_count("n_stages", n_stages)
    for i, piece in enumerate(pieces):
        if not isinstance(piece, nn.Module):
            raise TypeError(f"piece {i} is a {type(piece).__name__}, not an nn.Module")
    if len(pieces) < n_stages:
        raise ValueError(f"{len(pieces)} pieces cannot fill {n_stages} pipeline stages: every "
                         "stage needs at least one piece (use fewer stages or a deeper model)")
    if boundaries is None:
        base, extra = divmod(len(pieces), n_stages)
        sizes = [base + (1 if s < extra else 0) for s in range(n_stages)]
        cuts = [sum(sizes[:s]) for s in range(1, n_stages)]
    else:
        cuts = [int(b) for b in boundaries]
        if len(cuts) != n_stages - 1:
            raise ValueError(f"{n_stages} stages need {n_stages - 1} boundaries (where stages "
                             f"1..{n_stages - 1} start), got {len(cuts)}: {list(boundaries)}")
        edges = [0, *cuts, len(pieces)]
        if any(a >= b for a, b in zip(edges[:-1], edges[1:], strict=True)):
            raise ValueError(f"boundaries {cuts} must rise strictly between 0 and "
                             f"{len(pieces)} (exclusive), so that every stage gets a piece")
    edges = [0, *cuts, len(pieces)]
    return [nn.Sequential(*pieces[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]


# -- schedules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One unit of a stage's work: the forward ("F") or backward ("B") of one micro-batch."""

    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in ("F", "B"):
            raise ValueError(f"an action is 'F' (forward) or 'B' (backward), not {self.kind!r}")
        if isinstance(self.microbatch, bool) or not isinstance(self.microbatch, int) \
                or self.microbatch < 0:
            raise ValueError(f"micro-batch index must be an int >= 0, not {self.microbatch!r}")

    @classmethod
    def parse(cls, text: str) -> Action:
        """"F3" -> Action("F", 3)."""
        found = re.fullmatch(r"\s*([FB])\s*(\d+)\s*", text)
        if not found:
            raise ValueError(f"cannot read {text!r} as an action: write F<n> or B<n>, e.g. 'F0'")
        return cls(found[1], int(found[2]))

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


class Span(NamedTuple):
    """When an action ran: simulated time steps for a Schedule, seconds for a measured run."""

    kind: str
    microbatch: int
    start: float
    end: float

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


class Schedule:
    """Per-stage ordered actions, and their simulated timing on a grid of time steps.

    Build one with naive(), gpipe() or one_f_one_b(), or write your own:
    Schedule("mine", [["F0", "F1", "B0", "B1"], ["F0", "B0", "F1", "B1"]]).
    Every F takes 1 time step and every B takes backward_cost steps, on every stage. An action
    starts as soon as its stage is free and its inputs exist: F of micro-batch j on stage s
    after F j on stage s - 1; B j on stage s after B j on stage s + 1 (on the last stage,
    after its own F j). Communication is taken as free.
    """

    def __init__(self, name: str, actions: Sequence[Sequence[Action | str]], *,
                 backward_cost: int = 1):
        if isinstance(backward_cost, bool) or not isinstance(backward_cost, int) \
                or backward_cost < 1:
            raise ValueError(f"backward_cost is the time steps of one backward (a forward "
                             f"takes 1): an int >= 1, not {backward_cost!r}")
        if not actions:
            raise ValueError("a schedule needs at least one stage")
        self.name = name
        self.backward_cost = backward_cost
        self.actions: tuple[tuple[Action, ...], ...] = tuple(
            tuple(a if isinstance(a, Action) else Action.parse(a) for a in stage)
            for stage in actions)
        self.n_stages = len(self.actions)
        self.n_microbatches = 1 + max((a.microbatch for st in self.actions for a in st),
                                      default=-1)
        self._check_complete()
        self.spans: tuple[tuple[Span, ...], ...] = self._simulate()
        self.makespan: int = max(int(s.end) for stage in self.spans for s in stage)

    # -- validation and simulation --------------------------------------------------------

    def _check_complete(self) -> None:
        m = self.n_microbatches
        if m < 1:
            raise ValueError("a schedule needs at least one micro-batch")
        want = sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        for s, stage in enumerate(self.actions):
            got = sorted((a.kind, a.microbatch) for a in stage)
            if got != want:
                raise ValueError(f"stage {s} must run F and B of every micro-batch 0..{m - 1} "
                                 f"exactly once; it has {' '.join(map(str, stage)) or 'nothing'}")
            done = set()
            for a in stage:
                if a.kind == "B" and a.microbatch not in done:
                    raise ValueError(f"stage {s} runs B{a.microbatch} before F{a.microbatch}: a "
                                     "backward needs the activations of its own forward")
                done.add(a.microbatch)

    def _simulate(self) -> tuple[tuple[Span, ...], ...]:
        p, cost = self.n_stages, {"F": 1, "B": self.backward_cost}
        end: dict[tuple[int, str, int], int] = {}      # (stage, kind, mb) -> finish time
        spans: list[list[Span]] = [[] for _ in range(p)]
        nxt, free = [0] * p, [0] * p
        while any(nxt[s] < len(self.actions[s]) for s in range(p)):
            progressed = False
            for s in range(p):
                while nxt[s] < len(self.actions[s]):
                    a = self.actions[s][nxt[s]]
                    dep = _dependency(s, a, p)
                    if dep is not None and dep not in end:
                        break
                    start = max(free[s], end[dep] if dep is not None else 0)
                    free[s] = end[(s, a.kind, a.microbatch)] = start + cost[a.kind]
                    spans[s].append(Span(a.kind, a.microbatch, start, free[s]))
                    nxt[s] += 1
                    progressed = True
            if not progressed:
                stuck = ", ".join(f"stage {s} at {self.actions[s][nxt[s]]}" for s in range(p)
                                  if nxt[s] < len(self.actions[s]))
                raise ValueError(f"schedule {self.name!r} can never finish: every stage waits "
                                 f"for another ({stuck}); on real ranks this is a deadlock")
        return tuple(tuple(st) for st in spans)

    # -- what the simulation says ---------------------------------------------------------

    @property
    def grid(self) -> list[list[str]]:
        """Rows = stages, columns = time steps; a cell is "F0", "B3", or "." when idle."""
        rows = [["."] * self.makespan for _ in range(self.n_stages)]
        for s, stage in enumerate(self.spans):
            for span in stage:
                for t in range(int(span.start), int(span.end)):
                    rows[s][t] = str(span)
        return rows

    @property
    def bubble_fraction(self) -> float:
        """Idle cells / all cells of the grid: the share of stage-time spent waiting."""
        return measured_bubble(self.spans).overall

    def peak_in_flight(self, stage: int) -> int:
        """The most micro-batches whose activations `stage` holds at once (F done, B not yet)."""
        if not 0 <= stage < self.n_stages:
            raise ValueError(f"stage {stage} is not in this {self.n_stages}-stage schedule")
        held = peak = 0
        for a in self.actions[stage]:
            held += 1 if a.kind == "F" else -1
            peak = max(peak, held)
        return peak

    def timeline(self) -> Any:
        """The picture of this schedule (see dl.viz.timeline)."""
        from dpmp_lab import viz

        return viz.timeline(self)

    def describe(self) -> str:
        """One line: sizes, costs, the bubble (with its formula) and activations held."""
        p, m = self.n_stages, self.n_microbatches
        formula = {"gpipe": f" (formula (p-1)/(m+p-1) = {bubble_fraction(p, m):.1%})",
                   "1f1b": f" (formula (p-1)/(m+p-1) = {bubble_fraction(p, m):.1%})",
                   "naive": f" (formula (p-1)/p = {(p - 1) / p:.1%})"}.get(self.name, "")
        return (f"{self.name}: p={p} stages, m={m} micro-batches, F=1 B={self.backward_cost} "
                f"time steps; bubble {self.bubble_fraction:.1%} of the grid{formula}; "
                "activations held at most "
                + ", ".join(str(self.peak_in_flight(s)) for s in range(p)) + " per stage")

    def __str__(self) -> str:
        rows, width = self.grid, max(2, len(str(self.makespan - 1)),
                                     len(str(self.n_microbatches - 1)) + 1)
        label = len(f"stage {self.n_stages - 1}")
        out = [self.describe(),
               "time".ljust(label) + " " + " ".join(str(t).ljust(width)
                                                     for t in range(self.makespan))]
        for s, row in enumerate(rows):
            out.append(f"stage {s}".ljust(label) + " " + " ".join(c.ljust(width) for c in row))
        return "\n".join(line.rstrip() for line in out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = {"F": "#c6dbef", "B": "#fdd0a2", ".": "#f0f0f0"}
        head = "".join(f"<th>{t}</th>" for t in range(self.makespan))
        body = []
        for s, row in enumerate(self.grid):
            cells = "".join(f'<td style="background:{colour[c[0]]};text-align:center">'
                            f"{'' if c == '.' else c}</td>" for c in row)
            body.append(f"<tr><th>stage {s}</th>{cells}</tr>")
        return (f"<p>{html.escape(self.describe())}</p><table class=\"dpmp-lab\"><thead><tr>"
                f"<th>time</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _dependency(stage: int, action: Action, p: int) -> tuple[int, str, int] | None:
    """The (stage, kind, micro-batch) whose result this action needs, None for the very first."""
    j = action.microbatch
    if action.kind == "F":
        return (stage - 1, "F", j) if stage > 0 else None
    return (stage + 1, "B", j) if stage < p - 1 else (stage, "F", j)


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}={value}: a pipeline needs at least 1 "
                         + ("stage" if name in ("p", "n_stages") else "micro-batch"))


def naive(p: int, m: int = 1, *, backward_cost: int = 1) -> Schedule:
    """One micro-batch at a time through every stage and back: only one stage is ever busy."""
    _check_count("p", p)
    _check_count("m", m)
    one_stage = [Action(k, j) for j in range(m) for k in ("F", "B")]
    return Schedule("naive", [one_stage] * p, backward_cost=backward_cost)


def gpipe(p: int, m: int, *, backward_cost: int = 1) -> Schedule:
    """GPipe / all-forward-all-backward: every forward, then every backward, on each stage."""
    _check_count("p", p)
    _check_count("m", m)
    one_stage = [Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)]
    return Schedule("gpipe", [one_stage] * p, backward_cost=backward_cost)


def one_f_one_b(p: int, m: int, *, backward_cost: int = 1) -> Schedule:
    """1F1B: warm up with p - stage - 1 forwards, alternate one F and one B, then cool down."""
    _check_count("p", p)
    _check_count("m", m)
    stages = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        acts = [Action("F", j) for j in range(warmup)]
        for i in range(m - warmup):
            acts += [Action("F", warmup + i), Action("B", i)]
        acts += [Action("B", j) for j in range(m - warmup, m)]
        stages.append(acts)
    return Schedule("1f1b", stages, backward_cost=backward_cost)


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "naive": naive, "gpipe": gpipe, "afab": gpipe, "1f1b": one_f_one_b}


def make_schedule(name: str, p: int, m: int, *, backward_cost: int = 1) -> Schedule:
    """A schedule by name: "naive", "gpipe" (or "afab") or "1f1b"."""
    key = name.lower().replace("-", "").replace("_", "") if isinstance(name, str) else name
    if key not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    return SCHEDULES[key](p, m, backward_cost=backward_cost)


def bubble_fraction(p: int, m: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of a GPipe or 1F1B step with equal stages."""
    _check_count("p", p)
    _check_count("m", m)
    return (p - 1) / (m + p - 1)


class Bubble(NamedTuple):
    """Idle fractions of a pipeline step: overall and per stage."""

    overall: float
    per_stage: tuple[float, ...]


def measured_bubble(spans: Sequence[Any]) -> Bubble:
    """Idle fraction of each stage, and overall, between the first start and the last end.

    `spans`: per stage, the Spans it ran (a Schedule's .spans; or PipelineResults from every
    stage, e.g. launch(...).values). Busy time is the sum of the span lengths; everything else
    inside the step's window (waiting for a neighbour) is bubble.
    """
    rows = [getattr(row, "spans", row) for row in getattr(spans, "values", spans)]
    if not rows or not all(rows):
        raise ValueError("measured_bubble needs the spans of at least one action per stage")
    start = min(s.start for row in rows for s in row)
    end = max(s.end for row in rows for s in row)
    window = end - start
    if window <= 0:
        raise ValueError("the spans cover no time: nothing to measure")
    per_stage = tuple(1.0 - sum(s.end - s.start for s in row) / window for row in rows)
    return Bubble(sum(per_stage) / len(per_stage), per_stage)


# -- running a schedule on real ranks ---------------------------------------------------------


class PipelineStage:
    """This rank's piece of the pipeline: its layers, its place, and its two neighbours.

    `pp_group`: the ranks of this pipeline in stage order (ProcessGrid's pp_group; None = the
    whole world). `activation_shape`: the shape of one micro-batch's activation passed between
    stages, e.g. (micro_batch, seq_len, d_model). As in Megatron and picotron every boundary
    carries that one shape, so a receiver can allocate its buffer without asking first.
    """

    def __init__(self, module: nn.Module, pp_group: dist.ProcessGroup | None = None, *,
                 activation_shape: Sequence[int], dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        if not isinstance(module, nn.Module):
            raise TypeError(f"the stage's module must be an nn.Module, not "
                            f"{type(module).__name__}")
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("a PipelineStage talks to other ranks, so it must be built "
                               "inside a rank (a function started by dl.launch)")
        shape = tuple(activation_shape)
        if not shape or not all(isinstance(d, int) and d >= 1 for d in shape):
            raise ValueError(f"activation_shape must be positive ints, e.g. (2, 16, 32), not "
                             f"{activation_shape!r}")
        params = [p for p in module.parameters() if p.is_floating_point()]
        self.module = module
        self.group = pp_group if pp_group is not None else dist.group.WORLD
        self.ranks: list[int] = dist.get_process_group_ranks(self.group)
        if dist.get_rank() not in self.ranks:
            raise ValueError(f"rank {dist.get_rank()} is not in the pipeline group "
                             f"{self.ranks}")
        self.index = self.ranks.index(dist.get_rank())
        self.n_stages = len(self.ranks)
        self.prev_rank = self.ranks[self.index - 1] if self.index > 0 else None
        self.next_rank = self.ranks[self.index + 1] if self.index < self.n_stages - 1 else None
        self.activation_shape = shape
        self.dtype = dtype or (params[0].dtype if params else torch.get_default_dtype())
        self.device = torch.device(device) if device is not None else (
            params[0].device if params else rank_device())

    is_first = property(lambda self: self.prev_rank is None)
    is_last = property(lambda self: self.next_rank is None)

    def recv_activation(self, microbatch: int) -> torch.Tensor:
        """The previous stage's output for this micro-batch, as a leaf that collects its grad."""
        buf = self._empty()
        dist.recv(buf, src=self.prev_rank, group=self.group, tag=microbatch)
        return buf.requires_grad_()

    def recv_grad(self, microbatch: int) -> torch.Tensor:
        """d loss / d (this stage's output) for this micro-batch, from the next stage."""
        buf = self._empty()
        dist.recv(buf, src=self.next_rank, group=self.group, tag=microbatch)
        return buf

    def send_activation(self, out: torch.Tensor, microbatch: int) -> _Pending:
        if tuple(out.shape) != self.activation_shape or out.dtype != self.dtype:
            raise ValueError(f"stage {self.index} produced an activation of shape "
                             f"{tuple(out.shape)} ({out.dtype}), but the stages agreed on "
                             f"activation_shape={self.activation_shape} ({self.dtype}); fix "
                             "activation_shape (micro-batch size = batch / n_microbatches)")
        return self._isend(out, self.next_rank, microbatch)

    def send_grad(self, grad: torch.Tensor, microbatch: int) -> _Pending:
        return self._isend(grad, self.prev_rank, microbatch)

    def _empty(self) -> torch.Tensor:
        return torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)

    def _isend(self, tensor: torch.Tensor, dst: int, microbatch: int) -> _Pending:
        payload = tensor.detach().contiguous()
        return _Pending(dist.isend(payload, dst=dst, group=self.group, tag=microbatch), payload)

    def __repr__(self) -> str:
        return (f"PipelineStage({self.index} of {self.n_stages}, ranks {self.ranks}, "
                f"activation {self.activation_shape})")


class _Pending(NamedTuple):
    """An isend in flight: wait() before reusing or dropping what was sent."""

    work: Any
    tensor: torch.Tensor   # kept alive until the send completes

    def wait(self) -> None:
        self.work.wait()


@dataclass
class PipelineResult:
    """What one stage did in one pipeline step."""

    stage: int
    n_stages: int
    rank: int
    schedule: str
    losses: list[float] = field(default_factory=list)   # per micro-batch; last stage only
    spans: list[Span] = field(default_factory=list)      # compute time of each action (s)
    peak_in_flight: int = 0    # most micro-batches whose activations were held at once

    @property
    def loss(self) -> float | None:
        """The mean micro-batch loss = the full-batch loss (last stage; None elsewhere)."""
        return sum(self.losses) / len(self.losses) if self.losses else None


def run_schedule(schedule: Schedule | str, stage: PipelineStage,
                 inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None, *,
                 n_microbatches: int | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 after_last_backward: Callable[[], None] | None = None) -> PipelineResult:
    """Run this rank's part of one pipeline step (forward and backward of every micro-batch).

    Call it on every rank of the pipeline with the same schedule. `inputs` (the whole batch)
    is needed on the first stage and `targets` with `loss_fn(output, targets)` on the last;
    other stages ignore them. Both are cut into m equal micro-batches along dim 0. The last
    stage scales each micro-batch loss by 1/m, so the gradients that accumulate in the stage's
    parameters (add to .grad, as loss.backward() does: zero them before) equal those of the
    full-batch mean loss.

    `after_last_backward()` runs right after this stage's last backward: the place for a
    data-parallel gradient all-reduce in DP x PP, which must wait for the gradients of every
    micro-batch (syncing per micro-batch would send m times the data for nothing).
    """
    if not isinstance(stage, PipelineStage):
        raise TypeError(f"stage must be a PipelineStage, not {type(stage).__name__}")
    if isinstance(schedule, str):
        if n_microbatches is None:
            raise ValueError(f"a schedule given by name ({schedule!r}) needs n_microbatches")
        schedule = make_schedule(schedule, stage.n_stages, n_microbatches)
    elif not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule or a name, not {type(schedule).__name__}")
    m = schedule.n_microbatches
    if n_microbatches is not None and n_microbatches != m:
        raise ValueError(f"n_microbatches={n_microbatches}, but the schedule has {m}")
    if schedule.n_stages != stage.n_stages:
        raise ValueError(f"the schedule has {schedule.n_stages} stages but the pipeline group "
                         f"has {stage.n_stages} ranks {stage.ranks}")
    # checked wherever given (not only where used), so that ranks passing the same batch all
    # refuse it together instead of leaving their neighbours waiting
    xs = _microbatches(inputs, m, "inputs") if inputs is not None else None
    ys = _microbatches(targets, m, "targets") if targets is not None else None
    if stage.is_first and xs is None:
        raise ValueError("the first stage needs the batch: pass inputs")
    if stage.is_last and (ys is None or loss_fn is None):
        raise ValueError("the last stage computes the loss: pass targets and loss_fn")

    result = PipelineResult(stage.index, stage.n_stages, dist.get_rank(), schedule.name)
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # mb -> (stage input, output)
    pending: list[_Pending] = []
    for action in schedule.actions[stage.index]:
        j = action.microbatch
        if action.kind == "F":
            x = xs[j] if stage.is_first else stage.recv_activation(j)
            start = time.perf_counter()
            out = stage.module(x)
            if stage.is_last:
                loss = loss_fn(out, ys[j])
                result.losses.append(loss.item())
                out = loss / m
            else:
                pending.append(stage.send_activation(out, j))
            held[j] = (x, out)
            result.peak_in_flight = max(result.peak_in_flight, len(held))
        else:
            grad = None if stage.is_last else stage.recv_grad(j)
            start = time.perf_counter()
            x, out = held.pop(j)
            torch.autograd.backward(out, grad)
            if not stage.is_first:
                pending.append(stage.send_grad(x.grad, j))
        result.spans.append(Span(action.kind, j, start, time.perf_counter()))
        pending = [p for p in pending if not p.work.is_completed()]
    if after_last_backward is not None:
        after_last_backward()
    for p in pending:
        p.work.wait()
    return result


def _microbatches(batch: torch.Tensor, m: int, name: str) -> list[torch.Tensor]:
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, not {type(batch).__name__}")
    if batch.dim() == 0 or batch.shape[0] % m:
        rows = batch.shape[0] if batch.dim() else 0
        raise ValueError(f"{name} has {rows} rows, which do not split into {m} equal "
                         "micro-batches: the mean of micro-batch losses would not be the "
                         f"full-batch loss (use a batch divisible by {m})")
    return list(batch.chunk(m))


__all__ = ["Action", "Bubble", "PipelineResult", "PipelineStage", "SCHEDULES", "Schedule",
           "Span", "bubble_fraction", "gpipe", "make_schedule", "measured_bubble", "naive",
           "one_f_one_b", "run_schedule", "split_pieces"]
