"""What a hang, debug mode and a profile look like on nccl: run once on a GPU server.

    python tools/nccl_checks.py [--json out.json]            # nccl, one rank per GPU (1 at least)
    python tools/nccl_checks.py --backend gloo --world-size 2   # the same checks on the CPU

Four launches, each printed as a learner would see it:
  1. a hang stopped by the launch timeout: a collective queued behind a kernel that never ends
     (torch.cuda._sleep); the LaunchTimeout must carry every rank's flight record and name the
     collective the ranks wait in;
  2. the same hang ended by the process-group timeout (nccl's watchdog, not an exception);
  3. a launch with debug=True (TORCH_DISTRIBUTED_DEBUG=DETAIL in the ranks) that must succeed;
  4. dl.bench.profile with trace_dir: the Chrome trace must hold the GPU's kernels on nccl.
Exit status 1 if a check failed. The records of check 1 are also handed to torch's own
analyser (python -m torch.distributed.flight_recorder.fr_trace), whose output is printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dpmp_lab as dl  # noqa: E402

SLEEP_CYCLES = 10 ** 12   # torch.cuda._sleep: minutes of a GPU's clock, longer than any timeout


def hang() -> float:
    x = torch.ones(4, device=dl.device())
    dist.all_reduce(x)                       # collective #1: completes
    if x.is_cuda:
        torch.cuda._sleep(SLEEP_CYCLES)      # a kernel that outlasts the launch
    elif dl.rank() == 1:
        time.sleep(600)                      # on the CPU: rank 1 never joins #2
    dist.all_reduce(x)                       # collective #2: queued behind it, never runs
    return x.sum().item()


def step() -> float:
    x = torch.ones(256, 256, device=dl.device())
    y = x @ x
    dist.all_reduce(y)
    return y.sum().item()


def debugged() -> str:
    step()
    return str(dist.get_debug_level())


def profiled(trace_dir: str) -> dict:
    _, prof = dl.bench.profile(step, trace_dir=trace_dir)
    events = json.loads(Path(prof.trace_file).read_text())["traceEvents"]
    cats = sorted({str(e.get("cat")) for e in events})
    return {"file": prof.trace_file, "categories": cats,
            "kernels": sum(1 for e in events if e.get("cat") == "kernel")}


def check(name: str, fn, results: dict) -> None:
    t0 = time.monotonic()
    try:
        value = fn()
        results[name] = {"ok": True, "value": value}
    except Exception as exc:  # noqa: BLE001 - every check reports, whatever failed
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    results[name]["seconds"] = round(time.monotonic() - t0, 2)
    print(f"--- {name}: {'ok' if results[name]['ok'] else 'FAILED'} "
          f"({results[name]['seconds']} s)\n{results[name].get('value') or results[name].get('error')}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--world-size", type=int,
                        default=max(1, torch.cuda.device_count()) if torch.cuda.is_available()
                        else 2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, backend {args.backend}, {args.world_size} ranks", flush=True)
    launch = dict(world_size=args.world_size, backend=args.backend, stream=False)
    results: dict = {"torch": torch.__version__, "backend": args.backend}

    def launch_timeout_hang() -> str:
        try:
            dl.launch(hang, timeout=10, pg_timeout=60, **launch)
        except dl.LaunchTimeout as err:
            with tempfile.TemporaryDirectory() as folder:
                err.save_flight_records(folder)
                analysed = subprocess.run(
                    [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                     folder, "--allow-incomplete-ranks"],
                    capture_output=True, text=True, timeout=60)
            results["fr_trace"] = (analysed.stdout + analysed.stderr)[-3000:]
            print("fr_trace says:\n" + results["fr_trace"], flush=True)
            if "collective #2" not in str(err) or len(err.flight_records) != args.world_size:
                raise AssertionError("no flight record naming collective #2:\n" + str(err)) from err
            return str(err)
        raise AssertionError("the hang returned")

    def watchdog_hang() -> str:
        t0 = time.monotonic()
        try:
            dl.launch(hang, timeout=60, pg_timeout=4, **launch)
        except dl.LaunchError as err:
            seconds = time.monotonic() - t0
            results["watchdog_error_type"] = type(err).__name__
            results["watchdog_output"] = [o[-4000:] for o in err.output]
            results["watchdog_records"] = len(err.flight_records)
            if not isinstance(err, dl.LaunchTimeout) or seconds > 30 \
                    or len(err.flight_records) != args.world_size:
                raise AssertionError(f"after {seconds:.1f} s, {type(err).__name__} with "
                                     f"{len(err.flight_records)} records:\n{err}") from err
            return f"after {seconds:.1f} s: {type(err).__name__}: {err}"
        raise AssertionError("the hang returned")

    check("launch timeout, flight record", launch_timeout_hang, results)
    check("process-group timeout (watchdog)", watchdog_hang, results)
    check("debug=True", lambda: dl.launch(debugged, debug=True, timeout=60, **launch).values,
          results)
    with tempfile.TemporaryDirectory() as traces:
        check("profile trace", lambda: dl.launch(profiled, traces, timeout=120, **launch).values,
              results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False]
    print("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
