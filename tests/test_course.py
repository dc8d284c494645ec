"""The course: solution notebooks run, course/ matches solutions/, and nbgrader's real round trip
gives the solutions full marks, the blank release zero, and every wrong answer in
tests/course_variants/ exactly the points it should lose."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dpmp_lab import course

from .conftest import ROOT, stray_processes

# Grading every submission of every assignment takes many minutes on 2 cores; the fixture's
# time counts against the first test that uses it.
pytestmark = pytest.mark.timeout(4800)

# DPMP_LAB_ASSIGNMENTS=02_data_parallel,04_pipeline: only those (an author's quick round trip)
_ONLY = [a for a in os.environ.get("DPMP_LAB_ASSIGNMENTS", "").split(",") if a]
ASSIGNMENTS = [a for a in course.assignments(ROOT) if not _ONLY or a in _ONLY]
VARIANTS_DIR = ROOT / "tests" / "course_variants"
GRADE_JOBS = int(os.environ.get("DPMP_LAB_GRADE_JOBS", "4"))   # assignments graded at once


def variants(name: str) -> list[dict]:
    path = VARIANTS_DIR / f"{name}.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location(f"variants_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VARIANTS


def source_notebook(name: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)


def cells_by_kind(nb: nbformat.NotebookNode, kind: str) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.metadata.get("nbgrader", {}).get(kind)]


def test_there_are_assignments():
    assert course.assignments(ROOT)[:1] == ["00_launch"]
    assert ASSIGNMENTS, f"DPMP_LAB_ASSIGNMENTS={_ONLY} names no assignment"


# -- the instructor notebooks -----------------------------------------------------------------


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solution_notebook_runs_with_every_hidden_test_passing(name, monkeypatch):
    """Under the device audit: every launch runs as if each rank had a GPU, so a tensor of the
    notebook's that would be on the wrong device under nccl fails here. (The plain run on the
    CPU is the nbgrader round trip below.)"""
    monkeypatch.setenv("DPMP_LAB_DEVICE_AUDIT", "1")   # the kernel inherits it
    nb = source_notebook(name)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "solutions" / name)}}).execute()
    assert stray_processes() == []


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_notebooks_are_committed_without_outputs(name):
    for folder in ("solutions", "course"):
        nb = nbformat.read(ROOT / folder / name / f"{name}.ipynb", as_version=4)
        assert all(not c.get("outputs") and not c.get("execution_count")
                   for c in nb.cells if c.cell_type == "code"), f"{folder}/{name} has outputs"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_every_graded_cell_is_proven_to_fail_on_a_wrong_answer(name):
    graded = set(cells_by_kind(source_notebook(name), "grade"))
    assert graded, f"{name} has no graded cell"
    caught = {cell for v in variants(name) for cell in v["loses"]}
    assert graded <= caught, f"no broken variant of {name} loses {sorted(graded - caught)}"
    assert caught <= graded, f"variants name cells that are not graded: {caught - graded}"


# A learner's answer that works on a laptop but would put data on the wrong device on a GPU
# server: under the audit, the exercise's own test cell shows the audit's message.
DEVICE_MISTAKES = [
    ("00_launch", "gather", "gather_tests",
     ("parts = [torch.zeros(1, dtype=torch.float64, device=dev)",
      "parts = [torch.zeros(1, dtype=torch.float64)"),
     "an all_gather was handed a CPU tensor"),
    ("02_data_parallel", "sharded_momentum_sgd", "sharded_momentum_sgd_tests",
     ("grad_shard = torch.empty_like(self.momentum)",
      "grad_shard = torch.empty(self.shard_size, dtype=self.momentum.dtype)"),
     "a reduce_scatter was handed a CPU tensor"),
]


@pytest.mark.parametrize("name, cell, test_cell, edit, message", DEVICE_MISTAKES,
                         ids=[m[0] for m in DEVICE_MISTAKES])
def test_a_device_mistake_fails_its_test_cell_under_the_audit(name, cell, test_cell, edit,
                                                              message, monkeypatch):
    from tests.course_variants import solution_editor

    if name not in ASSIGNMENTS:
        pytest.skip(f"{name} is not among DPMP_LAB_ASSIGNMENTS")
    monkeypatch.setenv("DPMP_LAB_DEVICE_AUDIT", "1")
    nb = _with_replacements(source_notebook(name), solution_editor(name)(cell, edit))
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT / "solutions" / name)}}).execute()
    failed = {c.metadata["nbgrader"]["grade_id"]: "\n".join(o.traceback)
              for c in nb.cells if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"}
    assert test_cell in failed, f"{test_cell} passed: {sorted(failed)}"
    assert "device audit: " + message in failed[test_cell]
    assert "dl.device()" in failed[test_cell] and "cell, line" in failed[test_cell]
    assert stray_processes() == []


def test_gpu_course_script_counts_the_cells_of_each_backend(tmp_path):
    """tools/gpu_course.py on this (GPU-less) machine: every launch is gloo, none failed."""
    import subprocess
    import sys

    out = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_course.py"), "00_launch",
                          "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "every notebook passed" in run.stdout
    [row] = json.loads(out.read_text())["rows"]
    assert row["error"] is None and row["cells_with_launches"] >= 5
    assert row["cells_on_nccl"] == 0 and row["cells_on_gloo_only"] == row["cells_with_launches"]
    assert row["launches_gloo"] >= row["cells_with_launches"]
    assert stray_processes() == []


# -- the release is what nbgrader makes of the solutions ---------------------------------------


def _comparable(path: Path) -> dict:
    nb = json.loads(path.read_text())
    nb.get("metadata", {}).pop("language_info", None)
    return nb


def test_course_folder_is_current(tmp_path):
    course.release(ASSIGNMENTS, root=ROOT, into=str(tmp_path))
    for name in ASSIGNMENTS:
        fresh, committed = tmp_path / name, ROOT / "course" / name
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(committed) for p in committed.rglob("*")
                               if p.is_file()), f"course/{name} has other files than solutions/"
        for rel in files:
            if rel.suffix == ".ipynb":
                assert _comparable(fresh / rel) == _comparable(committed / rel), (
                    f"course/{name}/{rel} is stale: run `dpmp-lab release {name}`")
            else:
                assert (fresh / rel).read_bytes() == (committed / rel).read_bytes()


# -- the nbgrader round trip ----------------------------------------------------------------------


def _submit(root: Path, student: str, name: str, nb: nbformat.NotebookNode) -> None:
    folder = root / "submitted" / student / name
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{name}.ipynb")


def _with_replacements(nb: nbformat.NotebookNode, replace: dict[str, str]) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    solutions = set(cells_by_kind(nb, "solution"))
    unknown = set(replace) - solutions
    assert not unknown, f"variants replace cells that are not solution cells: {unknown}"
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in replace:
            cell.source = replace[grade_id].strip()
    return nb


def _round_trip(root: Path, name: str) -> dict:
    """Release, submit (solution, blank release, every variant), autograde, feedback: in a
    scratch course of its own, so that one assignment's trouble stays its own."""
    from nbgrader.api import Gradebook

    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / name, root / "solutions" / name)
    course.nbgrader("generate_assignment", name, "--force", root=root, capture=True)
    released = nbformat.read(root / "course" / name / f"{name}.ipynb", as_version=4)
    _submit(root, "solution", name, source_notebook(name))
    _submit(root, "release", name, released)
    for i, variant in enumerate(variants(name)):
        _submit(root, f"variant{i:02d}", name,
                _with_replacements(source_notebook(name), variant["replace"]))
    course.nbgrader("autograde", name, "--create", root=root, capture=True)
    course.nbgrader("generate_feedback", name, "--force", root=root, capture=True)
    scores = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for sub in gb.assignment_submissions(name):
            for notebook in sub.notebooks:
                scores[(name, sub.student_id)] = {g.name: (g.score, g.max_score)
                                                  for g in notebook.grades}
    return scores


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """Scores per (assignment, student, graded cell), after a real nbgrader round trip."""
    base = tmp_path_factory.mktemp("courses")

    def grade(name: str, root: Path) -> dict | Exception:
        try:
            return _round_trip(root, name)
        except Exception as exc:   # reported by that assignment's tests, not by all of them
            return exc

    # Side by side: grading waits on kernels and rank processes starting far more than it
    # computes (8 CPU-minutes in 24 when serial), so GRADE_JOBS assignments at once finish in
    # about a third of the time on 2 cores. Measured here: 4 at once all graded exactly. The
    # most variants first, so the long ones do not start last.
    order = sorted(ASSIGNMENTS, key=lambda name: -len(variants(name)))
    with ThreadPoolExecutor(max_workers=GRADE_JOBS) as pool:
        results = dict(zip(order, pool.map(lambda name: grade(name, base / name), order),
                           strict=True))
    # An assignment that failed among others is graded once more alone: a failure that only
    # happens under load is then reported as a warning with its first error, never hidden.
    roots = {name: base / name for name in ASSIGNMENTS}
    for name in [n for n, r in results.items() if isinstance(r, Exception)]:
        first, roots[name] = results[name], base / f"{name}-alone"
        results[name] = grade(name, roots[name])
        if not isinstance(results[name], Exception):
            warnings.warn(f"grading {name} failed side by side and passed alone: {first}",
                          stacklevel=1)
    assert stray_processes() == []
    return {"results": results, "roots": roots}


