"""What our FSDP costs: a training step with dpmp_lab.fsdp.FullyShardedDataParallel against the
same step under torch's FSDP2 (`fully_shard`), in the same run, and its peak parameter memory
against the formula.

    python benchmarks/fsdp.py [--world-size 2] [--steps 5] [--rounds 5] [--layers 8]

Both shard the same model (a stack of Linear layers, one unit each, 8.4 M parameters by
default) over gloo ranks and train it with AdamW on the same shards; blocks of steps are timed
in turn (ours, torch, ours, ...) so that drift hits both alike. Printed: median step times of
rank 0, the collectives per step of each (forward and backward all-gathers, reduce-scatters),
the ratio ours / torch, and the peak parameter bytes dl.footprint measured on rank 0 against
dl.cost.fsdp_peak_param_bytes (the shards plus one gathered unit) and against
dl.cost.memory(..., zero=3) (the shards only). Ratios are measured in one run, because these
machines are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

import dpmp_lab as dl
from dpmp_lab.fsdp import FullyShardedDataParallel

WIDTH = 1024


def _model(layers: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())])


def time_steps(layers: int, steps: int, rounds: int) -> dict:
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(16, WIDTH, generator=g), torch.randn(16, WIDTH, generator=g)
    ours = FullyShardedDataParallel(_model(layers))
    theirs = _model(layers)
    for m in theirs:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(theirs)
    models = {"ours": ours, "torch": theirs}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}

    def step(name: str) -> None:
        optimizers[name].zero_grad()
        F.mse_loss(models[name](x), y).backward()
        if name == "ours":
            ours.finish_gradient_sync()
        optimizers[name].step()

    counts = {}
    for name in models:             # warm up, then one traced step each
        step(name)
        with dl.trace() as t:
            step(name)
        counts[name] = (t.count("all_gather", phase="forward"),
                        t.count("all_gather", phase="backward"), t.count("reduce_scatter"))
    with dl.footprint.record(ours, optimizers["ours"]) as fp:
        step("ours")
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name in models:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step(name)
            times[name].append((time.perf_counter() - t0) / steps)
    n_params = sum(p.numel() for p in _model(layers).parameters())
    return {"times": times, "counts": counts, "peak": fp.peak("params"), "params": n_params}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.world_size} gloo ranks, "
          f"{args.layers} x Linear({WIDTH}, {WIDTH}), AdamW, median of {args.rounds} blocks of "
          f"{args.steps} steps (rank 0)")
    res = dl.launch(time_steps, args.layers, args.steps, args.rounds,
                    world_size=args.world_size, stream=False, timeout=1200)
    r0 = res[0]
    med = {name: statistics.median(r0["times"][name]) for name in ("ours", "torch")}
    for name in ("ours", "torch"):
        fwd, bwd, rs = r0["counts"][name]
        print(f"  {name:>5}: {med[name] * 1e3:7.1f} ms per step; per step {fwd} all-gathers in "
              f"forward, {bwd} in backward, {rs} reduce-scatters")
    print(f"  ratio ours / torch fully_shard: {med['ours'] / med['torch']:.2f}x")
    unit = WIDTH * WIDTH + WIDTH
    formula = dl.cost.fsdp_peak_param_bytes(r0["params"], args.world_size, unit)
    shards_only = dl.cost.memory(r0["params"], dp=args.world_size, zero=3).params
    print(f"  peak parameter bytes on rank 0: measured {dl.viz.human_bytes(r0['peak'])}, "
          f"shards + one gathered unit {dl.viz.human_bytes(formula)} "
          f"({r0['peak'] / formula - 1:+.1%}), shards only (06's formula) "
          f"{dl.viz.human_bytes(shards_only)} ({r0['peak'] / shards_only - 1:+.1%})")


if __name__ == "__main__":
    main()
