"""A real notebook, executed headless: functions defined in cells, launched, output in the cell."""

from __future__ import annotations

import re

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import ROOT, stray_processes

NOTEBOOK = ROOT / "tests" / "notebooks" / "launch_in_a_cell.ipynb"


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb


def text_of(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def cell_with(nb, snippet: str):
    return next(c for c in nb.cells if c.cell_type == "code" and snippet in c.source)


def test_rank_lines_appear_in_the_launching_cell(executed):
    out = text_of(cell_with(executed, "res = dl.launch(hello"))
    for r in range(4):
        assert f"[rank {r}] sum over ranks = 20.0" in out


def test_cell_magic_runs_the_cell_on_every_rank(executed):
    cell = cell_with(executed, "%%distributed -n 2 -o out")
    out = text_of(cell)
    assert "[rank 0] magic says 1.0" in out and "[rank 1] magic says 1.0" in out
    assert "[101.0, 101.0]" in out  # the last expression, one value per rank


def test_errors_show_the_rank_and_the_cell_source_not_the_launcher(executed):
    out = text_of(cell_with(executed, "dl.launch(broken"))
    assert re.search(r"rank \d raised ZeroDivisionError: division by zero", out)
    assert "return 1 / 0" in out
    assert "launch.py" not in out


def test_hang_in_a_magic_cell_is_a_timeout(executed):
    out = text_of(cell_with(executed, "--timeout 3"))
    assert "LaunchTimeout" in out and "rank 0 of 2 did not finish" in out
    assert "dist.all_reduce(torch.ones(1))" in out  # where it waited, from the cell's source


def test_kernel_still_works_after_failures(executed):
    last = executed.cells[-1]  # nbclient raises if an untagged cell fails, so this one passed
    assert all(o.output_type == "stream" for o in last.outputs)
    assert "[rank 1] sum over ranks = 3.0" in text_of(last)
    assert stray_processes() == []
