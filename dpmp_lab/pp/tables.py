"""The schedules of the literature, as tables: naive, GPipe and 1F1B.

    pp.one_f_one_b(4, 8)             # PipeDream-Flush / Megatron's 1F1B
    pp.make_schedule("gpipe", 4, 8)  # the same, by name

Each generator returns a pp.Schedule: one list of actions per stage, nothing more. How much each
one idles, and what it holds, is read off the Schedule's simulation.
"""

from __future__ import annotations

from collections.abc import Callable

from dpmp_lab._helpers import whole_number
from dpmp_lab.pp.schedules import Action, Schedule

__all__ = ["SCHEDULES", "gpipe", "make_schedule", "naive", "one_f_one_b"]


def _check_sizes(p: int, m: int) -> None:
    whole_number("p", p, what="a pipeline needs at least 1 stage")
    whole_number("m", m, what="a pipeline needs at least 1 micro-batch")


def naive(p: int, m: int = 1, *, backward_cost: int = 1) -> Schedule:
    """One micro-batch at a time through every stage and back: only one stage is ever busy."""
    _check_sizes(p, m)
    one_stage = [Action(k, j) for j in range(m) for k in ("F", "B")]
    return Schedule("naive", [one_stage] * p, backward_cost=backward_cost)


def gpipe(p: int, m: int, *, backward_cost: int = 1) -> Schedule:
    """GPipe / all-forward-all-backward: every forward, then every backward, on each stage."""
    _check_sizes(p, m)
    one_stage = [Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)]
    return Schedule("gpipe", [one_stage] * p, backward_cost=backward_cost)


def one_f_one_b(p: int, m: int, *, backward_cost: int = 1) -> Schedule:
    """1F1B: warm up with p - stage - 1 forwards, alternate one F and one B, then cool down."""
    _check_sizes(p, m)
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
