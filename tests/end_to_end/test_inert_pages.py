"""No learner script runs in the feedback page or in formgrader's page: tested in headless
Chromium on a notebook that holds every vector (tests/support/inert_vectors.py), rendered by
nbgrader's own steps. Two course roots share it: one with the course's nbgrader_config.py, one with
nbgrader's defaults (bare), which shows that the same pages run the learner's script without
dpmp_lab (so the probe can fail). In each, ada's autograded notebook is as the learner made it and
bob's is what dpmp_lab's autograde writes (InertNotebook last).

- feedback: `nbgrader generate_feedback` in each root; the course's page also without its
  Content-Security-Policy (the notebook alone is inert) and the bare page with it (the policy
  alone stops the script);
- formgrader: a Jupyter server in each root, and its submission page for ada and bob: the
  course's formgrader makes ada's notebook inert as it renders it; bare formgrader shows
  bob's inert as written;
- autograde: `nbgrader autograde` with the course's configuration, on a small assignment whose
  learner wrote a vector cell and displayed HTML, JavaScript and markdown, writes the
  notebook inert (no browser needed).

Every page is loaded, every link in the notebook clicked, and the console watched for the
vectors' `PWNED:` lines. Marked slow: it drives a browser (about 60 s on 2 cores). Pictures
of every page and the servers' logs go to test-artifacts/inert/.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest

from dpmp_lab.instructor.course import nbgrader
from dpmp_lab.instructor.inert import FEEDBACK_CSP, InertNotebook
from tests.conftest import ROOT
from tests.support.browser_pages import (
    CHROMIUM_ARGS,
    chromium_path,
    descendants,
    free_port,
    playwright_api,
    stop_group,
    wait_for,
)
from tests.support.inert_vectors import (
    ASSIGNMENT,
    MARK,
    MARKDOWN,
    NOTEBOOK,
    VECTORS,
    gradebook,
    live_parts,
    log,
    vector_notebook,
)

pytestmark = pytest.mark.slow

BARE_CONFIG = 'c = get_config()  # noqa: F821\nc.CourseDirectory.course_id = "dpmp_lab"\n'
# What runs in nbgrader's own pages when nothing makes the notebook inert: what the probe must
# see, so that seeing nothing elsewhere means something. Not every vector: both templates show
# an SVG output as an <img> (where no script runs) and clean a raw cell's HTML, the feedback
# page loads no jQuery (so a JavaScript output fails on its first line), and widget state and
# streams are escaped.
LIVE_IN_FEEDBACK = frozenset({"md-script", "md-img", "md-link", "md-iframe", "md-svg",
                              "md-object", "md-style", "md-changed", "md-claimed",
                              "html-script", "html-img", "html-svg", "html-link", "mdout-img",
                              "mdout-link", "png-width"})
LIVE_IN_FORMGRADER = LIVE_IN_FEEDBACK | {"js"}
ARTIFACTS = ROOT / "test-artifacts" / "inert"
TOOLS = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


@dataclass
class Course:
    root: Path
    ids: dict[str, str]
    url: str = ""
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: subprocess.Popen | None = None
    log: Any = None

    def feedback(self, student: str) -> Path:
        return self.root / "feedback" / student / ASSIGNMENT / f"{NOTEBOOK}.html"

    def submission(self, student: str) -> str:
        return f"{self.url}/formgrader/submissions/{self.ids[student]}/?token={self.token}"


def _course(root: Path, config: str) -> Course:
    """A course root with the vector notebook autograded for ada (as the learner made it) and
    bob (as dpmp_lab's autograde writes it), and their feedback made by nbgrader."""
    root.mkdir()
    (root / "nbgrader_config.py").write_text(config)
    db_url = f"sqlite:///{root / 'gradebook.db'}"
    course = Course(root, gradebook(db_url, ["ada", "bob"]))
    resources = {"nbgrader": {"db_url": db_url, "assignment": ASSIGNMENT, "notebook": NOTEBOOK,
                              "student": "bob"}}
    made = {"ada": vector_notebook(),
            "bob": InertNotebook().preprocess(vector_notebook(), resources)[0]}
    for student, nb in made.items():
        path = root / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    nbgrader("generate_feedback", ASSIGNMENT, "--force", root=root)
    return course


def _start(course: Course, home: Path) -> None:
    """A Jupyter server (formgrader included) in the course root, as an instructor runs one."""
    for name in ("config", "data", "runtime"):
        (home / name).mkdir(parents=True)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               PATH=TOOLS)
    port = free_port()
    course.url = f"http://127.0.0.1:{port}"
    log = open(ARTIFACTS / f"server-{course.root.name}.log", "w")  # noqa: SIM115 - stop_group
    course.proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser",
         "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={course.token}", f"--ServerApp.root_dir={course.root}"],
        cwd=course.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    course.log = log


