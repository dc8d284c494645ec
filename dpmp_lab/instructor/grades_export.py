"""Grades out of the gradebook: an nbgrader ExportPlugin, so that the command instructors
already know, `nbgrader export`, writes them (nbgrader_config.py makes it the default).

It writes what nbgrader's own CSV export writes (one row per learner and assignment, a learner
who submitted nothing with zero; raw score, late penalty, the score after it) and adds what
nbgrader's leaves out: whether a cell still waits for manual grading (a submission the grader
flagged, or could not grade, is zero until the instructor looks). Learners' ids are replaced by
pseudonyms unless asked (`--GradesExport.names=True`): a keyed hash, stable across exports, so
that spreadsheets of several assignments join, and not reversible from a class list without the
key, kept in the course root (`.dpmp_grading/pseudonym.key`, made on first use, readable by
its owner alone). `dpmp-lab grades` prints the same rows.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import os
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import ExportPlugin
from traitlets import Bool, Unicode

from dpmp_lab.instructor.course import gradebook_url
from dpmp_lab.instructor.grading_job import open_gradebook
from dpmp_lab.render import Table

KEY_FILE = Path(".dpmp_grading") / "pseudonym.key"   # in the course root
COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name",
           "email", "raw_score", "late_submission_penalty", "score", "max_score",
           "needs_manual_grade", "submitted"]


@dataclass(frozen=True)
class GradeRow:
    """One learner's result in one assignment, as the gradebook holds it."""

    assignment: str
    student_id: str
    duedate: datetime | None
    timestamp: datetime | None
    raw_score: float          # the cells' points: the manual score where given, else the auto
    late_penalty: float       # nbgrader's LateSubmissionPlugin's, recorded when graded
    max_score: float
    needs_manual_grade: bool
    submitted: bool
    last_name: str = ""
    first_name: str = ""
    email: str = ""
    lms_user_id: str = ""     # the university's id, where the roster gave one

    @property
    def score(self) -> float:
        """What the learner gets: the points less the late penalty, never below zero."""
        return max(0.0, self.raw_score - self.late_penalty)


def grade_rows(gb: Gradebook, assignments: list[str] | None = None,
               students: list[str] | None = None) -> list[GradeRow]:
    """Every (assignment, learner) pair of the gradebook, or of those named; assignments in
    course order, learners sorted. A name the gradebook does not hold is a ValueError."""
    known = sorted(a.name for a in gb.assignments)
    learners = sorted(s.id for s in gb.students)
    for what, asked, have in (("assignments", assignments, known),
                              ("learners", students, learners)):
        unknown = sorted(set(asked or ()) - set(have))
        if unknown:
            raise ValueError(f"not in the gradebook: {', '.join(unknown)} ({what} there: "
                             f"{', '.join(have) or 'none yet'})")
    rows = []
    for name in [a for a in known if not assignments or a in assignments]:
        assignment = gb.find_assignment(name)
        for student_id in [s for s in learners if not students or s in students]:
            student = gb.find_student(student_id)
            who = {"last_name": student.last_name or "", "first_name": student.first_name or "",
                   "email": student.email or "", "lms_user_id": student.lms_user_id or ""}
            try:
                sub = gb.find_submission(name, student_id)
            except MissingEntry:
                rows.append(GradeRow(name, student_id, assignment.duedate, None, 0.0, 0.0,
                                     assignment.max_score, False, False, **who))
                continue
            rows.append(GradeRow(name, student_id, assignment.duedate, sub.timestamp,
                                 sub.score, sub.late_submission_penalty or 0.0,
                                 assignment.max_score, bool(sub.needs_manual_grade), True,
                                 **who))
    return rows


def course_grades(root: Path, assignments: list[str] | None = None) -> list[GradeRow]:
    """grade_rows of the gradebook in course root `root`, which must exist."""
    if not (Path(root) / "gradebook.db").exists():
        raise ValueError(f"no gradebook.db in {root}: nothing graded there yet "
                         "(dpmp-lab grade NAME)")
    with open_gradebook(gradebook_url(Path(root))) as gb:
        return grade_rows(gb, assignments)


