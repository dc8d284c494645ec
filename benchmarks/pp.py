"""The pipeline bubble, measured: 1F1B and GPipe on 4 ranks whose stages only sleep.

    python benchmarks/pp.py [--t-ms 20] [--ratio 2] [--steps 5] [--microbatches 4 8]

Every stage's forward sleeps t and its backward sleeps ratio * t, on every stage: equal
stages, which is what the formula (p - 1) / (m + p - 1) assumes (the ratio between backward
and forward does not change it: the fill and the drain each last p - 1 slots of F + B, as the
simulated grid with backward_cost=ratio shows). Sleeping instead of computing keeps the two
shared cores of these machines out of the timing, so what is measured is the schedule.

Printed for each schedule and m: the formula, the simulated grid's bubble, the bubble
measured from pp.run_schedule's own spans, and the same stages driven by torch's
torch.distributed.pipelining (Schedule1F1B / ScheduleGPipe) in the same launch, its bubble
measured from the compute spans the sleeping stage records itself (so both runners are timed
the same way); then the step time of ours / torch's. Medians over --steps steps after one
warm-up step.
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

WIDTH = 8     # activation: (1, WIDTH) per micro-batch; tiny, so sending costs next to nothing


class _Sleep(torch.autograd.Function):
    """Identity that takes t to run forward and ratio * t backward, and says when it ran."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, stage: SleepStage) -> torch.Tensor:
        ctx.stage = stage
        stage.run("F", stage.t_forward)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.stage.run("B", ctx.stage.t_backward)
        return grad, None


class SleepStage(nn.Module):
    def __init__(self, t_forward: float, t_backward: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.t_forward, self.t_backward = t_forward, t_backward
        self.spans: list[pp.Span] = []

    def run(self, kind: str, seconds: float) -> None:
        start = time.perf_counter()
        time.sleep(seconds)
        self.spans.append(pp.Span(kind, len(self.spans), start, time.perf_counter()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x * self.w, self)


def _ours(stage: SleepStage, name: str, m: int) -> list[pp.Span]:
    x = torch.zeros(m, WIDTH)
    pipeline = pp.Stage(stage, activation_shape=(1, WIDTH))
    result = pp.run_schedule(name, pipeline, x, x, n_microbatches=m,
                             loss_fn=nn.functional.mse_loss)
    return result.spans


def _torch_schedule(stage: SleepStage, name: str, m: int):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    torch_stage = PipelineStage(stage, rank, world, torch.device("cpu"),
                                input_args=torch.zeros(1, WIDTH))
    kind = Schedule1F1B if name == "1f1b" else ScheduleGPipe
    schedule = kind(torch_stage, m, loss_fn=nn.functional.mse_loss)
    x = torch.zeros(m, WIDTH)

    def step() -> None:
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=x, losses=[])
        else:
            schedule.step()
    return step


def bench(t_ms: float, ratio: float, ms: list[int], steps: int) -> dict:
    """On every rank: per (runner, schedule, m) the spans of each step and its wall time."""
    stage = SleepStage(t_ms / 1e3, ratio * t_ms / 1e3)
    out: dict = {}
    for name in ("1f1b", "gpipe"):
        for m in ms:
            torch_step = _torch_schedule(stage, name, m)
            for runner in ("ours", "torch"):
                per_step = []
                for i in range(steps + 1):
                    stage.spans.clear()
                    dist.barrier()     # start every step together, so one step's tail never
                    t0 = time.perf_counter()   # overlaps the next step's head
                    spans = _ours(stage, name, m) if runner == "ours" else (torch_step() or [])
                    wall = time.perf_counter() - t0
                    if runner == "torch":
                        spans = list(stage.spans)
                    if i:      # step 0 warms up (torch's runner also infers shapes then)
                        per_step.append((spans, wall))
                out[(runner, name, m)] = per_step
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t-ms", type=float, default=20.0, help="forward time per stage (ms)")
    ap.add_argument("--ratio", type=int, default=2, help="backward time / forward time")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    args = ap.parse_args()
    p = 4
    res = dl.launch(bench, args.t_ms, args.ratio, args.microbatches, args.steps,
                    world_size=p, backend="gloo", timeout=600, stream=False)
    print(f"p={p} stages, forward {args.t_ms:g} ms and backward {args.ratio * args.t_ms:g} ms "
          f"of sleep on every stage; median of {args.steps} steps\n")
    rows = []
    for name in ("1f1b", "gpipe"):
        for m in args.microbatches:
            measured, walls = {}, {}
            for runner in ("ours", "torch"):
                per_rank = [v[(runner, name, m)] for v in res.values]
                bubbles = [pp.measured_bubble([r[i][0] for r in per_rank]).overall
                           for i in range(args.steps)]
                measured[runner] = statistics.median(bubbles)
                walls[runner] = statistics.median(r[i][1] for r in per_rank[:1]
                                                  for i in range(args.steps))
            formula = pp.bubble_fraction(p, m)
            simulated = pp.make_schedule(name, p, m, backward_cost=args.ratio).bubble_fraction
            rows.append([name, m, f"{formula:.3f}", f"{simulated:.3f}",
                         f"{measured['ours']:.3f}", f"{measured['torch']:.3f}",
                         f"{abs(measured['ours'] - formula):.3f}",
                         f"{walls['ours'] / walls['torch']:.2f}"])
    print(dl.viz.Table(["schedule", "m", "formula", "simulated", "ours", "torch",
                        "|ours - formula|", "step ours/torch"], rows,
                       title="bubble fraction: formula (p-1)/(m+p-1), simulated grid, measured"))


if __name__ == "__main__":
    main()
