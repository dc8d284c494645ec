"""Pipeline schedules as plain data: which stage runs which forward and backward, in what order.

    print(pp.one_f_one_b(4, 8))       # the time grid, the bubble and the activations held
    pp.gpipe(4, 8).bubble_fraction    # idle cells / all cells of the grid

A Schedule is per-stage lists of actions (F3 = the forward of micro-batch 3), checked for
completeness and simulated here on a grid of time steps, so a learner can study the bubble
and the memory of a schedule in the notebook kernel; pp.runner executes the same Schedule on
real ranks.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dpmp_lab._helpers import whole_number

__all__ = ["Action", "Bubble", "Schedule", "Span", "bubble_fraction", "measured_bubble"]


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


def _check_sizes(p: int, m: int) -> None:
    whole_number("p", p, what="a pipeline needs at least 1 stage")
    whole_number("m", m, what="a pipeline needs at least 1 micro-batch")


def bubble_fraction(p: int, m: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of a GPipe or 1F1B step with equal stages."""
    _check_sizes(p, m)
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
