"""Grading a class: `dpmp-lab grade --jobs N` gives the gradebook one job gives, whatever order
the jobs finish in, with a submission that hangs and one that kills its kernel among them; the
class report names each broken variant's mistake under the cell it breaks, with the right
counts; grades come out through `nbgrader export`, late penalty applied; feedback is released
through an exchange, hand-placed submissions and collected ones alike.

The class is tests/end_to_end/grading_class.py's (honest learners and attackers, graded with --jobs
2; three of the honest learners again with --jobs 1): each autograde costs 10-40 s on the shared
2-core machine, so the first test here takes a few minutes.
"""

from __future__ import annotations

import csv
import io
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch
from nbgrader.utils import notebook_hash, parse_utc

from dpmp_lab import cli
from dpmp_lab.check import hints
from dpmp_lab.instructor import (
    class_report,
    course,
    grades_export,
    grading,
    grading_job,
    sandbox,
)
from tests.end_to_end.grading_class import (
    AGAIN,
    ALL_REDUCE,
    BROKEN,
    FORGED,
    FULL,
    HONEST,
    LATE,
    LIMIT,
    NAME,
    NOT_GRADED,
    ROWS,
    STOPPED,
    ZEROED,
    course_root,
    hand_in,
    not_graded_here,
    released_root,
    run_processes,
)
from tests.support.comm_cases import COMM_CASES, comm_failure, trace_of
from tests.support.notebook_sources import source_notebook

pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow, pytest.mark.skipif(
    sandbox.problem() is not None and os.environ.get("CI") != "true",
    reason=f"grading runs every submission in the sandbox, which cannot run here: "
           f"{sandbox.problem()}")]


@pytest.fixture
def graded(graded_class) -> dict:
    """The class (tests/end_to_end/grading_class.py), graded with --jobs 2 (root "two": honest
    learners and attackers) and --jobs 1 (root "one": two honest learners, AGAIN)."""
    return graded_class


def test_jobs_1_and_jobs_2_give_identical_gradebooks(graded):
    two = grading.gradebook_dump(course.gradebook_url(graded["two"]), NAME)
    one = grading.gradebook_dump(course.gradebook_url(graded["one"]), NAME)
    assert set(two) == graded["everyone"] and set(one) == AGAIN
    assert {learner: two[learner] for learner in one} == one   # attackers changed nothing
    assert "RLIMIT_AS per process" in graded["summary_one"].limits_held   # rlimits alone
    for learner, cells in two.items():   # every graded cell has a score: none lost
        scores = [v for k, v in cells.items() if isinstance(v, tuple)]
        assert scores and all(auto is not None for auto, _, _ in scores), (learner, cells)
    assert graded["left_two"] == [] and graded["left_one"] == []


def test_a_hang_and_a_dead_kernel_cost_their_own_time_and_say_so(graded):
    for key, expected in (("summary_two", not_graded_here(graded["summary_two"])),
                          ("summary_one", NOT_GRADED & AGAIN)):
        summary = graded[key]
        failed = {o.student: o for o in summary.failed}
        assert set(failed) == expected, graded["lines"]
        assert "kernel" in failed["gus_l17"].reason.lower(), failed["gus_l17"].reason
        assert failed["gus_l17"].seconds < LIMIT
        for o in summary.outcomes:
            if o.student not in expected:
                assert o.graded and o.seconds < LIMIT, o
    fay = {o.student: o for o in graded["summary_two"].outcomes}["fay_l17"]
    assert "time limit" in fay.reason and fay.seconds < LIMIT + 30
    text = "\n".join(graded["lines"])
    total = len(graded["everyone"])
    assert f"[{total}/{total}]" in text and "fay_l17: NOT GRADED" in text
    assert "gus_l17: NOT GRADED" in text
    dump = grading.gradebook_dump(course.gradebook_url(graded["two"]), NAME)
    for learner in NOT_GRADED:   # zero everywhere, waiting for the instructor
        grades = [v for k, v in dump[learner].items() if isinstance(v, tuple)]
        assert all(auto == 0 and manual_flag for auto, _, manual_flag in grades)
        assert not (graded["two"] / "feedback" / learner).exists()
    for learner in set(HONEST) - NOT_GRADED:
        assert (graded["two"] / "feedback" / learner / NAME / f"{NAME}.html").exists()
        assert (graded["two"] / "autograded" / learner / NAME / f"{NAME}.ipynb").exists()


