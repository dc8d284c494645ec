"""The learner's view, end to end: the README's course command, JupyterLab in headless Chromium.

One JupyterLab is started exactly as a learner starts it (`python3 bootstrap.py course`), on a
copy of course/ so the committed notebooks stay untouched, and one Chromium page drives it with
Playwright, in the order a learner works through 00_launch:

  1. run the launch cells: every rank's `[rank r]` lines and each rank's state show in the cell;
  2. answer the exercises, save, press nbgrader's Validate button: the notebook passes;
  3. run a launch that hangs, watch its ranks run, interrupt it: no rank process is left and the
     kernel launches again;
  4. with an nbgrader exchange (a shared server): the instructor releases 00_launch, the learner
     fetches and submits it from the Assignment List, the instructor collects it.

A second JupyterLab serves the same notebook released in Japanese, as `bootstrap.py course
--lang ja` serves it: JupyterLab's menus, the text and the library's messages in Japanese.

Screenshots of each step are kept in test-artifacts/browser/, with the servers' logs.
Chromium comes from the system (Debian's `chromium` package), never from a Playwright download
(tests/support/browser_pages.py). Without it the test skips on a learner's machine and fails
under CI (CI=true).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.conftest import ROOT
from tests.support.browser_pages import (
    CHROMIUM_ARGS,
    DONE,
    KERNEL_READY,
    LAB_SETTINGS,
    RUNNING,
    cell,
    chromium_path,
    descendants,
    free_port,
    output,
    playwright_api,
    prompt,
    run,
    stop_group,
    wait_for,
)

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "test-artifacts" / "browser"
NOTEBOOK = "00_launch/00_launch.ipynb"
HUNG_CELL = '''\
def rank_one_never_joins():
    t = torch.ones(1)
    if dist.get_rank() == 0:
        print("waiting in all_reduce for rank 1", flush=True)
        dist.all_reduce(t)
    else:
        print("skipping the all_reduce", flush=True)
    return t.item()

dl.launch(rank_one_never_joins, world_size=2, timeout=600, pg_timeout=600)'''


# -- the server, started by the README's command -----------------------------------------------


def kernels(server_pid: int) -> list[int]:
    return [p for p, (ppid, cmd) in descendants(server_pid).items()
            if ppid == server_pid and "ipykernel" in cmd]


def rank_processes(server_pid: int) -> list[str]:
    """Processes forked by a kernel's forkserver: ranks (they carry the forkserver's command)."""
    tree = descendants(server_pid)
    forkservers = [p for p, (ppid, cmd) in tree.items() if "multiprocessing.forkserver" in cmd
                   and "multiprocessing.forkserver" not in tree.get(ppid, (0, ""))[1]]
    return [f"{p} {cmd}" for f in forkservers for p, (_, cmd) in descendants(f).items()]


class Lab:
    """A JupyterLab started with `python3 bootstrap.py course`, on a copy of course/ (or of
    another release); its log in test-artifacts/browser/<log>."""

    def __init__(self, tmp: Path, release: Path = ROOT / "course",
                 log: str = "jupyter-server.log"):
        self.course = tmp / "course"
        shutil.copytree(release, self.course)
        home = tmp / "jupyter"
        # An nbgrader exchange, as on a shared server: the instructor releases into it, the
        # learner's Assignment List fetches into fetched/ and submits back.
        self.exchange, self.fetched = tmp / "exchange", self.course / "fetched"
        self.exchange.mkdir()
        self.fetched.mkdir()
        (home / "config").mkdir(parents=True)
        (home / "config" / "nbgrader_config.py").write_text(
            f"c = get_config()  # noqa: F821\n"
            f"c.CourseDirectory.course_id = 'dpmp_lab'\n"
            f"c.Exchange.root = {str(self.exchange)!r}\n"
            f"c.Exchange.assignment_dir = {str(self.fetched)!r}\n")
        for name, values in LAB_SETTINGS.items():
            path = home / "config" / "lab" / "user-settings" / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
                   JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
                   IPYTHONDIR=str(home / "ipython"))
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log_path = ARTIFACTS / log
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        port = self.url.rsplit(":", 1)[1]
        # bootstrap.py becomes `dpmp-lab lab`, which becomes `jupyter lab`: one pid throughout.
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bootstrap.py"), "course", "--dir", str(self.course),
             "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}",
             "--LabApp.expose_app_in_browser=True"],  # window.jupyterapp: is the kernel ready?
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for(self.ready, 180, f"JupyterLab did not answer; see {self.log_path}")
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"`bootstrap.py course` exited with {self.proc.returncode}:\n"
                                 + self.log_path.read_text()[-3000:])
        try:
            with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> list[str]:
        """Stop the server as Ctrl-C would; return what outlived it (killed, then reported)."""
        return stop_group(self.proc, self.log, signal.SIGTERM, descendants(self.proc.pid),
                          grace=10)


# -- the page --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    chromium_path()  # skip before starting anything when the browser or playwright is missing
    playwright_api()
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # only this run's pictures and logs
    ARTIFACTS.mkdir(parents=True)
    server = Lab(tmp_path_factory.mktemp("browser"))
    try:
        yield server
    finally:
        left = server.stop()
    assert left == [], f"processes outlived the Jupyter server: {left}"


@pytest.fixture(scope="module")
def page(lab: Lab):
    api = playwright_api()
    api.expect.set_options(timeout=60_000)  # a shared CI machine can be slow to render
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
            page.wait_for_function(KERNEL_READY, timeout=120_000)
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def notebook(lab: Lab, page) -> nbformat.NotebookNode:
    """The notebook as served (to find cells by their source), with its imports cell run."""
    nb = nbformat.read(lab.course / NOTEBOOK, as_version=4)
    run(page, cell(page, nb, "import dpmp_lab as dl"))
    return nb


@pytest.fixture(autouse=True)
def last_screenshot(request, page) -> Iterator[None]:
    """Whatever happens, keep a picture of the page as each test left it."""
    yield
    shot(page, f"end_{request.node.name}")


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)


def states_of(c):
    """The progress row's labels, one per rank: `rank <r>: <state>`."""
    return c.locator(".dpmp-lab-progress .dpmp-rank")


