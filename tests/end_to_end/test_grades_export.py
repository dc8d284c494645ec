"""Grades out through `nbgrader export` (instructor/grades_export.py): the course's
nbgrader_config.py makes the plugin the default; it applies nbgrader's late penalty, counts
manual credit, says which learners wait for manual grading, and writes pseudonyms unless asked
for names. `dpmp-lab grades` prints the same rows. The gradebook is built here through
nbgrader's API, as grading leaves it (tests/end_to_end/test_class_grading.py exports a graded
class)."""

from __future__ import annotations

import csv
import io
import os
import shutil
import stat
import subprocess
import sys
import warnings
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import SAWarning

from dpmp_lab import cli
from dpmp_lab.instructor import course, grades_export, grading_job
from tests.conftest import ROOT

DUE = datetime(2026, 12, 1, 12, 0)
CELLS = {"00_launch": {"a": 10.0, "b": 5.0}, "01_collectives": {"c": 4.0}}
# learner -> (first name, {cell: (auto, manual)}, submitted at, late penalty of 00_launch)
CLASS = {
    "ada_x9": ("Ada", {"a": (10, None), "b": (5, None)}, DUE - timedelta(hours=1), 0.0),
    # late with penalty_method = "zero": nbgrader records the whole score as the penalty
    "cy_x9": ("Cy", {"a": (6, None), "b": (5, None)}, DUE + timedelta(hours=2), 11.0),
    # flagged: zero and waiting; the instructor then gave 3 by hand on one cell
    "ben_x9": ("Ben", {"a": (0, 3), "b": (0, None)}, DUE, 0.0),
    "dee_x9": ("Dee", {}, None, 0.0),   # submitted nothing
}


def make_course(root: Path) -> Path:
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    with grading_job.open_gradebook(course.gradebook_url(root)) as gb:
        for name, cells in CELLS.items():
            gb.update_or_create_assignment(name, duedate=DUE if name == "00_launch" else None)
            gb.update_or_create_notebook(name, name)
            for cell, points in cells.items():
                gb.update_or_create_grade_cell(cell, name, name, max_score=points,
                                               cell_type="code")
        for learner, (first, scores, when, penalty) in CLASS.items():
            gb.update_or_create_student(learner, first_name=first, last_name="Q",
                                        email=f"{learner}@example.org")
            if not scores:
                continue
            with warnings.catch_warnings():   # as nbgrader's own autograde warns, harmlessly
                warnings.filterwarnings("ignore", category=SAWarning)
                sub = gb.add_submission("00_launch", learner, timestamp=when)
            for nb in sub.notebooks:
                nb.late_submission_penalty = penalty
                for g in nb.grades:
                    g.auto_score, g.manual_score = scores[g.name]
                    g.needs_manual_grade = learner == "ben_x9" and g.manual_score is None
        gb.db.commit()
    return root


