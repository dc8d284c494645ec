"""Tamper evidence: the grader's functions cannot be swapped out from a cell unnoticed."""

from __future__ import annotations

import nbformat
import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import integrity, scan
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


GIVEN = ["import torch\nimport torch.distributed as dist\nimport dpmp_lab as dl\n"
         "from dpmp_lab.check import comm"]


@pytest.mark.parametrize("line", [
    "dl.check.comm = lambda *a, **k: None",
    "dist.all_reduce = print",
    "setattr(dl.check, 'compare', print)",
    "vars(dl.check)['close'] = print",
    "dl.check.__dict__['close'] = print",
    "vars(dl.check).update(comm=print)",
    "dl.Trace.count = lambda self, *a: 0",
    "comm.__code__ = (lambda *a: None).__code__",
    "del dl.check.comm",
    "with dl.integrity.swapped(dl.check, 'comm', print): pass",
])
def test_scan_finds_writes_into_the_grader(line):
    assert scan.scan(["def f():\n    return 1\n" + line], context=GIVEN) == [f"`{line}`"]


@pytest.mark.parametrize("line", [
    "model.weight = torch.nn.Parameter(torch.ones(2))",
    "torch.backends.cudnn.deterministic = True",
    "x = dl.check.comm",
    "grads = {}\ngrads['w'] = dist.get_rank()",
    "p.grad /= dist.get_world_size()",
    "this is not python",
])
def test_scan_leaves_ordinary_code_alone(line):
    assert scan.scan([line], context=GIVEN) == []


def test_autograde_zeroes_a_tampering_submission_naming_the_line():
    from dpmp_lab.nbgrader_plugin import TamperScan

    def cell(source, **meta):
        c = nbformat.v4.new_code_cell(source)
        c.metadata["nbgrader"] = {"grade_id": meta.get("id", "x"), **meta}
        return c
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell(GIVEN[0], id="imports"),
                cell("def f():\n    return 2\ndl.check.comm = print", id="f", solution=True),
                cell("assert f() == 2", id="f_tests", grade=True, points=1)]
    TamperScan().preprocess(nb, {})
    [error] = nb.cells[2].outputs
    assert error["ename"] == "TamperingDetected" and "`dl.check.comm = print`" in error["evalue"]
    assert nb.cells[1].outputs == []
