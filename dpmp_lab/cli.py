"""The `dpmp-lab` command: `doctor` checks this machine, `lab` opens the course in JupyterLab,
`release` regenerates course/ from solutions/, `grade` autogrades submissions (nbgrader)."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path


def _all_reduce_check(expected: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    if not torch.allclose(t, torch.full((4,), expected)):
        raise AssertionError(f"all_reduce gave {t.tolist()}, expected {expected} everywhere")
    return float(t[0])


def doctor(args: argparse.Namespace) -> int:
    """Print what this machine offers for the course and prove a 2-rank launch works."""
    import torch
    import torch.distributed as dist

    import dpmp_lab
    from dpmp_lab.launch import _cores, visible_gpus

    print(f"dpmp_lab    {dpmp_lab.__version__} ({Path(dpmp_lab.__file__).parent})")
    print(f"python      {platform.python_version()} ({sys.executable})")
    print(f"torch       {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    backends = [b for b, ok in (("gloo", dist.is_gloo_available()),
                                ("nccl", dist.is_nccl_available()),
                                ("mpi", dist.is_mpi_available())) if ok]
    print(f"backends    {', '.join(backends) or 'none'}")
    print(f"GPUs        {visible_gpus()} visible")
    print(f"CPU cores   {_cores()}")
    n = args.world_size
    print(f"launching   {n} ranks: one all_reduce ...", flush=True)
    try:
        res = dpmp_lab.launch(_all_reduce_check, float(n * (n + 1) / 2), world_size=n,
                              backend=args.backend, timeout=args.timeout, stream=False)
    except Exception as exc:  # the doctor's job is to say what went wrong, whatever it was
        print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"            ok on {res.backend} in {res.wall_time:.2f} s: {res.values}")
    return 0


def course_dir() -> Path:
    """The course/ folder of the checkout this package was installed from, else the cwd."""
    here = Path(__file__).resolve().parent.parent / "course"
    return here if here.is_dir() else Path.cwd()


def lab(args: argparse.Namespace) -> int:
    """Start JupyterLab on the course (replaces this process)."""
    directory = Path(args.dir) if args.dir else course_dir()
    argv = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={directory}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args.extra:
        argv.append("--allow-root")  # containers and cloud GPU boxes often run as root
    argv += args.extra
    print(f"starting JupyterLab on {directory}", flush=True)
    os.execv(sys.executable, argv)
    return 0  # not reached


def release(args: argparse.Namespace) -> int:
    """Regenerate the learners' notebooks in course/ from the instructor's in solutions/."""
    from dpmp_lab import course

    for name in course.release(args.names or None):
        print(f"course/{name} regenerated from solutions/{name}")
    return 0


def grade(args: argparse.Namespace) -> int:
    """Autograde submitted/*/<assignment> and write feedback/ (nbgrader)."""
    from dpmp_lab import course

    course.grade(args.assignment)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpmp-lab", description=__doc__,
        epilog="dpmp-lab lab passes any other option to `jupyter lab` (e.g. --no-browser).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("doctor", help="check torch, backends and a 2-rank launch")
    p.add_argument("-n", "--world-size", type=int, default=2)
    p.add_argument("--backend", default="auto")
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(func=doctor)
    p = sub.add_parser("lab", help="open the course in JupyterLab")
    p.add_argument("--dir", default=None, help="folder to open (default: the course)")
    p.set_defaults(func=lab)
    p = sub.add_parser("release", help="regenerate course/ from solutions/ (nbgrader)")
    p.add_argument("names", nargs="*", help="assignments (default: all)")
    p.set_defaults(func=release)
    p = sub.add_parser("grade", help="autograde submitted/*/ASSIGNMENT, write feedback/")
    p.add_argument("assignment")
    p.set_defaults(func=grade)
    args, extra = parser.parse_known_args(argv)
    if extra and args.func is not lab:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
