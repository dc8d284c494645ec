"""A class on the course's JupyterHub, end to end (docs/instructor-guide.md: "Running a class on
a GPU server").

As root, the test makes an instructor and two learner accounts, the instructor's course root
(mode 700) and an nbgrader exchange, and starts the hub exactly as the guide does
(deploy/jupyterhub_config.py, its proxy from deploy/node_modules, a shared test password).
Then, in headless Chromium, learner A logs in, fetches 00_launch from the Assignment List,
runs a launch cell and submits; the instructor's account collects, grades with `dpmp-lab
grade` (sandboxed) and releases feedback; A fetches the feedback, which holds no hidden test.
Learner B can read neither A's submission nor A's home nor the instructor's course, nor any
hidden test or wrong answer in the checkout the hub runs from, and a submission B hands in
under A's name is left out by the instructor's collect.

Everything it starts it stops (the hub, its proxy, every single-user server, the users'
processes), and it removes the accounts and their homes, on failure too. It needs root,
useradd, Chromium, bubblewrap and the proxy (`python3 bootstrap.py test` installs it): without
them it skips and says why, and under CI (CI=true) it fails instead.

The single-user servers and the instructor's grading run the Python of this checkout's .venv.
Where that interpreter lives in a folder other users cannot enter (pyenv under /root), under CI
the test lets them enter (o+x, not list) the folders above it for its run; elsewhere it gives
the accounts a venv of a system Python of the same minor version that reads the same packages
(a package that needs a later patch release can then fail there: soupsieve needs 3.11.5). On
a server, install the course where every account can run it (the instructor guide).
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from dpmp_lab.instructor import nbgrader_plugin, sandbox
from dpmp_lab.instructor.course import assignments

from .browser_pages import (
    CHROMIUM_ARGS,
    KERNEL_READY,
    LAB_SETTINGS,
    cell,
    chromium_path,
    descendants,
    free_port,
    output,
    playwright_api,
    run,
    stop_group,
    unavailable,
    wait_for,
)
from .conftest import ROOT, proc_table
from .notebook_sources import source_notebook

# a hub, two JupyterLabs, Chromium and a sandboxed grading: 80-110 s on this 2-core machine, and
# 254-272 s while other work loaded it, near pytest-timeout's 300 s for the suite
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ARTIFACTS = ROOT / "test-artifacts" / "hub"
NAME = "00_launch"
PROXY = ROOT / "deploy" / "node_modules" / ".bin" / "configurable-http-proxy"
VENV_BIN = Path(sys.executable).parent
PASSWORD = secrets.token_hex(8)


def sh(*cmd: str, user: str | None = None, check: bool = True, timeout: float = 120,
       cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command as root, or as `user` (runuser: a login-free switch, as the hub's spawner)."""
    argv = (["runuser", "-u", user, "--"] if user else []) + list(cmd)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env)
    if check and done.returncode:
        raise AssertionError(f"`{' '.join(argv)}` failed ({done.returncode}):\n"
                             f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


def preconditions() -> None:
    if os.name != "posix" or os.geteuid() != 0:
        unavailable("the hub test makes system accounts: it runs as root")
    for program in ("useradd", "userdel", "runuser"):
        if not shutil.which(program):
            unavailable(f"no {program} on this machine (the hub test makes accounts)")
    if not PROXY.exists():
        unavailable(f"no JupyterHub proxy at {PROXY}: `python3 bootstrap.py test` installs "
                    "it with npm (apt-get install npm)")
    why = sandbox.problem()
    if why:
        unavailable(f"`dpmp-lab grade` needs its sandbox: {why}")
    chromium_path()
    playwright_api()


def users_python(user: str, base: Path) -> str:
    """The Python the accounts run: .venv's when `user` can run it, else a venv of a system
    Python of the same version under `base` that reads .venv's packages and Jupyter data."""
    check = ["-c", "import jupyterhub, nbgrader"]
    if sh(sys.executable, *check, user=user, check=False).returncode == 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.access(candidate, os.X_OK):
            break
    else:
        unavailable(f"{sys.executable} cannot be run by other users and there is no system "
                    f"{version}: install the checkout where every account can run it")
    env = base / "venv"
    subprocess.run([candidate, "-m", "venv", "--without-pip", str(env)], check=True)
    purelib = sysconfig.get_paths()["purelib"]
    site = env / "lib" / version / "site-packages"
    (site / "dpmp_lab_venv.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    for shared in ("share", "etc"):    # JupyterLab's app, the extensions and their config
        if (Path(sys.prefix) / shared).exists():
            (env / shared).symlink_to(Path(sys.prefix) / shared)
    python = str(env / "bin" / "python")
    if sh(python, *check, user=user, check=False).returncode:
        unavailable(f"another account cannot read this checkout's packages ({purelib}): "
                    "clone it where every account may enter, e.g. under /srv or /opt")
    return python


class Accounts:
    """System users made for the test, removed with their homes and processes at the end."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.instructor = f"dpmpt{tag}"
        self.learners = (f"dpmpa{tag}", f"dpmpb{tag}")
        self.made: list[str] = []

    def make(self) -> None:
        for name in (self.instructor, *self.learners):
            sh("useradd", "--create-home", "--shell", "/bin/bash", name)
            self.made.append(name)

    def uids(self) -> set[int]:
        return {pwd.getpwnam(n).pw_uid for n in self.made}

    def processes(self) -> list[str]:
        """What the accounts run, zombies (dead, not yet reaped) left out."""
        uids, found = self.uids(), []
        for pid, (_, cmd) in proc_table().items():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if os.stat(f"/proc/{pid}").st_uid in uids and state != "Z":
                    found.append(f"{pid} {cmd}")
            except OSError:
                continue
        return found

    def remove(self) -> list[str]:
        """Kill what the accounts still run 10 s after the hub stopped (reported: a kernel's
        helpers end a moment after it), then delete the accounts and their homes."""
        end = time.monotonic() + 10
        while self.processes() and time.monotonic() < end:
            time.sleep(0.2)
        left = self.processes()
        for entry in left:
            try:
                os.kill(int(entry.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:
            wait_for(lambda: not self.processes(), 10, f"still running: {self.processes()}")
        for name in self.made:
            sh("userdel", "--remove", name, check=False)
        return left


class Hub:
    """The hub as the guide's step starts it, on free ports, with the test's settings."""

    def __init__(self, base: Path, accounts: Accounts, python: str) -> None:
        self.base, self.course, self.exchange = base, base / "course", base / "exchange"
        self.state = base / "state"
        self.url = f"http://127.0.0.1:{free_port()}"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.log_path = ARTIFACTS / "jupyterhub.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
                        DPMP_LAB_HUB_COURSE=str(self.course),
                        DPMP_LAB_HUB_EXCHANGE=str(self.exchange),
                        DPMP_LAB_HUB_STATE=str(self.state),
                        DPMP_LAB_HUB_INSTRUCTORS=accounts.instructor,
                        DPMP_LAB_HUB_LEARNERS=" ".join(accounts.learners),
                        DPMP_LAB_HUB_GPUS="0,1", DPMP_LAB_HUB_PYTHON=python,
                        DPMP_LAB_HUB_PASSWORD=PASSWORD)
        port = self.url.rsplit(":", 1)[1]
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "jupyterhub"), "-f", str(ROOT / "deploy" / "jupyterhub_config.py"),
             "--ip=127.0.0.1", f"--port={port}", f"--JupyterHub.hub_port={free_port()}",
             f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{free_port()}"],
            cwd=base, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.started: dict[int, tuple[int, str]] = {}
        self.course_release: subprocess.Popen | None = None

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"jupyterhub exited with {self.proc.returncode}:\n"
                                 + self.log_path.read_text()[-3000:])
        self.started.update(descendants(self.proc.pid))   # the proxy, the users' servers
        try:
            with urllib.request.urlopen(f"{self.url}/hub/api", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> list[str]:
        """Stop the hub as Ctrl-C would (it stops the servers and its proxy); return what
        outlived it by 5 s, killed. A kernel's forkserver exits when it sees its kernel gone,
        a moment after: once, on a loaded machine, it was still there the instant the hub
        had stopped."""
        self.started.update(descendants(self.proc.pid))
        return stop_group(self.proc, self.log, signal.SIGINT, self.started, grace=5.0)


class Phases:
    """Seconds per phase, kept in test-artifacts/hub/phases.txt (the test's time budget)."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "phases.txt").write_text("")

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        with open(ARTIFACTS / "phases.txt", "a") as f:
            f.write(f"{now - self.last:6.1f} s  {name} (at {now - self.start:.1f} s)\n")
        self.last = now


PHASES: list[Phases] = []


def phase(name: str) -> None:
    if PHASES:
        PHASES[0](name)


def start_course(course: Path) -> subprocess.Popen:
    """The instructor's course root: 00_launch released into its gradebook (`dpmp-lab
    release`, run while the hub starts)."""
    course.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "solutions" / NAME, course / "solutions" / NAME)
    return subprocess.Popen(
        [str(VENV_BIN / "dpmp-lab"), "release", NAME, "--root", str(course)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"))


def finish_course(release: subprocess.Popen, course: Path, instructor: str) -> None:
    """The course root, private to the instructor (the hub made the exchange)."""
    out, _ = release.communicate(timeout=180)
    assert release.returncode == 0, out
    sh("chown", "-R", f"{instructor}:{instructor}", str(course))
    course.chmod(0o700)


@contextlib.contextmanager
def entered_by_everyone(path: Path) -> Iterator[None]:
    """Under CI, the folders above the checkout that other accounts cannot enter (a clone under
    /root, mode 700) may be entered (o+x: entered, not listed) while the test runs, and get
    their modes back after it; elsewhere nothing changes, and users_python says what to do."""
    changed = []
    if os.environ.get("CI", "").lower() == "true":
        for folder in (path, *path.parents):
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
                changed.append((folder, stat.S_IMODE(mode)))
    try:
        yield
    finally:
        for folder, mode in changed:
            folder.chmod(mode)


@contextlib.contextmanager
def checkout_private(path: Path) -> Iterator[None]:
    """The checkout's private parts (hub.CHECKOUT_PRIVATE) closed to every other account while
    the class runs, as a server's must be (the hub refuses to start otherwise), and their
    modes given back after it."""
    from dpmp_lab.instructor import hub

    changed = [(part, stat.S_IMODE(part.stat().st_mode)) for part in hub.open_to_others(path)]
    for part, mode in changed:
        part.chmod(mode & 0o700)
    try:
        yield
    finally:
        for part, mode in changed:
            part.chmod(mode)


@pytest.fixture(scope="module")
def hub_class() -> Iterator[tuple[Hub, Accounts]]:
    preconditions()
    base = Path(tempfile.mkdtemp(prefix="dpmp-hub-"))
    base.chmod(0o755)   # the accounts cross it to their Python, the exchange and the state
    accounts, hub, release, failures = Accounts(), None, None, []
    PHASES[:] = [Phases()]
    # the accounts run .venv's own interpreter where CI lets them enter it (pyenv's, under
    # /root): a system Python of another patch release reading .venv's packages is not what a
    # server runs (soupsieve, which nbconvert's HTML export uses, needs CPython >= 3.11.5)
    with entered_by_everyone(ROOT), entered_by_everyone(Path(sys.base_prefix)), \
            checkout_private(ROOT):
        try:
            release = start_course(base / "course")
            accounts.make()
            python = users_python(accounts.learners[0], base)
            phase("accounts and their Python")
            for learner in accounts.learners:
                home = Path(pwd.getpwnam(learner).pw_dir)
                for name, values in {**LAB_SETTINGS, "expose": None}.items():
                    if values is None:   # window.jupyterapp, to see when the kernel is ready
                        path, text = home / ".jupyter" / "jupyter_server_config.json", (
                            '{"LabApp": {"expose_app_in_browser": true}}')
                    else:
                        path = home / ".jupyter/lab/user-settings" / f"{name}.jupyterlab-settings"
                        text = json.dumps(values)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                sh("chown", "-R", f"{learner}:{learner}", str(home / ".jupyter"))
            hub = Hub(base, accounts, python)
            hub.course_release = release   # it finishes while ada logs in
            wait_for(hub.ready, 60, f"the hub did not answer; see {hub.log_path}")
            phase("the hub answers")
            yield hub, accounts
        finally:
            if release is not None:
                stopped(release)
            if hub is not None:
                failures += [f"outlived the hub: {p}" for p in hub.stop()]
                phase("the hub stopped")
            failures += [f"outlived the hub, run by a test account: {p}" for p in accounts.remove()]
            shutil.rmtree(base, ignore_errors=True)
            phase("everything stopped and removed")
    assert failures == []


def as_instructor(hub: Hub, accounts: Accounts, *args: str,
                  wait: bool = True) -> subprocess.Popen | str:
    """An nbgrader command as the instructor, in the course root, with the instructor's
    config (the one their server gets); started only, with wait=False."""
    env = dict(hub.env, HOME=pwd.getpwnam(accounts.instructor).pw_dir,
               JUPYTER_CONFIG_PATH=str(hub.state / "jupyter-config" / "instructor"))
    python = hub.env["DPMP_LAB_HUB_PYTHON"]
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env['PATH']}"
    argv = ["runuser", "-u", accounts.instructor, "--", python, "-m", "nbgrader", *args]
    proc = subprocess.Popen(argv, cwd=hub.course, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return finished(proc, f"nbgrader {' '.join(args)}") if wait else proc


def release_assignment(hub: Hub, accounts: Accounts) -> None:
    """The course's 00_launch (recorded in its gradebook while the hub started), then the
    instructor's release of it into the exchange."""
    finish_course(hub.course_release, hub.course, accounts.instructor)
    as_instructor(hub, accounts, "release_assignment", NAME)


def stopped(proc: subprocess.Popen) -> None:
    """Whatever happened, the process is gone."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def finished(proc: subprocess.Popen, what: str, timeout: float = 120) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as late:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"{what}: still running after {timeout} s:\n{out[-3000:]}") from late
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{out[-3000:]}"
    return out


def test_a_class_on_the_hub(hub_class):
    hub, accounts = hub_class
    api = playwright_api()
    api.expect.set_options(timeout=60_000)
    ada = accounts.learners[0]
    ada_home = Path(pwd.getpwnam(ada).pw_dir)
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS,
                                    headless=True)
        pages = []
        try:
            for _ in ("learner", "instructor"):   # one browser each: their own cookies
                pages.append(browser.new_context(viewport={"width": 1400, "height": 1000})
                             .new_page())
                pages[-1].set_default_timeout(60_000)
            learner_session(pages, hub, accounts, ada, ada_home)
        finally:
            for name, page in zip(("learner", "instructor"), pages, strict=False):
                page.screenshot(path=str(ARTIFACTS / f"end_{name}.png"))
            browser.close()


def log_in(page, hub: Hub, user: str) -> str:
    """Log in on the hub's page; the user's JupyterLab opens. Its URL."""
    page.goto(f"{hub.url}/hub/login")
    page.locator("#username_input").fill(user)
    page.locator("#password_input").fill(PASSWORD)
    page.locator("#login_submit").click()
    page.wait_for_url(f"{hub.url}/user/{user}/lab**", timeout=120_000)
    return f"{hub.url}/user/{user}"


def nbgrader_menu(page) -> str:
    page.get_by_text("Nbgrader", exact=True).click()
    return page.locator(".lm-Menu").inner_text()


def open_assignment_list(page):
    menu = nbgrader_menu(page)
    assert "Assignment List" in menu, menu
    assert "Formgrader" not in menu and "Course List" not in menu, menu
    page.get_by_text("Assignment List", exact=True).click()


def learner_session(pages, hub: Hub, accounts: Accounts, ada: str, ada_home: Path) -> None:
    expect = playwright_api().expect
    page = pages[0]
    with ThreadPoolExecutor(1) as pool:   # leaves only when the release is done, or failed
        released = pool.submit(release_assignment, hub, accounts)
        base = log_in(page, hub, ada)
        phase("ada logged in, her server started")
        released.result(timeout=240)
        phase("00_launch released to the class")
    server = wait_for(lambda: [pid for pid, (_, cmd) in descendants(hub.proc.pid).items()
                               if "jupyterhub.singleuser" in cmd], 30, "no server for ada")
    environ = Path(f"/proc/{server[0]}/environ").read_bytes().split(b"\0")
    assert b"CUDA_VISIBLE_DEVICES=1" in environ   # the round-robin: the instructor has GPU 0

    open_assignment_list(page)
    listed = page.locator("#released_assignments_list")
    expect(listed).to_contain_text(NAME)
    listed.get_by_role("button", name="Fetch").click()
    expect(page.locator("#fetched_assignments_list")).to_contain_text(NAME)
    assert (ada_home / NAME / f"{NAME}.ipynb").is_file()
    page.screenshot(path=str(ARTIFACTS / "01_fetched.png"))
    phase("fetched")

    page.goto(f"{base}/lab/tree/{NAME}/{NAME}.ipynb")
    page.wait_for_function(KERNEL_READY, timeout=120_000)
    nb = nbformat.read(ROOT / "course" / NAME / f"{NAME}.ipynb", as_version=4)
    run(page, cell(page, nb, "import dpmp_lab as dl"))
    hello = cell(page, nb, "res = dl.launch(hello")
    run(page, hello)
    assert "[rank 3] I am rank 3 of 4" in output(hello), output(hello)
    page.keyboard.press("Control+s")
    page.locator(".jp-mod-current.jp-mod-dirty").wait_for(state="detached")
    page.screenshot(path=str(ARTIFACTS / "02_launch_cell.png"))
    phase("a launch cell run, saved")

    open_assignment_list(page)
    page.locator("#fetched_assignments_list").get_by_role("button", name="Submit").click()
    submitted = page.locator("#submitted_assignments_list")
    expect(submitted).to_contain_text(NAME)
    page.screenshot(path=str(ARTIFACTS / "03_submitted.png"))
    phase("submitted")

    instructor_grades(pages[1], hub, accounts, ada)
    others_cannot_read(hub, accounts, ada_home)
    phase("bob reads nothing of ada's or the instructor's")

    submitted.get_by_role("button", name="Fetch Feedback").click()
    feedback = wait_for(lambda: list((ada_home / NAME / "feedback").glob(f"*/{NAME}.html")),
                        30, "no feedback fetched")
    page.screenshot(path=str(ARTIFACTS / "04_feedback.png"))
    phase("feedback fetched")
    text = html.unescape(re.sub(r"<[^>]+>", "", feedback[0].read_text()))
    assert "I am rank 3 of 4" in text     # her own notebook, graded
    hidden = nbgrader_plugin.hidden_lines(source_notebook(NAME))
    assert len(hidden) > 10 and [line for line in hidden if line in text] == []


def forge(hub: Hub, bob: str, ada: str) -> str:
    """Bob hands in a notebook under ada's name, newer than hers. The folder's name."""
    nb = nbformat.read(ROOT / "course" / NAME / f"{NAME}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("FORGED BY BOB"))
    forged = hub.course.parent / "forged.ipynb"
    nbformat.write(nb, forged)
    forged.chmod(0o644)
    name = f"{ada}+{NAME}+2099-01-01 00:00:00.000000 UTC+forged"
    folder = hub.exchange / "dpmp_lab" / "inbound" / name
    sh("sh", "-c", 'mkdir "$1" && cp "$2" "$1/$3" && echo "$4" > "$1/timestamp.txt"', "forge",
       str(folder), str(forged), f"{NAME}.ipynb", "2099-01-01 00:00:00.000000 UTC", user=bob)
    return name


def instructor_grades(page, hub: Hub, accounts: Accounts, ada: str) -> None:
    """Collect (past a submission forged in ada's name) and grade from the command line;
    while the grader runs, the instructor's own JupyterLab shows formgrader on the course."""
    forged = forge(hub, accounts.learners[1], ada)
    collected = as_instructor(hub, accounts, "collect", NAME)
    assert f"not collected: {forged} names {ada} but was handed in by" in collected, collected
    handed = (hub.course / "submitted" / ada / NAME / f"{NAME}.ipynb").read_text()
    assert "FORGED BY BOB" not in handed and "I am rank 3 of 4" in handed
    assert sorted(p.name for p in (hub.course / "submitted").iterdir()) == [ada]
    phase("collected, a forgery left out")
    # graded by the instructor's own account, in its course root, as the guide says (its
    # sandbox then runs in a user namespace of its own)
    env = dict(hub.env, HOME=pwd.getpwnam(accounts.instructor).pw_dir)
    python = hub.env["DPMP_LAB_HUB_PYTHON"]
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env['PATH']}"
    grading = subprocess.Popen(["runuser", "-u", accounts.instructor, "--", python, "-m",
                                "dpmp_lab.cli", "grade", NAME, "--root", str(hub.course),
                                "--timeout", "240"], cwd=hub.course,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env)
    try:
        base = log_in(page, hub, accounts.instructor)
        assert "Formgrader" in nbgrader_menu(page)
        page.keyboard.press("Escape")
        page.goto(f"{base}/formgrader")
        playwright_api().expect(page.locator("body")).to_contain_text(NAME)
        page.screenshot(path=str(ARTIFACTS / "05_formgrader.png"))
        phase("the instructor's formgrader lists the course's 00_launch")
        out, _ = grading.communicate(timeout=240)
    finally:
        stopped(grading)
    assert grading.returncode == 0 and ada in out and "NOT GRADED" not in out, out
    phase("graded (dpmp-lab grade as the instructor, sandboxed)")
    owners = {p.owner() for p in hub.course.rglob("*")}
    assert owners == {accounts.instructor}, owners   # nothing left that root owns
    as_instructor(hub, accounts, "release_feedback", NAME)
    phase("feedback released")


def others_cannot_read(hub: Hub, accounts: Accounts, ada_home: Path) -> None:
    _, bob = accounts.learners
    inbound = hub.exchange / "dpmp_lab" / "inbound"
    [submission] = [p for p in inbound.iterdir() if p.name.startswith(accounts.learners[0])
                    and not p.name.endswith("+forged")]
    for target in (inbound, submission / f"{NAME}.ipynb", ada_home / NAME / f"{NAME}.ipynb",
                   hub.course / "solutions" / NAME / f"{NAME}.ipynb",
                   hub.course / "gradebook.db", hub.state / "hub" / "jupyterhub.sqlite"):
        reading = ["ls", str(target)] if target.is_dir() else ["cat", str(target)]
        done = sh(*reading, user=bob, check=False)
        assert done.returncode != 0 and "Permission denied" in done.stderr, (target, done)
    # nor anything of the checkout the hub runs from that holds a hidden test or a wrong
    # answer: read by name, and searched for, every hidden line of every assignment
    for target in (ROOT / "solutions" / NAME / f"{NAME}.ipynb",
                   ROOT / "tests" / "course_variants" / f"{NAME}.py", ROOT / ".git" / "HEAD"):
        done = sh("cat", str(target), user=bob, check=False)
        assert done.returncode != 0 and "Permission denied" in done.stderr, (target, done)
    secrets_file = hub.base / "hidden_lines.txt"
    public = "\n".join(c.source for name in assignments(ROOT)   # what any release shows
                       for c in nbformat.read(ROOT / "course" / name / f"{name}.ipynb",
                                              as_version=4).cells)
    lines = sorted({h for name in assignments(ROOT) for h in
                    nbgrader_plugin.hidden_lines(source_notebook(name))
                    if len(h) >= 24 and h not in public})
    secrets_file.write_text("\n".join(lines) + "\n")
    secrets_file.chmod(0o644)
    found = sh("grep", "-rlsF", "-f", str(secrets_file), "--exclude", secrets_file.name,
               "--exclude-dir", ".venv", "--exclude-dir", "node_modules", str(ROOT),
               str(hub.base), user=bob, check=False, timeout=300)
    assert found.returncode in (1, 2) and not found.stdout, found.stdout   # no file read holds one
    course = hub.exchange / "dpmp_lab"   # nor put a course of his own in its place
    done = sh("mv", str(course), f"{course}-gone", user=bob, check=False)
    assert done.returncode != 0 and "Operation not permitted" in done.stderr, done
