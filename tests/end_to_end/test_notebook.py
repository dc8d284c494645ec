"""A real notebook, executed headless: functions defined in cells, launched, output in the cell."""

from __future__ import annotations

import re

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT, stray_processes

NOTEBOOKS = ROOT / "tests" / "notebooks"


def execute(name: str):
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


@pytest.fixture(scope="module")
def executed():
    return execute("launch_in_a_cell.ipynb")


@pytest.fixture(scope="module")
def traced():
    return execute("trace_in_a_cell.ipynb")


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
    assert re.search(r"ranks? \d(, \d)* raised ZeroDivisionError: division by zero", out)
    assert "return 1 / 0" in out
    assert "launch.py" not in out


def test_hang_in_a_magic_cell_is_a_timeout(executed):
    out = text_of(cell_with(executed, "--timeout 6"))
    assert "LaunchTimeout" in out and "rank 0 of 2 did not finish" in out
    assert "dist.all_reduce(torch.ones(1))" in out  # where it waited, from the cell's source


def test_kernel_still_works_after_failures(executed):
    last = executed.cells[-1]  # nbclient raises if an untagged cell fails, so this one passed
    assert {o.output_type for o in last.outputs} <= {"stream", "display_data"}
    assert "[rank 1] sum over ranks = 3.0" in text_of(last)
    assert stray_processes() == []


def progress_of(cell) -> list:
    return [o for o in cell.outputs if o.output_type == "display_data"
            and o.data.get("text/plain", "").startswith("ranks: ")]


def test_progress_widget_with_a_text_fallback_shows_final_states(executed):
    [shown] = progress_of(cell_with(executed, "res = dl.launch(hello"))
    assert shown.data["text/plain"] == "ranks: 0 done, 1 done, 2 done, 3 done"
    assert "application/vnd.jupyter.widget-view+json" in shown.data
    [broken] = progress_of(cell_with(executed, "dl.launch(broken"))
    states = broken.data["text/plain"]
    assert states == "ranks: 0 failed, 1 failed"   # both ranks of that cell raise


def rich(cell, mime: str) -> str:
    return "".join(o.data.get(mime, "") for o in cell.outputs if "data" in o)


def test_trace_summary_renders_as_a_table(traced):
    cell = cell_with(traced, "res.traces[3].summary()")
    html = rich(cell, "text/html")
    assert "<table" in html and "<td>all_reduce</td>" in html and "<td>dp</td>" in html
    assert "<td>all_gather</td>" in html and "<td>tp</td>" in html and "32 B" in html
    assert "communication issued by rank 3" in rich(cell, "text/plain")


def test_comm_table_grid_picture_and_traced_magic_render(traced):
    table = rich(cell_with(traced, "dl.viz.comm(res)"), "text/html")
    assert all(f"<th>rank {r}</th>" in table for r in range(4))
    assert rich(cell_with(traced, "dl.viz.grid("), "image/svg+xml").startswith("<svg")
    magic = cell_with(traced, "%%distributed -n 2 --trace")
    assert "<td>broadcast</td>" in rich(magic, "text/html")
    assert "<th>rank 1</th>" in rich(magic, "text/html")


def test_device_audit_names_the_cell_line_of_a_misplaced_tensor(monkeypatch):
    """Planted wrong cells under DPMP_LAB_DEVICE_AUDIT=1: a function cell and a magic cell."""
    monkeypatch.setenv("DPMP_LAB_DEVICE_AUDIT", "1")   # the kernel inherits it
    nb = nbformat.v4.new_notebook()
    wrong = {"tags": ["raises-exception"]}
    nb.cells = [
        nbformat.v4.new_code_cell("import torch, torch.distributed as dist\n"
                                  "import dpmp_lab as dl\n%load_ext dpmp_lab"),
        nbformat.v4.new_code_cell("def forgot():\n    t = torch.ones(3)\n    dist.all_reduce(t)\n"
                                  "dl.launch(forgot, world_size=2)", metadata=wrong),
        nbformat.v4.new_code_cell("%%distributed -n 2\nw = torch.zeros(2, 2)\n"
                                  "x = torch.ones(2, device=dl.device())\nw @ x", metadata=wrong),
        nbformat.v4.new_code_cell("def right():\n    t = torch.ones(3, device=dl.device())\n"
                                  "    dist.all_reduce(t)\n    return str(t.device)\n"
                                  "dl.launch(right, world_size=2).values"),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    forgot, magic, right = (text_of(c) for c in nb.cells[1:])
    assert "device audit: an all_reduce was handed a CPU tensor" in forgot
    assert "made at cell, line 2: `t = torch.ones(3)`" in forgot
    assert "at cell, line 3: `dist.all_reduce(t)`" in forgot and "dl.device()" in forgot
    assert "matmul() mixes a tensor on this rank's device" in magic
    assert "made at cell, line 1: `w = torch.zeros(2, 2)`" in magic
    assert "['cpu:0', 'cpu:0']" in right
    assert stray_processes() == []
