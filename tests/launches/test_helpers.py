"""_helpers.py: the argument checks and the nested-tensor walk the modules share."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpmp_lab._helpers import whole_number
from dpmp_lab._torch_helpers import tensors_in


def test_whole_number_refuses_bools_floats_and_out_of_range_values():
    assert whole_number("world_size", 3) == 3
    assert whole_number("warmup", 0, at_least=0) == 0
    assert whole_number("repeats", 1000, at_most=1000) == 1000
    with pytest.raises(TypeError, match=r"world_size must be an int, not bool \(True\)"):
        whole_number("world_size", True)
    with pytest.raises(TypeError, match="not float"):
        whole_number("world_size", 2.0)
    with pytest.raises(ValueError, match="repeats=0: it must be from 1 to 1000"):
        whole_number("repeats", 0, at_most=1000)
    with pytest.raises(ValueError, match="repeats=1001"):
        whole_number("repeats", 1001, at_most=1000)
    with pytest.raises(ValueError, match="jobs=0: it must be at least 1"):
        whole_number("jobs", 0)
    with pytest.raises(ValueError, match="a pipeline needs at least 1 stage"):
        whole_number("stages", 0, what="a pipeline needs at least 1 stage")


def test_tensors_in_walks_lists_tuples_and_dict_values_to_the_depth_asked():
    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))
    nested = [a, (b, {"k": c}), {"deep": [[[d]]]}, "text", 3]
    assert [t.item() for t in tensors_in(nested)] == [0, 1, 2, 3]
    # levels=2: containers at depths 0, 1 and 2 are opened, a tensor at depth 3 is still seen
    assert [t.item() for t in tensors_in(nested, levels=2)] == [0, 1, 2]
    assert [t.item() for t in tensors_in([[[a]]], levels=2)] == [0]
    assert list(tensors_in([[[[a]]]], levels=2)) == []
    assert list(tensors_in(a)) == [a]


def test_tensors_in_opens_modules_only_when_asked():
    lin = nn.Linear(2, 3)
    norm = nn.BatchNorm1d(3)
    assert list(tensors_in([lin])) == []
    found = list(tensors_in({"m": [lin, norm]}, modules=True))
    expected = [*lin.parameters(), *norm.parameters(), *norm.buffers()]
    assert len(found) == len(expected) and all(f is e for f, e in zip(found, expected,
                                                                      strict=True))


FREEZE_PROBE = """
import gc, sys, torch
{before}
from dpmp_lab._torch_helpers import freeze_startup
import dpmp_lab as dl
froze = freeze_startup()
later = torch.ones(1000, dtype=torch.float64)     # made after: a walk still finds it
with dl.footprint.held() as mem:
    kept = [torch.zeros(500, dtype=torch.float64)]
    mem.mark("kept")
print(froze, gc.get_freeze_count() > 100_000, any(o is later for o in gc.get_objects()),
      mem.at("kept"),
      len(gc.get_objects()) * 10 < gc.get_freeze_count() if froze else None)   # a walk's work
"""


@pytest.mark.parametrize("before, expected", [
    ("", "True True True 4000 True"),
    ("early = torch.zeros(3)", "False False True 4000 None")])
def test_freeze_startup_hides_the_imports_from_gc_but_never_a_tensor(before, expected):
    """What the imports made leaves the collector's sight (a kernel's collections and
    dl.footprint's walks get cheap), what comes after does not, and a process that already
    holds a tensor is not frozen (the walks would lose it)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FREEZE_PROBE.format(before=before)],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[-2] == expected, out.stdout + out.stderr