def read_key(path: Path) -> bytes:
    """The course's pseudonym key, made (owner-only) the first time it is asked for."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass   # another export made it meanwhile: read theirs
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    key = path.read_text().strip()
    if len(key) < 32:
        raise ValueError(f"{path} holds no pseudonym key (remove it to make a new one; the "
                         "pseudonyms of earlier exports then change)")
    return key.encode()


def pseudonym(student_id: str, key: bytes) -> str:
    """'learner-<10 hex digits>': the same for the same id and key, unguessable without key."""
    return "learner-" + hmac.new(key, student_id.encode(), hashlib.sha256).hexdigest()[:10]


def _number(x: float) -> str:
    return f"{x:g}"


def grades_csv(rows: list[GradeRow], key: bytes | None) -> str:
    """The rows as CSV (COLUMNS); with a key, ids become pseudonyms and names are left out."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        names = ["", "", ""] if key else [r.last_name, r.first_name, r.email]
        w.writerow([r.assignment, r.duedate or "", r.timestamp or "",
                    pseudonym(r.student_id, key) if key else r.student_id, *names,
                    _number(r.raw_score), _number(r.late_penalty), _number(r.score),
                    _number(r.max_score), r.needs_manual_grade, r.submitted])
    return buf.getvalue()


def grades_table(rows: list[GradeRow], key: bytes | None) -> Table:
    """The terminal's view of the same rows."""
    return Table(["learner", "assignment", "score", "max", "late penalty", "manual grading"],
                 [[pseudonym(r.student_id, key) if key else r.student_id, r.assignment,
                   _number(r.score) if r.submitted else "-", _number(r.max_score),
                   _number(r.late_penalty) if r.late_penalty else "",
                   "needed" if r.needs_manual_grade else ""] for r in rows])


# One row per learner, one column per assignment, as a learning platform imports a gradebook:
# Canvas matches a row by "SIS Login ID" (or "SIS User ID") and a column by the assignment's
# name, and takes every other column after "Section" for an assignment (so nothing else is
# written); Moodle's CSV grade import maps any column to the user (username, idnumber or
# email) and each other column to a grade item, chosen on its import page.
LMS_IDS = {
    "canvas": (["Student", "ID", "SIS User ID", "SIS Login ID", "Section"],
               lambda r: [f"{r.last_name}, {r.first_name}".strip(", "), "", r.lms_user_id,
                          r.student_id, ""]),
    "moodle": (["username", "idnumber", "email", "firstname", "lastname"],
               lambda r: [r.student_id, r.lms_user_id, r.email, r.first_name, r.last_name]),
}


def lms_csv(rows: list[GradeRow], platform: str) -> tuple[str, list[str]]:
    """The rows as one row per learner and one column per assignment (the score after the
    late penalty) in the form `platform` ("canvas" or "moodle") imports, and what was left
    blank: a submission waiting for manual grading has no score to send yet (its zero is not
    a grade), and an empty cell leaves the platform's own value alone."""
    if platform not in LMS_IDS:
        raise ValueError(f"no such platform {platform!r}: {', '.join(LMS_IDS)}")
    header, ids = LMS_IDS[platform]
    names = list(dict.fromkeys(r.assignment for r in rows))
    learners: dict[str, dict[str, GradeRow]] = {}
    for r in rows:
        learners.setdefault(r.student_id, {})[r.assignment] = r
    buf, blank = io.StringIO(), []
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header + names)
    for student_id in sorted(learners):
        by_name = learners[student_id]
        cells = []
        for name in names:
            r = by_name.get(name)
            if r is not None and r.needs_manual_grade:
                blank.append(f"{student_id} {name}: waits for manual grading")
                cells.append("")
            else:
                cells.append(_number(r.score) if r is not None else "")
        w.writerow(ids(next(iter(by_name.values()))) + cells)
    return buf.getvalue(), blank


class GradesExport(ExportPlugin):
    """`nbgrader export`'s CSV with the late penalty applied, manual grading pending, and
    pseudonyms for learners' ids unless `names` is set."""

    names = Bool(False, help="Write learners' ids and names (default: pseudonyms, no "
                 "names)").tag(config=True)
    key_file = Unicode("", help="The pseudonym key (default: .dpmp_grading/pseudonym.key in "
                       "the course root)").tag(config=True)

    def key_path(self) -> Path:
        if self.key_file:
            return Path(self.key_file)
        coursedir = getattr(self.parent, "coursedir", None)
        return Path(coursedir.root if coursedir else os.getcwd()) / KEY_FILE

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        rows = grade_rows(gradebook, [str(a) for a in self.assignment] or None,
                          [str(s) for s in self.student] or None)
        key = None if self.names else read_key(self.key_path())
        Path(dest).write_text(grades_csv(rows, key))
        self.log.info("Exported %d grade(s) to %s (%s)", len(rows), dest,
                      "learners' ids and names" if self.names
                      else f"pseudonyms keyed by {self.key_path()}")


__all__ = ["COLUMNS", "GradeRow", "GradesExport", "KEY_FILE", "course_grades", "grade_rows",
           "grades_csv", "grades_table", "lms_csv", "pseudonym", "read_key"]