def type_into(page, c, text: str) -> None:
    """Replace a cell's source. insert_text types it at once, without the editor's auto-indent."""
    c.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(text)
    page.keyboard.press("Escape")


# -- the learner's session -------------------------------------------------------------------


def test_launch_cells_show_every_rank_and_its_state(page, notebook):
    expect = playwright_api().expect
    hello = cell(page, notebook, "res = dl.launch(hello")
    run(page, hello)
    text = output(hello)
    for r in range(4):
        assert f"[rank {r}] I am rank {r} of 4, computing on cpu with gloo" in text, text
    assert "[0, 1, 4, 9]" in text, text
    # the progress widget (ipywidgets) stays under the cell with each rank's final state
    expect(hello.locator(".jupyter-widgets.dpmp-lab-progress")).to_have_count(1)
    expect(states_of(hello)).to_have_text([f"rank {r}: done" for r in range(4)])

    remember = cell(page, notebook, "def remember_my_rank")
    run(page, remember)
    assert "returned: [1, 1, 1]" in output(remember)
    assert "the notebook's list: []" in output(remember)
    expect(states_of(remember)).to_have_text([f"rank {r}: done" for r in range(3)])

    all_reduce = cell(page, notebook, "def sum_of_ranks")
    run(page, all_reduce)
    text = output(all_reduce)
    for r in range(4):
        assert f"[rank {r}] before: [{r + 1}.0, {r + 1}.0, {r + 1}.0]" in text, text
        assert f"[rank {r}] after:  [10.0, 10.0, 10.0]" in text, text
    assert "[10.0, 10.0, 10.0, 10.0]" in text, text

    groups = cell(page, notebook, "def even_and_odd")
    run(page, groups)
    assert "[rank 3] rank 3: sum over my group [1, 3] = 4.0" in output(groups)

    run(page, cell(page, notebook, "%load_ext dpmp_lab"))
    magic = cell(page, notebook, "%%distributed -n 2")
    run(page, magic)
    text = output(magic)
    assert "[rank 0] tensor([0., 3., 6.])" in text and "[rank 1] tensor([0., 3., 6.])" in text
    assert "[9.0, 9.0]" in text, text
    hello.scroll_into_view_if_needed()
    shot(page, "01_launch_cells")