def _ready(course: Course) -> bool:
    if course.proc.poll() is not None:
        raise AssertionError(f"the Jupyter server in {course.root} exited with "
                             f"{course.proc.returncode}")
    try:
        with urllib.request.urlopen(f"{course.url}/api/status?token={course.token}", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def courses(tmp_path_factory):
    chromium_path()   # skip before building anything when the browser or playwright is missing
    playwright_api()
    tmp = tmp_path_factory.mktemp("inert")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)   # only this run's pictures and logs
    ARTIFACTS.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as env:   # nbgrader's gradebook runs alembic by name
        env.setenv("PATH", TOOLS)
        made = {"course": _course(tmp / "course", (ROOT / "nbgrader_config.py").read_text()),
                "bare": _course(tmp / "bare", BARE_CONFIG)}
    for name, course in made.items():
        _start(course, tmp / f"{name}-jupyter")
    try:
        for course in made.values():
            wait_for(lambda c=course: _ready(c), 120, f"no Jupyter server in {course.root}")
        yield made
    finally:
        left = [p for c in made.values() if c.proc
                for p in stop_group(c.proc, c.log, signal.SIGTERM, descendants(c.proc.pid),
                                    grace=5)]
        assert left == [], f"processes outlived the Jupyter servers: {left}"


@pytest.fixture(scope="module")
def browser(courses):
    api = playwright_api()
    with api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS,
                                     headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def _local(url: str) -> bool:
    return url.startswith(("file:", "data:", "about:", "http://127.0.0.1:"))


@dataclass
class Visit:
    ran: set[str]
    text: str
    html: str


def visit(browser, url: str, name: str, expect: frozenset[str] = frozenset()) -> Visit:
    """Load the page (nothing outside this machine), click every link in the notebook, and
    collect the vectors that ran: until `expect` have, or 2 s after the clicks. The page's
    picture goes to test-artifacts/inert/<name>.png."""
    context = browser.new_context()
    context.route("**/*", lambda route: route.continue_() if _local(route.request.url)
                  else route.abort())
    page = context.new_page()
    ran: set[str] = set()
    page.on("console", lambda m: ran.add(m.text[len(MARK):]) if m.text.startswith(MARK) else 0)
    try:
        page.goto(url, wait_until="load")
        at = page.url.split("#")[0]
        links = page.locator("#notebook-container a[href]")
        for i in range(links.count()):   # one at a time: a later click cancels an earlier one
            links.nth(i).evaluate("a => a.click()")
            page.wait_for_timeout(100)
        if expect:   # waiting in the page lets its console events in
            wait_for(lambda: expect <= ran or page.wait_for_timeout(200), 20,
                     f"{url}: only {sorted(ran)} of {sorted(expect)} ran")
        page.wait_for_timeout(2000)
        assert page.url.split("#")[0] == at, f"a link took the page away: {page.url}"
        page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)
        return Visit(ran, page.inner_text("#notebook-container"),
                     page.inner_html("#notebook-container"))
    finally:
        context.close()


def _page(path: Path, html: str) -> str:
    path.write_text(html)
    return path.as_uri()


def _shows_what_it_keeps(page: Visit) -> None:
    assert "<b>own</b>" in page.html   # the notebook's own markup
    assert re.search(r"<td>all_reduce</td>\s*<td>4096</td>", page.html)   # a table output
    assert "<b>html kept</b>" in page.html
    assert re.search(r"<img[^>]* src=\"data:image/svg\+xml;base64,", page.html)   # the picture
    assert f"<script>console.log('{MARK}md-script')</script>" in page.text   # shown as source


