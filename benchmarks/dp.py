"""What our DataParallel costs: a training step with dpmp_lab.dp.DataParallel (bucketed,
overlapped) against the same step under torch's DistributedDataParallel, in the same run.

    python benchmarks/dp.py [--world-size 4] [--steps 10] [--rounds 7] [--bucket-mb 1 25]

Both wrap the same model (a stack of Linear layers, 2.6 M parameters, so the gradient
all-reduce of 10 MiB matters) with the same bucket size, train with SGD on the same shards,
and time blocks of steps in turn (ours, DDP, ours, ...) so that drift hits both alike. Printed:
median step times of rank 0, the all-reduces per step of each, and the ratio ours / DDP, per
bucket size. Ratios are measured in one run, because these machines are noisy.

DDP closes a bucket once it reaches the cap (so a 1 MiB weight and its bias share one), ours
before a tensor would overflow it (the bias goes alone): at 1 MiB this model makes 8 buckets
of ours against DDP's 4, and each all-reduce pays a latency.
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

import dpmp_lab as dl
from dpmp_lab.dp import DataParallel


def _model() -> nn.Module:
    torch.manual_seed(0)
    width = 1024
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 256))


def time_steps(bucket_mb: float, steps: int, rounds: int) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(32, 256, generator=g), torch.randn(32, 256, generator=g)
    ours = DataParallel(_model(), bucket_mb=bucket_mb, overlap=True)
    ddp = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=bucket_mb)
    ways = {"ours": (ours, ours.finish_gradient_sync), "ddp": (ddp, lambda: None)}
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=1e-3)
                  for name, (model, _) in ways.items()}

    def step(name: str) -> None:
        model, sync = ways[name]
        optimizers[name].zero_grad()
        F.mse_loss(model(x), y).backward()
        sync()
        optimizers[name].step()

    for name in ways:          # warm up (DDP rebuilds its buckets after the first steps)
        for _ in range(3):
            step(name)
    with dl.trace() as t:
        step("ddp")
    ddp_buckets = t.count("all_reduce")
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name in ways:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step(name)
            times[name].append((time.perf_counter() - t0) / steps)
    return times | {"num_buckets": ours.num_buckets, "ddp_buckets": ddp_buckets,
                    "params": sum(p.numel() for p in ours.parameters())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[1.0, 25.0])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.world_size} gloo ranks, "
          f"SGD step, median of {args.rounds} blocks of {args.steps} steps (rank 0)")
    for bucket_mb in args.bucket_mb:
        res = dl.launch(time_steps, bucket_mb, args.steps, args.rounds,
                        world_size=args.world_size, stream=False, timeout=1200)
        r0 = res[0]
        med = {name: statistics.median(r0[name]) for name in ("ours", "ddp")}
        print(f"  bucket {bucket_mb:g} MiB, {r0['params'] / 1e6:.1f} M params: DataParallel "
              f"{med['ours'] * 1e3:6.1f} ms ({r0['num_buckets']} all-reduces)   torch DDP "
              f"{med['ddp'] * 1e3:6.1f} ms ({r0['ddp_buckets']})   ratio "
              f"{med['ours'] / med['ddp']:.2f}x")


if __name__ == "__main__":
    main()
