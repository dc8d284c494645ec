"""Ring attention: overlapped, not overlapped, and all-gathered K/V, against torch's attention.

    python benchmarks/cp.py [--world 2] [--seq 2048] [--heads 4] [--dim 64] [--steps 5] [--zigzag]

One launch of --world ranks (one compute thread each). Every rank holds seq / world tokens of
one causal sequence and runs forward + backward of
  * dl.cp.ring_attention, K/V sends posted before each block's compute (overlap=True),
  * the same with every message waited for before the compute (overlap=False),
  * dl.cp.all_gather_attention: K/V all-gathered first, dK/dV reduce-scattered in backward;
then rank 0 alone runs torch's scaled_dot_product_attention (causal) on the whole sequence,
the one-process baseline, in the same launch. Printed: medians over --steps timed steps (after
one warm-up), as ratios: each cp variant against the baseline, overlap against none, ring
against all-gather. With cp ranks sharing the work, a ratio below 1 against the baseline is the
speed-up; on these shared 2-core machines the ranks also share the cores, so read the ratios
between the cp variants, not the absolutes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dpmp_lab as dl


def measure(seq: int, heads: int, dim: int, steps: int, zigzag: bool) -> dict:
    """Median seconds per variant; the variants take turns within every step, so that a change
    in the machine's load (shared cores) hits them all alike."""
    torch.set_num_threads(1)
    group = dist.group.WORLD
    full = [torch.randn(1, heads, seq, dim, generator=torch.Generator().manual_seed(i))
            .to(dl.device()) for i in range(3)]
    mine = [dl.cp.split_sequence(t, group, zigzag).requires_grad_() for t in full]
    whole = [t.clone().requires_grad_() for t in full]

    def step(attend, inputs):
        def run():
            for t in inputs:
                t.grad = None
            attend(*inputs).sum().backward()
        return run

    variants = {
        "ring, overlapped": step(lambda q, k, v: dl.cp.ring_attention(
            q, k, v, group, zigzag=zigzag, overlap=True), mine),
        "ring, not overlapped": step(lambda q, k, v: dl.cp.ring_attention(
            q, k, v, group, zigzag=zigzag, overlap=False), mine),
        "all-gathered K/V": step(lambda q, k, v: dl.cp.all_gather_attention(
            q, k, v, group, zigzag=zigzag), mine),
        # rank 0 alone, the others wait at the barrier: one process, the whole sequence
        "torch sdpa, one process": step(lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True), whole),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(steps + 1):                  # step 0 warms up
        for name, run in variants.items():
            alone = name.startswith("torch")
            dist.barrier()
            start = time.perf_counter()
            if not alone or dist.get_rank() == 0:
                run()
            if i and (not alone or dist.get_rank() == 0):
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items() if t}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--zigzag", action="store_true")
    a = parser.parse_args()
    res = dl.launch(measure, a.seq, a.heads, a.dim, a.steps, a.zigzag, world_size=a.world,
                    timeout=600, stream=False)
    # a step lasts as long as its slowest rank
    t = {name: max(v[name] for v in res.values if name in v) for name in res.values[0]}
    base = t["torch sdpa, one process"]
    split = "zig-zag" if a.zigzag else "contiguous"
    print(f"causal attention, forward + backward: {a.seq} tokens, {a.heads} heads of {a.dim}, "
          f"cp = {a.world} ({split}), median of {a.steps} steps")
    for name, seconds in t.items():
        print(f"  {name:26s} {seconds * 1e3:9.1f} ms   {seconds / base:5.2f} x torch sdpa")
    print(f"  overlapped / not overlapped: {t['ring, overlapped'] / t['ring, not overlapped']:.2f}")
    print(f"  ring (overlapped) / all-gathered K/V: "
          f"{t['ring, overlapped'] / t['all-gathered K/V']:.2f}")


if __name__ == "__main__":
    main()
