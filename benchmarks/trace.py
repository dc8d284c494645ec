"""What tracing costs: a small training step with dl.trace on, against the same step without it.

    python benchmarks/trace.py [--world-size 2] [--steps 40] [--rounds 7]

Each rank trains a tiny model under torch's DistributedDataParallel (so the all-reduces come
from DDP's C++ reducer inside backward, the hardest case for a tracer) and times blocks of
steps in turn: plain, with dl.trace, and with a do-nothing TorchDispatchMode (what a tracer
built like torch's CommDebugMode pays, since such a mode runs Python for every op). Printed:
median step times and the ratios traced / plain and dispatch-mode / plain, for an MLP and for
a GPT-like transformer block. Ratios are measured in one run because these machines are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import dpmp_lab as dl


class _PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                   torch.nn.Linear(64, 64), torch.nn.GELU(),
                                   torch.nn.Linear(64, 10))
    return torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                            dropout=0.0, batch_first=True, norm_first=True)


def _batch(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(dist.get_rank())
    if kind == "mlp":
        return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    return torch.randn(4, 16, 32, generator=g), torch.randn(4, 16, 32, generator=g)


def time_steps(kind: str, steps: int, rounds: int) -> dict[str, list[float]]:
    model = torch.nn.parallel.DistributedDataParallel(_model(kind))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _batch(kind)
    loss_fn = torch.nn.functional.cross_entropy if kind == "mlp" else \
        torch.nn.functional.mse_loss

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    ways = {"plain": contextlib.nullcontext, "dl.trace": dl.trace,
            "dispatch mode": _PassThrough}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, context in ways.items():   # interleaved, so drift hits every way alike
            dist.barrier()
            with context():
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                times[name].append((time.perf_counter() - t0) / steps)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.world_size} gloo ranks, "
          f"DDP training step, median of {args.rounds} blocks of {args.steps} steps (rank 0)")
    for kind in ("mlp", "gpt block"):
        res = dl.launch(time_steps, kind, args.steps, args.rounds, world_size=args.world_size,
                        stream=False, timeout=600)
        med = {name: statistics.median(v) for name, v in res[0].items()}
        print(f"  {kind:<10} plain {med['plain'] * 1e3:6.2f} ms   dl.trace "
              f"{med['dl.trace'] * 1e3:6.2f} ms ({med['dl.trace'] / med['plain']:.2f}x)   "
              f"dispatch mode {med['dispatch mode'] * 1e3:6.2f} ms "
              f"({med['dispatch mode'] / med['plain']:.2f}x)")


if __name__ == "__main__":
    main()
