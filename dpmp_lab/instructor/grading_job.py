"""One submission graded in a scratch course root of its own: its nbgrader runs, the time
limit, killing what outlives it, and the scores it gave. `grading.grade_class` runs many of
these at once and alone records their outcomes in the course's gradebook.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import parse_utc

from dpmp_lab._helpers import PACKAGE_HOME
from dpmp_lab.instructor import submitted
from dpmp_lab.instructor.course import COURSE_ID, gradebook_url
from dpmp_lab.instructor.limits import MIB, Cgroups, Limits, disk_used, enter_command
from dpmp_lab.instructor.nbgrader_steps import Step, command
from dpmp_lab.instructor.submitted import TIMESTAMP, NotData
from dpmp_lab.launcher import processes

REPORT = "dpmp-report.json"   # what GuardedExecute found, in the job's scratch course
MAX_FILES = 20000             # files a submission may make (or hold) before its job is stopped
LOG_TAIL = 64 * 1024          # bytes of nbgrader's log read back: its last error is at the end


@dataclass
class Graded:
    """What grading one submission gave: nbgrader's scores per (notebook, graded cell), or why
    there are none. Plain data, so the parent can record it in any order."""

    student: str
    fingerprint: str
    graded: bool
    reason: str = ""                     # why not graded (time limit, nbgrader's error)
    seconds: float = 0.0
    timestamp: datetime | None = None
    scores: dict[tuple[str, str], tuple[float | None, bool]] = field(default_factory=dict)
    comments: dict[tuple[str, str], str | None] = field(default_factory=dict)
    penalties: dict[str, float] = field(default_factory=dict)
    scratch: Path | None = None          # the job's course root: autograded/ and feedback/
    flagged: list[str] = field(default_factory=list)   # why it needs the instructor's eyes
    peak: dict[str, int] = field(default_factory=dict)  # memory_mb, tasks: the most it used
    size: int = 0                        # bytes of the submission's files, as graded


def open_gradebook(url: str) -> Gradebook:
    """nbgrader's Gradebook at `url`, for use in a with-statement. nbgrader runs its helper
    `alembic` by name when it opens a database, so this Python's scripts go on PATH."""
    here = os.path.dirname(sys.executable)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    return Gradebook(url, COURSE_ID)