def nbgrader_export(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))
    return subprocess.run([sys.executable, "-m", "nbgrader", "export", *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)


def read_csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """A course, exported twice by plain `nbgrader export` (pseudonyms) and once with names."""
    root = make_course(tmp_path_factory.mktemp("export") / "course")
    out = {"root": root}
    for run in ("first", "second"):
        done = nbgrader_export(root, f"--to={run}.csv")
        assert done.returncode == 0, done.stderr
        out[run] = (root / f"{run}.csv").read_text()
    done = nbgrader_export(root, "--to=named.csv", "--GradesExport.names=True")
    assert done.returncode == 0, done.stderr
    out["named"] = (root / "named.csv").read_text()
    out["log"] = done.stderr
    return out


def test_plain_nbgrader_export_applies_the_late_penalty_and_says_who_waits(exported):
    assert "Using exporter: GradesExport" in exported["log"]
    rows = {(r["student_id"], r["assignment"]): r for r in read_csv(exported["named"])}
    assert len(rows) == len(CLASS) * len(CELLS)   # every learner, every assignment
    ada, cy, ben, dee = (rows[(s, "00_launch")] for s in ("ada_x9", "cy_x9", "ben_x9", "dee_x9"))
    assert (ada["score"], ada["max_score"], ada["needs_manual_grade"]) == ("15", "15", "False")
    # late: 11 points earned, nbgrader's "zero" penalty takes them all
    assert (cy["raw_score"], cy["late_submission_penalty"], cy["score"]) == ("11", "11", "0")
    # manual credit counts, and a cell still waiting says so
    assert (ben["raw_score"], ben["score"], ben["needs_manual_grade"]) == ("3", "3", "True")
    assert (dee["submitted"], dee["score"], dee["timestamp"]) == ("False", "0", "")
    assert rows[("ada_x9", "01_collectives")]["submitted"] == "False"
    assert ada["first_name"] == "Ada" and ada["email"] == "ada_x9@example.org"
    assert ada["duedate"].startswith("2026-12-01 12:00")


def test_learners_get_pseudonyms_by_default_stable_and_keyed(exported):
    root = exported["root"]
    assert exported["first"] == exported["second"]   # stable: spreadsheets join
    for learner, (first, *_) in CLASS.items():
        assert learner not in exported["first"] and first not in exported["first"]
    anonymous = read_csv(exported["first"])
    named = read_csv(exported["named"])
    assert [r["score"] for r in anonymous] == [r["score"] for r in named]
    key = grades_export.read_key(root / grades_export.KEY_FILE)
    assert {r["student_id"] for r in anonymous} == {
        grades_export.pseudonym(s, key) for s in CLASS}
    assert len({r["student_id"] for r in anonymous}) == len(CLASS)
    assert stat.S_IMODE((root / grades_export.KEY_FILE).stat().st_mode) == 0o600
    # another key, other pseudonyms: a class list alone does not reverse them
    assert grades_export.pseudonym("ada_x9", b"k" * 64) != grades_export.pseudonym(
        "ada_x9", key)


def test_dpmp_lab_grades_prints_the_exporters_rows(exported, capsys):
    root = exported["root"]
    assert cli.main(["grades", "--root", str(root), "--csv"]) == 0
    assert capsys.readouterr().out == exported["first"]
    assert cli.main(["grades", "--root", str(root), "--csv", "--names"]) == 0
    assert capsys.readouterr().out == exported["named"]
    assert cli.main(["grades", "00_launch", "--root", str(root), "--names"]) == 0
    table = capsys.readouterr().out
    cy = next(line for line in table.splitlines() if "cy_x9" in line)
    assert cy.split()[:5] == ["cy_x9", "00_launch", "0", "15", "11"]
    assert "01_collectives" not in table


def test_an_unknown_name_is_a_clear_error(exported, tmp_path, capsys):
    with grading_job.open_gradebook(course.gradebook_url(exported["root"])) as gb:
        with pytest.raises(ValueError, match="not in the gradebook: 99_nothing"):
            grades_export.grade_rows(gb, ["99_nothing"])
        with pytest.raises(ValueError, match="not in the gradebook: zed .learners there"):
            grades_export.grade_rows(gb, None, ["zed"])
    done = nbgrader_export(exported["root"], "--to=x.csv", "--assignment=['99_nothing']")
    assert done.returncode != 0 and "not in the gradebook: 99_nothing" in done.stderr
    assert cli.main(["grades", "--root", str(tmp_path)]) == 2   # no gradebook: one line
    assert "no gradebook.db" in capsys.readouterr().err
    assert not (tmp_path / "gradebook.db").exists()
    bad = tmp_path / "bad.key"
    bad.write_text("short\n")
    with pytest.raises(ValueError, match="holds no pseudonym key"):
        grades_export.read_key(bad)


def test_a_roster_goes_in_with_nbgraders_import_and_grades_come_out_as_an_lms_imports_them(
        tmp_path, capsys):
    """The roster (account, names, email, the university's id) goes into the gradebook with
    nbgrader's own `db student import`; `dpmp-lab grades --for canvas|moodle --names` writes one
    row per learner and one column per assignment, the late penalty applied, a submission
    waiting for manual grading blank (and said so)."""
    root = make_course(tmp_path / "course")
    roster = tmp_path / "roster.csv"
    roster.write_text("id,first_name,last_name,email,lms_user_id\n"
                      "ada_x9,Ada,Lovelace,ada@uni.example,S1001\n"
                      "eve_x9,Eve,Late,eve@uni.example,S1005\n")   # enrolled, nothing handed in
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))
    done = subprocess.run([sys.executable, "-m", "nbgrader", "db", "student", "import",
                           str(roster)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert cli.main(["grades", "--root", str(root), "--for", "canvas"]) == 2
    assert "add --names" in capsys.readouterr().err
    assert cli.main(["grades", "--root", str(root), "--for", "canvas", "--names"]) == 0
    out = capsys.readouterr()
    canvas = read_csv(out.out)
    assert list(canvas[0]) == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                               "00_launch", "01_collectives"]
    by_login = {r["SIS Login ID"]: r for r in canvas}
    assert set(by_login) == {*CLASS, "eve_x9"}
    ada, cy, ben, eve = (by_login[s] for s in ("ada_x9", "cy_x9", "ben_x9", "eve_x9"))
    assert (ada["Student"], ada["SIS User ID"], ada["00_launch"], ada["01_collectives"]) == (
        "Lovelace, Ada", "S1001", "15", "0")
    assert cy["00_launch"] == "0"                                   # late, penalty "zero"
    assert ben["00_launch"] == "" and "ben_x9 00_launch: waits for manual grading" in out.err
    assert (eve["00_launch"], eve["SIS User ID"]) == ("0", "S1005")
    assert cli.main(["grades", "00_launch", "--root", str(root), "--for", "moodle",
                     "--names"]) == 0
    moodle = read_csv(capsys.readouterr().out)
    assert list(moodle[0]) == ["username", "idnumber", "email", "firstname", "lastname",
                               "00_launch"]
    row = next(r for r in moodle if r["username"] == "ada_x9")
    assert (row["idnumber"], row["email"], row["00_launch"]) == ("S1001", "ada@uni.example",
                                                                 "15")
