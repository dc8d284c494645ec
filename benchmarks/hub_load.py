"""A class on the course's hub, under load: as many learners as this machine holds, each
running a launch cell at the same moment, one of them a runaway, while the instructor grades.

    sudo python benchmarks/hub_load.py [--learners 8] [--memory 2G] [--cpus 1] [--json out.json]

It starts the hub as tests/end_to_end/test_hub_class.py does (root, throw-away accounts, the
learners' copy, the hub's API with an admin token), and measures, in this one run:
- a launch cell (`dl.launch` of a 4-rank all-reduce, the kernel's first launch, its rank starter
  included, then a second) in one learner's server alone: the baseline;
- the same in every learner's server at once, while `dpmp-lab grade` grades copies of
  00_launch's solution as the instructor and one more learner's cell takes more memory than
  its server has: each launch's seconds against the baseline's, the grading's seconds against
  its own alone, what the runaway lost (its kernel) and what the others did not;
- each server's memory (its cgroup's peak and what it holds once the cells are done: its
  JupyterLab, one kernel with torch, the kernel's rank starter).

The figures are ratios within the run and memory in MiB; the instructor guide's sizing note
quotes them, and what it extrapolates to 40 learners on a GPU server it says is extrapolated.
Everything it starts it stops, and it removes the accounts, as the test does.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpmp_lab.instructor.hub_settings import memory_bytes  # noqa: E402
from tests.end_to_end.test_hub_class import (  # noqa: E402
    Accounts,
    Hub,
    cgroup_files,
    class_hub,
    finish_course,
    in_kernel,
    start_server,
)

LAUNCH = ("import time\nimport dpmp_lab as dl\n"
          "def reduce():\n    import torch, torch.distributed as dist\n"
          "    t = torch.ones(1000)\n    dist.all_reduce(t)\n    return t[0].item()\n"
          "for _ in range(2):\n    began = time.monotonic()\n"
          "    assert dl.launch(reduce, world_size=4, stream=False).values == [4.0] * 4\n"
          "    print(round(time.monotonic() - began, 3), end=' ')\n")


def launches(hub: Hub, user: str) -> tuple[str, list[float]]:
    """(status, [first launch s, second launch s]) of the launch cell in a new kernel."""
    status, printed = in_kernel(hub, user, LAUNCH, timeout=600)
    if status != "ok":
        print(f"{user}: {status}: {printed[-2000:]}", file=sys.stderr)
        return status, []
    return status, [float(x) for x in printed.split()]


def memory_mb(user: str) -> dict[str, float]:
    files = cgroup_files(user)
    now = files.get("memory.usage_in_bytes") or files.get("memory.current")
    peak = files.get("memory.max_usage_in_bytes") or files.get("memory.peak")
    return {"now": int(now.read_text()) / 2**20 if now else float("nan"),
            "peak": int(peak.read_text()) / 2**20 if peak else float("nan")}


def grading(hub: Hub, accounts: Accounts, copies: int) -> float:
    """Seconds of `dpmp-lab grade` of `copies` copies of 00_launch's solution, as the
    instructor, in the course root (sandboxed, as the class is graded)."""
    course = hub.course
    for i in range(copies):
        folder = course / "submitted" / f"load{i}" / "00_launch"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "solutions" / "00_launch" / "00_launch.ipynb", folder)
    subprocess.run(["chown", "-R", f"{accounts.instructor}:", str(course / "submitted")],
                   check=True)
    env = dict(hub.env, HOME=pwd.getpwnam(accounts.instructor).pw_dir)
    python = hub.env["DPMP_LAB_HUB_PYTHON"]
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env['PATH']}"
    began = time.monotonic()
    subprocess.run(["runuser", "-u", accounts.instructor, "--", python, "-m", "dpmp_lab.cli",
                    "grade", "00_launch", "--root", str(course), "--force", "--timeout", "900"],
                   cwd=course, env=env, check=True, capture_output=True, timeout=1200)
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=8, help="learners launching at once "
                        "(one runaway more)")
    parser.add_argument("--memory", default="2G")
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--submissions", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run it as root: it makes accounts and starts a hub")
    accounts = Accounts(more=args.learners - 1)   # and the runaway, the last of them
    out: dict = {"learners launching": args.learners, "runaways": 1, "memory": args.memory,
                 "cpus": args.cpus, "cores": os.cpu_count()}
    outlived: list[str] = []
    with class_hub(accounts, outlived, DPMP_LAB_HUB_MEMORY=args.memory,
                   DPMP_LAB_HUB_CPUS=str(args.cpus)) as hub:
        finish_course(hub.course_release, hub.course, accounts.instructor)
        *learners, runaway = accounts.learners
        began = time.monotonic()
        with ThreadPoolExecutor(len(accounts.learners)) as pool:
            list(pool.map(lambda u: start_server(hub, u), accounts.learners))
        out["all servers started s"] = round(time.monotonic() - began, 1)
        out["alone"] = launches(hub, learners[0])[1]
        out["grading alone s"] = round(grading(hub, accounts, args.submissions), 1)
        out["memory after one launch cell, MiB"] = memory_mb(learners[0])
        with ThreadPoolExecutor(len(accounts.learners) + 1) as pool:
            graded = pool.submit(grading, hub, accounts, args.submissions)
            too_much = memory_bytes(args.memory) + 2**30
            hog = pool.submit(in_kernel, hub, runaway,
                              f"hog = b'x' * {too_much}\nprint('survived')", 600)
            loaded = list(pool.map(lambda u: launches(hub, u), learners))
            out["grading under load s"] = round(graded.result(), 1)
            out["runaway"] = hog.result()[0]
        out["under load"] = [times for _, times in loaded]
        out["statuses"] = sorted({status for status, _ in loaded})
        first = [t[0] for t in out["under load"] if t]
        second = [t[1] for t in out["under load"] if t]
        out["first launch, x alone (median)"] = round(
            sorted(first)[len(first) // 2] / out["alone"][0], 2)
        out["second launch, x alone (median)"] = round(
            sorted(second)[len(second) // 2] / out["alone"][1], 2)
        out["grading, x alone"] = round(out["grading under load s"]
                                        / out["grading alone s"], 2)
        out["memory per server, MiB"] = {u: memory_mb(u) for u in learners}
        out["hub answers"] = hub.ready()
    out["outlived the hub"] = outlived
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
