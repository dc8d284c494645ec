"""Grades a class can trust: every attack on the grader, handed in as a 00_launch submission
in a class graded the documented way (tests/end_to_end/grading_class.py: two jobs, the sandbox,
tight limits, a relative --root), is harmless: honest learners are graded exactly as alone, nothing
outside a job is read or changed, no attack earns a mark its answers do not, a write into the
library is zeroed and flagged with its reason, every limit ends its own job and says so, nothing is
left running or lying in the temp folder, and feedback is one HTML page without a hidden test, in
any encoding the learner could print it in.

Its tests run as tests/end_to_end/test_class_grading.py's, which imports them (and whose marks they
take): both grade on the one class of conftest.graded_class, a session fixture of minutes, and
pytest-xdist runs one test file's tests on one worker (--dist=loadfile), so the class is graded
once.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

from dpmp_lab import cli
from dpmp_lab._helpers import PACKAGE_DIR, PACKAGE_HOME
from dpmp_lab.instructor import class_report, course, grading, grading_job, nbgrader_plugin, sandbox
from tests.conftest import ROOT
from tests.end_to_end.grading_class import (
    CHECKOUT,
    FORGED,
    FULL,
    LINKED,
    NAME,
    ROWS,
    STOPPED,
    VICTIM,
    ZEROED,
    not_graded_here,
    released_root,
    stopped_here,
    tree_hash,
)
from tests.support.notebook_sources import source_notebook


def _scores(root) -> dict[str, dict[str, tuple]]:
    dump = grading.gradebook_dump(course.gradebook_url(root), NAME)
    return {s: {k[1]: v for k, v in cells.items() if isinstance(v, tuple)}
            for s, cells in dump.items()}


def test_honest_learners_are_graded_as_if_alone(graded_class):
    scores = _scores(graded_class["two"])
    assert sum(a for a, _, _ in scores["ada_l17"].values()) == 9
    assert not any(flag for _, _, flag in scores["ada_l17"].values())
    assert all(a == 0 for a, _, _ in scores["ben_l17"].values())
    lost = {cell for cell, (a, _, _) in scores["cy_l17"].items() if a == 0}
    assert lost == set(ROWS["loses"])
    for learner, outcome in graded_class["outcomes"].items():
        if not learner.startswith("mal_"):
            assert not outcome.flagged, (learner, outcome.flagged)
    # no GPU here: every launch of the class's jobs ran under the device audit, as on a GPU
    # server the solution passes it (tests/end_to_end/test_course.py grades device mistakes under
    # it)
    assert any("under the device audit" in line for line in graded_class["lines"])


def test_the_grader_turns_the_audit_on_by_the_launchers_own_variable():
    from dpmp_lab.launcher import launch

    assert grading_job.AUDIT_ENV == launch.AUDIT_ENV


def test_nothing_outside_a_job_is_read_or_changed(graded_class):
    root = graded_class["two"]
    for path, digest in graded_class["before"].items():
        assert tree_hash(root / path) == digest, f"{path} changed"
    assert b"pwned" not in (root / "gradebook.db").read_bytes()
    # what the attacker printed, as the instructor's autograded notebook keeps it (its
    # feedback masks the server's paths)
    graded = nbformat.read(root / "autograded" / "mal_reach" / NAME / f"{NAME}.ipynb",
                           as_version=4)
    printed = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", [])
                      if o.get("output_type") == "stream")
    found = re.findall(r"REACH (\{.*?\})\n", printed)
    assert found, "the attacker's report is missing from its own autograded notebook"
    reach = json.loads(found[-1])
    course_paths = [p for p in reach if p.startswith(str(root.resolve()))]
    assert len(course_paths) == 6
    checkout = [str(ROOT / p) for p in CHECKOUT]
    for path in course_paths + checkout:   # the course root and the checkout are not there
        assert reach[path] == "FileNotFoundError", (path, reach[path])
    assert reach["network"] != "CONNECTED" and reach["other jobs"] == []
    assert reach["environ"] != "GRADER" and reach["memory"] != "WRITABLE", reach
    assert reach["host uid"] != 0, reach   # never root on the host
    assert sum(a for a, _, _ in _scores(root)["mal_reach"].values()) == 9   # its own answers
    assert not graded_class["outcomes"]["mal_reach"].flagged


def test_every_write_into_the_library_is_zeroed_and_flagged_with_its_reason(graded_class):
    scores = _scores(graded_class["two"])
    for learner, words in FORGED.items():
        outcome = graded_class["outcomes"][learner]
        assert outcome.graded and outcome.flagged, (learner, outcome.reason)
        assert any(words.lower() in reason.lower() for reason in outcome.flagged), (
            learner, outcome.flagged)
        assert all(a == 0 and flag for a, _, flag in scores[learner].values()), learner
    text = "\n".join(graded_class["lines"])
    assert "mal_snapshot: FLAGGED for manual grading, 0 points" in text


def test_no_attack_earns_a_mark_its_answers_do_not(graded_class):
    """The kernel's shell, answers that always compare equal, the library's reference kept in
    a default argument: zero on every cell, graded, nothing to flag (the tests never ran where
    the attack did). The attackers whose answers are the solution's get its marks, no more."""
    scores = _scores(graded_class["two"])
    for learner in ZEROED:
        outcome = graded_class["outcomes"][learner]
        assert outcome.graded and not outcome.flagged, (learner, outcome.reason, outcome.flagged)
        assert all(a == 0 for a, _, _ in scores[learner].values()), (learner, scores[learner])
    for learner in FULL:
        assert sum(a for a, _, _ in scores[learner].values()) == 9, learner
        assert not graded_class["outcomes"][learner].flagged, learner
    rows = _text(graded_class["two"] / "feedback" / "mal_subclass" / NAME / f"{NAME}.html")
    assert "shard_range is switched off here" in rows   # the default argument met the switch


