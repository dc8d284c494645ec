"""How many CPU cores this process may use: what a launch's ranks share, and how many grading
jobs a class gets by default.

The CPU affinity says which cores the process may run on; a container's CPU quota (a cgroup's
`cpu.max`, or `cpu.cfs_quota_us` / `cpu.cfs_period_us` on cgroup v1) says how much of them it
gets, and the affinity does not see it: a container given 4 CPUs of a 64-core server has an
affinity of 64. `DPMP_LAB_CORES` overrides both (an instructor sharing a server between
learners says how many each one's ranks should assume).

Imports nothing from dpmp_lab but `_()`, for the words of its one error.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from dpmp_lab.i18n.messages import _

__all__ = ["CORES_ENV", "cgroup_cpu_limit", "usable_cores"]

CORES_ENV = "DPMP_LAB_CORES"
_CGROUP_FS = Path("/sys/fs/cgroup")


def _quota_v2(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _quota_v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def _ancestors(base: Path, path: str) -> list[Path]:
    """`base`/path and each folder above it up to `base`: a parent's quota limits too."""
    parts = [p for p in path.split("/") if p]
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_cpu_limit(proc_cgroup: str | None = None, fs: Path = _CGROUP_FS) -> float | None:
    """CPUs this process's cgroups allow (the smallest quota / period on its path), or None
    where no quota is set or none can be read. `proc_cgroup`: the text of /proc/self/cgroup."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    limits = []
    for line in proc_cgroup.splitlines():
        _hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":                       # cgroup v2: one unified hierarchy
            limits += [q for f in _ancestors(fs, path) if (q := _quota_v2(f)) is not None]
        elif "cpu" in controllers.split(","):       # cgroup v1: the cpu controller's own
            for mount in (fs / controllers, fs / "cpu", fs / "cpu,cpuacct"):
                limits += [q for f in _ancestors(mount, path) if (q := _quota_v1(f)) is not None]
    return min(limits) if limits else None


def usable_cores(proc_cgroup: str | None = None, fs: Path = _CGROUP_FS) -> int:
    """Cores this process may use: DPMP_LAB_CORES if set, else its affinity capped by its
    cgroups' CPU quota (rounded up: 1.5 CPUs keep 2 threads busy part of the time); the
    arguments as cgroup_cpu_limit's."""
    if os.environ.get(CORES_ENV, "").strip():
        text = os.environ[CORES_ENV].strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(_("{name}={text!r}: give a whole number of cores, 1 or more").format(
                name=CORES_ENV, text=text))
        return int(text)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(proc_cgroup, fs)
    return max(1, min(cores, math.ceil(quota))) if quota else cores
