"""Limits for one grading job: memory, processes, disk, output and time.

A job (nbgrader, the submission's kernel, every rank it launches) is started through
`enter_command`, a few lines of Python that put the job's first process into its cgroups
and set its rlimits before it becomes nbgrader, so that everything below inherits both.

- memory and processes: a cgroup per job where this machine lets us make one (cgroup v1's
  memory and pids controllers, or a v2 tree with both enabled), else RLIMIT_AS per process
  (a bound on every process, not on their sum) and no process limit (RLIMIT_NPROC counts
  every process of the user, and not at all for root). `Cgroups.held` says which held.
- disk: every file is bounded by RLIMIT_FSIZE, and the job's writable folders are measured
  while it runs (`disk_used`); the grader stops a job past its limit.
- output: bytes per cell and per notebook, counted by the grader as they arrive (see
  nbgrader_plugin.GuardedExecute), and wall time: the grader's own clock.
- CPU time is counted, not limited: cgroup v1's cpuacct (or v2's cpu.stat) per job. (A
  learner's server on the course's hub is limited in CPU too: `Cgroups.make` with `cpus`.)

`Cgroups.hit()` reads the kernel's own counters (an OOM kill, a fork refused), so a job
stopped by a limit is reported as such, not as a mysterious dead kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpmp_lab._helpers import whole_number

MIB = 2**20
CPU_PERIOD_US = 100_000   # the kernel's default CFS period: a quota of one CPU is this much


@dataclass(frozen=True)
class Limits:
    """What one submission may use. Output limits are per cell and per notebook, in bytes of
    text and data as the kernel sent them."""

    memory_mb: int = 4096
    processes: int = 512
    disk_mb: int = 512
    cell_output_kb: int = 2048
    notebook_output_mb: int = 16

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            whole_number(f"limit {name}", value)

    def autograded_bytes(self, handed: int) -> int:
        """The most an autograded folder may hold, where `handed` is the bytes of the
        submission and of the assignment's source (nbgrader puts the hidden tests back): those,
        the notebook's output as its file spells it (a character counted once takes up to 12
        bytes there: an empty line is `"\\n",` on a line of its own, indented), and 1 MiB of
        nbgrader's metadata."""
        return handed + 12 * self.notebook_output_mb * MIB + MIB

    def describe(self) -> str:
        return (f"memory {self.memory_mb} MiB, {self.processes} processes, disk "
                f"{self.disk_mb} MiB, output {self.cell_output_kb} KiB a cell and "
                f"{self.notebook_output_mb} MiB a notebook")


# -- cgroups --------------------------------------------------------------------------------


def own_cgroups() -> dict[str, str]:
    """{controller or "" for v2: this process's cgroup path}, from /proc/self/cgroup."""
    found = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                found[c] = path
    except (OSError, ValueError):
        pass
    return found


def cgroup_mounts() -> dict[str, Path]:
    """{controller or "" for the v2 tree: where it is mounted}."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        where, kind, options = Path(parts[1]), parts[2], parts[3].split(",")
        if kind == "cgroup2":
            found.setdefault("", where)
        elif kind == "cgroup":
            for c in ("memory", "pids", "cpuacct", "cpu"):
                if c in options:
                    found.setdefault(c, where)
    return found


@dataclass
class Cgroups:
    """The cgroup folders of one job (none where the machine allows none), and which limits
    they hold."""

    folders: list[Path] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)   # "memory" -> "cgroup v1", ...
    version: int = 0
    memory_mb: int = 0

    @classmethod
    def create(cls, limits: Limits, name: str | None = None) -> Cgroups:
        """Make the job's cgroups below this process's own; what cannot be made is left to
        rlimits, and said in `held`."""
        return cls.make(name or f"dpmp-lab-{uuid.uuid4().hex[:12]}", limits.memory_mb,
                        limits.processes)

    @classmethod
    def make(cls, name: str, memory_mb: int, processes: int, cpus: float | None = None,
             ) -> Cgroups:
        """Cgroups called `name` below this process's own, holding `memory_mb` (no swap),
        `processes` and, with `cpus`, that many CPUs' time (a quota per 100 ms period); a
        folder left by an earlier one of that name is taken over. `held` says what holds."""
        own, mounts = own_cgroups(), cgroup_mounts()
        job = cls(memory_mb=memory_mb)
        quota = None if cpus is None else max(1000, round(cpus * CPU_PERIOD_US))
        if "memory" in mounts or "pids" in mounts:
            job.version = 1
            for controller, files in (
                    ("memory", {"memory.limit_in_bytes": memory_mb * MIB,
                                "memory.memsw.limit_in_bytes": memory_mb * MIB}),
                    ("pids", {"pids.max": processes}),
                    ("cpu", {} if quota is None else {"cpu.cfs_period_us": CPU_PERIOD_US,
                                                      "cpu.cfs_quota_us": quota}),
                    ("cpuacct", {})):
                if controller == "cpu" and quota is None:
                    continue
                if controller in mounts and _make(
                        mounts[controller] / own.get(controller, "/").lstrip("/") / name, files,
                        job) and controller != "cpuacct":   # cpuacct counts, limits nothing
                    job.held[controller] = "cgroup v1"
        elif "" in mounts:
            parent = mounts[""] / own.get("", "/").lstrip("/")
            enabled = set(_read(parent / "cgroup.subtree_control").split())
            files: dict[str, int | str] = {"memory.max": memory_mb * MIB, "memory.swap.max": 0,
                                           "pids.max": processes}
            if quota is not None and "cpu" in enabled:
                files["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
            if {"memory", "pids"} <= enabled and _make(parent / name, files, job):
                job.version = 2
                job.held = {"memory": "cgroup v2", "pids": "cgroup v2"}
                if "cpu.max" in files:
                    job.held["cpu"] = "cgroup v2"
        return job

    @classmethod
    def existing(cls, name: str) -> Cgroups:
        """The cgroups called `name` below this process's own that exist now (to stop what
        is in them), whoever made them."""
        own, mounts = own_cgroups(), cgroup_mounts()
        if "memory" in mounts or "pids" in mounts:   # v1 first, as make() does
            where = [mount / own.get(c, "/").lstrip("/") / name
                     for c, mount in mounts.items() if c]
        else:
            where = [mounts[""] / own.get("", "/").lstrip("/") / name] if "" in mounts else []
        return cls(folders=sorted({f for f in where if f.is_dir()}))

    def hit(self) -> str | None:
        """Which limit the kernel enforced on this job, if one: an OOM kill or a refused fork."""
        for folder in self.folders:
            if self.version == 2:
                events = _counters(folder / "memory.events")
                if events.get("oom_kill", 0) > 0:
                    return f"it used more than its memory limit of {self.memory_mb} MiB"
            elif (folder / "memory.oom_control").exists():
                if _counters(folder / "memory.oom_control").get("oom_kill", 0) > 0:
                    return f"it used more than its memory limit of {self.memory_mb} MiB"
            if _counters(folder / "pids.events").get("max", 0) > 0:
                return (f"it started more than its limit of {_read(folder / 'pids.max').strip()} "
                        "processes at once")
        return None

    def peak(self) -> dict[str, int]:
        """The most the job used so far, where the machine counts it: memory in MiB, tasks
        (processes and their threads, as the pids controller counts them), and the CPU time of
        all its processes in milliseconds (sandboxed ones included, which getrusage misses)."""
        out = {}
        for folder in self.folders:
            for name, key, scale in (("memory.max_usage_in_bytes", "memory_mb", MIB),
                                     ("memory.peak", "memory_mb", MIB),
                                     ("pids.peak", "tasks", 1),
                                     ("cpuacct.usage", "cpu_ms", 10**6)):
                text = _read(folder / name).strip()
                if text.isdigit():
                    out[key] = int(text) // scale
            used = _counters(folder / "cpu.stat").get("usage_usec")
            if used is not None:
                out["cpu_ms"] = used // 1000
        return out

    def kill_all(self) -> None:
        """SIGKILL every process still in the job's cgroups, then remove them."""
        for folder in self.folders:
            for _ in range(50):
                pids = [int(p) for p in _read(folder / "cgroup.procs").split()]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                time.sleep(0.02)
            try:
                folder.rmdir()
            except OSError:
                pass

    def procs_files(self) -> list[str]:
        return [str(f / "cgroup.procs") for f in self.folders]