def test_a_link_is_never_followed_and_a_bad_file_costs_its_learner_alone(graded_class):
    """The notebook a link to the course's solution, links to the gradebook and /etc/shadow:
    not graded, the link named, nothing of their targets in the course's folders. A secret
    that is not UTF-8: its learner graded on its answers, and the class recorded."""
    root = graded_class["two"]
    for learner, words in LINKED.items():
        outcome = graded_class["outcomes"][learner]
        assert not outcome.graded and words in outcome.reason, (learner, outcome.reason)
        assert "a link is never followed" in outcome.reason
        assert not (root / "autograded" / learner).exists()
        assert not (root / "feedback" / learner).exists()
    shadow = Path("/etc/shadow").read_bytes()[:64] if os.access("/etc/shadow", os.R_OK) else None
    for folder in ("autograded", "feedback"):
        for path in (root / folder).rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert b"SQLite format 3" not in data[:16] and (not shadow or shadow not in data)
    assert graded_class["outcomes"]["mal_markup"].graded
    assert len((root / "feedback" / "mal_markup" / NAME / "submission_secret.txt")
               .read_text()) == 128   # a new one, beside the page


def test_no_learner_markup_is_live_in_the_pages_that_show_it(graded_class):
    """Script in a markdown and a raw cell the learner added, in HTML, SVG and JavaScript
    outputs: the instructor's autograded notebook (what formgrader shows) holds none of it
    live, and the feedback page runs no script at all (its policy) and holds none of it as
    markup. tests/end_to_end/test_inert_pages.py opens both pages in Chromium."""
    from dpmp_lab.instructor import inert
    from tests.support.inert_vectors import live_parts

    root = graded_class["two"]
    graded = nbformat.read(root / "autograded" / "mal_markup" / NAME / f"{NAME}.ipynb",
                           as_version=4)
    own = inert.own_sources({"db_url": course.gradebook_url(root), "assignment": NAME,
                             "notebook": NAME})
    assert own and live_parts(graded, own) == []
    page = (root / "feedback" / "mal_markup" / NAME / f"{NAME}.html").read_text()
    assert inert.FEEDBACK_CSP in html.unescape(page)
    live = _live_markup(page)
    assert not live, live[:5]
    assert "PWNED:md" in html.unescape(page)   # shown, as text