def test_a_course_in_japanese_opens_in_a_japanese_jupyterlab(lab, page, tmp_path):
    """A release in Japanese opened as `bootstrap.py course` opens it (the folder's language
    decides): JupyterLab's own menus in Japanese (its language pack), the notebook's text in
    Japanese, its launch cell showing every rank, and a failed launch told in Japanese by the
    library (the kernel and its ranks speak the notebook's language)."""
    from dpmp_lab import i18n

    expect = playwright_api().expect
    release = tmp_path / "course-ja" / "00_launch"
    release.mkdir(parents=True)
    nb = i18n.translate(nbformat.read(ROOT / "course" / NOTEBOOK, as_version=4), "ja",
                        "00_launch")
    nbformat.write(nb, release / "00_launch.ipynb")
    server = Lab(tmp_path / "lab", release.parent, log="jupyter-server-ja.log")
    try:
        ja = page.context.browser.new_page(viewport={"width": 1400, "height": 1000})
        ja.set_default_timeout(60_000)
        ja.goto(f"{server.url}/lab/tree/{NOTEBOOK}?token={server.token}")
        ja.wait_for_function(KERNEL_READY, timeout=120_000)
        expect(ja.locator(".lm-MenuBar-itemLabel").first).to_have_text("ファイル")
        heading = ja.locator(".jp-Notebook .jp-Cell").first.inner_text()
        assert re.search("[\u3040-\u30ff]", heading), heading   # kana: the text is Japanese
        run(ja, cell(ja, nb, "import dpmp_lab as dl"))
        hello = cell(ja, nb, "res = dl.launch(hello")
        run(ja, hello)
        text = output(hello)   # what the ranks print is the notebook's, in Japanese
        assert all(f"[rank {r}] ランク {r}（全4ランク中）です" in text for r in range(4)), text
        assert "[0, 1, 4, 9]" in text, text
        answer = cell(ja, nb, "def my_rows")   # a learner's scratch line in an answer cell
        type_into(ja, answer, "dl.launch(lambda: 1 / 0, world_size=2, stream=False)")
        run(ja, answer)
        text = output(answer)
        assert "ZeroDivisionError" in text and "ランク" in text, text
        ja.screenshot(path=str(ARTIFACTS / "ja_launch.png"), full_page=False)
        ja.close()
    finally:
        left = server.stop()
    assert left == [], f"processes outlived the Japanese course's server: {left}"


def solution(source: str) -> str:
    """What a learner who found the reference answer types: the solution without its markers."""
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def test_answers_pass_nbgrader_validate_button(lab, page, notebook):
    solutions = nbformat.read(ROOT / "solutions" / NOTEBOOK, as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: solution(c.source) for c in solutions.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    cells = page.locator(".jp-Notebook .jp-Cell")
    for index, c in enumerate(notebook.cells):
        grade_id = c.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            type_into(page, cells.nth(index), answers.pop(grade_id))
    assert answers == {}, f"solution cells missing from the release: {list(answers)}"
    page.keyboard.press("Control+s")
    page.locator(".jp-mod-current.jp-mod-dirty").wait_for(state="detached")

    page.locator(".jp-Toolbar").get_by_text("Validate", exact=True).click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=300_000)  # nbgrader runs the whole notebook in a fresh kernel
    shot(page, "02_validate")
    text = dialog.inner_text()
    assert "Success! Your notebook passes all the tests." in text, text
    dialog.get_by_role("button").last.click()
    dialog.wait_for(state="detached")
    # nbgrader's kernel (and its ranks) are gone; only the notebook's own kernel remains
    wait_for(lambda: len(kernels(lab.proc.pid)) == 1 and not rank_processes(lab.proc.pid), 20,
             f"leftovers after Validate: {descendants(lab.proc.pid)}")