def test_recording_in_any_order_gives_the_same_gradebook(graded, tmp_path):
    expected = grading.gradebook_dump(course.gradebook_url(graded["two"]), NAME)
    outcomes = graded["summary_two"].outcomes
    fresh = released_root(tmp_path / "fresh")   # every order starts from a copy of it
    # shuffled, with three results recorded twice (not doubled)
    shuffled = random.Random(1).sample(outcomes, len(outcomes))
    for order in (shuffled + shuffled[:3],):
        root = course_root(tmp_path / f"order{len(list(tmp_path.iterdir()))}")
        shutil.copy(fresh / "gradebook.db", root / "gradebook.db")
        with grading_job.open_gradebook(course.gradebook_url(root)) as gb:
            for outcome in order:
                grading.record(gb, NAME, outcome)
        assert grading.gradebook_dump(course.gradebook_url(root), NAME) == expected


def _cell(report: class_report.ClassReport, name: str) -> class_report.CellCounts:
    return next(c for c in report.cells if c.cell == name)


def test_report_names_each_variants_mistake_under_the_cell_it_spoils(graded):
    report = class_report.class_report(NAME, graded["two"])
    # the attackers whose answers are the solution's keep their marks (FULL), and so do the
    # limits an rlimit does not stop on this machine; the others score zero (ZEROED)
    not_graded = not_graded_here(graded["summary_two"])
    full_marks = (set(HONEST) - NOT_GRADED) | FULL | (set(STOPPED) - not_graded)
    for c in report.cells:
        losers = {s for s, v in BROKEN.items() if c.cell in v["loses"]} | {"ben_l17"}
        assert (c.full, c.partial, c.zero, c.not_graded, c.flagged) == (
            len(full_marks - losers), 0, len(losers | ZEROED), len(not_graded), len(FORGED)), c
        # the blank release is counted as not attempted, under every cell, and so is the
        # attacker who left the gather exercise blank
        blank = 1 + c.cell.startswith("gather")
        assert any(m.key == class_report.NOT_ATTEMPTED and m.count == blank
                   for m in c.mistakes), c
    for variant in (ROWS, ALL_REDUCE):
        learners = sorted(s for s, v in BROKEN.items() if v is variant)
        for words in variant["visible_says"]:
            hits = [(c.cell, m) for c in report.cells if c.cell in variant["loses"]
                    for m in c.mistakes if words in m.example]
            assert hits, f"{variant['name']!r}: no mistake under {variant['loses']} says {words!r}"
            for _, m in hits:
                assert m.count == len(learners) and m.learners == learners, m
    # a check's likely mistake is counted by its key from check/hints.py, not by its words,
    # and once: the exercise's own key for it is named beside it, not counted again
    comm = _cell(report, "gather_comm_tests")
    assert [(m.count, m.also) for m in comm.mistakes
            if m.key == "comm.all_reduce_for_all_gather"] == [(1, ["exercise.all_gather"])]
    assert not [m for m in comm.mistakes if m.key == "exercise.all_gather"]
    for c in report.cells:   # every learner's failure of a cell counted once
        counted = [learner for m in c.mistakes for learner in m.learners]
        assert len(counted) == len(set(counted)), c
    # the same mistake found on other inputs is one mistake
    rows = [m for m in _cell(report, "my_rows_tests").mistakes if set(m.learners) & set(BROKEN)]
    assert len(rows) == 1 and rows[0].key.startswith("CheckFailed: for n=# over # ranks")
    # the attackers whose kernels rewrite what they run never answer the tests' requests, and
    # the report says so in those words
    silent = [m for m in _cell(report, "my_rows_tests").mistakes
              if m.key.startswith("HarnessError: your kernel ran the grader's request")]
    assert [sorted(m.learners) for m in silent] == [
        ["mal_transformer"]], silent
    assert sorted(report.not_graded) == sorted(not_graded)
    assert report.totals["ada_l17"] == (9.0, 9.0) and report.totals["ben_l17"][0] == 0


