"""What the browser tests share: the system's Chromium driven by Playwright, JupyterLab's page
(its cells, prompts and outputs), free ports, waiting by polling, and the processes below a
server. tests/end_to_end/test_browser.py (one JupyterLab) and tests/end_to_end/test_hub_class.py (a
JupyterHub) use it. Chromium comes from the system (Debian's `chromium`), never from a Playwright
download; without it the tests skip, and under CI (CI=true) they fail."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time

import nbformat
import pytest

from tests.conftest import proc_table

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_ARGS = [  # without the network flags Chromium keeps dialling out on a closed network
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# JupyterLab settings for a quiet, deterministic page: no news pop-up over the cells, every cell
# in the DOM (no windowing), and nothing saved unless the learner saves.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
}
# A cell run before the kernel is attached is silently not run, so wait for that first.
KERNEL_READY = """() => {
    const kernel = window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel;
    return !!kernel && kernel.connectionStatus === "connected" && kernel.status === "idle";
}"""
RUNNING = re.compile(r"^\s*\[\*\]:\s*$")
DONE = re.compile(r"^\s*\[\d+\]:\s*$")


def unavailable(reason: str) -> None:
    """A learner without a browser gets a skip; CI must never skip this test silently."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the browser test must run in CI)", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str:
    chosen = os.environ.get("DPMP_LAB_CHROMIUM")
    if chosen:
        if not os.access(chosen, os.X_OK) or os.path.isdir(chosen):
            unavailable(f"DPMP_LAB_CHROMIUM={chosen} is not a program that can be run")
        return chosen
    found = next((p for p in map(shutil.which, BROWSERS) if p), None)
    if not found:
        unavailable("no Chromium on this machine: the browser test needs one "
                    "(Debian/Ubuntu: apt-get install chromium; or set DPMP_LAB_CHROMIUM)")
    return found


def playwright_api():
    try:
        from playwright import sync_api
    except ImportError:
        unavailable("the playwright package is missing (it comes with the [dev] extra)")
    return sync_api


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> dict[int, tuple[int, str]]:
    table = proc_table()
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, cmd) in table.items():
            if ppid == parent and child not in found:
                found[child] = (ppid, cmd)
                frontier.append(child)
    return found


def stop_group(proc: subprocess.Popen, log, sig: int, started: dict[int, tuple[int, str]],
               grace: float = 0.0) -> list[str]:
    """Send `sig` to `proc`'s process group (SIGKILL after 30 s) and close its log; then kill
    what of `started` (descendants(), taken while it ran) is still the same process after
    `grace` seconds, and return those as "pid command"."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        log.close()

    def alive() -> list[int]:
        table = proc_table()   # a pid seen as a zombie has cmd "": gone means not in table
        return [p for p, (_, cmd) in started.items() if p in table and table[p][1] == cmd]

    end = time.monotonic() + grace
    while alive() and time.monotonic() < end:
        time.sleep(0.2)
    left = alive()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:   # it ended between the look and the kill
            pass
    return [f"{pid} {started[pid][1]}" for pid in left]


def wait_for(condition, seconds: float, what: str):
    end = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"after {seconds:g} s: {what}")
        time.sleep(0.2)


def cell(page, nb: nbformat.NotebookNode, snippet: str):
    """The cell whose source contains `snippet`, located by its index in the notebook."""
    index = next(i for i, c in enumerate(nb.cells) if snippet in c.source)
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def prompt(c) -> str:
    return c.locator(".jp-InputPrompt").inner_text()


def run(page, c, wait: bool = True, timeout: float = 120) -> None:
    """Select the cell and press Shift+Enter, as a learner does; wait for a new execution count."""
    expect = playwright_api().expect

    before = prompt(c)
    c.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("Shift+Enter")
    if wait:
        expect(c.locator(".jp-InputPrompt")).not_to_have_text(before, timeout=timeout * 1000)
        expect(c.locator(".jp-InputPrompt")).to_have_text(DONE, timeout=timeout * 1000)


def output(c) -> str:
    return c.locator(".jp-OutputArea").inner_text()
