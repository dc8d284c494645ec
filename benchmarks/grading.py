"""Grading a class: CPU seconds and wall time per submission of this checkout's grading, against
a baseline commit's measured in the same run, and what that projects to on a many-core server.

    python benchmarks/grading.py [--assignment 00_launch] [--submissions 4] [--jobs 1]
                                 [--baseline 6b54e76] [--json rows.json]

The baseline is by default the last commit whose grading ran the tests in the learner's own
kernel (one kernel, receipts), before the tests moved to a harness of their own: a worktree of it
is made for the run. Each grading (`dpmp-lab grade`, in the sandbox, from an empty gradebook,
`--submissions` copies of the assignment's solution) runs in a process of its own, with that
commit's package first on its PYTHONPATH, inside a cgroup made for it (cgroup v1's cpuacct, or
v2's cpu.stat): its CPU time is everything the grading started, the sandboxed kernels and ranks
included, which getrusage misses (they run in pid namespaces of their own). The runs alternate,
baseline first, `--rounds` times, so that a busy moment of this noisy machine does not fall on
one side only; the ratios are what to read, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpmp_lab.instructor.limits import cgroup_mounts, own_cgroups  # noqa: E402
from dpmp_lab.launcher.launch import usable_cores  # noqa: E402

BASELINE = "6b54e76"   # the grading before issue 38: tests in the learner's kernel

GRADE = """
import json, shutil, sys, time
from pathlib import Path
import dpmp_lab
from dpmp_lab.instructor import grading
name, copies, jobs, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
package = Path(sys.argv[5])
assert Path(dpmp_lab.__file__).resolve().parent == package / "dpmp_lab", dpmp_lab.__file__
shutil.copy(package / "nbgrader_config.py", root)
shutil.copytree(package / "solutions" / name, root / "solutions" / name)
for i in range(copies):
    folder = root / "submitted" / f"learner{i:03d}" / name
    folder.mkdir(parents=True)
    shutil.copy(package / "solutions" / name / f"{name}.ipynb", folder)
grading.ensure_assignment(name, root)   # not grading: done once per course
start = time.perf_counter()
summary = grading.grade_class(name, root=root, jobs=jobs, say=lambda _: None)
wall = time.perf_counter() - start
failed = [(o.student, o.reason, o.flagged) for o in summary.outcomes if not o.graded or o.flagged]
points = sorted({sum(s or 0 for s, _ in o.scores.values()) for o in summary.outcomes})
print(json.dumps({"wall_s": wall, "failed": failed, "points": points,
                  "job_s_mean": sum(o.seconds for o in summary.outcomes) / copies}))
"""


class CpuCgroup:
    """A cgroup counting the CPU time of the processes put in it and of all their children."""

    def __init__(self) -> None:
        mounts, own = cgroup_mounts(), own_cgroups()
        name = f"dpmp-bench-{uuid.uuid4().hex[:10]}"
        self.v1 = "cpuacct" in mounts
        if self.v1:
            self.folder = mounts["cpuacct"] / own.get("cpuacct", "/").lstrip("/") / name
        elif "" in mounts:
            self.folder = mounts[""] / own.get("", "/").lstrip("/") / name
        else:
            raise SystemExit("no cgroup to count CPU time in: this benchmark needs cgroup v1's "
                             "cpuacct or cgroup v2 (run it as root, or in a delegated cgroup)")
        self.folder.mkdir()

    def usage(self) -> float:
        """CPU seconds used in this cgroup so far."""
        if self.v1:
            return int((self.folder / "cpuacct.usage").read_text()) / 1e9
        stats = dict(line.split() for line in (self.folder / "cpu.stat").read_text().splitlines())
        return int(stats["usage_usec"]) / 1e6

    def run(self, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
        """(CPU seconds, stdout) of `argv` run inside this cgroup, in `cwd`."""
        enter = ("import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
                 "os.execv(sys.argv[2], sys.argv[2:])")
        before = self.usage()
        done = subprocess.run([sys.executable, "-c", enter, str(self.folder / "cgroup.procs"),
                               *argv], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=3600)
        if done.returncode:
            raise RuntimeError(f"{argv[:3]} failed:\n{done.stderr[-3000:]}")
        return self.usage() - before, done.stdout

    def remove(self) -> None:
        time.sleep(0.5)
        self.folder.rmdir()


def grade(package: Path, base: Path, label: str, args: argparse.Namespace) -> dict:
    """One grading of `args.submissions` copies with `package`'s code and files."""
    root = base / f"{label}-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": str(package)}
    group = CpuCgroup()
    try:
        # in the course root: `python -c` puts its working directory first on sys.path
        cpu, out = group.run([sys.executable, "-c", GRADE, args.assignment,
                              str(args.submissions), str(args.jobs), str(root), str(package)],
                             env, cwd=root)
    finally:
        group.remove()
        shutil.rmtree(root, ignore_errors=True)
    row = json.loads(out.strip().splitlines()[-1])
    if row["failed"]:
        raise RuntimeError(f"{label}: not every copy was graded cleanly: {row['failed']}")
    return {"label": label, "cpu_s": cpu, **row,
            "cpu_s_per_submission": cpu / args.submissions,
            "wall_s_per_submission": row["wall_s"] / args.submissions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", default="00_launch")
    parser.add_argument("--submissions", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dpmp-bench-grading-"))
    worktree = base / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(worktree),
                    args.baseline], check=True)
    rows = []
    try:
        for _ in range(args.rounds):
            rows.append(grade(worktree, base, "baseline", args))
            rows.append(grade(ROOT, base, "this", args))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                       check=False)
        shutil.rmtree(base, ignore_errors=True)

    def mean(label: str, key: str) -> float:
        picked = [r[key] for r in rows if r["label"] == label]
        return sum(picked) / len(picked)

    cpu = {label: mean(label, "cpu_s_per_submission") for label in ("baseline", "this")}
    wall = {label: mean(label, "wall_s_per_submission") for label in ("baseline", "this")}
    print(f"{args.assignment}, {args.submissions} submissions, --jobs {args.jobs}, "
          f"{args.rounds} rounds, {usable_cores()} cores; CPU from a cgroup around each grading")
    for label, name in (("baseline", f"baseline {args.baseline}"), ("this", "this checkout")):
        each = ", ".join(f"{r['cpu_s']:.0f}" for r in rows if r["label"] == label)
        print(f"  {name:>22}: {cpu[label]:5.1f} CPU-s and {wall[label]:5.1f} s wall per "
              f"submission ({each} CPU-s a grading)")
    print(f"  this / baseline: {cpu['this'] / cpu['baseline']:.2f}x the CPU, "
          f"{wall['this'] / wall['baseline']:.2f}x the wall time per submission")
    print(f"  CPU-bound, N cores grade about N x {60 / cpu['this']:.1f} submissions per minute "
          f"(e.g. 32 cores: {32 * 60 / cpu['this']:.0f}/min)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