def _make(folder: Path, files: dict[str, int | str], job: Cgroups) -> bool:
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return False
    try:
        for name, value in files.items():
            if (folder / name).exists():
                (folder / name).write_text(str(value))
    except OSError:
        with contextlib.suppress(OSError):
            folder.rmdir()
        return False
    job.folders.append(folder)
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counters(path: Path) -> dict[str, int]:
    out = {}
    for line in _read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


# -- rlimits and the job's first process ----------------------------------------------------


def rlimits(limits: Limits, cgroups: Cgroups) -> dict[str, int]:
    """The rlimits a job starts with: files no bigger than its disk, no core dumps, and where
    no memory cgroup holds, address space per process."""
    # a file may grow just past the disk limit, so that the grader sees it was hit
    out = {"RLIMIT_FSIZE": (limits.disk_mb + 1) * MIB, "RLIMIT_CORE": 0}
    if "memory" not in cgroups.held:
        # torch reserves address space well beyond what it touches: the bound is generous
        out["RLIMIT_AS"] = max(limits.memory_mb, 4096) * MIB * 2
    return out


ENTER = """
import json, os, resource, sys
spec = json.loads(sys.argv[1])
for path in spec["cgroups"]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
for name, value in spec["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
os.execv(sys.argv[2], sys.argv[2:])
"""


def enter_command(command: list[str], limits: Limits, cgroups: Cgroups) -> list[str]:
    """`command`, started as a process that first joins the job's cgroups and sets its
    rlimits (a process cannot be moved into a cgroup safely from a threaded parent before it
    runs, and preexec_fn is unsafe with threads)."""
    spec = {"cgroups": cgroups.procs_files(), "rlimits": rlimits(limits, cgroups)}
    return [sys.executable, "-I", "-S", "-c", ENTER, json.dumps(spec), *command]


def held_text(limits: Limits, cgroups: Cgroups) -> str:
    """'memory: cgroup v1; processes: cgroup v1; disk: RLIMIT_FSIZE and measured; ...'."""
    memory = cgroups.held.get("memory") or "RLIMIT_AS per process (no memory cgroup here)"
    procs = cgroups.held.get("pids") or "not limited (no pids cgroup here)"
    return (f"memory: {memory}; processes: {procs}; disk: RLIMIT_FSIZE per file and the "
            "job's folders measured; output and time: counted by the grader")


def disk_used(folders: list[Path], max_entries: int = 20000) -> tuple[int, int]:
    """(bytes allocated, entries) under `folders`, stopping once past max_entries."""
    total = entries = 0
    stack = [str(f) for f in folders]
    while stack and entries <= max_entries:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    if entries > max_entries:
                        break
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return total, entries


__all__ = ["Cgroups", "Limits", "cgroup_mounts", "disk_used", "enter_command", "held_text",
           "own_cgroups", "rlimits"]