def _live_markup(page: str) -> list[str]:
    """What of an HTML page a browser would run: a script that mentions the learner's marks,
    an event attribute, a javascript: link (the learner's code, shown as text, is not)."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Reader(HTMLParser):
        script = False

        def handle_starttag(self, tag: str, attrs: list) -> None:
            self.script = tag == "script"
            found.extend(f"<{tag} {k}>" for k, v in attrs if k.startswith("on")
                         or (v or "").strip().lower().startswith("javascript:"))

        def handle_data(self, data: str) -> None:
            if self.script and "PWNED" in data:
                found.append(data)

    Reader().feed(page)
    return found


def test_a_transformer_that_saw_every_cell_saw_no_test(graded_class):
    """The transformer kept every cell the learner's kernel ran and printed them, base64, from
    a cell the learner added: none of them is a test cell, visible or hidden."""
    root = graded_class["two"]
    page = _text(root / "feedback" / "mal_transformer" / NAME / f"{NAME}.html")
    [seen] = re.findall(r"SEEN ([A-Za-z0-9+/=]+)", page)
    seen = base64.b64decode(seen).decode()
    assert "def my_rows" in seen or "raise NotImplementedError" in seen   # it did run
    tests = [c.source for c in source_notebook(NAME).cells
             if c.metadata.get("nbgrader", {}).get("grade")]
    leaked = [line for src in tests for line in src.splitlines()
              if len(line.strip()) > 20 and line.strip() in seen]
    assert not leaked, leaked[:3]


def test_every_limit_ends_its_job_with_the_reason(graded_class):
    for learner in stopped_here(graded_class["summary_two"]):
        words = STOPPED[learner]
        outcome = graded_class["outcomes"][learner]
        assert not outcome.graded and words in outcome.reason, (learner, outcome.reason)
        assert f"{learner}: NOT GRADED: stopped: " in "\n".join(graded_class["lines"])
        assert not (graded_class["two"] / "autograded" / learner).exists()
    report = class_report.class_report(NAME, graded_class["two"])
    assert "output limit" in report.not_graded["mal_flood"]


def test_nothing_is_left_running_or_in_the_temp_folder(graded_class):
    assert graded_class["left_two"] == [] and graded_class["left_one"] == []
    assert graded_class["tmp_left"] == []


def test_feedback_is_the_page_and_nbgraders_two_files_and_holds_no_hidden_test(graded_class):
    root = graded_class["two"]
    hidden = nbgrader_plugin.hidden_lines(source_notebook(NAME))
    assert len(hidden) > 10
    files = [p for p in (root / "feedback").rglob("*") if p.is_file()]
    # beside each page, what `nbgrader release_feedback` reads (written by the grader)
    assert {p.name for p in files if p.suffix != ".html"} == {"timestamp.txt",
                                                              "submission_secret.txt"}
    pages = [p for p in files if p.suffix == ".html"]
    assert {p.name for p in pages} == {f"{NAME}.html"}
    assert {p.parent.parent.name for p in pages} == (
        graded_class["everyone"] - not_graded_here(graded_class["summary_two"]))
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"{page}: {leaked[:3]}"


def _text(page) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_feedback_shows_no_server_path_and_ranks_that_failed_alike_once(graded_class):
    """The attacker who reached out printed where the package, torch and Python lie: the
    instructor's autograded notebook keeps the paths, the learner's page names the files
    without them, and no page holds a path of the checkout or the Python installation. The
    blank release's stub raised in both ranks of a launch: one traceback, naming both."""
    root = graded_class["two"]
    server = [str(PACKAGE_HOME), sys.prefix, sys.base_prefix]
    autograded = (root / "autograded" / "mal_reach" / NAME / f"{NAME}.ipynb").read_text()
    assert str(PACKAGE_DIR / "__init__.py") in autograded and sys.prefix in autograded
    for page in (root / "feedback").rglob("*.html"):
        text = _text(page)
        assert not [path for path in server if path in text], page
    # one print may reach the page as several stream outputs (the kernel sends what it has
    # every so often), so the words are compared with their spacing made one
    reach = " ".join(_text(root / "feedback" / "mal_reach" / NAME / f"{NAME}.html").split())
    assert ("WHERE dpmp_lab/__init__.py <site-packages>/torch/__init__.py "
            "<python>/json/__init__.py") in reach
    blank = _text(root / "feedback" / "ben_l17" / NAME / f"{NAME}.html")
    launches = blank.split("LaunchError: ")[1:]   # gather_tests, gather_comm_tests
    assert any("ranks 0, 1 raised NotImplementedError" in text for text in launches)
    for text in launches:   # (a rank stopped before it reported is named alone, rightly)
        assert not ("rank 0 raised NotImplementedError" in text
                    and "rank 1 raised NotImplementedError" in text)


