"""Shared fixtures: every launch test also proves that no rank process and no fd was left behind."""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path

import pytest

import dpmp_lab as dl

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def sigint_put_back(request):
    """Every test starts and ends with Python's own SIGINT handler. Python keeps SIGINT ignored
    when it starts with it ignored, as a shell's background job does (`.ci/run &` in a script),
    and then the Ctrl-C tests wait out their launch's timeout; a test or fixture could also
    leave its own handler. Say so, and put Python's back."""
    def put_back(when: str) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if handler is not signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            warnings.warn(f"SIGINT was handled by {handler!r} {when} {request.node.nodeid} "
                          "(inherited, e.g. by a background job, or set by a test or fixture "
                          "before); put back", stacklevel=1)

    put_back("before")
    yield
    put_back("after")


# Long-lived helpers that multiprocessing starts once per process; they are not leaks.
_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def proc_table() -> dict[int, tuple[int, str]]:
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        table[int(entry)] = (ppid, cmd)
    return table


def fake_nvidia_smi(folder: Path, gpus: int, driver: str = "535.104.05") -> str:
    """A PATH whose nvidia-smi lists `gpus` GPUs (or fails, with 0, as without a driver)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})'\n"
                    for i in range(gpus))
    script.write_text("#!/bin/sh\n" + (
        f'case "$1" in --query-gpu*) echo {driver};; *) {lines or "exit 9"};; esac\n'
        if gpus else "echo 'NVIDIA-SMI has failed' >&2; exit 9\n"))
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def stray_processes() -> list[str]:
    """Descendants of this process other than multiprocessing's own helpers."""
    table = proc_table()
    me, found, frontier = os.getpid(), [], [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, cmd) in table.items():
            if ppid == parent and pid != me:
                frontier.append(pid)
                if not any(h in cmd for h in _HELPERS):
                    found.append(f"{pid} {cmd}")
    return found


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="session")
def warm() -> None:
    """Start the forkserver once, so its own pipes are not counted as leaks."""
    dl.launch(lambda: None, world_size=2, stream=False)


@pytest.fixture
def no_leaks(warm):
    before = open_fds()
    yield
    deadline = time.monotonic() + 3.0
    while (stray_processes() or open_fds() > before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stray_processes() == [], "rank processes were left behind"
    assert open_fds() <= before, f"file descriptors leaked: {before} before, {open_fds()} after"


@pytest.fixture(scope="session")
def graded_class(tmp_path_factory) -> dict:
    """One class of 00_launch, honest learners and attackers, graded twice (grading_class.py):
    shared by test_class_grading.py and the tests it imports from grading_trust.py, one file
    for xdist, so it costs its minutes once."""
    from tests.end_to_end.grading_class import (
        grade_the_class,  # it imports this file: no cycle at import
    )

    return grade_the_class(tmp_path_factory.mktemp("class"))


# The files whose fixtures grade for minutes start first, one per worker, and every other file
# fills the time around them: started in the middle of the run (xdist orders the files largest
# first, and the class's come after test_launch's and test_scan's), one could end the run alone
# on one worker while the other sat idle. After them, the files of few tests that each take
# long and mostly wait (a hub, a browser, torchrun): counted by their tests they would come
# last, and one of them ran for the last minute and a half of the run on one worker (measured:
# one core idle).
FIRST = ("tests/end_to_end/test_course.py", "tests/end_to_end/test_class_grading.py",
         "tests/end_to_end/test_hub_class.py", "tests/end_to_end/test_browser.py",
         "tests/end_to_end/test_inert_pages.py", "tests/launches/test_hybrid.py")


def file_of(item: pytest.Item) -> str:
    """tests/<file>.py of a collected test, as FIRST names it."""
    return item.nodeid.split("::", 1)[0]


def scheduled_order(files: list[str]) -> list[str]:
    """The files in the order they are handed to the workers: FIRST's, in its order, then the
    others by their number of tests, most first, as xdist's own reordering would (`files`
    has one entry per test), ties in collection order."""
    counts = {f: files.count(f) for f in dict.fromkeys(files)}
    rest = sorted((f for f in counts if f not in FIRST), key=lambda f: -counts[f])
    return [f for f in FIRST if f in counts] + rest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The collection in scheduled_order. With pytest-xdist (the test command runs 2 workers;
    pyproject's addopts give `--dist=loadfile --no-loadscope-reorder`), each test file runs
    whole on one worker, so that a module's fixtures (a JupyterLab, a graded course) are built
    once, and the files go out in the collection's order. (`--dist=loadgroup` would let two
    files share a worker, but pytest 9.2 broke it: pytest-xdist#1386; the class's two files
    are one file for that reason, tests/end_to_end/grading_trust.py.)"""
    rank = {f: i for i, f in enumerate(scheduled_order([file_of(i) for i in items]))}
    items.sort(key=lambda item: rank[file_of(item)])   # stable: a file keeps its own order
