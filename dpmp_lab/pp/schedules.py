"""Pipeline schedules as plain data: which rank runs which forward and backward, in what order.

    print(pp.one_f_one_b(4, 8))       # the time grid, the bubble and the activations held
    pp.gpipe(4, 8).bubble_fraction    # idle cells / all cells of the grid

A Schedule is per-rank lists of actions, checked for completeness and dependencies and
simulated here on a grid of time steps, so a learner can study the bubble and the memory of a
schedule in the notebook kernel; pp.runner executes the same Schedule on real ranks, and
pp.tables writes the schedules of the literature.

How an action is written: "F3" is the forward of micro-batch 3, "B3" its backward, "W3" its
weight gradient. With virtual stages (each rank holds v model chunks) a suffix names the
chunk: "F3.1" is micro-batch 3 through chunk 1 ("F3" = "F3.0"). Rank r's chunk c is stage
c * p + r of the model (Megatron's and torch's interleaved layout: rank r holds stages r,
r + p, ...). A "B" is the whole backward (input and weight gradients) unless its rank's list
also has W actions: then B computes only the gradient of the stage's input, which the previous
stage waits for, and a later W of the same micro-batch and chunk computes the weight gradients,
which nobody waits for (Qi et al. 2024, "Zero Bubble Pipeline Parallelism").
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dpmp_lab.cost import pp_bubble
from dpmp_lab.i18n.messages import _

__all__ = ["Action", "Bubble", "Schedule", "Span", "measured_bubble"]

_KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class Action:
    """One unit of a rank's work: the forward ("F"), backward ("B") or weight gradient ("W") of
    one micro-batch through one of its chunks (0 unless the rank holds virtual stages)."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(_("an action is 'F' (forward), 'B' (backward) or 'W' (weight "
                               "gradient), not {kind!r}").format(kind=self.kind))
        for name in ("microbatch", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError((_("micro-batch index must be an int >= 0, not {value!r}")
                                  if name == "microbatch" else
                                  _("chunk index must be an int >= 0, not {value!r}")).format(
                    value=value))

    @classmethod
    def parse(cls, text: str) -> Action:
        """"F3" -> Action("F", 3); "B3.1" -> Action("B", 3, chunk=1)."""
        found = re.fullmatch(r"\s*([FBW])\s*(\d+)(?:\.(\d+))?\s*", text)
        if not found:
            raise ValueError(_("cannot read {text!r} as an action: write F<n>, B<n> or W<n>, "
                               "e.g. 'F0', and F<n>.<chunk> for a virtual stage, e.g. "
                               "'F0.1'").format(text=text))
        return cls(found[1], int(found[2]), int(found[3] or 0))

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


class Span(NamedTuple):
    """When an action ran: simulated time steps for a Schedule, seconds for a measured run."""

    kind: str
    microbatch: int
    start: float
    end: float
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


class Schedule:
    """Per-rank ordered actions, and their simulated timing on a grid of time steps.

    Build one with the generators of pp.tables (gpipe, one_f_one_b, interleaved_1f1b, zb_h1,
    ...), or write your own: Schedule("mine", [["F0", "F1", "B0", "B1"], ["F0", "B0", "F1",
    "B1"]]). One list per rank (a "stage" when each rank holds one); the number of chunks v is
    read from the actions. Costs in time steps: an F takes 1, a B backward_cost (the whole
    backward, or only its input-gradient part on a rank that also runs W), a W weight_cost.
    An action starts as soon as its rank is free and its input exists: F of model stage k
    after F of stage k - 1; B of stage k after B of stage k + 1 (on the model's last stage,
    after its own F); W after its own B. Communication is taken as free.
    """

    def __init__(self, name: str, actions: Sequence[Sequence[Action | str]], *,
                 backward_cost: int = 1, weight_cost: int = 1):
        for what, cost in (("backward_cost", backward_cost), ("weight_cost", weight_cost)):
            if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
                raise ValueError(_("{what} is the time steps of one {kind} pass (a forward "
                                   "takes 1): an int >= 1, not {cost!r}").format(
                    what=what, kind=what.split('_')[0], cost=cost))
        if not actions:
            raise ValueError(_("a schedule needs at least one stage"))
        self.name = name
        self.backward_cost = backward_cost
        self.weight_cost = weight_cost
        self.actions: tuple[tuple[Action, ...], ...] = tuple(
            tuple(a if isinstance(a, Action) else Action.parse(a) for a in row)
            for row in actions)
        every = [a for row in self.actions for a in row]
        self.n_ranks = len(self.actions)        # ranks (p): one row each
        self.n_chunks = 1 + max((a.chunk for a in every), default=0)
        self.n_microbatches = 1 + max((a.microbatch for a in every), default=-1)
        self.splits_backward = tuple(any(a.kind == "W" for a in row) for row in self.actions)
        self._check_complete()
        self.spans: tuple[tuple[Span, ...], ...] = self._simulate()
        self.makespan: int = max(int(s.end) for row in self.spans for s in row)

    @property
    def n_model_stages(self) -> int:
        """v * p: the stages the model is cut into (one per rank unless ranks hold chunks)."""
        return self.n_chunks * self.n_ranks

    def row_name(self, rank: int) -> str:
        return f"stage {rank}" if self.n_chunks == 1 else f"rank {rank}"

    def row_label(self, rank: int) -> str:
        """row_name in the learner's language, for what a table or a picture shows."""
        return (_("stage {rank}") if self.n_chunks == 1 else _("rank {rank}")).format(rank=rank)

    # -- validation and simulation --------------------------------------------------------

    def _check_complete(self) -> None:
        m, v = self.n_microbatches, self.n_chunks
        if m < 1:
            raise ValueError(_("a schedule needs at least one micro-batch"))
        for s, row in enumerate(self.actions):
            kinds = ("F", "B", "W") if self.splits_backward[s] else ("F", "B")
            want = sorted((k, c, j) for k in kinds for c in range(v) for j in range(m))
            got = sorted((a.kind, a.chunk, a.microbatch) for a in row)
            if got != want:
                what = _("F and B and W") if self.splits_backward[s] else _("F and B")
                chunks = _(" on each of its {v} chunks").format(v=v) if v > 1 else ""
                note = (_(" (a rank that runs any W runs one W after each B)")
                        if self.splits_backward[s] else "")
                raise ValueError(_("{row} must run {what} of every micro-batch 0..{last}{chunks} "
                                   "exactly once; it has {actions}{note}").format(
                    row=self.row_label(s), what=what, last=m - 1, chunks=chunks,
                    actions=" ".join(map(str, row)) or _("nothing"), note=note))
            done: set[tuple[str, int, int]] = set()
            for a in row:
                f, b = Action("F", a.microbatch, a.chunk), Action("B", a.microbatch, a.chunk)
                if a.kind == "B" and ("F", a.chunk, a.microbatch) not in done:
                    raise ValueError(_("{row} runs {a} before {f}: a backward needs the "
                                       "activations of its own forward").format(
                        row=self.row_label(s), a=a, f=f))
                if a.kind == "W" and ("B", a.chunk, a.microbatch) not in done:
                    raise ValueError(_("{a} before {b} on {row}: the weight gradient needs "
                                       "the output gradient that {b} receives").format(
                        a=a, b=b, row=self.row_label(s)))
                done.add((a.kind, a.chunk, a.microbatch))

    def needs(self, rank: int, action: Action) -> tuple[int, Action] | None:
        """The (rank, action) whose result this action waits for; None for the very first F.

        Model stage k = chunk * p + rank: F of k needs F of k - 1, B of k needs B of k + 1 (the
        last stage: its own F, where the loss is), W needs its own B."""
        p, j, c = self.n_ranks, action.microbatch, action.chunk
        k, last = c * p + rank, self.n_model_stages - 1
        if action.kind == "F":
            return None if k == 0 else ((k - 1) % p, Action("F", j, (k - 1) // p))
        if action.kind == "B":
            return (rank, Action("F", j, c)) if k == last else \
                ((k + 1) % p, Action("B", j, (k + 1) // p))
        return rank, Action("B", j, c)

    def messages(self, rank: int) -> list[tuple[str, int]]:
        """("recv" or "send", peer rank) in the order a runner of this rank's row issues them,
        receiving what an action needs right before it and sending what it made right after:
        the order a checker holds a runner to (W sends nothing; model stage k = chunk * p +
        rank lives on rank k % p)."""
        p, last, seq = self.n_ranks, self.n_model_stages - 1, []
        for action in self.actions[rank]:
            k = action.chunk * p + rank
            if action.kind == "F":
                seq += [("recv", (k - 1) % p)] * (k > 0) + [("send", (k + 1) % p)] * (k < last)
            elif action.kind == "B":
                seq += [("recv", (k + 1) % p)] * (k < last) + [("send", (k - 1) % p)] * (k > 0)
        return seq

    def cost(self, kind: str) -> int:
        return {"F": 1, "B": self.backward_cost, "W": self.weight_cost}[kind]

    def _simulate(self) -> tuple[tuple[Span, ...], ...]:
        p = self.n_ranks
        end: dict[tuple[int, Action], int] = {}      # (rank, action) -> finish time
        spans: list[list[Span]] = [[] for _ in range(p)]
        nxt, free = [0] * p, [0] * p
        while any(nxt[s] < len(self.actions[s]) for s in range(p)):
            progressed = False
            for s in range(p):
                while nxt[s] < len(self.actions[s]):
                    a = self.actions[s][nxt[s]]
                    dep = self.needs(s, a)
                    if dep is not None and dep not in end:
                        break
                    start = max(free[s], end[dep] if dep is not None else 0)
                    free[s] = end[(s, a)] = start + self.cost(a.kind)
                    spans[s].append(Span(a.kind, a.microbatch, start, free[s], a.chunk))
                    nxt[s] += 1
                    progressed = True
            if not progressed:
                stuck = ", ".join(_("{row} at {action}").format(
                    row=self.row_label(s), action=self.actions[s][nxt[s]])
                    for s in range(p) if nxt[s] < len(self.actions[s]))
                raise ValueError(_("schedule {name!r} can never finish: every stage waits for "
                                   "another ({stuck}); on real ranks this is a "
                                   "deadlock").format(name=self.name, stuck=stuck))
        return tuple(tuple(row) for row in spans)

    # -- what the simulation says ---------------------------------------------------------

    @property
    def grid(self) -> list[list[str]]:
        """Rows = ranks, columns = time steps; a cell is "F0", "B3", "W3", "F3.1" or "." (idle)."""
        rows = [["."] * self.makespan for _ in range(self.n_ranks)]
        for s, row in enumerate(self.spans):
            for span in row:
                for t in range(int(span.start), int(span.end)):
                    rows[s][t] = str(span)
        return rows

    @property
    def bubble_fraction(self) -> float:
        """Idle cells / all cells of the grid: the share of stage-time spent waiting."""
        return measured_bubble(self.spans).overall

    def peak_in_flight(self, stage: int) -> int:
        """The most micro-batches whose activations `stage` holds at once, counting each chunk's
        micro-batches apart: held from F until the B, or until the W on a rank that runs W."""
        # what a stage holds grows only at a forward: its peak is right after one
        return max((held + 1 for held in self.held_before_each_forward(stage)), default=0)

    def held_before_each_forward(self, stage: int) -> list[int]:
        """For each forward of `stage`, in order: the micro-batches (chunks apart) whose
        activations it holds as that forward begins, which a runner's memory may hold then
        besides what the forward makes."""
        if not 0 <= stage < self.n_ranks:
            raise ValueError(_("stage {stage} is not in this {n}-stage schedule").format(
                stage=stage, n=self.n_ranks))
        frees = "W" if self.splits_backward[stage] else "B"
        held, out = 0, []
        for a in self.actions[stage]:
            if a.kind == "F":
                out.append(held)
            held += 1 if a.kind == "F" else -1 if a.kind == frees else 0
        return out

    def describe(self) -> str:
        """One line: sizes, costs, the bubble (with its formula) and activations held."""
        p, m, v = self.n_ranks, self.n_microbatches, self.n_chunks
        costs = f"F=1 B={self.backward_cost}" + (f" W={self.weight_cost}"
                                                 if any(self.splits_backward) else "")
        sizes = (_("p={p} stages").format(p=p) if v == 1
                 else _("p={p} ranks x v={v} chunks").format(p=p, v=v))
        formula = _FORMULAS.get(self.name)
        if formula and self.name == "naive":
            formula_text = _(" (formula {formula} = {value})").format(
                formula=formula, value=f"{(p - 1) / p:.1%}")
        elif formula and _formula_holds(self):
            value = pp_bubble(self.name, p, m, v, t_b=self.backward_cost,
                              t_w=self.weight_cost)
            formula_text = _(" (formula {formula} = {value})").format(
                formula=formula, value=f"{value:.1%}")
        else:
            formula_text = ""
        held = ", ".join(str(self.peak_in_flight(s)) for s in range(p))
        per = _(" per stage") if v == 1 else _(" per rank (chunk x micro-batch)")
        return _("{name}: {sizes}, m={m} micro-batches, {costs} time steps; bubble {bubble} of "
                 "the grid{formula}; activations held at most {held}{per}").format(
            name=self.name, sizes=sizes, m=m, costs=costs, bubble=f"{self.bubble_fraction:.1%}",
            formula=formula_text, held=held, per=per)

    def __str__(self) -> str:
        rows = self.grid
        width = max(2, len(str(self.makespan - 1)), *(len(c) for row in rows for c in row))
        label = max(len(_("time")), *(len(self.row_label(s)) for s in range(self.n_ranks)))
        out = [self.describe(),
               _("time").ljust(label) + " " + " ".join(str(t).ljust(width)
                                                       for t in range(self.makespan))]
        for s, row in enumerate(rows):
            out.append(self.row_label(s).ljust(label) + " "
                       + " ".join(c.ljust(width) for c in row))
        return "\n".join(line.rstrip() for line in out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{t}</th>" for t in range(self.makespan))
        body = []
        for s, row in enumerate(self.spans):
            cells, t = [], 0
            for span in row:
                if span.start > t:
                    cells.append(f'<td colspan="{int(span.start) - t}" '
                                 f'style="background:{_IDLE_COLOUR}"></td>')
                cells.append(f'<td colspan="{int(span.end - span.start)}" style="background:'
                             f'{_action_colour(span.kind, span.chunk)};text-align:center">'
                             f"{span}</td>")
                t = int(span.end)
            if t < self.makespan:
                cells.append(f'<td colspan="{self.makespan - t}" '
                             f'style="background:{_IDLE_COLOUR}"></td>')
            body.append(f"<tr><th>{self.row_label(s)}</th>{''.join(cells)}</tr>")
        legend = ("F forward, B backward" + (" (input gradient only on ranks with W), W weight "
                                             "gradient" if any(self.splits_backward) else "")
                  + ("; darker = later chunk" if self.n_chunks > 1 else ""))
        return (f"<p>{html.escape(self.describe())}</p><table class=\"dpmp-lab\"><thead><tr>"
                f"<th>time</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
                f"<p>{legend}</p>")


# forward blue, backward orange, weight gradient green; a later chunk in a darker shade
_SHADES = {"F": ("#c6dbef", "#6baed6", "#2171b5", "#08519c"),
           "B": ("#fdd0a2", "#fd8d3c", "#d94801", "#a63603"),
           "W": ("#c7e9c0", "#74c476", "#238b45", "#006d2c")}
_IDLE_COLOUR = "#f0f0f0"


def _action_colour(kind: str, chunk: int = 0) -> str:
    """The colour of an action in every picture: its kind's hue, darker for a later chunk."""
    shades = _SHADES[kind]
    return shades[chunk % len(shades)]


# the formula each named schedule's describe() quotes (pp_bubble computes it)
_FORMULAS = {"naive": "(p-1)/p", "gpipe": "(p-1)/(m+p-1)", "1f1b": "(p-1)/(m+p-1)",
             "interleaved": "(p-1)/(v*m+p-1)", "zbh1": "(p-1)B/(m(F+B+W)+(p-1)B)",
             "zbh2": "(p-1)/(3m+p-1)"}


def _formula_holds(schedule: Schedule) -> bool:
    """Where a schedule's formula (dl.cost.pp_bubble) holds: ZB-H1 from m = p on, ZB-H2 with
    the paper's equal costs from m = 2p - 1 on, the others always."""
    p, m = schedule.n_ranks, schedule.n_microbatches
    if (schedule.n_chunks > 1) != (schedule.name == "interleaved") or \
            any(schedule.splits_backward) != (schedule.name in ("zbh1", "zbh2")):
        return False       # a hand-written table under a library schedule's name
    if schedule.name == "zbh1":
        return m >= p
    if schedule.name == "zbh2":
        return schedule.backward_cost == schedule.weight_cost == 1 and m >= 2 * p - 1
    return True


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
        raise ValueError(_("measured_bubble needs the spans of at least one action per stage"))
    start = min(s.start for row in rows for s in row)
    end = max(s.end for row in rows for s in row)
    window = end - start
    if window <= 0:
        raise ValueError(_("the spans cover no time: nothing to measure"))
    per_stage = tuple(1.0 - sum(s.end - s.start for s in row) / window for row in rows)
    return Bubble(sum(per_stage) / len(per_stage), per_stage)
