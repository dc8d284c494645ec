"""Grading a class in parallel: `dpmp-lab grade NAME --jobs N`.

nbgrader keeps one sqlite gradebook, and `nbgrader autograde` processes sharing it would rely
on sqlite's file lock: a writer waits at most its busy timeout (5 s in Python's sqlite3) and
then fails with "database is locked", which a long autograde commit under load can exceed; and
two autogrades of one assignment without --student grade the same students into the same
autograded/ folders. (The "two autogrades at once" failure seen in
tests/end_to_end/test_course.py was another thing: ast.parse in several threads of one CPython
3.11 process. Jobs here are processes.) So no job here touches the course's gradebook: each
submission is autograded (and its feedback written) by its own nbgrader process, in a scratch
course root of its own, with a copy of the gradebook taken before any job started, its own
kernel and its own rank processes.
The parent alone, in one thread, writes each result into the course's gradebook as it arrives
(`record`), and copies the autograded notebook and feedback into place. A result replaces
whatever the gradebook held for that student, so the gradebook ends the same whatever order
the jobs finish in: no grade lost, none doubled.

A job that outlives its time limit is killed with every process under it (nbgrader, kernel,
ranks); one whose nbgrader fails (the kernel died) is recorded with zero points on every graded
cell and flagged for manual grading, and the summary says why. A submission graded before and
unchanged since (same files, same assignment source) is skipped unless `force`.
One job (grading_job.py) never writes outside its scratch root; this module is the other half
of that protocol: the one writer. A failure while keeping one result (`_keep`: the gradebook,
its folders, the state file) costs that learner alone, who is graded again on the next run.
Why it stays whole: it is everything that writes into the course root, and the steps kept for
one result, undone together when one fails, read best side by side.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.exc import SAWarning

from dpmp_lab._helpers import whole_number
from dpmp_lab.instructor import sandbox, submitted
from dpmp_lab.instructor.course import (
    assignments,
    gradebook_url,
    nbgrader,
    no_such_assignment,
    open_to_others,
    repo_root,
)
from dpmp_lab.instructor.grading_job import (
    MAX_FILES,
    Graded,
    LiveJobs,
    Settings,
    fingerprint,
    grade_one,
    open_gradebook,
)
from dpmp_lab.instructor.limits import MIB, Cgroups, Limits, held_text
from dpmp_lab.instructor.submitted import SECRET, TIMESTAMP, NotData
from dpmp_lab.launcher.cores import usable_cores
from dpmp_lab.launcher.nvidia import nvidia_smi

STATE = ".dpmp_grading"        # {assignment}.json: what was graded, from which files
UNSANDBOXED = ("WARNING: grading WITHOUT the sandbox (--no-sandbox): every submission's code "
               "runs as this user, able to read and change the gradebook, solutions/, "
               "nbgrader_config.py and other learners' work, and to leave processes behind. "
               "Grade this way only submissions you trust.")


@dataclass
class Summary:
    """What `grade_class` did: the outcomes of the submissions it graded, and who it skipped."""

    assignment: str
    outcomes: list[Graded]
    skipped: list[str]
    seconds: float
    run_id: str = ""          # DPMP_LAB_GRADING_RUN in every process of this run's jobs
    sandboxed: bool = True
    limits_held: str = ""     # which mechanism held each limit on this machine

    @property
    def failed(self) -> list[Graded]:
        return [o for o in self.outcomes if not o.graded]


def submissions(name: str, root: Path) -> dict[str, Path]:
    """{student: submitted/<student>/<name>} for every student who submitted `name`."""
    base = root / "submitted"
    if not base.is_dir():
        return {}
    return {p.parent.name: p for p in sorted(base.glob(f"*/{name}")) if p.is_dir()}


def default_jobs(n_submissions: int) -> int:
    """The cores this process may use, at most one job per submission."""
    return max(1, min(usable_cores(), n_submissions))


# -- the parent: the course's gradebook, one writer ------------------------------------------------


def record(gb: Gradebook, name: str, outcome: Graded) -> tuple[float, float]:
    """Write one outcome into the course's gradebook, replacing what it held for the student.
    A submission that could not be graded, or that was flagged (a forgery suspected), gets
    zero on every graded cell, flagged for manual grading, so it is neither lost nor given
    points it did not earn. Manual scores given earlier stay (only the automatic ones are
    written). Returns what the gradebook now holds: (points, late penalty)."""
    gb.update_or_create_student(outcome.student)
    kwargs = {"timestamp": outcome.timestamp} if outcome.timestamp else {}
    with warnings.catch_warnings():   # nbgrader's own autograde warns the same, harmlessly
        warnings.filterwarnings("ignore", category=SAWarning)
        sub = gb.update_or_create_submission(name, outcome.student, **kwargs)
    trusted = outcome.graded and not outcome.flagged
    for nb in sub.notebooks:
        nb.late_submission_penalty = outcome.penalties.get(nb.name) if outcome.graded else None
        for g in nb.grades:
            if trusted:
                g.auto_score, g.needs_manual_grade = outcome.scores[(nb.name, g.name)]
            else:
                g.auto_score, g.needs_manual_grade = 0.0, True
        for c in nb.comments:
            c.auto_comment = outcome.comments.get((nb.name, c.name)) if outcome.graded else None
    gb.db.commit()
    return sub.score, sub.late_submission_penalty or 0.0


def _install(root: Path, name: str, outcome: Graded, limits: Limits | None = None) -> None:
    """Put the job's autograded notebook and feedback in the course's folders (or remove
    stale ones, when this grading failed). Feedback is the graded notebooks' HTML pages and the
    two files `nbgrader release_feedback` reads (feedback_receipt), nothing else: nbgrader
    would also copy every file of the graded folder, learner-made or not. The autograded folder is
    copied as data, within what its submission and the output limit allow (NotData: it is
    bigger)."""
    for kind in ("autograded", "feedback"):
        dest = root / kind / outcome.student / name
        earlier = {f: text for f in (TIMESTAMP, SECRET)
                   if (text := submitted.small_text(dest, f)) is not None}
        if dest.exists():
            shutil.rmtree(dest)
        made = outcome.scratch / kind / outcome.student / name if outcome.scratch else None
        if outcome.graded and made and made.is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
            if kind == "autograded":
                _install_autograded(made, dest, outcome, root / "solutions" / name,
                                    limits or Limits())
                continue
            dest.mkdir()
            # the pages nbgrader wrote for the graded notebooks, never a learner's own .html
            # (nbgrader copies every file of the submission into feedback/, and
            # release_feedback would hand it out, to be opened in a browser)
            for notebook in sorted({nb for nb, _ in outcome.scores}):
                page = made / f"{notebook}.html"
                if page.is_file() and not page.is_symlink():
                    shutil.copy(page, dest / page.name)
            handed = root / "submitted" / outcome.student / name
            for file, text in feedback_receipt(handed, outcome.timestamp, earlier).items():
                (dest / file).write_text(text)


def _install_autograded(made: Path, dest: Path, outcome: Graded, source: Path,
                        limits: Limits) -> None:
    bound = limits.autograded_bytes(outcome.size + sum(
        p.stat().st_size for p in source.rglob("*") if p.is_file()))
    size = submitted.check(made, max_files=MAX_FILES)
    if size > bound:
        raise NotData(f"its autograded notebook is {size / MIB:.1f} MiB, more than its "
                      f"submission and the notebook output limit allow ({bound / MIB:.1f} MiB)")
    submitted.copy_tree(made, dest, max_bytes=bound, max_files=MAX_FILES)


def feedback_receipt(folder: Path, when: datetime | None,
                     earlier: dict[str, str] | None = None) -> dict[str, str]:
    """{timestamp.txt: ..., submission_secret.txt: ...} for a feedback folder: `nbgrader
    release_feedback` reads both there and stops at the first folder without them (or with
    a file that is not UTF-8). `nbgrader collect` puts them in the submission; a submission
    placed by hand has neither, so its time is the one graded (the gradebook's, else now)
    and its secret a new one, kept from an earlier grading (`earlier`): its page is released
    under a name no Assignment List asks for, since the learner never submitted through the
    exchange. A learner's file that is not what nbgrader writes (a link, too big, not UTF-8)
    is read as absent: a time is then the one graded, a secret a new one (so that learner
    alone misses the page)."""
    made = {TIMESTAMP: f"{when or datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S.%f} UTC",
            SECRET: secrets.token_hex(64)}
    handed = {f: submitted.small_text(folder, f) for f in (TIMESTAMP, SECRET)}
    return {file: handed[file] if handed[file] is not None
            else (earlier or {}).get(file) or made[file] for file in (TIMESTAMP, SECRET)}


def gradebook_dump(url: str, name: str) -> dict:
    """{student: {(notebook, cell): (auto_score, manual_score, needs_manual_grade)}, plus the
    notebooks' late penalties}: what two gradings are compared by."""
    out: dict = {}
    with open_gradebook(url) as gb:
        for sub in gb.assignment_submissions(name):
            rows = {}
            for nb in sub.notebooks:
                rows[(nb.name, "(late penalty)")] = nb.late_submission_penalty
                for g in nb.grades:
                    rows[(nb.name, g.name)] = (g.auto_score, g.manual_score, g.needs_manual_grade)
                for c in nb.comments:
                    rows[(nb.name, "comment " + c.name)] = c.auto_comment
            out[sub.student_id] = rows
    return out


def ensure_assignment(name: str, root: Path) -> None:
    """The gradebook must know the assignment (its graded cells and points) before anything is
    graded; `nbgrader generate_assignment` records it, as `dpmp-lab release` does."""
    try:
        with open_gradebook(gradebook_url(root)) as gb:
            gb.find_assignment(name)
            return
    except MissingEntry:
        pass
    nbgrader("generate_assignment", name, "--force", root=root, capture=True)


def _load_state(root: Path, name: str) -> dict:
    path = root / STATE / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _save_state(root: Path, name: str, state: dict) -> None:
    (root / STATE).mkdir(exist_ok=True)
    path = root / STATE / f"{name}.json"
    path.with_suffix(".tmp").write_text(json.dumps(state, indent=1, sort_keys=True))
    path.with_suffix(".tmp").replace(path)


def _still_recorded(root: Path, name: str, students: Iterable[str]) -> set[str]:
    with open_gradebook(gradebook_url(root)) as gb:
        have = {s.student_id for s in gb.assignment_submissions(name)}
    return have & set(students)


def _outcome_of(future: Future, student: str) -> Graded:
    """The job's outcome; a job that itself broke (a disk full, say) is a submission not
    graded, with the error as the reason, not the end of the class's grading."""
    try:
        return future.result()
    except Exception as exc:
        return Graded(student, "", graded=False,
                      reason=f"grading failed: {type(exc).__name__}: {exc}")


def _keep(gb: Gradebook, root: Path, name: str, outcome: Graded, state: dict,
          limits: Limits) -> tuple[Graded, tuple[float, float] | None]:
    """Record one outcome, install its files and save the state file, as it arrives. A
    failure in any of them is that learner's alone: the outcome becomes NOT GRADED (zero,
    flagged for manual grading) with the failure as its reason, and the state file keeps no
    fingerprint for it, so the next run grades it again. Returns the outcome kept and the
    gradebook's (points, late penalty)."""
    try:
        recorded = record(gb, name, outcome)
        _install(root, name, outcome, limits)
        state[outcome.student] = _state_entry(outcome)
        _save_state(root, name, state)
        return outcome, recorded
    except Exception as exc:
        why = str(exc) if isinstance(exc, NotData) else (
            f"its result could not be recorded: {type(exc).__name__}: {exc}")
    gb.db.rollback()
    failed = Graded(outcome.student, "", graded=False, reason=why, seconds=outcome.seconds,
                    scratch=outcome.scratch)   # removed by the caller, never installed
    state[failed.student] = _state_entry(failed)
    for step in (lambda: record(gb, name, failed), lambda: _install(root, name, failed),
                 lambda: _save_state(root, name, state)):
        try:
            step()
        except Exception as exc:   # the next result saves the state again; a rerun regrades
            gb.db.rollback()
            failed.reason += f" (and then: {type(exc).__name__}: {exc})"
    return failed, None


def _state_entry(outcome: Graded) -> dict:
    return {"fingerprint": outcome.fingerprint, "graded": outcome.graded,
            "reason": outcome.reason, "flagged": outcome.flagged}


def progress_line(done: int, total: int, outcome: Graded, running: int,
                  recorded: tuple[float, float] | None = None) -> str:
    """'[3/12] alice: graded, 7 points (14 s); 2 running', '... NOT GRADED: why' or
    '... FLAGGED for manual grading, 0 points: why'. `recorded`: the gradebook's (points, late
    penalty) after recording, which the line gives as the learner's score (what `nbgrader
    export` writes), with the automatic points where manual grades made them differ."""
    if outcome.flagged:
        what = (f"FLAGGED for manual grading, 0 points: {outcome.flagged[0]}"
                + (f" (and {len(outcome.flagged) - 1} more)" if len(outcome.flagged) > 1
                   else ""))
    elif outcome.graded:
        auto = sum(s or 0 for s, _ in outcome.scores.values())
        points, penalty = recorded if recorded else (auto, 0.0)
        notes = ([f"{auto:g} automatic, with manual grades {points:g}"] if points != auto
                 else []) + ([f"late penalty {penalty:g}"] if penalty else [])
        what = (f"graded, {max(0.0, points - penalty):g} points"
                + (f" ({'; '.join(notes)})" if notes else ""))
    else:
        what = f"NOT GRADED: {outcome.reason}"
    return (f"[{done}/{total}] {outcome.student}: {what} ({outcome.seconds:.0f} s)"
            + (f"; {running} running" if running else ""))


class SandboxUnavailable(RuntimeError):
    """Grading was asked for in the sandbox, and the sandbox cannot run on this machine."""


def grade_class(name: str, *, root: Path | None = None, jobs: int | None = None,
                timeout: float = 1800.0, cell_timeout: int | None = None, force: bool = False,
                students: Iterable[str] | None = None, sandboxed: bool = True,
                limits: Limits | None = None, device_audit: bool | None = None,
                say: Callable[[str], None] = print) -> Summary:
    """Autograde every submission of `name` (or of `students`) in `jobs` parallel jobs, each
    in its own sandbox (unless `sandboxed` is False) within `timeout` seconds and `limits`;
    record the results in the course's gradebook as they arrive.

    device_audit: every launch under the device audit (dl.launch's device_audit), so that code
    that puts a rank's data on the wrong device loses its cells on a machine without GPUs as
    it would on a GPU server; default: where nvidia-smi lists no GPU."""
    root = Path(root).resolve() if root else repo_root()
    if sandboxed and (why := sandbox.problem()):
        raise SandboxUnavailable(
            f"cannot grade in the sandbox: {why}. Without it every submission runs as you, "
            "able to read and change the gradebook, solutions/ and other learners' work: "
            "`--no-sandbox` does that, for submissions you trust")
    if name not in assignments(root):
        raise ValueError(no_such_assignment([name], root))
    if jobs is not None:
        whole_number("jobs", jobs)
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    started = time.monotonic()
    found = submissions(name, root)
    if students is not None:
        wanted = set(students)
        missing = sorted(wanted - set(found))
        if missing:
            raise ValueError(f"no submission of {name} in submitted/ for: {', '.join(missing)}")
        found = {s: p for s, p in found.items() if s in wanted}
    ensure_assignment(name, root)
    limits = limits or Limits()
    state = _load_state(root, name)
    recorded = _still_recorded(root, name, found)
    source = root / "solutions" / name
    todo, skipped = {}, []
    for student, folder in found.items():
        known = state.get(student, {})
        if (not force and student in recorded and known.get("fingerprint")
                and known["fingerprint"] == fingerprint(folder, source, limits)):
            skipped.append(student)
        else:
            todo[student] = folder
    jobs = jobs or default_jobs(len(todo))
    say(f"grading {name}: {len(todo)} submission(s) with {min(jobs, max(1, len(todo)))} "
        f"job(s)" + (f", {len(skipped)} unchanged since graded (--force regrades them)"
                     if skipped else ""))
    run_id = uuid.uuid4().hex
    probe = Cgroups.create(limits)   # which limits this machine's cgroups can hold
    probe.kill_all()
    held = held_text(limits, probe)
    audit = nvidia_smi()[0] == 0 if device_audit is None else device_audit
    if sandboxed:
        say(f"each submission in a sandbox of its own; limits: {limits.describe()} ({held})")
    else:
        say(UNSANDBOXED)
    if audit:
        say("every launch under the device audit, as if each rank had a GPU: data on the wrong "
            "device costs its cells here as on a GPU server (--no-device-audit: off)")
    exposed = exposed_to_others(root)
    if exposed:
        say(f"note: other users of this machine can read {', '.join(exposed)}: an instructor "
            "keeps them private (chmod 700 solutions; chmod 600 gradebook.db)")
    outcomes: list[Graded] = []
    if not todo:
        return Summary(name, outcomes, skipped, time.monotonic() - started, run_id, sandboxed,
                       held)
    base = Path(tempfile.mkdtemp(prefix=f"dpmp-grade-{name}-"))
    try:
        settings = Settings(root, _snapshot(root, base), base, timeout, cell_timeout,
                            sandboxed, limits, run_id, audit)
        live = LiveJobs()
        with ThreadPoolExecutor(max_workers=jobs) as pool, \
                open_gradebook(gradebook_url(root)) as gb:
            of = {pool.submit(grade_one, name, s, f, settings=settings, live=live): s
                  for s, f in todo.items()}
            pending = set(of)
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        outcome, recorded = _keep(gb, root, name,
                                                  _outcome_of(future, of[future]), state,
                                                  limits)
                        outcomes.append(outcome)
                        if outcome.scratch:
                            shutil.rmtree(outcome.scratch, ignore_errors=True)
                        say(progress_line(len(outcomes), len(todo), outcome,
                                          min(jobs, len(todo) - len(outcomes)), recorded))
            except BaseException:   # Ctrl-C: stop every job, then say
                for future in pending:
                    future.cancel()
                while live.kill_all():
                    time.sleep(0.1)   # a job between two nbgrader runs may start one more
                raise
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = Summary(name, outcomes, skipped, time.monotonic() - started, run_id, sandboxed,
                      held)
    minutes = summary.seconds / 60
    flagged = [o.student for o in outcomes if o.graded and o.flagged]
    say(f"graded {len(outcomes) - len(summary.failed)} of {len(outcomes)} in "
        f"{summary.seconds:.0f} s ({len(outcomes) / minutes:.1f} per minute)"
        + (f"; NOT GRADED (zero, flagged for manual grading): "
           f"{', '.join(o.student for o in summary.failed)}" if summary.failed else "")
        + (f"; FLAGGED (zero, for manual grading: see `dpmp-lab report {name}`): "
           f"{', '.join(flagged)}" if flagged else "")
        + ("" if sandboxed else "; graded WITHOUT the sandbox"))
    return summary


def exposed_to_others(root: Path) -> list[str]:
    """The instructor's private parts of a course root that other users may read."""
    return [p.name + ("/" if p.is_dir() else "")
            for p in open_to_others(root, ("solutions", "gradebook.db"))]


def _snapshot(root: Path, base: Path) -> Path:
    """The gradebook every job starts from: the course's assignments, and no learner at all
    (a job's nbgrader creates its own learner), so no job holds another learner's grades."""
    snapshot = base / "gradebook.db"
    shutil.copy(root / "gradebook.db", snapshot)
    with open_gradebook(gradebook_url(base)) as gb:
        for student in list(gb.students):
            gb.remove_student(student.id)
    return snapshot


__all__ = ["SandboxUnavailable", "Summary", "default_jobs", "ensure_assignment",
           "feedback_receipt", "grade_class", "gradebook_dump", "progress_line", "record",
           "submissions"]