def test_interrupting_a_hung_launch_stops_every_rank(lab, page, notebook):
    expect = playwright_api().expect

    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.last.locator(".jp-InputPrompt, .jp-InputArea").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below the last one
    hung = cells.nth(cells.count() - 1)  # pinned: running the last cell appends another
    type_into(page, hung, HUNG_CELL)
    run(page, hung, wait=False)

    # while the ranks run: their lines and their states are in the cell, and so are they
    expect(hung.locator(".jp-OutputArea")).to_contain_text(
        "[rank 0] waiting in all_reduce for rank 1", timeout=60_000)
    expect(hung.locator(".jp-OutputArea")).to_contain_text("[rank 1] skipping the all_reduce")
    expect(states_of(hung)).to_have_text(["rank 0: running", "rank 1: done"])
    assert RUNNING.match(prompt(hung)), prompt(hung)
    assert len(rank_processes(lab.proc.pid)) == 2, descendants(lab.proc.pid)
    shot(page, "03_hung_launch")

    page.locator(".jp-Toolbar [title='Interrupt the kernel']").click()
    expect(hung.locator(".jp-OutputArea")).to_contain_text(
        "KeyboardInterrupt: interrupted: all 2 ranks were stopped")
    expect(hung.locator(".jp-InputPrompt")).to_have_text(DONE)
    wait_for(lambda: rank_processes(lab.proc.pid) == [], 10,
             f"rank processes left after the interrupt: {rank_processes(lab.proc.pid)}")
    expect(states_of(hung)).to_have_text([re.compile(r"rank 0: (stopped|failed)"),
                                          "rank 1: done"])
    shot(page, "04_interrupted")

    # the same kernel launches again
    hello = cell(page, notebook, "res = dl.launch(hello")
    run(page, hello)
    assert "[rank 3] I am rank 3 of 4" in output(hello) and "[0, 1, 4, 9]" in output(hello)
    assert len(kernels(lab.proc.pid)) == 1
    shot(page, "05_launch_after_interrupt")


def nbgrader(cwd: Path, *args: str) -> None:
    """The instructor's nbgrader command line (it runs helpers such as alembic by name)."""
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


def test_assignment_list_fetches_and_submits_through_an_exchange(lab, page, tmp_path):
    expect = playwright_api().expect

    instructor = tmp_path / "instructor"
    shutil.copytree(ROOT / "course", instructor / "course")
    shutil.copy(ROOT / "nbgrader_config.py", instructor)
    nbgrader(instructor, "release_assignment", "00_launch", f"--Exchange.root={lab.exchange}")

    page.get_by_text("Nbgrader", exact=True).click()
    page.get_by_text("Assignment List", exact=True).click()
    released = page.locator("#released_assignments_list")
    expect(released).to_contain_text("00_launch")
    released.get_by_role("button", name="Fetch").click()
    downloaded = page.locator("#fetched_assignments_list")
    expect(downloaded).to_contain_text("00_launch")
    assert (lab.fetched / NOTEBOOK).is_file(), sorted(lab.course.rglob("*"))
    downloaded.get_by_role("button", name="Submit").click()
    expect(page.locator("#submitted_assignments_list")).to_contain_text("00_launch")
    shot(page, "06_assignment_list")

    nbgrader(instructor, "collect", "00_launch", f"--Exchange.root={lab.exchange}")
    collected = list((instructor / "submitted").glob(f"*/{NOTEBOOK}"))
    assert len(collected) == 1, sorted(instructor.rglob("*"))