def test_the_report_lists_the_flagged_with_their_reasons(graded_class):
    report = class_report.class_report(NAME, graded_class["two"])
    assert set(report.flagged) == set(FORGED)
    text = class_report.text_report(report, names=True)
    assert "flagged for manual grading, a forgery suspected" in text and "mal_snapshot" in text
    assert "mal_snapshot" not in class_report.text_report(report)   # anonymous by default


def test_the_victims_submission_is_untouched(graded_class):
    root = graded_class["two"]
    assert graded_class["before"][f"submitted/{VICTIM}/{NAME}"] == tree_hash(
        root / "submitted" / VICTIM / NAME)
    assert sum(a for a, _, _ in _scores(root)[VICTIM].values()) == 9


def test_grading_refuses_to_run_unsandboxed_unless_told(tmp_path, monkeypatch, capsys):
    root = released_root(tmp_path / "c")
    folder = root / "submitted" / "ok_l21" / NAME
    folder.mkdir(parents=True)
    nbformat.write(source_notebook(NAME), folder / f"{NAME}.ipynb")
    monkeypatch.setattr(sandbox, "problem", lambda: "bubblewrap is not installed")
    with pytest.raises(grading.SandboxUnavailable, match="--no-sandbox"):
        grading.grade_class(NAME, root=root)
    assert cli.main(["grade", NAME, "--root", str(root)]) == 2
    assert "bubblewrap is not installed" in capsys.readouterr().err

    def fake(name, student, folder, *, settings, live=None):
        assert settings.sandbox is False
        return grading_job.Graded(student, "", graded=False, reason="not run")

    monkeypatch.setattr(grading, "grade_one", fake)
    lines: list[str] = []
    grading.grade_class(NAME, root=root, sandboxed=False, say=lines.append)
    assert lines[1].startswith("WARNING: grading WITHOUT the sandbox")
    assert "graded WITHOUT the sandbox" in lines[-1]


def test_grading_says_when_the_instructors_folders_are_readable_by_others(tmp_path):
    (tmp_path / "solutions").mkdir(mode=0o755)
    (tmp_path / "gradebook.db").write_bytes(b"")
    (tmp_path / "gradebook.db").chmod(0o644)
    (tmp_path / "solutions").chmod(0o755)
    assert grading.exposed_to_others(tmp_path) == ["solutions/", "gradebook.db"]
    (tmp_path / "solutions").chmod(0o700)
    (tmp_path / "gradebook.db").chmod(0o600)
    assert grading.exposed_to_others(tmp_path) == []