def test_report_is_anonymous_unless_asked_in_the_terminal_html_and_csv(graded, capsys):
    root = graded["two"]
    assert cli.main(["report", NAME, "--root", str(root)]) == 0
    text = capsys.readouterr().out
    page = (root / "reports" / f"{NAME}.html").read_text()
    assert "my_rows_tests" in text and "comm.all_reduce_for_all_gather" in text
    assert "total score (out of 9)" in text
    assert "data:image/png;base64," in page and "comm.all_reduce_for_all_gather" in page
    for learner in graded["everyone"]:
        assert learner not in text and learner not in page
    assert cli.main(["report", NAME, "--root", str(root), "--csv", "--names"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    gather = next(r for r in rows if r["cell"] == "gather_comm_tests" and not r["mistake"])
    # full: ada, cy, dee and the attackers with the solution's answers; zero: eve, the blank
    # release and the attackers with no answer that counts
    not_graded = not_graded_here(graded["summary_two"])
    assert (gather["full"], gather["zero"], gather["not_graded"], gather["flagged"]) == (
        str(3 + len(FULL) + len(set(STOPPED) - not_graded)), str(2 + len(ZEROED)),
        str(len(not_graded)), str(len(FORGED)))
    rows_mistake = next(r for r in rows if r["cell"] == "my_rows_tests"
                        and r["mistake"].startswith("CheckFailed"))
    assert rows_mistake["learners"] == "cy_l17 dee_l17"
    assert rows_mistake["learners_with_mistake"] == "2"


def test_nbgrader_export_has_every_learners_score_after_the_late_penalty(graded, tmp_path):
    """Plain `nbgrader export`, as an instructor runs it in the course root: the course's
    exporter (grades_export.py) with names, and the late learner's points taken by nbgrader's
    "zero" penalty, which autograde computed in the job and the parent recorded."""
    root = graded["two"]
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))
    done = subprocess.run([sys.executable, "-m", "nbgrader", "export",
                           f"--to={tmp_path / 'grades.csv'}", "--GradesExport.names=True"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {r["student_id"]: r for r in csv.DictReader(open(tmp_path / "grades.csv"))}
    assert set(rows) == graded["everyone"]
    assert rows["ada_l17"]["score"] == "9" and rows["ada_l17"]["max_score"] == "9"
    assert rows["ben_l17"]["score"] == "0"
    assert rows["eve_l17"]["score"] == "6"   # gather_tests (2) and gather_comm_tests (1) lost
    [late] = LATE
    earned = 9 - sum(_cell(class_report.class_report(NAME, root), c).points
                     for c in ROWS["loses"])
    assert earned > 0 and rows[late]["raw_score"] == f"{earned:g}"
    assert (rows[late]["late_submission_penalty"], rows[late]["score"]) == (f"{earned:g}", "0")
    assert rows["cy_l17"]["late_submission_penalty"] == "0"   # the same answers, on time
    assert {s for s, r in rows.items() if r["needs_manual_grade"] == "True"} == (
        not_graded_here(graded["summary_two"]) | set(FORGED))
    # the progress line gives the learner's score, the penalty taken
    assert f"{late}: graded, 0 points (late penalty {earned:g})" in "\n".join(graded["lines"])


def test_release_feedback_releases_every_page_hand_placed_or_collected(graded, tmp_path):
    """`nbgrader release_feedback` reads timestamp.txt and submission_secret.txt beside each
    page and stopped at the first folder without them (every submission placed by hand). A
    collected submission's page goes where its learner's Assignment List looks for it."""
    root = graded["two"]
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))
    done = subprocess.run([sys.executable, "-m", "nbgrader", "release_feedback", NAME,
                           f"--Exchange.root={exchange}"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pages = sorted((root / "feedback").glob(f"*/{NAME}/{NAME}.html"))
    released = sorted((exchange / course.COURSE_ID / "feedback").glob("*.html"))
    assert len(pages) > 5 and len(released) == len(pages)
    [(late, (stamp, secret))] = LATE.items()
    expected = notebook_hash(secret=secret, notebook_id=NAME)
    assert (exchange / course.COURSE_ID / "feedback" / f"{expected}.html").read_bytes() == (
        root / "feedback" / late / NAME / f"{NAME}.html").read_bytes()
    assert (root / "feedback" / late / NAME / "timestamp.txt").read_text() == stamp
    placed = root / "feedback" / "ada_l17" / NAME
    assert parse_utc((placed / "timestamp.txt").read_text()) is not None
    assert len((placed / "submission_secret.txt").read_text()) == 128


def test_the_progress_line_gives_the_gradebooks_score():
    outcome = grading_job.Graded("ann", "", graded=True, seconds=3.0,
                                 scores={("nb", "a"): (4.0, False), ("nb", "b"): (2.0, False)})
    line = grading.progress_line
    assert line(1, 2, outcome, 1) == "[1/2] ann: graded, 6 points (3 s); 1 running"
    assert line(1, 2, outcome, 0, (6.0, 0.0)) == "[1/2] ann: graded, 6 points (3 s)"
    assert line(1, 2, outcome, 0, (6.0, 6.0)) == (
        "[1/2] ann: graded, 0 points (late penalty 6) (3 s)")
    assert line(1, 2, outcome, 0, (9.0, 0.0)) == (
        "[1/2] ann: graded, 9 points (6 automatic, with manual grades 9) (3 s)")


def test_a_hand_placed_submission_keeps_its_feedback_secret_across_gradings(tmp_path):
    submitted = tmp_path / "submitted"
    submitted.mkdir()
    first = grading.feedback_receipt(submitted, None)
    assert parse_utc(first["timestamp.txt"]) is not None and len(first["submission_secret.txt"]) == 128
    assert grading.feedback_receipt(submitted, None, first) == first
    assert grading.feedback_receipt(submitted, None)["submission_secret.txt"] != (
        first["submission_secret.txt"])
    (submitted / "timestamp.txt").write_text("2026-12-01 14:30:00.000000 UTC")
    (submitted / "submission_secret.txt").write_text("abc")
    assert grading.feedback_receipt(submitted, None, first) == {
        "timestamp.txt": "2026-12-01 14:30:00.000000 UTC", "submission_secret.txt": "abc"}


def test_a_rerun_grades_only_what_changed_unless_forced(graded):
    root = graded["one"]
    again = grading.grade_class(NAME, root=root, jobs=2, timeout=LIMIT, say=lambda _: None)
    assert again.outcomes == [] and sorted(again.skipped) == sorted(AGAIN)
    hand_in(root, "cy_l17", source_notebook(NAME))   # cy hands in a fixed notebook
    fixed = grading.grade_class(NAME, root=root, jobs=2, timeout=LIMIT, say=lambda _: None)
    assert [o.student for o in fixed.outcomes] == ["cy_l17"] and fixed.outcomes[0].graded
    rows = {r.student_id: r for r in grades_export.course_grades(root, [NAME])}
    assert rows["cy_l17"].score == 9
    # forced: graded again though unchanged (the learner whose kernel dies: the quickest)
    forced = grading.grade_class(NAME, root=root, jobs=2, timeout=LIMIT, force=True,
                                 students=["gus_l17"], say=lambda _: None)
    assert [(o.student, o.graded) for o in forced.outcomes] == [("gus_l17", False)]
    assert forced.skipped == []
    rows = {r.student_id: r for r in grades_export.course_grades(root, [NAME])}
    assert rows["cy_l17"].score == 9 and len(rows) == len(AGAIN)
    assert run_processes(fixed.run_id) == [] and run_processes(forced.run_id) == []


def test_bad_requests_are_refused_before_anything_runs(tmp_path):
    root = course_root(tmp_path / "c")
    assert cli.main(["report", NAME, "--root", str(root)]) == 2   # no gradebook: one line
    assert not (root / "gradebook.db").exists()
    with pytest.raises(ValueError, match="no such assignment"):
        grading.grade_class("99_nothing", root=root)
    with pytest.raises(ValueError, match="jobs=0"):
        grading.grade_class(NAME, root=root, jobs=0)
    with pytest.raises(ValueError, match="no submission of 00_launch .* for: zed"):
        grading.grade_class(NAME, root=root, students=["zed"])
    with pytest.raises(SystemExit):
        cli.main(["grade", NAME, "--jobs", "0"])


def test_a_failure_is_keyed_by_its_hints_else_by_its_masked_advice_or_message():
    keys = class_report.failure_keys
    assert keys("CheckFailed", "bad\nLikely mistake: x\n[hint: comm.a] [hint: exercise.b]") == [
        "comm.a", "exercise.b"]
    assert keys("CheckFailed", "for n=10 over 4 ranks your rows are [[0, 1], [2]]: why") == (
        keys("CheckFailed", "for n=7 over 2 ranks your rows are [[0], [1, [2]]]: why"))
    # a hint without a key: keyed by its words, whatever the numbers of the case before it
    assert keys("CheckFailed", "x differs by 0.5 on rank 1\nLikely mistake: summed over 4 ranks") \
        == keys("CheckFailed", "x differs by 2 on rank 3\nLikely mistake: summed over 2 ranks") \
        == ["mistake: summed over # ranks"]
    assert keys("NotImplementedError", "") == [class_report.NOT_ATTEMPTED]
    assert keys("LaunchError", "rank 0 raised NotImplementedError") == [
        class_report.NOT_ATTEMPTED]
    assert keys("CellTimeoutError", "") == [class_report.TIMEOUT]


def test_feedback_keeps_what_nbgrader_release_feedback_reads_and_no_learner_file(tmp_path):
    """Beside the feedback page: the submission's timestamp and secret (release_feedback reads
    both and hands the learner the page alone), from the course's copy, nothing else: not a
    learner's own .html (release_feedback would hand it out, to run in a browser)."""
    root = tmp_path / "root"
    handed = root / "submitted" / "ada_l17" / NAME
    handed.mkdir(parents=True)
    for record, text in (("timestamp.txt", "2026-01-01 10:00:00 UTC"),
                         ("submission_secret.txt", "s3cret"), ("notes.txt", "mine")):
        (handed / record).write_text(text)
    made = tmp_path / "scratch" / "feedback" / "ada_l17" / NAME
    made.mkdir(parents=True)
    (made / f"{NAME}.html").write_text("<html>feedback</html>")
    (made / "notes.txt").write_text("mine")
    (made / "mine.html").write_text("<script>steal()</script>")
    grading._install(root, NAME, grading_job.Graded(
        "ada_l17", "", graded=True, scratch=tmp_path / "scratch",
        scores={(NAME, "my_rows_tests"): (1.0, False)}))
    feedback = root / "feedback" / "ada_l17" / NAME
    assert sorted(p.name for p in feedback.iterdir()) == [
        f"{NAME}.html", "submission_secret.txt", "timestamp.txt"]
    assert (feedback / "timestamp.txt").read_text() == "2026-01-01 10:00:00 UTC"


def test_a_job_that_breaks_costs_its_own_submission_only(tmp_path, monkeypatch):
    """The parent's side alone (no nbgrader run): a job raising is recorded as not graded,
    with zero points and its error as the reason, and the other submissions go on."""
    root = released_root(tmp_path / "c")
    for learner in ("ok_l17", "broken_l17"):
        hand_in(root, learner, source_notebook(NAME))

    def fake(name, student, folder, **kw):
        if student == "broken_l17":
            raise OSError("No space left on device")
        out = grading_job.Graded(student, grading_job.fingerprint(
            folder, root / "solutions" / NAME), graded=True)
        with grading_job.open_gradebook(course.gradebook_url(root)) as gb:
            for g in gb.find_notebook(NAME, NAME).grade_cells:
                out.scores[(NAME, g.name)] = (g.max_score, False)
        return out

    monkeypatch.setattr(grading, "grade_one", fake)
    lines: list[str] = []
    summary = grading.grade_class(NAME, root=root, jobs=2, say=lines.append)
    [failed] = summary.failed
    assert failed.student == "broken_l17" and "OSError: No space left" in failed.reason
    rows = {r.student_id: r for r in grades_export.course_grades(root, [NAME])}
    assert rows["ok_l17"].score == 9 and rows["broken_l17"].score == 0
    assert rows["broken_l17"].needs_manual_grade
    assert any("broken_l17: NOT GRADED: grading failed: OSError" in line for line in lines)
    again = grading.grade_class(NAME, root=root, jobs=2, say=lines.append)
    assert [o.student for o in again.outcomes] == ["broken_l17"]   # tried again: no fingerprint


def test_a_notebook_under_another_name_is_not_graded_and_says_the_name_expected(tmp_path):
    """nbgrader alone would say "did you forget to run generate_assignment?"."""
    import nbformat

    root = released_root(tmp_path / "c")
    folder = root / "submitted" / "hal_l17" / NAME
    folder.mkdir(parents=True)
    nbformat.write(source_notebook(NAME), folder / f"{NAME} (1).ipynb")
    summary = grading.grade_class(NAME, root=root, jobs=1, sandboxed=False, say=lambda _: None)
    [failed] = summary.failed
    assert failed.student == "hal_l17" and not failed.graded
    assert f"expected {NAME}.ipynb in the submission, found {NAME} (1).ipynb" in failed.reason
    rows = {r.student_id: r for r in grades_export.course_grades(root, [NAME])}
    assert rows["hal_l17"].score == 0 and rows["hal_l17"].needs_manual_grade


# -- the keys the report counts ------------------------------------------------------------------


def test_every_likely_mistake_has_its_own_key():
    keys = [h.key for h in hints.COMM_HINTS + hints.SCALE_HINTS]
    assert len(set(keys)) == len(keys)
    assert not {"comm.grader", "scale.grader"} & set(keys)


@pytest.mark.parametrize("case", range(len(COMM_CASES)))
def test_a_comm_failure_prints_the_key_of_its_hint(case):
    calls, expected, kw, _ = COMM_CASES[case]   # one case per COMM_HINTS entry, in order
    msg = comm_failure(trace_of(*calls), expected, **kw)
    assert class_report.failure_keys("CheckFailed", msg)[-1] == hints.COMM_HINTS[case].key


def test_an_exercises_own_words_and_a_scale_hint_are_keyed():
    calls, expected, kw, _ = COMM_CASES[4]      # an all_reduce where an all_gather belongs
    msg = comm_failure(trace_of(*calls), expected, hints={"all_gather": "use one all_gather"})
    assert class_report.failure_keys("CheckFailed", msg) == [
        "exercise.all_gather", "comm.all_reduce_for_all_gather"]
    e = torch.arange(1.0, 5.0)
    assert hints.keyed_scale_hint(4 * e, e, 1e-6, 1e-6, world=4)[0] == (
        "scale.sum_over_ranks_not_divided")
    assert hints.keyed_scale_hint(4 * e, e, 1e-6, 1e-6, world=4)[1].startswith(
        "every element is 4x")


# the trust tests grade on the same class; tests/end_to_end/grading_trust.py says why they are
# collected here
from tests.end_to_end.grading_trust import *  # noqa: E402, F403
