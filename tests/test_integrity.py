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


def test_every_module_of_the_graders_packages_is_guarded():
    """Derived from the package, not listed: each module of check/ and launcher/ on disk, and
    each grader module named, refuses to have one of its functions or classes replaced."""
    import importlib
    import sys
    import types
    import warnings
    from pathlib import Path

    package = Path(dl.__file__).parent
    on_disk = {".".join(("dpmp_lab", *f.relative_to(package).with_suffix("").parts))
               .removesuffix(".__init__")
               for folder in ("check", "launcher") for f in (package / folder).rglob("*.py")}
    assert on_disk <= set(integrity.GUARDED_MODULES), on_disk - set(integrity.GUARDED_MODULES)
    for name in integrity.GUARDED_MODULES:
        module = importlib.import_module(name)
        with warnings.catch_warnings():   # torch's deprecated aliases warn when looked at
            warnings.simplefilter("ignore", FutureWarning)
            held = [k for k, v in vars(module).items() if not k.startswith("_")
                    and isinstance(v, (types.FunctionType, type))]
        if not held:
            continue   # a package's __init__ with a docstring only
        with pytest.raises(TamperingDetected, match="cannot be replaced"):
            setattr(module, held[0], lambda *args, **kwargs: None)
        assert getattr(sys.modules[name], held[0]) is vars(module)[held[0]]
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
    vars(sys.modules["dpmp_lab.trace"])["tensors_in"] = lambda value: iter(())
    return 1


def test_a_rank_that_changes_the_grader_fails_under_nbgrader(warm, monkeypatch):
    assert dl.launch(rank_that_switches_the_tracer_off, world_size=1, stream=False).values == [1]
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(rank_that_switches_the_tracer_off, world_size=1, stream=False)
    assert "dpmp_lab.trace.tensors_in was replaced" in str(info.value)
