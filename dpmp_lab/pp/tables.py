"""The schedules of the literature, as tables: naive, GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2.

    pp.one_f_one_b(4, 8)             # PipeDream-Flush / Megatron's 1F1B
    pp.interleaved_1f1b(4, 8, 2)     # each rank holds 2 chunks (virtual stages)
    pp.zb_h1(4, 8), pp.zb_h2(4, 8)   # the backward split into B (input grad) and W (weight grad)
    pp.make_schedule("zb-h1", 4, 8)  # the same, by name

Each generator returns a pp.Schedule: one list of actions per rank, nothing more. How much each
one idles, and what it holds, is read off the Schedule's simulation (and dl.cost.pp_bubble
gives the formulas).
"""

from __future__ import annotations

from collections.abc import Callable

from dpmp_lab._helpers import whole_number
from dpmp_lab.i18n.messages import _
from dpmp_lab.pp.schedules import Action, Schedule

__all__ = ["SCHEDULES", "bubble_fraction", "gpipe", "interleaved_1f1b", "make_schedule",
           "naive", "one_f_one_b", "zb_h1", "zb_h2"]


def _check_sizes(p: int, m: int) -> None:
    whole_number("p", p, what=_("a pipeline needs at least 1 stage"))
    whole_number("m", m, what=_("a pipeline needs at least 1 micro-batch"))


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


def interleaved_1f1b(p: int, m: int, n_chunks: int = 2, *, backward_cost: int = 1) -> Schedule:
    """Interleaved 1F1B: rank r holds v = n_chunks chunks, model stages r, r + p, ... (Narayanan
    et al. 2021, Section 2.2.2; Megatron-LM's and torch's ScheduleInterleaved1F1B order).

    The table for p ranks, m micro-batches and v chunks per rank. m must be a multiple of p,
    the paper's rule (torch's version regroups m into rounds of m // (m // p) when that
    divides m, and Megatron-LM makes the group size a setting,
    microbatch_group_size_per_vp_stage). Notebook 10 has you build this order from the paper's
    idea; its construction is in the code below, for after you have.
    """
    _check_sizes(p, m)
    v = whole_number("n_chunks", n_chunks, at_least=2,
                     what=_("interleaving needs at least 2 chunks per rank (with 1, use "
                            "one_f_one_b)"))
    if m % p:
        raise ValueError(_("interleaved 1F1B sends micro-batches through each chunk in rounds "
                           "of p={p}, so m must be a multiple of p (Narayanan et al. 2021); "
                           "m={m} is not: use m={fit}").format(p=p, m=m, fit=m + p - m % p))
    total = v * m

    def slot(k: int, kind: str) -> Action:
        round_, within = divmod(k, p * v)
        chunk = within // p if kind == "F" else v - 1 - within // p
        return Action(kind, round_ * p + within % p, chunk)

    ranks = []
    for r in range(p):
        warmup = min((v - 1) * p + 2 * (p - 1 - r), total)
        acts = [slot(k, "F") for k in range(warmup)]
        for i in range(total - warmup):
            acts += [slot(warmup + i, "F"), slot(i, "B")]
        acts += [slot(k, "B") for k in range(total - warmup, total)]
        ranks.append(acts)
    return Schedule("interleaved", ranks, backward_cost=backward_cost)


def zb_h1(p: int, m: int, *, backward_cost: int = 1, weight_cost: int = 1) -> Schedule:
    """ZB-H1 (Qi et al. 2024, Section 2.1, Figure 3 top): 1F1B with the backward split in two,
    B (the input gradient) and W (the weight gradient), run apart. Notebook 10 has you build a
    table of it and work out what it holds and saves; the order this one uses is in the code
    below, for after you have.
    """
    _check_sizes(p, m)
    stages = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        acts, w_next = [Action("F", j) for j in range(warmup)], 0
        for i in range(m):
            if warmup + i < m:
                acts.append(Action("F", warmup + i))
            acts.append(Action("B", i))
            if i >= s:
                acts.append(Action("W", w_next))
                w_next += 1
        acts += [Action("W", j) for j in range(w_next, m)]
        stages.append(acts)
    return Schedule("zbh1", stages, backward_cost=backward_cost, weight_cost=weight_cost)


