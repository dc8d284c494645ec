"""One submission graded in a scratch course root of its own: its nbgrader runs, the time
limit, killing what outlives it, and the scores it gave. `grading.grade_class` runs many of
these at once and alone records their outcomes in the course's gradebook.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

from dpmp_lab.course import COURSE_ID, gradebook_url

PACKAGE_HOME = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
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


def open_gradebook(url: str) -> Gradebook:
    """nbgrader's Gradebook at `url`, for use in a with-statement. nbgrader runs its helper
    `alembic` by name when it opens a database, so this Python's scripts go on PATH."""
    here = os.path.dirname(sys.executable)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    return Gradebook(url, COURSE_ID)


def fingerprint(folder: Path, source: Path) -> str:
    """A hash of every file of a submission and of the assignment's source: what a grade was
    computed from. Either changing means the grade may change."""
    h = hashlib.sha256()
    for top in (folder, source):
        for path in sorted(p for p in top.rglob("*") if p.is_file()):
            if ".ipynb_checkpoints" in path.parts:
                continue
            h.update(str(path.relative_to(top)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children first found first."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        for child in parents.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a job's process and everything under it: the kernel runs in a session of its own
    (jupyter_client starts it so) and the ranks below it, so a process group is not enough."""
    for _ in range(2):   # a second sweep catches what was being started during the first
        for pid in [*_descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait()


def _last_error(log: str) -> str:
    """The last 'SomethingError: message' line of nbgrader's log, else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", line)]
    return (errors or lines or ["no output"])[-1][:300]


def _run(args: list[str], cwd: Path, deadline: float,
         live: set[subprocess.Popen]) -> tuple[int | None, str]:
    """`nbgrader args` in cwd until the deadline: (exit code or None if killed, its log).
    While it runs it is in `live`, so that an interrupted grade_class can kill it."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # nbgrader_config.py and the kernel import dpmp_lab: from this checkout, wherever cwd is
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_HOME), env.get("PYTHONPATH"))
                                        if p)
    log = cwd / "nbgrader.log"
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        live.add(proc)
        try:
            code: int | None = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            code = None
        finally:
            live.discard(proc)
    return code, log.read_text(errors="replace")


def _scratch_root(root: Path, name: str, student: str, folder: Path, gradebook: Path,
                  base: Path) -> Path:
    scratch = Path(tempfile.mkdtemp(prefix=f"{student[:40]}-", dir=base))
    shutil.copy(root / "nbgrader_config.py", scratch)
    shutil.copy(gradebook, scratch / "gradebook.db")
    (scratch / "solutions").mkdir()
    (scratch / "solutions" / name).symlink_to(root / "solutions" / name)
    shutil.copytree(folder, scratch / "submitted" / student / name)   # keeps the file times
    return scratch


def grade_one(name: str, student: str, folder: Path, *, root: Path, gradebook: Path,
              base: Path, timeout: float, cell_timeout: int | None = None,
              live: set[subprocess.Popen] | None = None) -> Outcome:
    """Autograde one submission and write its feedback, in a scratch course root, within
    `timeout` seconds in all. Never raises for the submission's own trouble: says it."""
    start = time.monotonic()
    fp = fingerprint(folder, root / "solutions" / name)
    scratch = _scratch_root(root, name, student, folder, gradebook, base)
    extra = [f"--Execute.timeout={cell_timeout}"] if cell_timeout else []
    deadline = start + timeout
    live = set() if live is None else live
    outcome = Outcome(student, fp, graded=False, scratch=scratch)
    code, log = _run(["autograde", name, "--create", f"--student={student}", *extra],
                     scratch, deadline, live)
    if code == 0:
        code, log = _run(["generate_feedback", name, f"--student={student}", "--force"],
                         scratch, deadline, live)
    outcome.seconds = time.monotonic() - start
    if code is None:
        outcome.reason = (f"stopped after the time limit of {timeout:g} s (a cell that never "
                          "finishes?); its kernel and ranks were killed")
    elif code:
        outcome.reason = f"nbgrader could not grade it: {_last_error(log)}"
    elif not (scratch / "autograded" / student / name).is_dir():
        outcome.reason = f"nbgrader wrote no graded notebook: {_last_error(log)}"
    else:
        outcome.graded = True
    _read_scores(scratch, name, student, outcome)
    return outcome


def _read_scores(scratch: Path, name: str, student: str, outcome: Outcome) -> None:
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


__all__ = ["Outcome", "fingerprint", "grade_one", "kill_tree", "open_gradebook"]
