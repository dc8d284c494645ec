"""Submissions are data: a learner's folder is checked before a job reads it (no link, no
special file, within bounds), nbgrader's small files are read as bounded bytes, and one
learner's bad file or failed recording costs that learner alone. Fast: nbgrader never runs
here (`grading.grade_one` or the job's nbgrader command is replaced), and no sandbox."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from dpmp_lab.instructor import course, grading, grading_job, submitted
from dpmp_lab.instructor.limits import Limits
from tests.conftest import ROOT

NAME = "00_launch"
SOURCE = ROOT / "solutions" / NAME
OUTSIDE = b"OUTSIDE-THE-SUBMISSION-9f1c2e"   # what no copy, page or report may hold
STAMP = "2026-03-01 09:30:00.000000 UTC"


@pytest.fixture(scope="module")
def course_once(tmp_path_factory) -> Path:
    """A course root whose gradebook knows the assignment (nbgrader's generate_assignment,
    once for the module)."""
    root = tmp_path_factory.mktemp("course") / "c"
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(SOURCE, root / "solutions" / NAME)
    grading.ensure_assignment(NAME, root)
    return root


@pytest.fixture
def root(course_once, tmp_path) -> Path:
    shutil.copytree(course_once, tmp_path / "c")
    return tmp_path / "c"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file beside the course that a learner would like the grader (root) to read."""
    (tmp_path / "elsewhere").mkdir()
    path = tmp_path / "elsewhere" / "secret.txt"
    path.write_bytes(OUTSIDE)
    return path


def hand_in(root: Path, learner: str) -> Path:
    folder = root / "submitted" / learner / NAME
    folder.mkdir(parents=True)
    shutil.copy(SOURCE / f"{NAME}.ipynb", folder)
    return folder


def holding(top: Path, data: bytes) -> list[Path]:
    """The regular files under `top` (links not followed) whose bytes contain `data`."""
    return [p for p in top.rglob("*")
            if p.is_file() and not p.is_symlink() and data in p.read_bytes()]


class Nbgrader:
    """The job's nbgrader run, replaced: counts its runs and fails them, so a test sees
    whether a submission got as far as nbgrader, and what it would have read."""

    def __init__(self, monkeypatch) -> None:
        self.runs: list[Path] = []
        monkeypatch.setattr(grading_job, "_run", self._run)

    def _run(self, steps, scratch, *args):
        self.runs.append(scratch)
        return 1, "RuntimeError: not run in this test", ""


def job(root: Path, tmp_path: Path) -> grading_job.Graded:
    """Grade learner lea's submission as `dpmp-lab grade` would, unsandboxed, in tmp_path/base."""
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    settings = grading_job.Settings(root, root / "gradebook.db", base, 60.0, sandbox=False)
    return grading_job.grade_one(NAME, "lea", root / "submitted" / "lea" / NAME,
                                 settings=settings)


# -- the reader: bounded, never through a link ----------------------------------------------------


def test_small_files_are_read_as_bounded_bytes_and_never_through_a_link(tmp_path, outside):
    (tmp_path / "s").mkdir()
    folder = tmp_path / "s"
    assert submitted.read_small(folder, "timestamp.txt") is None
    (folder / "timestamp.txt").write_bytes(b"x" * 4096)
    assert submitted.read_small(folder, "timestamp.txt") == b"x" * 4096
    (folder / "timestamp.txt").write_bytes(b"x" * 4097)
    with pytest.raises(submitted.NotData, match="4097 bytes"):
        submitted.read_small(folder, "timestamp.txt")
    (folder / "timestamp.txt").unlink()
    (folder / "timestamp.txt").symlink_to(outside)
    with pytest.raises(submitted.NotData, match="symbolic link"):
        submitted.read_small(folder, "timestamp.txt")
    assert submitted.small_text(folder, "timestamp.txt") is None
    (folder / "submission_secret.txt").write_bytes(b"\xff")
    assert submitted.small_text(folder, "submission_secret.txt") is None


def test_the_digest_sees_a_link_and_a_special_file_without_opening_them(tmp_path, outside):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"a")

    def digest() -> str:
        h = hashlib.sha256()
        submitted.digest(folder, h, max_bytes=2**20)
        return h.hexdigest()

    plain = digest()
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "a-checkpoint.txt").write_bytes(b"old")
    assert digest() == plain   # Jupyter's checkpoints are not what was graded
    os.mkfifo(folder / "pipe")   # opened, it would block the digest forever
    with_fifo = digest()
    (folder / "pipe").unlink()
    (folder / "pipe").symlink_to(outside)
    assert len({plain, with_fifo, digest()}) == 3