def test_the_probe_sees_learner_script_in_nbgrader_s_own_pages(courses, browser):
    bare = courses["bare"]
    feedback = visit(browser, bare.feedback("ada").as_uri(), "bare-feedback-ada",
                     LIVE_IN_FEEDBACK)
    formgrader = visit(browser, bare.submission("ada"), "bare-formgrader-ada",
                       LIVE_IN_FORMGRADER)
    assert feedback.ran == LIVE_IN_FEEDBACK, sorted(feedback.ran ^ LIVE_IN_FEEDBACK)
    assert formgrader.ran == LIVE_IN_FORMGRADER, sorted(formgrader.ran ^ LIVE_IN_FORMGRADER)
    assert LIVE_IN_FORMGRADER <= VECTORS


def test_feedback_page_runs_no_learner_script(courses, browser):
    course = courses["course"]
    for student in ("ada", "bob"):
        page = visit(browser, course.feedback(student).as_uri(), f"feedback-{student}")
        assert page.ran == set(), (student, sorted(page.ran))
        assert "secret_hidden_check" not in course.feedback(student).read_text()
        assert "[a line of the hidden tests]" in page.text
        _shows_what_it_keeps(page)


def test_feedback_page_is_inert_without_its_policy_and_the_policy_alone_stops_script(
        courses, browser, tmp_path):
    html = courses["course"].feedback("ada").read_text()
    policy = f'<meta http-equiv="Content-Security-Policy" content="{FEEDBACK_CSP}">'
    assert html.count(policy) == 1 and html.index(policy) < html.index("<style")
    without = visit(browser, _page(tmp_path / "without.html", html.replace(policy, "")),
                    "feedback-ada-without-policy")
    assert without.ran == set(), sorted(without.ran)
    bare = courses["bare"].feedback("ada").read_text()
    only_policy = visit(browser, _page(tmp_path / "policy.html",
                                       bare.replace("<head>", "<head>\n" + policy, 1)),
                        "bare-feedback-ada-with-policy")
    assert only_policy.ran == set(), sorted(only_policy.ran)


def test_formgrader_page_runs_no_learner_script(courses, browser):
    for root, student in (("course", "ada"), ("course", "bob"), ("bare", "bob")):
        page = visit(browser, courses[root].submission(student), f"{root}-formgrader-{student}")
        assert page.ran == set(), (root, student, sorted(page.ran))
        _shows_what_it_keeps(page)


LEARNER_CODE = f"""from IPython.display import HTML, Javascript, Markdown, display
display(HTML("<b>kept</b><script>{log('ag-html')}</script>"))
display(Javascript("{log('ag-js')}"))
display(Markdown("[a link](javascript:{log('ag-md')})"))"""


def test_nbgrader_autograde_writes_the_notebook_inert(tmp_path, monkeypatch):
    """The course's configuration in nbgrader's own autograde (the kernel outside the sandbox:
    this learner's code is the test's): the learner's markdown shows as its source, their
    outputs are cleaned, the notebook's own markup stays."""
    monkeypatch.setenv("PATH", TOOLS)
    (tmp_path / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    own = nbformat.v4.new_markdown_cell("# Intro, <b>own</b>")
    own.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True,
                                "task": False, "grade_id": "intro", "schema_version": 3}
    source = nbformat.v4.new_notebook(cells=[own], metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    (tmp_path / "solutions" / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(source, tmp_path / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
    nbgrader("generate_assignment", ASSIGNMENT, root=tmp_path)
    handed_in = nbformat.read(tmp_path / "course" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", 4)
    handed_in.cells += [nbformat.v4.new_markdown_cell(MARKDOWN["md-img"]),
                        nbformat.v4.new_code_cell(LEARNER_CODE)]
    (tmp_path / "submitted" / "ada" / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(handed_in, tmp_path / "submitted" / "ada" / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
    nbgrader("autograde", ASSIGNMENT, "--create", "--GuardedExecute.sandbox=False",
             root=tmp_path)
    made = nbformat.read(tmp_path / "autograded" / "ada" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", 4)
    assert made.cells[0].source == own.source
    assert made.cells[1].source.endswith(f"~~~\n{MARKDOWN['md-img']}\n~~~\n")
    outputs = [out.get("data", {}) for out in made.cells[2].outputs]
    assert [sorted(data) for data in outputs] == [["text/html", "text/plain"], ["text/plain"],
                                                  ["text/plain"]], outputs
    assert outputs[0]["text/html"].startswith("<b>kept</b>&lt;script&gt;")
    assert live_parts(made, {"intro": ("markdown", own.source)}) == []
