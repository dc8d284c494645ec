"""dl.check's parts, without launching: the hint tables (every built-in entry fires on its case,
a grader's entry speaks first), references switched off wherever the library holds them, and
the check submodules guarded like the package."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import dpmp_lab as dl
from dpmp_lab import integrity
from dpmp_lab.check import hints
from dpmp_lab.check.failed import CheckFailed
from dpmp_lab.check.hints import COMM_HINTS, SCALE_HINTS, CommHint, ScaleHint
from dpmp_lab.integrity import TamperingDetected
from tests.conftest import ROOT
from tests.support.comm_cases import COMM_CASES, comm_failure, dp_calls, trace_of


@pytest.mark.parametrize("calls, expected, kw, words", COMM_CASES)
def test_each_comm_hint_names_its_mistake(calls, expected, kw, words):
    assert f"Likely mistake: {words}" in comm_failure(trace_of(*calls), expected, **kw)


def test_every_built_in_comm_hint_fires_on_its_own_case(monkeypatch):
    fired = []

    def recorded(i: int, hint: CommHint) -> CommHint:
        def when(row, table):
            if hint.when(row, table):
                fired.append(i)
                return True
            return False
        return CommHint(when, hint.says, hint.accounts_for)

    monkeypatch.setattr(hints, "COMM_HINTS", [recorded(i, h) for i, h in enumerate(COMM_HINTS)])
    assert len(COMM_CASES) == len(COMM_HINTS)
    for i, (calls, expected, kw, _) in enumerate(COMM_CASES):
        fired.clear()
        comm_failure(trace_of(*calls), expected, **kw)
        assert fired[0] == i, f"case {i} was named by entry {fired[0]}"


def test_a_hint_that_accounts_for_the_extra_calls_leaves_them_no_line_of_their_own():
    msg = comm_failure(trace_of(*dp_calls("all_gather", 2)), {"all_reduce": 1})
    assert "unexpected all_gather" not in msg and "Also" not in msg


def test_a_graders_comm_hint_speaks_first():
    hint = CommHint(lambda row, table: row.op == "all_to_all" and row.expected is None,
                    lambda row, table: f"{row.seen} all_to_all: this exercise needs none")
    t = trace_of(*dp_calls("all_to_all", 2))
    assert "Likely mistake: 2 unexpected all_to_all" in comm_failure(t, {})
    COMM_HINTS.insert(0, hint)
    try:
        msg = comm_failure(t, {})
    finally:
        COMM_HINTS.remove(hint)
    assert "Likely mistake: 2 all_to_all: this exercise needs none" in msg
    assert "unexpected all_to_all" not in msg      # the first entry that applies speaks alone


def test_an_exercises_own_words_come_before_the_table():
    t = trace_of(*dp_calls("all_reduce", 2))
    msg = comm_failure(t, {"all_reduce": 1}, hints={"all_reduce": "one per bucket"})
    assert "Likely mistake: one per bucket\nAlso: 2x the expected number" in msg


SCALE_CASES = [
    (0.0, 2, "every element is zero"),
    (0.1, 2, "every element is 1/10 of the reference: divided by 10 once too often (not the"),
    (10.0, 2, "every element is 10x the reference: a sum over 10 micro-batches or parts"),
    (4.0, 4, "every element is 4x the reference: a sum over 4 ranks or micro-batches"),
    (0.5, 2, "every element is 1/2 of the reference: divided by 2 once too often"),
    (1.7, 2, "every element is 1.7x the reference (a wrong scale factor)"),
]


@pytest.mark.parametrize("factor, world, words", SCALE_CASES)
def test_each_scale_hint_names_its_mistake(factor, world, words):
    e = torch.linspace(1, 2, 6, dtype=torch.float64)
    with pytest.raises(CheckFailed) as info:
        dl.check.compare([{"m": factor * e}] * world, {"m": e}, dtype=torch.float64)
    assert f"Likely mistake: {words}" in str(info.value)


def test_scale_hints_fire_in_order_and_a_graders_entry_speaks_first():
    assert len(SCALE_CASES) == len(SCALE_HINTS)
    e = torch.linspace(1, 2, 6, dtype=torch.float64)
    for i, (factor, world, _) in enumerate(SCALE_CASES):
        scale = hints.Scale(factor, world)
        assert next(n for n, h in enumerate(SCALE_HINTS) if h.when(scale)) == i
    hint = ScaleHint(lambda s: s.factor == -1, "the sign is flipped: loss or gradient negated")
    SCALE_HINTS.insert(0, hint)
    try:
        assert hints.keyed_scale_hint(-e, e, 1e-10, 1e-10)[1] == hint.says
    finally:
        SCALE_HINTS.remove(hint)
    assert hints.keyed_scale_hint(-e, e, 1e-10, 1e-10)[1] == (
        "every element is -1x the reference (a wrong scale factor)")
    assert hints.keyed_scale_hint(e + 1, e, 1e-10, 1e-10)[1] == ""     # not a scaled copy: no guess
    # an unfilled buffer's leftovers fit a factor like -9e-309: read as never filled, no scale
    key, _ = hints.keyed_scale_hint(-9.07e-309 * e, e, 1e-10, 1e-10)
    assert key == "scale.zero"


# -- references switched off wherever the library holds them -----------------------------------


def holders(obj) -> list[str]:
    """The dpmp_lab modules that hold `obj` under some name."""
    return sorted(f"{key}.{name}" for key, m in list(sys.modules.items())
                  if key.startswith("dpmp_lab") and m is not None
                  for name, value in list(vars(m).items()) if value is obj)


@pytest.mark.parametrize("target, name", [("dl.tp.copy_to_tp_region", "copy_to_tp_region"),
                                          ("dl.dp", "DataParallel"), ("ProcessGrid", None)])
def test_a_reference_is_off_in_every_library_module_that_holds_it(target, name):
    owner = dl if name is None else (dl.tp if "tp" in target else dl.dp)
    original = getattr(owner, name or target)
    before = holders(original)
    assert len(before) >= 2       # where learners reach it, and where it is defined
    with dl.check.references_off(target):
        assert holders(original) == []
        with pytest.raises(dl.check.ReferenceSwitchedOff, match="is switched off here"):
            getattr(owner, name or target)()
        integrity.verify()
    assert holders(original) == before


def test_a_library_module_imported_after_a_switch_is_read_too(monkeypatch):
    """The library's bindings are read once and kept: a module of the library imported after
    that (a rank imports a few of its own) is read as well, and one binding a name more."""
    original = dl.tp.copy_to_tp_region
    with dl.check.references_off("dl.tp.copy_to_tp_region"):
        pass
    late = types.ModuleType("dpmp_lab._imported_late")
    late.region = original
    monkeypatch.setitem(sys.modules, late.__name__, late)
    with dl.check.references_off("dl.tp.copy_to_tp_region"):
        assert late.region is not original
    monkeypatch.setattr(dl.models, "region_too", original, raising=False)
    with dl.check.references_off("dl.tp.copy_to_tp_region"):
        assert late.region is not original and dl.models.region_too is not original
    assert late.region is original and dl.models.region_too is original


def test_the_graders_own_references_stay_on():
    original = dl.models.default_dtype
    with dl.check.references_off("models.default_dtype"):
        assert dl.models.default_dtype is not original
        assert vars(dl.check.numbers)["default_dtype"] is original
        with vars(dl.check.numbers)["default_dtype"](None):   # and it still works
            pass


def test_a_reference_held_by_the_learners_code_is_off_too():
    """A default argument, an alias made before the switch and a table all hold the function
    object: they meet the switch as a call by name does, and get it back afterwards."""
    def my_rows(n, rank, world, _split=dl.models.shard_range):
        return _split(n, rank, world)
    alias, table = dl.models.shard_range, {"split": dl.models.shard_range}
    with dl.check.references_off("models.shard_range"):
        for call in (lambda: my_rows(10, 1, 4), lambda: alias(10, 1, 4),
                     lambda: table["split"](10, 1, 4)):
            with pytest.raises(dl.check.ReferenceSwitchedOff, match="shard_range is switched"):
                call()
    assert my_rows(10, 1, 4) == alias(10, 1, 4) == range(3, 6)
    closure = dl.pp.make_schedule("gpipe", 2, 3)   # a method: off on every instance
    with dl.check.references_off("pp.Schedule.peak_in_flight"):
        with pytest.raises(dl.check.ReferenceSwitchedOff):
            closure.peak_in_flight(0)
    assert closure.peak_in_flight(0) == 3


def test_targets_are_checked():
    with pytest.raises(ValueError, match="no 'hybrid.nothing_like_this'"):
        with dl.check.references_off("hybrid.nothing_like_this"):
            pass
    with pytest.raises(ValueError, match="not a name under dpmp_lab"):
        with dl.check.references_off("tp..shard"):
            pass


# -- the submodules are the grader's too -------------------------------------------------------


def test_writes_into_a_check_submodule_are_caught_by_verify():
    original = hints.keyed_likely_mistakes
    vars(hints)["keyed_likely_mistakes"] = lambda table, custom=None: []
    try:
        assert integrity.changes() == ["dpmp_lab.check.hints.keyed_likely_mistakes was replaced"]
        with pytest.raises(TamperingDetected, match="keyed_likely_mistakes was replaced"):
            integrity.verify()
    finally:
        vars(hints)["keyed_likely_mistakes"] = original


def notebook_reference_targets() -> set[str]:
    """Every string a solution notebook hands to references_off / with_references_off, or keeps
    in a tuple named *_OFF for them, read from the source (nothing is run)."""
    import ast
    import json

    found: set[str] = set()
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            try:
                tree = ast.parse("".join(cell["source"]))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                called = (getattr(node.func, "attr", getattr(node.func, "id", ""))
                          if isinstance(node, ast.Call) else "")
                if called in ("references_off", "with_references_off"):
                    # with_references_off(fn, *targets): the first argument is the function
                    args = node.args[1:] if called == "with_references_off" else node.args
                    found |= {a.value for a in args if isinstance(a, ast.Constant)
                              and isinstance(a.value, str)}
                elif isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id.endswith("_OFF") for t in node.targets):
                    found |= {e.value for e in ast.walk(node.value)
                              if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return found


def test_every_reference_a_notebook_switches_off_exists():
    """A reference renamed or moved in the library fails here, not in a learner's cell."""
    targets = notebook_reference_targets()
    assert len(targets) >= 20, sorted(targets)      # the reader finds the notebooks' targets
    for target in sorted(targets):
        with dl.check.references_off(target):        # ValueError for a name that is gone
            pass