# -- links and special files: NOT GRADED, and nothing they name is read --------------------------


def _notebook_link(folder: Path, root: Path, outside: Path) -> str:
    (folder / f"{NAME}.ipynb").unlink()
    (folder / f"{NAME}.ipynb").symlink_to(root / "solutions" / NAME / f"{NAME}.ipynb")
    return f"{NAME}.ipynb is a symbolic link"


def _file_link(folder: Path, root: Path, outside: Path) -> str:
    (folder / "notes.txt").symlink_to(outside)
    return "notes.txt is a symbolic link"


def _link_in_a_subfolder(folder: Path, root: Path, outside: Path) -> str:
    (folder / "data" / "more").mkdir(parents=True)
    (folder / "data" / "more" / "rows.csv").symlink_to(outside)
    return "data/more/rows.csv is a symbolic link"


def _folder_link(folder: Path, root: Path, outside: Path) -> str:
    (folder / "lib").symlink_to(outside.parent, target_is_directory=True)
    return "lib is a symbolic link"


def _gradebook_link(folder: Path, root: Path, outside: Path) -> str:
    (folder / "grades.db").symlink_to(root / "gradebook.db")
    return "grades.db is a symbolic link"


def _hard_link(folder: Path, root: Path, outside: Path) -> str:
    os.link(outside, folder / "notes.txt")
    return "notes.txt is a hard link"


def _fifo(folder: Path, root: Path, outside: Path) -> str:
    os.mkfifo(folder / "pipe")
    return "pipe is a fifo, not a regular file"


