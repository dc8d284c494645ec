"""The pipeline bubble, measured: GPipe, 1F1B, interleaved 1F1B, ZB-H1 and ZB-H2 on 4 ranks whose
stages only sleep, ours against torch.distributed.pipelining's.

    python benchmarks/pp.py [--t-ms 20] [--steps 5] [--microbatches 8 16] [--chunks 2]

Every stage (every chunk, for the interleaved schedules) is the same model piece: its forward
sleeps t, the input-gradient part of its backward (B) sleeps t and the weight-gradient part (W)
sleeps t, so a whole backward sleeps 2t: the equal F, B and W times the zero-bubble paper's
handcrafted schedules assume, and the same model under every schedule. Sleeping instead of
computing keeps the two shared cores of these machines out of the timing, so what is measured
is the schedule.

Printed for each schedule and m: the formula (dl.cost.pp_bubble: the idle share of one step),
the simulated grid's bubble, the bubble measured with pp.run_schedule, and the same stages
driven by torch's schedule class in the same launch; both measured from the spans the sleeping
stage records itself (so both runners are timed the same way); then the
step time of ours / torch's. Medians over --steps steps after one warm-up step; a barrier
starts every step. Then ZB-H2 (and, for contrast, ZB-H1 and 1F1B) with 3 steps run back to
back, no barrier: ZB-H2's only idle time is the fill of the first forwards, which the next
step's start overlaps, so its bubble falls towards the paper's zero (formula with steps=3).

torch's schedules on gloo/CPU (torch 2.13): Schedule1F1B, ScheduleGPipe,
ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble (v = 2 chunks per rank, and v = 1,
which is ZB-H1's order) and ScheduleZBVZeroBubble (2 chunks in a V: rank r holds stages r and
2p - 1 - r) all run here (`run_torch` below). Their ZB-H1 compares with ours at v = 1 only;
ZBV has no counterpart of ours (its formula is not printed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

import dpmp_lab as dl
from dpmp_lab import pp
from dpmp_lab.cost import pp_bubble

WIDTH = 8     # activation: (1, WIDTH) per micro-batch; tiny, so sending costs next to nothing
P = 4


class _Sleep(torch.autograd.Function):
    """Identity that sleeps t_forward forward and t_backward backward, and says when it ran."""

    @staticmethod
    def forward(ctx, x, spans, t_forward, kind, t_backward):
        ctx.spans, ctx.kind, ctx.t_backward = spans, kind, t_backward
        if t_forward:
            _run(spans, "F", t_forward)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _run(ctx.spans, ctx.kind, ctx.t_backward)
        return grad, None, None, None, None


def _run(spans: list[pp.Span], kind: str, seconds: float) -> None:
    start = time.perf_counter()
    time.sleep(seconds)
    spans.append(pp.Span(kind, len(spans), start, time.perf_counter()))


class SleepStage(nn.Module):
    """out = sleep_B(x) * sleep_W(w): the gradient for x runs only the B sleep, the gradient for
    w only the W sleep, so a split backward sleeps each part where it belongs."""

    def __init__(self, t: float, spans: list[pp.Span]):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.t, self.spans = t, spans

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in a real model the first stage's backward still walks back through its layers; here
        # autograd runs the B sleep only for an input that needs a gradient (both runners)
        if not x.requires_grad:
            x.requires_grad_()
        return _Sleep.apply(x, self.spans, self.t, "B", self.t) * \
            _Sleep.apply(self.w, self.spans, 0.0, "W", self.t)


# (label, our schedule name, chunks, torch class name or None)
RUNS = [("gpipe", "gpipe", 1, "ScheduleGPipe"), ("1f1b", "1f1b", 1, "Schedule1F1B"),
        ("interleaved", "interleaved", 2, "ScheduleInterleaved1F1B"),
        ("zbh1", "zbh1", 1, "ScheduleInterleavedZeroBubble"),
        ("zbh2", "zbh2", 1, None),
        ("torch interleaved zb", None, 2, "ScheduleInterleavedZeroBubble"),
        ("torch zbv", None, 2, "ScheduleZBVZeroBubble")]


def run_ours(modules: list[SleepStage], name: str, m: int) -> None:
    x = torch.zeros(m, WIDTH)
    stages = [pp.Stage(mod, activation_shape=(1, WIDTH), chunk=c, n_chunks=len(modules))
              for c, mod in enumerate(modules)]
    pp.run_schedule(name, stages if len(stages) > 1 else stages[0], x, x, n_microbatches=m,
                    loss_fn=nn.functional.mse_loss)


def run_torch(modules: list[SleepStage], kind: str, m: int):
    """A step function driving the modules with torch's schedule `kind`."""
    from torch.distributed.pipelining import PipelineStage, schedules

    rank, p = dist.get_rank(), dist.get_world_size()
    v = len(modules)
    index = [rank, 2 * p - 1 - rank] if kind == "ScheduleZBVZeroBubble" else \
        [c * p + rank for c in range(v)]
    stages = [PipelineStage(mod, k, v * p, torch.device("cpu"), input_args=torch.zeros(1, WIDTH))
              for mod, k in zip(modules, index, strict=True)]
    cls = getattr(schedules, kind)
    schedule = cls(stages if kind not in ("Schedule1F1B", "ScheduleGPipe") else stages[0], m,
                   loss_fn=nn.functional.mse_loss)
    x = torch.zeros(m, WIDTH)
    first, last = 0 in index, v * p - 1 in index

    def step() -> None:
        kwargs = {"target": x, "losses": []} if last else {}
        schedule.step(x, **kwargs) if first else schedule.step(**kwargs)
    return step


