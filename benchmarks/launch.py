"""How long a launch takes: dl.launch against torch.multiprocessing.spawn, in the same run.

    python benchmarks/launch.py [--world-size 4] [--warm 30] [--spawn 5]

The work is the same for both: initialise a gloo process group, one all_reduce, destroy.
Printed: the first dl.launch in a fresh process (it starts the forkserver); the first
dl.launch in a fresh IPython session 3 s after `import dpmp_lab` (the import started the
forkserver in the background: target 0.5 s or less); the median warm dl.launch; the median
torch.multiprocessing.spawn; and the ratios. Figures are ratios measured in one run, because
these machines are noisy.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp


def work() -> float:
    t = torch.ones(1024)
    dist.all_reduce(t)
    return float(t[0])


def spawned(rank: int, world_size: int, store_path: str) -> None:
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    work()
    dist.destroy_process_group()


def time_spawn(world_size: int) -> float:
    with tempfile.TemporaryDirectory() as tmpdir:
        t0 = time.perf_counter()
        tmp.spawn(spawned, args=(world_size, os.path.join(tmpdir, "store")), nprocs=world_size)
        return time.perf_counter() - t0


FIRST_LAUNCH = """
import time, sys
if {ipython}:   # what a kernel has: importing dpmp_lab then warms the forkserver up
    from IPython.core.interactiveshell import InteractiveShell
    InteractiveShell.instance()
t0 = time.perf_counter()
import dpmp_lab as dl
t1 = time.perf_counter()
sys.path.insert(0, {here!r})
from launch import work
time.sleep(max(0.0, {pause} - (time.perf_counter() - t1)))   # the learner reads a cell
t2 = time.perf_counter()
res = dl.launch(work, world_size={n}, stream=False)
t3 = time.perf_counter()
print(t1 - t0, t3 - t2)
"""


def time_first_launch(world_size: int, *, ipython: bool = False,
                      pause: float = 0.0) -> tuple[float, float]:
    """(seconds to import dpmp_lab, seconds of the first launch) in a fresh interpreter; the
    launch starts `pause` seconds after the import ended."""
    code = FIRST_LAUNCH.format(here=os.path.dirname(os.path.abspath(__file__)), n=world_size,
                               ipython=ipython, pause=pause)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported, launched = (float(x) for x in out.stdout.split())
    return imported, launched


def main() -> None:
    import dpmp_lab as dl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--warm", type=int, default=30, help="warm launches to time")
    parser.add_argument("--spawn", type=int, default=5, help="spawn runs to time")
    args = parser.parse_args()
    n = args.world_size

    firsts = [time_first_launch(n) for _ in range(3)]
    warmed = [time_first_launch(n, ipython=True, pause=3.0)[1] for _ in range(3)]
    dl.launch(work, world_size=n, stream=False)  # start this process's forkserver
    warm = []
    for _ in range(args.warm):
        t0 = time.perf_counter()
        dl.launch(work, world_size=n, stream=False)
        warm.append(time.perf_counter() - t0)
    spawn = [time_spawn(n) for _ in range(args.spawn)]

    warm_med, spawn_med = statistics.median(warm), statistics.median(spawn)
    first_med = statistics.median(f[1] for f in firsts)
    import_med = statistics.median(f[0] for f in firsts)
    warmed_med = statistics.median(warmed)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {n} gloo ranks: init + 1 "
          "all_reduce + destroy")
    print(f"  first dl.launch in a fresh process  {first_med:7.3f} s  "
          f"(import dpmp_lab before it: {import_med:.2f} s)")
    print(f"  first, 3 s after import in IPython  {warmed_med:7.3f} s  "
          f"(target <= 0.5 s; {first_med / warmed_med:.1f} x faster than without warm-up)")
    print(f"  warm dl.launch, median of {args.warm:<3}      {warm_med:7.3f} s  "
          f"(min {min(warm):.3f}, max {max(warm):.3f})")
    print(f"  torch.multiprocessing.spawn, median {spawn_med:7.3f} s  (of {args.spawn})")
    print(f"  ratio spawn / warm launch           {spawn_med / warm_med:7.1f} x")
    print(f"  ratio first in IPython / warm       {warmed_med / warm_med:7.1f} x")


if __name__ == "__main__":
    main()