def zb_h2(p: int, m: int, *, backward_cost: int = 1, weight_cost: int = 1) -> Schedule:
    """ZB-H2 (Qi et al. 2024, Section 2.2, Figure 3 bottom): zero bubble for more memory.

    More forwards in the warm-up fill the wait for the first gradient, and W passes fill the
    drain, so with equal F, B and W and enough micro-batches each stage works without a pause
    from its first action to its last: the pipeline's shape is a parallelogram, not 1F1B's
    trapezoid. The price is a higher peak of activations than 1F1B's, which notebook 10 asks
    you to predict (the paper's Table 1 gives it); the rule that orders the actions is in the
    code below.
    """
    _check_sizes(p, m)
    done: dict[tuple[str, int, int], int] = {}     # (kind, stage, micro-batch) -> end time
    counts = [{"F": 0, "B": 0, "W": 0} for _ in range(p)]
    stages: list[list[Action]] = [[] for _ in range(p)]
    t = 0
    while any(c["W"] < m for c in counts):
        for s, c in enumerate(counts):
            f_in = s == 0 or done.get(("F", s - 1, c["F"]), t + 1) <= t
            b_in = done.get(("F", s, c["B"]) if s == p - 1 else ("B", s + 1, c["B"]), t + 1) <= t
            if c["B"] < c["F"] and b_in:
                kind = "B"
            elif c["F"] < m and f_in and c["F"] - c["W"] < 2 * p - 1:
                kind = "F"
            elif c["W"] < c["B"]:
                kind = "W"
            else:
                continue
            done[(kind, s, c[kind])] = t + 1
            stages[s].append(Action(kind, c[kind]))
            c[kind] += 1
        t += 1
    return Schedule("zbh2", stages, backward_cost=backward_cost, weight_cost=weight_cost)


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "naive": naive, "gpipe": gpipe, "afab": gpipe, "1f1b": one_f_one_b,
    "interleaved": interleaved_1f1b, "interleaved1f1b": interleaved_1f1b,
    "zbh1": zb_h1, "zbh2": zb_h2}


def make_schedule(name: str, p: int, m: int, *, backward_cost: int = 1, weight_cost: int = 1,
                  n_chunks: int = 1) -> Schedule:
    """A schedule by name: "naive", "gpipe" (or "afab"), "1f1b", "interleaved" (n_chunks >= 2
    per rank), "zb-h1" or "zb-h2" (weight_cost: the time steps of a W)."""
    key = name.lower().replace("-", "").replace("_", "") if isinstance(name, str) else name
    if key not in SCHEDULES:
        raise ValueError(_("unknown schedule {name!r}: choose one of {names}").format(
            name=name, names=", ".join(SCHEDULES)))
    make = SCHEDULES[key]
    if make is interleaved_1f1b:
        return make(p, m, n_chunks, backward_cost=backward_cost)
    if n_chunks != 1:
        raise ValueError(_("n_chunks={n_chunks}: only the interleaved schedule runs several "
                           "chunks (virtual stages) per rank, not {name!r}").format(
            n_chunks=n_chunks, name=name))
    if make in (zb_h1, zb_h2):
        return make(p, m, backward_cost=backward_cost, weight_cost=weight_cost)
    if weight_cost != 1:
        raise ValueError(_("weight_cost={weight_cost}: only the zero-bubble schedules split W "
                           "off the backward, not {name!r} (its B is the whole backward: give "
                           "it backward_cost)").format(weight_cost=weight_cost, name=name))
    return make(p, m, backward_cost=backward_cost)


def bubble_fraction(p: int, m: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of a GPipe or 1F1B step with equal stages."""
    _check_sizes(p, m)
    return (p - 1) / (m + p - 1)
