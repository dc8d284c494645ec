"""What measuring costs, and how well the alpha-beta fit predicts: ratios from one run.

    python benchmarks/bench.py [--world-size 2] [--repeats 9] [--rounds 5]

1. A DataParallel TinyGPT step timed three ways, interleaved round by round so that drift hits
   each alike: a bare perf_counter loop on rank 0 (the baseline), dl.bench.time_in_ranks
   (a barrier before each repeat, the slowest rank), and one step under dl.bench.profile
   (torch.profiler's own cost). Printed: each median over the baseline.
2. The all-reduce fit: dl.bench.sweep on 2 ranks, fit_alpha_beta on all sizes but one, and the
   predicted / measured time of the held-out size (1.0 is a perfect prediction).

Ratios only: absolute times on a shared machine say little.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import dpmp_lab as dl

CONFIG = dl.models.GPTConfig(vocab_size=64, seq_len=32, d_model=64, n_heads=4, n_layers=2,
                             d_ff=256)


def time_three_ways(repeats: int, rounds: int) -> dict[str, list[float]]:
    dev = dl.device()
    model = dl.dp.DataParallel(dl.models.TinyGPT(CONFIG).to(dev), bucket_mb=0.1)
    idx, targets = dl.models.token_batch(8, CONFIG.seq_len, CONFIG.vocab_size, seed=dl.rank())
    idx, targets = idx.to(dev), targets.to(dev)

    def step() -> None:
        dl.models.lm_loss(model(idx), targets).backward()
        model.finish_gradient_sync()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    out: dict[str, list[float]] = {"bare loop": [], "time_in_ranks": [], "profiled": []}
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        out["bare loop"].append((time.perf_counter() - start) / repeats)
        out["time_in_ranks"].append(dl.bench.time_in_ranks(step, warmup=0,
                                                           repeats=repeats).median)
        start = time.perf_counter()
        dl.bench.profile(step)
        out["profiled"].append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.world_size} gloo ranks")
    res = dl.launch(time_three_ways, args.repeats, args.rounds, world_size=args.world_size,
                    stream=False, timeout=600)
    med = {name: statistics.median(v) for name, v in res[0].items()}
    base = med["bare loop"]
    print("DataParallel TinyGPT step, median of rounds, over a bare loop: "
          + ", ".join(f"{name} {value / base:.2f}x" for name, value in med.items()))
    sizes, held_out = [2**12, 2**14, 2**16, 2**18, 2**20], 2**19
    table = dl.bench.sweep(["all_reduce"], sizes + [held_out], [args.world_size],
                           repeats=args.repeats)
    rows = [(r.op, r.world_size, r.nbytes, r.min_seconds) for r in table.rows]
    fit = dl.bench.fit_alpha_beta([r for r in rows if r[2] != held_out])
    measured = next(r[3] for r in rows if r[2] == held_out)
    predicted = fit.predict("all_reduce", held_out, args.world_size)
    print(f"all-reduce fit on {args.world_size} ranks: {fit}; held-out 512 KiB predicted / "
          f"measured = {predicted / measured:.2f}")


if __name__ == "__main__":
    main()
