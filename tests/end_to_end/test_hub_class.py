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

Then the hub as a service, through its API with an admin token that the server's own config
file (DPMP_LAB_HUB_CONFIG) gives the test: B's server held to its CPU and memory limits (its
kernel lost to a 3 GiB cell, not the server); the hub killed and started again by its
supervisor, then stopped and started, with B's server and kernel the same throughout; a
learner added to the roster logging in within seconds, then removed; an idle server culled;
logins through another authenticator (jupyterhub's dummy standing in for single sign-on), the
course's users only.

Everything it starts it stops (the hub, its proxy, every single-user server, the users'
processes), and it removes the accounts and their homes, on failure too. It needs root,
useradd, Chromium, bubblewrap and the proxy (`python3 bootstrap.py test` installs it): without
them it skips and says why, and under CI (CI=true) it fails instead.

The single-user servers and the instructor's grading run from a learner's copy of the course
(`dpmp-lab learner-copy`: the release and the package, no hidden test), as the guide says to
serve learners, and the checkout the hub runs from is closed to every other account but for its
package (which the suite's own sandboxed grading beside this test reads) and .venv
(learners_python: the copy's venv holds hard links to the checkout's installed packages, in
place of an install of its own).
Where the interpreter lives in a folder other users cannot enter (pyenv under /root), under CI
the test lets them enter (o+x, not list) the folders above it for its run; elsewhere it skips.
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
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from dpmp_lab import i18n
from dpmp_lab.instructor import nbgrader_plugin, sandbox
from dpmp_lab.instructor.course import assignments
from tests.conftest import ROOT, proc_table
from tests.support.browser_pages import (
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
from tests.support.notebook_sources import source_notebook

# a hub, two JupyterLabs, Chromium and a sandboxed grading: 80-110 s on this 2-core machine, and
# 254-272 s while other work loaded it, near pytest-timeout's 300 s for the suite
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ARTIFACTS = ROOT / "test-artifacts" / "hub"
NAME = "00_launch"
PROXY = ROOT / "deploy" / "node_modules" / ".bin" / "configurable-http-proxy"
VENV_BIN = Path(sys.executable).parent
PASSWORD = secrets.token_hex(8)
# each server's limits: enough for 00_launch's 4 ranks, within reach of a runaway cell
MEMORY, CPUS = "2G", 1.0


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


def learners_python(base: Path, user: str) -> str:
    """The Python every server runs: a learner's copy of the course (`dpmp-lab learner-copy`:
    the release, the package, no hidden test), in a venv of its own whose package is the
    copy's. On a server `pip install -e '.[hub]'` in the copy fills its .venv; here, to save
    the install, its site-packages are this checkout's .venv's, hard-linked (copied where they
    cannot be), with the copy in place of the checkout's editable package."""
    from dpmp_lab.instructor import course as course_module

    copy = base / "learners"
    course_module.learner_copy(copy, root=ROOT)
    env = copy / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = env / "lib" / version / "site-packages"
    shutil.rmtree(site)
    purelib = sysconfig.get_paths()["purelib"]
    if subprocess.run(["cp", "-al", purelib, str(site)], capture_output=True).returncode:
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(purelib, site, symlinks=True)   # another file system
    for editable in site.glob("__editable__*dpmp_lab*"):
        editable.unlink()
    (site / "dpmp_lab_learners.pth").write_text(f"{copy}\n")
    for shared in ("share", "etc"):    # JupyterLab's app, the extensions and their config
        if (Path(sys.prefix) / shared).exists():
            (env / shared).symlink_to(Path(sys.prefix) / shared)
    python = str(env / "bin" / "python")
    if sh(python, "-c", "import jupyterhub, nbgrader", user=user, check=False).returncode:
        unavailable(f"the accounts cannot run {python} (its interpreter is in a folder they "
                    "cannot enter): clone the checkout where every account may enter, e.g. "
                    "under /srv or /opt")
    return python


class Accounts:
    """System users made for the test, removed with their homes and processes at the end."""

    def __init__(self, more: int = 0) -> None:
        tag = secrets.token_hex(3)
        self.instructor = f"dpmpt{tag}"
        self.learners = (f"dpmpa{tag}", f"dpmpb{tag}",
                         *(f"dpmp{i}l{tag}" for i in range(more)))   # `more`: a load test's
        self.late = f"dpmpc{tag}"   # on no list: added to the roster while the hub runs
        self.made: list[str] = []

    def make(self) -> None:
        for name in (self.instructor, *self.learners, self.late):
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
    """The hub as the guide's step starts it (under hub_supervisor, as `bootstrap.py hub`
    does), on free ports, with the test's settings: each learner's server held to MEMORY and
    CPUS, a roster it follows, and a config file of the server's own (DPMP_LAB_HUB_CONFIG)
    that gives the test an admin's token."""

    def __init__(self, base: Path, accounts: Accounts, python: str, **env: str) -> None:
        self.base, self.course, self.exchange = base, base / "course", base / "exchange"
        self.state, self.roster = base / "state", base / "roster.csv"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.token = secrets.token_hex(16)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.log_path = ARTIFACTS / "jupyterhub.log"
        self.write_roster([])
        self.env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
                        DPMP_LAB_HUB_COURSE=str(self.course),
                        DPMP_LAB_HUB_EXCHANGE=str(self.exchange),
                        DPMP_LAB_HUB_STATE=str(self.state),
                        DPMP_LAB_HUB_INSTRUCTORS=accounts.instructor,
                        DPMP_LAB_HUB_LEARNERS=" ".join(accounts.learners),
                        DPMP_LAB_HUB_GPUS="0,1", DPMP_LAB_HUB_PYTHON=python,
                        DPMP_LAB_HUB_PASSWORD=PASSWORD, DPMP_LAB_HUB_MEMORY=MEMORY,
                        DPMP_LAB_HUB_CPUS=str(CPUS), DPMP_LAB_HUB_ROSTER=str(self.roster),
                        DPMP_LAB_HUB_CONFIG=str(self.config()),
                        DPMP_LAB_HUB_LANGUAGE_MAP=f"{accounts.learners[1]}=ja")
        self.env.update(env)
        self.ports = [f"--port={self.url.rsplit(':', 1)[1]}",
                      f"--JupyterHub.hub_port={free_port()}",
                      f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{free_port()}"]
        self.started: dict[int, tuple[int, str]] = {}
        self.course_release: subprocess.Popen | None = None
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = self.start()

    def config(self, **lines: str) -> Path:
        """The server's own config file (root's, read last): the test's admin token, and
        `lines` (name: a line of config)."""
        path = self.base / "hub_config.py"
        path.write_text(
            "c.JupyterHub.services = [*c.JupyterHub.services, {'name': 'test-admin', "
            f"'api_token': {self.token!r}}}]\n"
            "c.JupyterHub.load_roles = [*c.JupyterHub.load_roles, {'name': 'test-admin', "
            "'services': ['test-admin'], 'scopes': ['admin:users', 'admin:servers', "
            "'access:servers', 'list:users', 'read:users', 'read:servers']}]\n"
            + "".join(f"{line}\n" for line in lines.values()))
        path.chmod(0o644)
        return path

    def write_roster(self, accounts: list[str]) -> None:
        rows = "".join(f"{a},{a.title()},Learner,{a}@example.edu,U{i}\n"
                       for i, a in enumerate(accounts))
        self.roster.write_text(f"id,first_name,last_name,email,lms_user_id\n{rows}")

    def start(self, **env: str) -> subprocess.Popen:
        self.env.update(env)
        return subprocess.Popen(
            [sys.executable, "-m", "dpmp_lab.instructor.hub_supervisor",
             "-f", str(ROOT / "deploy" / "jupyterhub_config.py"), "--ip=127.0.0.1", *self.ports],
            cwd=self.base, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def restart(self, **env: str) -> None:
        """Stop the supervisor and its hub as the guide's Ctrl-C does (learners' servers keep
        running) and start them again with `env` changed."""
        self.started.update(descendants(self.proc.pid))
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)
        self.proc = self.start(**env)
        wait_for(self.ready, 60, f"the hub did not answer again; see {self.log_path}")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the hub's supervisor exited with {self.proc.returncode}:\n"
                                 + self.log_path.read_text()[-3000:])
        self.started.update(descendants(self.proc.pid))   # the proxy, the users' servers
        try:
            with urllib.request.urlopen(f"{self.url}/hub/api", timeout=2):
                return True
        except OSError:
            return False

    def call(self, method: str, path: str, data: bytes | None = None) -> tuple[int, object]:
        """(status, JSON) of a request to the hub or a server with the test's admin token."""
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=data,
                                         headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                body = reply.read()
                return reply.status, json.loads(body) if body else None
        except urllib.error.HTTPError as refused:
            return refused.code, None

    def servers(self) -> dict[str, dict]:
        """{user: their default server's model} for every user with one running or starting."""
        status, users = self.call("GET", "/hub/api/users")
        assert status == 200, status
        return {u["name"]: u["servers"][""] for u in users if "" in u.get("servers", {})}

    def stop(self) -> list[str]:
        """Stop every learner's server (a hub that stops leaves them running), then the hub
        as Ctrl-C would; return what outlived it by 5 s, killed. A kernel's forkserver exits
        when it sees its kernel gone, a moment after: once, on a loaded machine, it was still
        there the instant the hub had stopped."""
        with contextlib.suppress(OSError, AssertionError):
            for user in self.servers():
                self.call("DELETE", f"/hub/api/users/{user}/server")
            wait_for(lambda: not self.servers(), 60, "servers still running")
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
    """The instructor's course root: 00_launch released into its gradebook, in English and in
    Japanese (`dpmp-lab release --lang ja`, run while the hub starts)."""
    course.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "solutions" / NAME, course / "solutions" / NAME)
    return subprocess.Popen(
        [str(VENV_BIN / "dpmp-lab"), "release", NAME, "--lang", "ja", "--root", str(course)],
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
    their modes back after it; elsewhere nothing changes."""
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
    """The checkout closed to every other account while the class runs: learners are served
    from their copy (learners_python), so nothing of it may be read or entered by them but the
    interpreter .venv links to, which they run, and the package (`dpmp_lab/`, what their copy
    holds too), which every sandboxed grading on this machine reads as an account of its own
    (the suite's, running beside this test); the hub itself refuses to start while its private
    parts (hub.CHECKOUT_PRIVATE) are open. The modes are given back after it."""
    changed = [(part, stat.S_IMODE(part.stat().st_mode)) for part in path.iterdir()
               if part.name not in (".venv", "dpmp_lab")
               and stat.S_IMODE(part.stat().st_mode) & 0o077]
    for part, mode in changed:
        part.chmod(mode & 0o700)
    try:
        yield
    finally:
        for part, mode in changed:
            part.chmod(mode)


@contextlib.contextmanager
def class_hub(accounts: Accounts, failures: list[str], prepare=lambda accounts: None,
              **env: str) -> Iterator[Hub]:
    """The class's hub, answering: its course root (00_launch released while the hub starts,
    `hub.course_release`), the accounts (`prepare` sets up their homes), the learners' copy,
    the checkout closed to them; `env`: settings of the hub's. Afterwards everything stopped
    and removed, and what outlived it added to `failures`."""
    base = Path(tempfile.mkdtemp(prefix="dpmp-hub-"))
    base.chmod(0o755)   # the accounts cross it to their Python, the exchange and the state
    hub = release = None
    with entered_by_everyone(ROOT), entered_by_everyone(Path(sys.base_prefix)), \
            checkout_private(ROOT):
        try:
            release = start_course(base / "course")
            accounts.make()
            python = learners_python(base, accounts.learners[0])
            phase("accounts and the learners' copy")
            prepare(accounts)
            hub = Hub(base, accounts, python, **env)
            hub.course_release = release   # it finishes while the first learner logs in
            wait_for(hub.ready, 60, f"the hub did not answer; see {hub.log_path}")
            phase("the hub answers")
            yield hub
        finally:
            if release is not None:
                stopped(release)
            if hub is not None:
                failures += [f"outlived the hub: {p}" for p in hub.stop()]
                phase("the hub stopped")
            failures += [f"outlived the hub, run by a test account: {p}" for p in accounts.remove()]
            shutil.rmtree(base, ignore_errors=True)
            phase("everything stopped and removed")


def lab_settings(accounts: Accounts) -> None:
    """The learners' JupyterLab settings the browser needs (browser_pages.LAB_SETTINGS), and
    window.jupyterapp exposed, to see when the kernel is ready."""
    for learner in accounts.learners:
        home = Path(pwd.getpwnam(learner).pw_dir)
        for name, values in {**LAB_SETTINGS, "expose": None}.items():
            if values is None:
                path, text = home / ".jupyter" / "jupyter_server_config.json", (
                    '{"LabApp": {"expose_app_in_browser": true}}')
            else:
                path = home / ".jupyter/lab/user-settings" / f"{name}.jupyterlab-settings"
                text = json.dumps(values)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        sh("chown", "-R", f"{learner}:{learner}", str(home / ".jupyter"))


@pytest.fixture(scope="module")
def hub_class() -> Iterator[tuple[Hub, Accounts]]:
    preconditions()
    accounts, failures = Accounts(), []
    PHASES[:] = [Phases()]
    with class_hub(accounts, failures, prepare=lab_settings) as hub:
        yield hub, accounts
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


# -- the hub as a service: limits, a restart, the roster, the culler, another authenticator --


def log_in_by_form(hub: Hub, user: str, password: str) -> int:
    """The status of the hub's answer to its login form: 302 (in) or 403 (refused)."""
    import http.cookiejar

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect)
    with opener.open(f"{hub.url}/hub/login", timeout=30) as page:
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.read().decode())[1]
    form = urllib.parse.urlencode({"username": user, "password": password,
                                   "_xsrf": xsrf}).encode()
    try:
        with opener.open(f"{hub.url}/hub/login", data=form, timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as answer:
        return answer.code


def start_server(hub: Hub, user: str) -> int:
    """Start `user`'s server through the hub's API; the pid of its process."""
    status, _ = hub.call("POST", f"/hub/api/users/{user}/server")
    assert status in (201, 202, 400), status   # 400: already running
    wait_for(lambda: hub.servers().get(user, {}).get("ready"), 120, f"{user}'s server")
    [pid] = [p for p, (_, cmd) in proc_table().items() if "jupyterhub.singleuser" in cmd
             and os.stat(f"/proc/{p}").st_uid == pwd.getpwnam(user).pw_uid]
    return pid


def in_kernel(hub: Hub, user: str, code: str, timeout: float = 120) -> tuple[str, str]:
    """Run `code` in a new kernel of `user`'s server, through the hub's proxy with the test's
    token: ("ok" | "error" | "died", what it printed)."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    status, kernel = hub.call("POST", f"/user/{user}/api/kernels", data=b"{}")
    assert status == 201, status

    async def run() -> tuple[str, str]:
        url = f"ws{hub.url[4:]}/user/{user}/api/kernels/{kernel['id']}/channels"
        ws = await websocket_connect(HTTPRequest(
            url, headers={"Authorization": f"token {hub.token}"}, connect_timeout=timeout,
            request_timeout=timeout))
        msg_id, printed = uuid.uuid4().hex, []
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False}}))
        while True:
            raw = await asyncio.wait_for(ws.read_message(), timeout)
            if raw is None:
                return "died", "".join(printed)
            msg = json.loads(raw)
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content.get("execution_state") in ("restarting", "dead"):
                return "died", "".join(printed)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream":
                printed.append(content["text"])
            elif kind == "error":
                printed.append(f"{content['ename']}: {content['evalue']}")
            elif kind == "execute_reply":
                ws.close()
                return content["status"], "".join(printed)

    return asyncio.run(run())


def cgroup_files(user: str) -> dict[str, Path]:
    """{file name: path} of the files of `user`'s server's cgroups (LimitedSpawner's)."""
    from dpmp_lab.instructor.limits import Cgroups

    return {f.name: f for folder in Cgroups.existing(f"dpmp-lab-hub-{user}").folders
            for f in folder.iterdir()}


def cpu_stat(user: str) -> dict[str, int]:
    files = cgroup_files(user)
    stat_ = {k: int(v) for k, v in (line.split() for line in
                                    files["cpu.stat"].read_text().splitlines())}
    if "cpuacct.usage" in files:   # cgroup v1 counts CPU time in another controller
        stat_["usage_usec"] = int(files["cpuacct.usage"].read_text()) // 1000
    return stat_


# three processes spinning for 3 s; the CPU time they got, the seconds it took, the cores the
# server was told it has, where its dpmp_lab comes from
BUSY = ("import os, subprocess, sys, time\n"
        "spin = 'import time\\nend = time.time() + 3\\nwhile time.time() < end: pass'\n"
        "began = time.monotonic()\n"
        "[p.wait() for p in [subprocess.Popen([sys.executable, '-c', spin]) for _ in range(3)]]\n"
        "t = os.times()\n"
        "print(t.children_user + t.children_system, time.monotonic() - began,"
        " os.environ['DPMP_LAB_CORES'], __import__('dpmp_lab').__file__)\n")


def test_a_runaway_learner_is_held_to_the_limits_of_their_server(hub_class):
    """Bob's server runs in cgroups of its own: three processes spinning get one CPU between
    them, and a cell that takes more memory than the server has loses its kernel, not the
    server, the hub or anyone else's server; the server says DPMP_LAB_CORES=1."""
    hub, accounts = hub_class
    bob = accounts.learners[1]
    server = start_server(hub, bob)
    files = cgroup_files(bob)
    limit = files.get("memory.limit_in_bytes") or files["memory.max"]
    assert int(limit.read_text()) == 2 * 2**30, limit
    procs = files["cgroup.procs"].read_text().split()
    assert str(server) in procs, procs
    before = cpu_stat(bob)
    status, printed = in_kernel(hub, bob, BUSY)
    after = cpu_stat(bob)
    assert status == "ok", (status, printed)
    spent, wall, cores, package = printed.split()
    assert cores == "1"   # DPMP_LAB_CORES: the server's share, which its launches divide
    assert package.startswith(str(hub.base / "learners")), package   # the learners' copy
    assert float(spent) < CPUS * float(wall) * 1.25, printed   # 3 spinning, 1 CPU's time
    quota = files.get("cpu.cfs_quota_us") or files["cpu.max"]
    assert quota.read_text().split()[0] == str(int(CPUS * 100_000)), quota
    if float(spent) > 0.8 * CPUS * float(wall):   # not starved by other work: the quota bit
        assert after["nr_throttled"] > before["nr_throttled"], (before, after, printed)
    phase("bob's spinning cell held to one CPU")
    status, printed = in_kernel(hub, bob, "hog = b'x' * (3 * 2**30)\nprint('survived')")
    assert status == "died" and "survived" not in printed, (status, printed)
    assert hub.servers()[bob]["ready"] and hub.ready()   # the server and the hub stay
    phase("bob's 3 GiB cell lost its kernel, not the server")


# what bob's Assignment List does when he presses Fetch: nbgrader's fetch, from his server's
# environment (its nbgrader config, his language), into his home
FETCH = ("import json, os, subprocess, sys\n"
         "done = subprocess.run([sys.executable, '-m', 'nbgrader', 'fetch_assignment', "
         f"'{NAME}'], capture_output=True, text=True)\n"
         "print(done.returncode, done.stderr[-2000:] if done.returncode else '')\n"
         f"nb = json.load(open('{NAME}/{NAME}.ipynb', encoding='utf-8'))\n"
         "print(os.environ['DPMP_LAB_LANG'], nb['metadata']['dpmp_lab']['language'],"
         f" sorted(os.listdir('{NAME}')))\n"
         "print(next(c['source'] for c in nb['cells'] if c['cell_type'] == 'markdown')[:200])\n")


def test_a_learner_in_japanese_fetches_the_assignment_in_japanese(hub_class):
    """Bob's course is in Japanese (LANGUAGE_MAP): his server opens JupyterLab with its
    Japanese language pack and speaks Japanese in his kernels, and his fetch of the one
    assignment the instructor released gives him its Japanese notebook under its own name
    (what he hands in is 00_launch, graded in Japanese)."""
    hub, accounts = hub_class
    bob = accounts.learners[1]
    if not (hub.exchange / "dpmp_lab" / "outbound" / NAME).is_dir():
        release_assignment(hub, accounts)   # when this test runs alone
    server = start_server(hub, bob)
    argv = Path(f"/proc/{server}/cmdline").read_bytes().decode().split("\0")
    assert f"--LabApp.app_settings_dir={i18n.lab_settings('ja')}" in argv, argv
    status, printed = in_kernel(hub, bob, FETCH)
    assert status == "ok", printed
    done, languages, first_text = printed.split("\n", 2)
    assert done.strip() == "0", printed
    assert languages == f"ja ja ['{NAME}.ipynb']", printed   # no hidden folder of translations
    assert re.search("[\u3040-\u30ff]", first_text), first_text   # kana: the text is Japanese
    phase("bob fetched 00_launch in Japanese")


def hub_pid(hub: Hub) -> int:
    """The jupyterhub process under the supervisor."""
    [pid] = [p for p, (parent, cmd) in proc_table().items()
             if parent == hub.proc.pid and "jupyterhub" in cmd]
    return pid


def test_the_hub_starts_again_after_a_crash_and_a_restart_without_stopping_a_server(hub_class):
    """The hub killed (a crash): its supervisor starts it again; stopped and started (an
    update): bob's server is the same process throughout, and answers through the new hub's
    proxy with the kernel it had."""
    hub, accounts = hub_class
    bob = accounts.learners[1]
    server = start_server(hub, bob)
    status, kernels = hub.call("GET", f"/user/{bob}/api/kernels")
    assert status == 200
    first = hub_pid(hub)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: hub.ready() and hub_pid(hub) != first, 90,
             f"the supervisor did not start the hub again; see {hub.log_path}")
    phase("the hub killed, started again by its supervisor")
    hub.restart()
    phase("the hub stopped and started")
    assert hub.servers()[bob]["ready"] and os.kill(server, 0) is None
    assert start_server(hub, bob) == server
    status, now = hub.call("GET", f"/user/{bob}/api/kernels")
    assert status == 200 and {k["id"] for k in now} == {k["id"] for k in kernels}, now


def test_a_learner_on_the_roster_logs_in_and_one_taken_off_cannot(hub_class):
    """A learner added to the roster file while the hub runs can log in within seconds, with
    no restart; taken off it, their server is stopped and they cannot."""
    hub, accounts = hub_class
    late = accounts.late
    assert log_in_by_form(hub, late, PASSWORD) == 403
    hub.write_roster([late])
    wait_for(lambda: hub.call("GET", f"/hub/api/users/{late}")[0] == 200, 30,
             "the roster's new learner is not a user of the hub")
    assert log_in_by_form(hub, late, PASSWORD) == 302
    server = start_server(hub, late)
    phase("a learner added to the roster logged in and started a server")
    hub.write_roster([])
    wait_for(lambda: hub.call("GET", f"/hub/api/users/{late}")[0] == 404, 60,
             "the learner taken off the roster is still a user of the hub")
    assert log_in_by_form(hub, late, PASSWORD) == 403
    wait_for(lambda: not Path(f"/proc/{server}").exists(), 30, "their server still runs")
    assert cgroup_files(late) == {}
    phase("taken off the roster: their server stopped, their login refused")


def test_an_idle_server_is_culled_and_another_authenticator_plugs_in(hub_class):
    """With CULL_IDLE, a server nobody uses is stopped, with what its cgroups held; with
    AUTHENTICATOR and the server's own config file, logins go through that authenticator and
    still only for the course's users (jupyterhub's dummy authenticator stands in for a
    university's single sign-on)."""
    hub, accounts = hub_class
    bob = accounts.learners[1]
    server = start_server(hub, bob)
    sso = secrets.token_hex(8)
    hub.config(sso=f"c.DummyAuthenticator.password = {sso!r}")
    hub.restart(DPMP_LAB_HUB_CULL_IDLE="6", DPMP_LAB_HUB_AUTHENTICATOR="dummy")
    wait_for(lambda: bob not in hub.servers(), 60, "bob's idle server was not culled")
    assert f"Culling server {bob}" in hub.log_path.read_text()   # by the culler, no other
    wait_for(lambda: not Path(f"/proc/{server}").exists(), 30, "bob's server still runs")
    assert cgroup_files(bob) == {}
    phase("an idle server culled")
    assert log_in_by_form(hub, accounts.learners[0], PASSWORD) == 403   # not the hub's own
    assert log_in_by_form(hub, accounts.learners[0], sso) == 302
    assert log_in_by_form(hub, "stranger", sso) == 403   # authenticated, not of the course
    phase("logins through another authenticator, the course's users only")