@pytest.mark.parametrize("plant", [_notebook_link, _file_link, _link_in_a_subfolder,
                                   _folder_link, _gradebook_link, _hard_link, _fifo],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_link_or_special_file_anywhere_is_not_graded_and_nothing_it_names_is_read(
        plant, root, outside, tmp_path, monkeypatch):
    folder = hand_in(root, "lea")
    said = plant(folder, root, outside)
    nbgrader = Nbgrader(monkeypatch)
    outcome = job(root, tmp_path)
    assert not outcome.graded and outcome.reason.startswith(said), outcome.reason
    if "link" in said:
        assert outcome.reason.endswith("hand in regular files; a link is never followed")
    assert nbgrader.runs == [] and not any((tmp_path / "base").iterdir())   # nothing copied
    assert holding(tmp_path / "base", OUTSIDE) == []


def test_a_submission_folder_that_is_itself_a_link_is_not_graded(root, tmp_path, monkeypatch):
    elsewhere = hand_in(root, "other")
    (root / "submitted" / "lea").mkdir()
    (root / "submitted" / "lea" / NAME).symlink_to(elsewhere, target_is_directory=True)
    nbgrader = Nbgrader(monkeypatch)
    outcome = job(root, tmp_path)
    assert not outcome.graded and outcome.reason.startswith(
        f"the submission folder {NAME} is a symbolic link"), outcome.reason
    assert nbgrader.runs == []


def test_a_link_made_after_the_check_is_refused_by_the_copy(
        root, outside, tmp_path, monkeypatch):
    """The folder may change between the check and the copy: the copy never follows."""
    folder = hand_in(root, "lea")
    checked = submitted.check

    def check_then_swap(path, **kw):
        size = checked(path, **kw)
        (folder / "notes.txt").symlink_to(outside)
        return size

    monkeypatch.setattr(submitted, "check", check_then_swap)
    nbgrader = Nbgrader(monkeypatch)
    outcome = job(root, tmp_path)
    assert not outcome.graded and outcome.reason.startswith(
        "notes.txt is a symbolic link"), outcome.reason
    assert nbgrader.runs == [] and not any((tmp_path / "base").iterdir())


def test_a_regular_submission_is_copied_byte_for_byte_with_its_times_and_no_set_id_bit(
        root, tmp_path, monkeypatch):
    folder = hand_in(root, "lea")
    (folder / "data").mkdir()
    (folder / "data" / "tool.sh").write_bytes(b"#!/bin/sh\n")
    (folder / "data" / "tool.sh").chmod(0o4755)
    os.utime(folder / "data" / "tool.sh", ns=(1_600_000_000 * 10**9, 1_600_000_000 * 10**9))
    (folder / "timestamp.txt").write_text(STAMP)
    nbgrader = Nbgrader(monkeypatch)
    outcome = job(root, tmp_path)
    [scratch] = nbgrader.runs
    copy = scratch / "submitted" / "lea" / NAME
    assert {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()} == {
        p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    tool = (copy / "data" / "tool.sh").stat()
    assert tool.st_mtime_ns == 1_600_000_000 * 10**9 and stat.S_IMODE(tool.st_mode) == 0o755
    assert outcome.size == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# -- the fingerprint: bounded, never through a link ----------------------------------------------


def test_the_fingerprint_never_reads_through_a_link_and_reads_at_most_the_disk_limit(
        root, outside, tmp_path):
    folder = hand_in(root, "lea")
    (folder / "notes.txt").symlink_to(outside)
    source = root / "solutions" / NAME
    before = grading_job.fingerprint(folder, source)
    outside.write_bytes(b"changed outside")
    assert grading_job.fingerprint(folder, source) == before   # a link is its name only
    (folder / "notes.txt").unlink()
    big = folder / "big.bin"
    big.write_bytes(bytes(3 * 2**20))
    one_mib = Limits(disk_mb=1)
    first = grading_job.fingerprint(folder, source, one_mib)
    with open(big, "r+b") as f:
        f.seek(2 * 2**20)
        f.write(b"x")   # past the disk limit: refused whatever it holds there
    assert grading_job.fingerprint(folder, source, one_mib) == first
    with open(big, "r+b") as f:
        f.write(b"x")   # within it
    assert grading_job.fingerprint(folder, source, one_mib) != first


# -- nbgrader's timestamp: bounded bytes, a bad one is its learner's -----------------------------


@pytest.mark.parametrize("data, said", [
    (b"2026-03-01 09:30:00 UTC\xff\xfe", "timestamp.txt holds no time nbgrader can read"),
    (STAMP.encode() + b" " * 2**20, "timestamp.txt holds 1048606 bytes, more than the 4096"),
    (b"next tuesday", "timestamp.txt holds no time nbgrader can read"),
], ids=["not-utf8", "huge", "not-a-time"])
def test_a_timestamp_nbgrader_cannot_read_is_its_learners_not_graded_reason(
        data, said, root, tmp_path, monkeypatch):
    folder = hand_in(root, "lea")
    (folder / "timestamp.txt").write_bytes(data)
    nbgrader = Nbgrader(monkeypatch)
    outcome = job(root, tmp_path)
    assert not outcome.graded and outcome.reason.startswith(said), outcome.reason
    assert nbgrader.runs == [] and not any((tmp_path / "base").iterdir())


def test_only_the_end_of_nbgrader_log_is_read_back(root, tmp_path, monkeypatch):
    """Its last error is what the reason quotes; what a kernel printed before it may be
    anything, in any amount and any bytes."""
    hand_in(root, "lea")
    noisy = ("import sys; sys.stdout.buffer.write(b'\\xff' * 3 * 2**20); "
             "print(); print('ValueError: the last words'); sys.exit(1)")
    monkeypatch.setattr(grading_job, "command", lambda steps: [sys.executable, "-c", noisy])
    seen: list[str] = []
    last_error = grading_job._last_error
    monkeypatch.setattr(grading_job, "_last_error", lambda log: seen.append(log) or (
        last_error(log)))
    outcome = job(root, tmp_path)
    assert outcome.reason == "nbgrader could not grade it: ValueError: the last words"
    assert [len(log.encode()) <= 3 * 64 * 1024 for log in seen] == [True]


# -- the parent: one learner's bad file, failed recording or big result is theirs ------------


def graded_job(root: Path, notebook_bytes: int = 0):
    """grade_one, replaced: every learner graded with full marks, a feedback page and an
    autograded notebook (`notebook_bytes` long, else the submitted one) in a scratch course,
    as a real job leaves them. Records the learners it was asked for."""
    asked: list[str] = []

    def fake(name, student, folder, *, settings, live=None):
        asked.append(student)
        out = grading_job.Graded(student, grading_job.fingerprint(
            folder, settings.root / "solutions" / name), graded=True,
            scratch=settings.base / student)
        out.size = (folder / f"{name}.ipynb").stat().st_size
        with grading_job.open_gradebook(course.gradebook_url(root)) as gb:
            for g in gb.find_notebook(name, name).grade_cells:
                out.scores[(name, g.name)] = (g.max_score, False)
        made = out.scratch / "autograded" / student / name
        made.mkdir(parents=True)
        if notebook_bytes:
            (made / f"{name}.ipynb").write_bytes(b" " * notebook_bytes)
        else:
            shutil.copy(folder / f"{name}.ipynb", made)
        (out.scratch / "feedback" / student / name).mkdir(parents=True)
        (out.scratch / "feedback" / student / name / f"{name}.html").write_text("<p>feedback")
        return out

    return fake, asked


def rows(root: Path) -> dict[str, tuple[float, bool]]:
    """{learner: (points, any cell flagged for manual grading)} from the course's gradebook."""
    dump = grading.gradebook_dump(course.gradebook_url(root), NAME)
    return {s: (sum(v[0] or 0 for v in cells.values() if isinstance(v, tuple)),
                any(v[2] for v in cells.values() if isinstance(v, tuple)))
            for s, cells in dump.items()}


@pytest.mark.parametrize("file, data", [
    ("submission_secret.txt", b"\xff\xfe not utf-8"),
    ("submission_secret.txt", b"a" * 2**20),
    ("timestamp.txt", b"\xff\xfe not utf-8"),
    ("timestamp.txt", STAMP.encode() + b" " * 2**20),
], ids=["secret-not-utf8", "secret-huge", "timestamp-not-utf8", "timestamp-huge"])
def test_a_bad_secret_or_timestamp_costs_the_class_nothing_and_feedback_gets_a_made_one(
        file, data, root, monkeypatch):
    """The parent reads both to write beside the feedback page, after the job: one that is
    not what nbgrader writes is replaced there (a made time, a new secret), the others go on."""
    for learner in ("ann", "bad", "cy"):
        hand_in(root, learner)
    (root / "submitted" / "bad" / NAME / file).write_bytes(data)
    fake, _ = graded_job(root)
    monkeypatch.setattr(grading, "grade_one", fake)
    summary = grading.grade_class(NAME, root=root, jobs=1, sandboxed=False,
                                  say=lambda _: None)
    assert sorted((o.student, o.graded) for o in summary.outcomes) == [
        ("ann", True), ("bad", True), ("cy", True)]
    feedback = root / "feedback" / "bad" / NAME
    secret = (feedback / "submission_secret.txt").read_bytes()
    stamp = (feedback / "timestamp.txt").read_bytes()
    assert len(secret) == 128 and int(secret, 16) >= 0
    assert len(stamp) < 64 and stamp.decode().endswith(" UTC")


def test_a_result_that_cannot_be_recorded_is_that_learners_and_a_rerun_grades_it_alone(
        root, monkeypatch):
    for learner in ("ann", "bad", "cy"):
        hand_in(root, learner)
    fake, asked = graded_job(root)
    monkeypatch.setattr(grading, "grade_one", fake)
    really = grading.record

    def record(gb, name, outcome):
        if outcome.student == "bad" and outcome.graded:
            raise OSError("disk I/O error")
        return really(gb, name, outcome)

    monkeypatch.setattr(grading, "record", record)
    lines: list[str] = []
    summary = grading.grade_class(NAME, root=root, jobs=1, sandboxed=False, say=lines.append)
    assert sorted((o.student, o.graded) for o in summary.outcomes) == [
        ("ann", True), ("bad", False), ("cy", True)]
    assert "bad: NOT GRADED: its result could not be recorded: OSError: disk I/O error" in (
        "\n".join(lines))
    assert rows(root) == {"ann": (9.0, False), "bad": (0.0, True), "cy": (9.0, False)}
    state = json.loads((root / ".dpmp_grading" / f"{NAME}.json").read_text())
    assert state["ann"]["fingerprint"] and state["cy"]["fingerprint"]
    assert state["bad"]["fingerprint"] == "" and "disk I/O error" in state["bad"]["reason"]
    assert not (root / "autograded" / "bad" / NAME).exists()
    assert (root / "autograded" / "cy" / NAME).is_dir()
    monkeypatch.setattr(grading, "record", really)
    asked.clear()
    again = grading.grade_class(NAME, root=root, jobs=1, sandboxed=False, say=lambda _: None)
    assert asked == ["bad"] and sorted(again.skipped) == ["ann", "cy"]
    assert rows(root)["bad"] == (9.0, False)


def test_an_autograded_notebook_bigger_than_its_limits_allow_is_not_installed(
        root, monkeypatch):
    """With 1 MiB of output, a notebook of about 100 KiB may grow to 13.1 MiB (its output
    as the file spells it, at most 12 bytes a character, and nbgrader's metadata)."""
    hand_in(root, "ann")
    fake, _ = graded_job(root, notebook_bytes=20 * 2**20)
    monkeypatch.setattr(grading, "grade_one", fake)
    [outcome] = grading.grade_class(NAME, root=root, jobs=1, sandboxed=False,
                                    limits=Limits(notebook_output_mb=1),
                                    say=lambda _: None).outcomes
    assert not outcome.graded and outcome.reason.startswith(
        "its autograded notebook is 20.0 MiB, more than its submission and the notebook "
        "output limit allow (13.1 MiB)"), outcome.reason
    assert not (root / "autograded" / "ann" / NAME).exists() and rows(root) == {
        "ann": (0.0, True)}