def scores_of(graded: dict, name: str, student: str) -> dict:
    result = graded["results"][name]
    if isinstance(result, Exception):
        pytest.fail(f"grading {name} failed: {result}")
    return result[(name, student)]


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solutions_get_full_marks(graded, name):
    cells = scores_of(graded, name, "solution")
    assert cells and all(score == top for score, top in cells.values()), cells


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_unmodified_release_gets_zero_on_every_graded_cell(graded, name):
    cells = scores_of(graded, name, "release")
    assert cells and all(score == 0 for score, _ in cells.values()), cells


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_each_wrong_answer_loses_exactly_its_cells(graded, name):
    for i, variant in enumerate(variants(name)):
        cells = scores_of(graded, name, f"variant{i:02d}")
        lost = {cell for cell, (score, top) in cells.items() if score < top}
        assert lost == set(variant["loses"]), (
            f"{name}, variant {variant['name']!r}: lost {sorted(lost)}, expected to lose "
            f"{sorted(variant['loses'])}")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_feedback_is_generated_and_explains_the_mistake(graded, name):
    scores_of(graded, name, "solution")   # fails clearly if grading this assignment failed
    root = graded["roots"][name]
    for i, _ in enumerate(variants(name)):
        page = root / "feedback" / f"variant{i:02d}" / name / f"{name}.html"
        assert page.exists(), f"no feedback for {name} variant {i}"
    pages = [(root / "feedback" / f"variant{i:02d}" / name / f"{name}.html").read_text()
             for i, _ in enumerate(variants(name))]
    assert any("Likely mistake" in p or "expected" in p for p in pages)
