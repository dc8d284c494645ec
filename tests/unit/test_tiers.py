"""The test tiers: where each test file lives, and the unit tier's rule that no test there
starts a process (tests/unit/conftest.py)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import subprocess

import pytest

from tests.conftest import ROOT
from tests.unit.conftest import ProcessStarted

# the tiers, fastest first, as the test command runs them (bootstrap.py's TIERS)
TIERS = ("unit", "launches", "end_to_end")


def test_every_test_file_lives_in_a_tier():
    tests = ROOT / "tests"
    stray = sorted(str(p.relative_to(ROOT)) for p in tests.rglob("test_*.py")
                   if p.relative_to(tests).parts[0] not in TIERS)
    assert not stray, f"test files outside tests/{{{','.join(TIERS)}}}/: {stray}"
    spec = importlib.util.spec_from_file_location("bootstrap_tiers", ROOT / "bootstrap.py")
    bootstrap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bootstrap)
    assert bootstrap.TIERS == tuple(f"tests/{t}" for t in TIERS)


@pytest.mark.parametrize("start", [
    lambda: subprocess.run(["true"], check=False),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("fork").Process(target=print).start(),
], ids=["subprocess", "spawn", "fork"])
def test_a_unit_test_that_starts_a_process_fails(start):
    with pytest.raises(ProcessStarted, match="belongs in tests/launches/"):
        start()
