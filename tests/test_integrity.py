"""Tamper evidence: the grader's functions cannot be swapped out from a cell unnoticed."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import integrity
from dpmp_lab.integrity import TamperingDetected


def test_replacing_a_grader_function_is_refused_at_once():
    with pytest.raises(TamperingDetected, match="dpmp_lab.check.comm cannot be replaced"):
        dl.check.comm = lambda *args, **kwargs: None
    with pytest.raises(TamperingDetected, match="all_reduce cannot be replaced"):
        dist.all_reduce = lambda *args, **kwargs: None
    with pytest.raises(TamperingDetected, match="cannot be deleted"):
        del dl.check.compare
    dl.check.my_own_helper = 1          # new names stay allowed
    del dl.check.my_own_helper
    assert integrity.changes() == []


def test_a_change_behind_the_guard_fails_every_check_naming_it():
    original = dl.check.comm
    vars(dl.check)["comm"] = lambda *args, **kwargs: None
    try:
        assert integrity.changes() == ["dpmp_lab.check.comm was replaced"]
        with pytest.raises(TamperingDetected, match="dpmp_lab.check.comm was replaced"):
            dl.check.close(torch.ones(2), torch.ones(2))
    finally:
        vars(dl.check)["comm"] = original
    original_count = dl.Trace.count
    dl.Trace.count = lambda self, *a, **k: 1
    try:
        with pytest.raises(TamperingDetected, match="Trace.count was replaced"):
            integrity.verify()
    finally:
        dl.Trace.count = original_count
    integrity.verify()


def rank_that_switches_the_tracer_off():
    import sys
    vars(sys.modules["dpmp_lab.trace"])["_flatten"] = lambda value: iter(())
    return 1


def test_a_rank_that_changes_the_grader_fails_under_nbgrader(warm, monkeypatch):
    assert dl.launch(rank_that_switches_the_tracer_off, world_size=1, stream=False).values == [1]
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(rank_that_switches_the_tracer_off, world_size=1, stream=False)
    assert "dpmp_lab.trace._flatten was replaced" in str(info.value)
