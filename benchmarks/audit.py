"""What the device audit costs: a TinyGPT data-parallel training step audited against plain.

    python benchmarks/audit.py [--world-size 2] [--steps 20] [--rounds 5]

The same function runs in two launches, one with device_audit=True; each rank times blocks of
steps (forward, backward, DataParallel's bucketed all-reduce, AdamW) and the median block is
compared. The audit runs Python for every torch call the rank's code makes (a TorchFunctionMode),
so it is for CI and authors, never for timing; this says by how much. Ratios in one run, as
these machines are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dpmp_lab as dl


def time_steps(steps: int, rounds: int) -> float:
    dev = dl.device()
    model = dl.dp.DataParallel(dl.models.TinyGPT(seed=0).to(dev), bucket_mb=0.25)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx, targets = dl.models.token_batch(8, model.module.config.seq_len,
                                         model.module.config.vocab_size, seed=dl.rank())
    idx, targets = idx.to(dev), targets.to(dev)

    def step() -> None:
        opt.zero_grad()
        dl.models.lm_loss(model(idx), targets).backward()
        model.finish_gradient_sync()
        opt.step()

    step()   # warm-up
    blocks = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        blocks.append((time.perf_counter() - start) / steps)
    return statistics.median(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    common = dict(world_size=args.world_size, stream=False, timeout=600)
    plain = max(dl.launch(time_steps, args.steps, args.rounds, device_audit=False,
                          **common).values)
    audited = max(dl.launch(time_steps, args.steps, args.rounds, device_audit=True,
                            **common).values)
    print(f"TinyGPT DP step, {args.world_size} ranks: plain {plain * 1e3:.1f} ms, "
          f"audited {audited * 1e3:.1f} ms, ratio {audited / plain:.2f}x")


if __name__ == "__main__":
    main()
