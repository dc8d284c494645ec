"""The unit tier: every test here runs in this process alone. Starting any process (a rank, a
kernel, a subprocess, a fork) fails the test that did, so the tier stays the fast one the test
command runs first, and a test that needs a process goes to tests/launches/ or
tests/end_to_end/."""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess

import pytest


class ProcessStarted(AssertionError):
    """A unit test started a process."""


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise ProcessStarted(f"a unit test started a process ({what}): it belongs in "
                             "tests/launches/ (ranks) or tests/end_to_end/ (anything else)")
    return refused


@pytest.fixture(autouse=True)
def no_process_started(monkeypatch):
    # every way a Python process starts another: subprocess and multiprocessing's spawn,
    # forkserver and fork all reach one of these
    monkeypatch.setattr(_posixsubprocess, "fork_exec", _refuse("fork_exec"))
    monkeypatch.setattr(subprocess, "_fork_exec", _refuse("subprocess"))   # bound at its import
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"os.{name}"))
    yield