def bench(t_ms: float, ms: list[int], steps: int) -> dict:
    """On every rank: per (label, runner, m) the spans of each step and its wall time."""
    spans: list[pp.Span] = []
    out: dict = {}
    for label, ours, v, theirs in RUNS:
        modules = [SleepStage(t_ms / 1e3, spans) for _ in range(v)]
        for m in ms:
            runners = {}
            if ours:
                runners["ours"] = lambda mods=modules, ours=ours, m=m: run_ours(mods, ours, m)
            if theirs:
                try:
                    runners["torch"] = run_torch(modules, theirs, m)
                except Exception as exc:  # noqa: BLE001 - reported, not hidden
                    out[(label, "torch", m)] = f"{type(exc).__name__}: {exc}"
            for runner, step in runners.items():
                per_step = []
                for i in range(steps + 1):
                    spans.clear()
                    dist.barrier()     # start every step together, so one step's tail never
                    t0 = time.perf_counter()   # overlaps the next step's head
                    try:
                        step()
                    except Exception as exc:  # noqa: BLE001
                        per_step = f"{type(exc).__name__}: {exc}"
                        break
                    if i:      # step 0 warms up (torch's runner also infers shapes then)
                        per_step.append((list(spans), time.perf_counter() - t0))
                out[(label, runner, m)] = per_step
    for name in ("zbh2", "zbh1", "1f1b"):      # 3 steps back to back, no barrier between
        modules = [SleepStage(t_ms / 1e3, spans)]
        m = max(ms)
        spans.clear()
        dist.barrier()
        for _ in range(3):
            run_ours(modules, name, m)
        out[(name, "back to back", m)] = list(spans)
    return out


def _median_bubble(values: list, key: tuple, steps: int) -> tuple[float, float] | str:
    per_rank = [v[key] for v in values]
    if isinstance(per_rank[0], str):
        return per_rank[0]
    bubbles = [pp.measured_bubble([r[i][0] for r in per_rank]).overall for i in range(steps)]
    walls = [per_rank[0][i][1] for i in range(steps)]
    return statistics.median(bubbles), statistics.median(walls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t-ms", type=float, default=20.0, help="F, B and W time per stage (ms)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    args = ap.parse_args()
    res = dl.launch(bench, args.t_ms, args.microbatches, args.steps,
                    world_size=P, backend="gloo", timeout=900, stream=False)
    print(f"p={P} ranks; F, B and W each {args.t_ms:g} ms of sleep per stage (a whole backward "
          f"{2 * args.t_ms:g} ms); median of {args.steps} steps\n")
    rows, notes = [], []
    for label, ours, v, _ in RUNS:
        for m in args.microbatches:
            formula = pp_bubble(ours, P, m, v) if ours else None
            if ours in ("zbh2",) and m < 2 * P - 1:
                formula = None
            simulated = pp.make_schedule(ours, P, m, n_chunks=v, backward_cost=2 if ours in (
                "gpipe", "1f1b", "interleaved") else 1).bubble_fraction if ours else None
            got = {r: _median_bubble(res.values, (label, r, m), args.steps)
                   for r in ("ours", "torch") if (label, r, m) in res.values[0]}
            for r, g in got.items():
                if isinstance(g, str):
                    notes.append(f"{label}, m={m}, {r}: {g}")
            num = {r: g for r, g in got.items() if not isinstance(g, str)}
            fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            rows.append([label + (f" (v={v})" if v > 1 else ""), m, fmt(formula),
                         fmt(simulated), fmt(num["ours"][0] if "ours" in num else None),
                         fmt(num["torch"][0] if "torch" in num else None),
                         fmt(abs(num["ours"][0] - formula) if "ours" in num and formula
                             is not None else None),
                         f"{num['ours'][1] / num['torch'][1]:.2f}" if len(num) == 2 else "-"])
    print(dl.viz.Table(["schedule", "m", "formula", "simulated", "ours", "torch",
                        "|ours - formula|", "step ours/torch"], rows,
                       title="bubble fraction of one step: formula, simulated grid, measured"))
    m = max(args.microbatches)
    back = []
    for name in ("zbh2", "zbh1", "1f1b"):
        spans = [v[(name, "back to back", m)] for v in res.values]
        measured = pp.measured_bubble(spans).overall
        formula = pp_bubble(name, P, m, steps=3) if name != "1f1b" else pp_bubble(name, P, m)
        back.append([name, m, f"{pp_bubble(name, P, m):.3f}", f"{formula:.3f}",
                     f"{measured:.3f}", f"{abs(measured - formula):.3f}"])
    print()
    print(dl.viz.Table(["schedule", "m", "one step", "formula, 3 steps", "measured, 3 steps",
                        "|measured - formula|"], back,
                       title="3 steps back to back (no barrier): ZB-H2's fill is shared"))
    for note in notes:
        print("could not run:", note)


if __name__ == "__main__":
    main()
