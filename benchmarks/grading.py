"""Grading a class in parallel: submissions per minute with --jobs 1 and --jobs 2, what the
sandbox costs per submission, and what that projects to on a many-core server.

    python benchmarks/grading.py [--assignment 00_launch] [--submissions 4] [--jobs 1 2]

A scratch course gets `--submissions` copies of the assignment's solution; `grade_class` grades
them once per --jobs value in the sandbox (the first, 1, is nbgrader's one-after-the-other
baseline), and once more with one job and without the sandbox (`--no-sandbox`), each time from
an empty gradebook, in the same run, so the ratios hold on this noisy machine where the
absolute numbers do not. The CPU time the grading processes used (getrusage of the children)
over the submissions graded says how many cores one submission keeps busy, which is what a
projection to N cores rests on.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from dpmp_lab.instructor import course, grading
from dpmp_lab.launcher.launch import usable_cores

ROOT = Path(__file__).resolve().parent.parent


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def grade_copies(base: Path, name: str, copies: int, jobs: int, sandboxed: bool = True) -> dict:
    """Grade `copies` submissions of the solution with `jobs` jobs in a fresh course root."""
    root = base / f"jobs{jobs}{'' if sandboxed else '-unsandboxed'}"
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / name, root / "solutions" / name)
    for i in range(copies):
        folder = root / "submitted" / f"learner{i:03d}" / name
        folder.mkdir(parents=True)
        shutil.copy(ROOT / "solutions" / name / f"{name}.ipynb", folder)
    grading.ensure_assignment(name, root)   # not part of grading: done once per course
    cpu, start = _children_cpu(), time.perf_counter()
    summary = grading.grade_class(name, root=root, jobs=jobs, sandboxed=sandboxed,
                                  say=lambda _: None)
    wall = time.perf_counter() - start
    if summary.failed or len(summary.outcomes) != copies:
        raise RuntimeError(f"jobs={jobs}: not every copy was graded: "
                           f"{[(o.student, o.reason) for o in summary.failed]}")
    return {"jobs": jobs, "sandboxed": sandboxed, "submissions": copies, "wall_s": wall,
            "per_minute": copies / wall * 60, "cpu_s_per_submission":
            (_children_cpu() - cpu) / copies,
            "job_s_mean": sum(o.seconds for o in summary.outcomes) / copies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", default="00_launch")
    parser.add_argument("--submissions", type=int, default=4)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    if args.assignment not in course.assignments(ROOT):
        parser.error(f"no such assignment: {args.assignment}")
    base = Path(tempfile.mkdtemp(prefix="dpmp-bench-grading-"))
    try:
        rows = [grade_copies(base, args.assignment, args.submissions, j) for j in args.jobs]
        bare = grade_copies(base, args.assignment, args.submissions, 1, sandboxed=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    first = rows[0]
    cores = usable_cores()
    print(f"{args.assignment}, {args.submissions} submissions, {cores} cores:")
    for row in rows:
        print(f"  --jobs {row['jobs']}: {row['per_minute']:.2f} submissions/min "
              f"(wall {row['wall_s']:.0f} s, {row['job_s_mean']:.0f} s per submission, "
              f"{row['cpu_s_per_submission']:.1f} CPU-s each), "
              f"{row['per_minute'] / first['per_minute']:.2f}x --jobs {first['jobs']}")
    print(f"  --jobs 1 --no-sandbox: {bare['per_minute']:.2f} submissions/min "
          f"({bare['job_s_mean']:.0f} s, {bare['cpu_s_per_submission']:.1f} CPU-s each); the "
          f"sandbox costs {first['job_s_mean'] / bare['job_s_mean']:.2f}x the time and "
          f"{first['cpu_s_per_submission'] / bare['cpu_s_per_submission']:.2f}x the CPU of "
          "grading unsandboxed")
    rows.append(bare)
    busy = first["cpu_s_per_submission"] / first["job_s_mean"]
    per_core_minute = 60 / first["cpu_s_per_submission"]
    print(f"one submission keeps {busy:.2f} cores busy on average ({first['job_s_mean']:.0f} s "
          f"wall, {first['cpu_s_per_submission']:.1f} CPU-s); CPU-bound, N cores grade at most "
          f"about N x {per_core_minute:.1f} submissions per minute "
          f"(e.g. 32 cores: {32 * per_core_minute:.0f}/min), reached with about "
          f"{1 / max(busy, 1e-9):.1f} jobs per core")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
