"""Tamper evidence in the ranks: a rank that changes the library's grading functions is named."""

from __future__ import annotations

import pytest

import dpmp_lab as dl
from dpmp_lab import integrity
from dpmp_lab.integrity import TamperingDetected


def test_the_snapshot_covers_every_module_of_the_graders_packages():
    """Derived from the package, not listed: each module of check/ and launcher/ on disk is
    remembered, and a function replaced in any of them is named."""
    import importlib
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
        original = vars(module)[held[0]]
        setattr(module, held[0], lambda *args, **kwargs: None)
        try:
            assert integrity.changes() == [f"{name}.{held[0]} was replaced"]
        finally:
            setattr(module, held[0], original)
    assert integrity.changes() == []


def test_a_change_fails_verify_naming_it():
    original = dl.check.comm
    vars(dl.check)["comm"] = lambda *args, **kwargs: None
    try:
        assert integrity.changes() == ["dpmp_lab.check.comm was replaced"]
        with pytest.raises(TamperingDetected, match="dpmp_lab.check.comm was replaced"):
            integrity.verify()
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
