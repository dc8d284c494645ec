"""The solution notebooks and their broken variants, as the course tests and the class-grading
tests read them (one place, so that no test module imports another)."""

from __future__ import annotations

import copy
import functools
import importlib.util

import nbformat

from tests.conftest import ROOT

VARIANTS_DIR = ROOT / "tests" / "course_variants"


@functools.cache
def variants(name: str) -> list[dict]:
    """tests/course_variants/<name>.py's VARIANTS ([] for a notebook without the file), loaded
    once per process: read-only data to every test."""
    path = VARIANTS_DIR / f"{name}.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location(f"variants_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VARIANTS


def source_notebook(name: str) -> nbformat.NotebookNode:
    """The solution notebook, a copy of its own for the caller to change (read and validated
    once per process: collecting the course's tests asks for it some 2,000 times)."""
    return copy.deepcopy(_read_solution(name))


@functools.cache
def _read_solution(name: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)


@functools.cache
def grade_ids(name: str) -> tuple[str | None, ...]:
    """The grade id of each cell of the solution notebook (None where it has none)."""
    return tuple(c.metadata.get("nbgrader", {}).get("grade_id") for c in _read_solution(name).cells)


def cells_by_kind(nb: nbformat.NotebookNode, kind: str) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.metadata.get("nbgrader", {}).get(kind)]


def with_replacements(nb: nbformat.NotebookNode, replace: dict[str, str]) -> nbformat.NotebookNode:
    """A copy of `nb` with the solution cells named in `replace` given those sources."""
    nb = copy.deepcopy(nb)
    solutions = set(cells_by_kind(nb, "solution"))
    unknown = set(replace) - solutions
    assert not unknown, f"variants replace cells that are not solution cells: {unknown}"
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in replace:
            cell.source = replace[grade_id].strip()
    return nb


@functools.cache
def translated(language: str) -> tuple[str, ...]:
    """The notebooks with a catalogue of their own in `language`: tests/end_to_end/test_i18n.py
    holds that each of them lacks nothing (dpmp_lab.i18n.problems, seconds a notebook: not paid
    again by every process that collects the tests)."""
    from dpmp_lab import i18n
    from dpmp_lab.instructor.course import assignments

    return tuple(name for name in assignments(ROOT)
                 if i18n.catalogue_path(language, name).exists())