def fingerprint(folder: Path, source: Path, limits: Limits | None = None) -> str:
    """A hash of every file of a submission and of the assignment's source: what a grade was
    computed from. Either changing means the grade may change. Read as data (no link
    followed), at most the disk limit of bytes from each: a submission bigger than that is
    not graded whatever the bytes past it."""
    h = hashlib.sha256()
    for top in (folder, source):
        submitted.digest(top, h, max_bytes=(limits or Limits()).disk_mb * MIB + 1)
        h.update(b"\0\0")
    return h.hexdigest()


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a job's process and everything under it: the kernel runs in a session of its own
    (jupyter_client starts it so) and the ranks below it, so a process group is not enough."""
    processes.kill_tree(proc.pid)
    proc.wait()


@dataclass(eq=False)
class Running:
    """One job's nbgrader process and its cgroups, while it runs: what an interrupted
    grade_class kills."""

    proc: subprocess.Popen
    cgroups: Cgroups

    def kill(self) -> None:
        kill_tree(self.proc)
        self.cgroups.kill_all()


class LiveJobs:
    """The nbgrader runs in flight: added and removed by the grading threads, killed all at
    once by the parent when grading is interrupted (a lock, since both sides change it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: set[Running] = set()

    def add(self, job: Running) -> None:
        with self._lock:
            self._jobs.add(job)

    def discard(self, job: Running) -> None:
        with self._lock:
            self._jobs.discard(job)

    def kill_all(self) -> bool:
        """Kill every run in flight; whether there was one."""
        with self._lock:
            jobs, self._jobs = self._jobs, set()
        for job in jobs:
            job.kill()
        return bool(jobs)


# launcher.launch.AUDIT_ENV (that module loads torch, which a job's own process never does;
# tests/end_to_end/grading_trust.py holds the two equal)
AUDIT_ENV = "DPMP_LAB_DEVICE_AUDIT"


@dataclass(frozen=True)
class Settings:
    """What every job of one grading run shares."""

    root: Path                # the course root
    gradebook: Path           # the snapshot every job starts from (no learner in it)
    base: Path                # the run's scratch folder, where every job has its own
    timeout: float            # seconds one submission may take in all
    cell_timeout: int | None = None
    sandbox: bool = True
    limits: Limits = field(default_factory=Limits)
    run_id: str = ""          # in every job process's environment: DPMP_LAB_GRADING_RUN
    device_audit: bool = False  # every launch of a job under the device audit (AUDIT_ENV)


def _last_error(log: str) -> str:
    """The last 'SomethingError: message' line of nbgrader's log, else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", line)]
    return (errors or lines or ["no output"])[-1][:300]


def _run(steps: list[Step], scratch: Path, deadline: float, settings: Settings,
         cgroups: Cgroups, watched: list[Path], live: LiveJobs) -> tuple[int | None, str, str]:
    """The nbgrader commands `steps`, in one process in the scratch course, until they end,
    the deadline passes or a limit is hit: (exit code or None if stopped, the log, why it was
    stopped). While it runs it is in `live`, so that an interrupted grade_class can kill it."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # nbgrader_config.py and the kernel import dpmp_lab: from this checkout, wherever cwd is
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_HOME), env.get("PYTHONPATH"))
                                        if p)
    env["DPMP_LAB_GRADING_RUN"] = settings.run_id
    if settings.device_audit:
        env[AUDIT_ENV] = "1"
    log = scratch / "nbgrader.log"
    argv = enter_command(command(steps), settings.limits, cgroups)
    stopped, disk_at = "", 0.0
    with open(log, "a") as out:
        proc = subprocess.Popen(argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        running = Running(proc, cgroups)
        live.add(running)
        try:
            while (code := _wait(proc, 0.25)) is None:
                if time.monotonic() >= deadline:
                    stopped = "time"
                elif time.monotonic() >= disk_at:
                    disk_at = time.monotonic() + 1.0
                    stopped = _disk_over(watched, settings.limits)
                stopped = stopped or cgroups.hit() or ""
                if stopped:
                    running.kill()
                    break
        finally:
            live.discard(running)
    return (None if stopped else code), _tail(log, LOG_TAIL), stopped


def _tail(path: Path, size: int) -> str:
    """The last `size` bytes of a file as text (the kernel's output may be any bytes)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - size))
        return f.read(size).decode("utf-8", errors="replace")


def _wait(proc: subprocess.Popen, seconds: float) -> int | None:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def _disk_over(folders: list[Path], limits: Limits) -> str:
    used, entries = disk_used(folders, MAX_FILES)
    if entries > MAX_FILES:
        return f"it made more than {MAX_FILES} files"
    if used > limits.disk_mb * 2**20:
        return f"it wrote more than its disk limit of {limits.disk_mb} MiB"
    return ""


def _scratch_root(name: str, student: str, folder: Path, settings: Settings) -> Path:
    """A course root of the job's own, made of copies: the course's configuration (and this
    job's settings), the assignment's source, the gradebook snapshot, the submission, copied
    as data (NotData: it holds what `_accepted` refused, or its timestamp is unreadable)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{student[:40]}-", dir=settings.base))
    try:
        shutil.copy(settings.gradebook, scratch / "gradebook.db")
        shutil.copytree(settings.root / "solutions" / name, scratch / "solutions" / name)
        (scratch / "submitted" / student).mkdir(parents=True)
        copy = scratch / "submitted" / student / name
        submitted.copy_tree(folder, copy, max_bytes=settings.limits.disk_mb * MIB,
                            max_files=MAX_FILES)   # keeps the file times
        _check_timestamp(copy)   # the copy: what nbgrader reads, and no learner changes
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch


def _check_timestamp(folder: Path) -> None:
    """NotData where the submission's timestamp.txt is one nbgrader's autograde cannot read
    (it would stop on it). Not replaced: a made-up time would decide the late penalty."""
    data = submitted.read_small(folder, TIMESTAMP)
    if data is None or not data.strip():
        return   # none: nbgrader grades it as on time, as a submission placed by hand
    try:
        parse_utc(data.decode("utf-8").strip())
    except Exception as exc:   # dateutil raises more than ValueError on what a learner wrote
        raise NotData(f"{TIMESTAMP} holds no time nbgrader can read ({type(exc).__name__}): "
                      "hand in again through nbgrader (or the instructor removes it, which "
                      "grades it as on time)") from exc


def _job_config(settings: Settings, scratch: Path, sockets: str, harness: str) -> str:
    """The course's nbgrader_config.py, then what this job adds (dpmp_lab.instructor.nbgrader_plugin)."""
    job = {"sandbox": settings.sandbox, "report_path": str(scratch / REPORT),
           "cell_output_bytes": settings.limits.cell_output_kb * 1024,
           "notebook_output_bytes": settings.limits.notebook_output_mb * 2**20,
           "job_dir": str(scratch / "sandbox"), "socket_dir": sockets, "harness_dir": harness,
           "hidden": [str(settings.root), str(settings.base)]}
    return ((settings.root / "nbgrader_config.py").read_text()
            + "\n\n# -- added by `dpmp-lab grade` for this one job\n"
            + "from dpmp_lab.instructor.nbgrader_plugin import configure as _dpmp_configure  # noqa\n"
            + f"_dpmp_configure(c, {job!r})\n")


def _misnamed(folder: Path, name: str) -> str:
    """Why a submission holds no `name`.ipynb, or "" (nbgrader would only say that the
    assignment may not have been released)."""
    if (folder / f"{name}.ipynb").is_file():
        return ""
    found = sorted(p.name for p in folder.glob("*.ipynb"))
    return (f"expected {name}.ipynb in the submission, found "
            + (", ".join(found) if found else "no notebook")
            + ": nbgrader grades only the notebook under its released name (renamed back, "
            "it can be graded)")


def _accepted(name: str, folder: Path, limits: Limits) -> int:
    """The bytes of the submission `folder`, checked as data before anything reads a file of
    it; NotData says why it cannot be graded."""
    size = submitted.check(folder, max_files=MAX_FILES)
    misnamed = _misnamed(folder, name)
    if misnamed:
        raise NotData(misnamed)
    if size > limits.disk_mb * MIB:
        raise NotData(f"the submission is {size / MIB:.0f} MiB, over the disk limit of "
                      f"{limits.disk_mb} MiB")
    return size


def grade_one(name: str, student: str, folder: Path, *, settings: Settings,
              live: LiveJobs | None = None) -> Graded:
    """Autograde one submission and write its feedback, in a scratch course root and (unless
    settings say otherwise) in the sandbox, within the time and limits of `settings`. Never
    raises for the submission's own trouble: says it."""
    start = time.monotonic()
    fp = fingerprint(folder, settings.root / "solutions" / name, settings.limits)
    live = LiveJobs() if live is None else live
    try:
        size = _accepted(name, folder, settings.limits)
        scratch = _scratch_root(name, student, folder, settings)
    except NotData as why:
        return Graded(student, fp, graded=False, reason=str(why))
    sockets = tempfile.mkdtemp(prefix="dpk-")   # short: unix socket paths are ~107 bytes
    harness = tempfile.mkdtemp(prefix="dph-")   # the harness's, as short
    (scratch / "nbgrader_config.py").write_text(_job_config(settings, scratch, sockets, harness))
    cgroups = Cgroups.create(settings.limits)
    outcome = Graded(student, fp, graded=False, scratch=scratch, size=size)
    watched = [scratch / "sandbox", Path(sockets), Path(harness)]
    extra = [f"--Execute.timeout={settings.cell_timeout}"] if settings.cell_timeout else []
    deadline = start + settings.timeout
    try:
        # feedback only after an autograde that succeeded (a limit hit makes it fail)
        steps = [Step(("autograde", name, "--create", f"--student={student}", *extra)),
                 Step(("generate_feedback", name, f"--student={student}", "--force"))]
        code, log, stopped = _run(steps, scratch, deadline, settings, cgroups, watched, live)
        report = _report(scratch)
        stopped = stopped or cgroups.hit() or ""   # a kernel the OOM killer ended, say
        outcome.peak = cgroups.peak()
    finally:
        cgroups.kill_all()
        shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(harness, ignore_errors=True)
        shutil.rmtree(scratch / "sandbox", ignore_errors=True)
    outcome.seconds = time.monotonic() - start
    outcome.flagged = list(report.get("forgery") or [])
    if stopped == "time":
        outcome.reason = (f"stopped after the time limit of {settings.timeout:g} s (a cell "
                          "that never finishes?); its kernel and ranks were killed")
    elif stopped or report.get("limit"):
        outcome.reason = f"stopped: {stopped or report['limit']}"
    elif code:
        outcome.reason = f"nbgrader could not grade it: {_last_error(log)}"
    elif not (scratch / "autograded" / student / name).is_dir():
        outcome.reason = f"nbgrader wrote no graded notebook: {_last_error(log)}"
    elif not report:
        outcome.reason = ("the guarded execution step never ran (nbgrader_config.py must not "
                          "replace dpmp_lab's autograde preprocessors)")
    else:
        outcome.graded = True
    _read_scores(scratch, name, student, outcome)
    return outcome


def _report(scratch: Path) -> dict:
    """What GuardedExecute found (nbgrader_plugin), or {} when it never wrote."""
    try:
        return json.loads((scratch / REPORT).read_text())
    except (OSError, ValueError):
        return {}


def _read_scores(scratch: Path, name: str, student: str, outcome: Graded) -> None:
    try:
        with open_gradebook(gradebook_url(scratch)) as gb:
            sub = gb.find_submission(name, student)
            outcome.timestamp = sub.timestamp
            for nb in sub.notebooks:
                outcome.penalties[nb.name] = nb.late_submission_penalty or 0.0
                for g in nb.grades:
                    outcome.scores[(nb.name, g.name)] = (g.auto_score, g.needs_manual_grade)
                for c in nb.comments:
                    outcome.comments[(nb.name, c.name)] = c.auto_comment
    except MissingEntry:
        pass   # nbgrader failed before recording the submission: zeros are recorded for it


__all__ = ["AUDIT_ENV", "Graded", "Running", "Settings", "fingerprint", "grade_one", "kill_tree",
           "open_gradebook"]
