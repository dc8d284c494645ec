"""Write nbgrader source notebooks from Python, for course authors.

A notebook in solutions/ is the source of truth; this module only makes it easy to write one
(or to rewrite one from a script) with the right nbgrader metadata:

    from nbsource import Notebook
    nb = Notebook()
    nb.md("# 00 · Launching ranks")
    nb.code("import dpmp_lab as dl")                      # a read-only cell
    nb.solution("ex1", "def f():\\n    ### BEGIN SOLUTION\\n    ...\\n    ### END SOLUTION")
    nb.tests("ex1_tests", 2, "assert f() == 1\\n### BEGIN HIDDEN TESTS\\n...\\n### END HIDDEN TESTS")
    nb.save("solutions/00_launch/00_launch.ipynb")

Instructors can equally edit the .ipynb in JupyterLab with nbgrader's "Create Assignment"
toolbar; the metadata written here is the same.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat


def _nbgrader(grade_id: str, *, solution: bool = False, grade: bool = False,
              locked: bool = False, points: float | None = None) -> dict:
    meta = {"grade_id": grade_id, "solution": solution, "grade": grade, "locked": locked,
            "task": False, "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


class Notebook:
    """Cells in order; every code cell gets nbgrader metadata and a unique grade_id."""

    def __init__(self) -> None:
        self.nb = nbformat.v4.new_notebook()
        self.nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                          "language": "python"}
        self.nb.metadata["language_info"] = {"name": "python"}
        self._ids: set[str] = set()
        self._n = 0

    def _id(self, grade_id: str | None, prefix: str) -> str:
        if grade_id is None:
            self._n += 1
            grade_id = f"{prefix}_{self._n}"
        if grade_id in self._ids:
            raise ValueError(f"grade_id {grade_id!r} used twice")
        self._ids.add(grade_id)
        return grade_id

    def md(self, text: str) -> None:
        """Explanation (read-only for learners)."""
        cell = nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip())
        cell.metadata.update(_nbgrader(self._id(None, "md"), locked=True))
        self.nb.cells.append(cell)

    def code(self, source: str, grade_id: str | None = None, *, locked: bool = True) -> None:
        """A code cell the learner runs as it is (read-only by default)."""
        cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip())
        if locked:
            cell.metadata.update(_nbgrader(self._id(grade_id, "code"), locked=True))
        self.nb.cells.append(cell)

    def solution(self, grade_id: str, source: str) -> None:
        """Code the learner writes: the part between ### BEGIN/END SOLUTION is removed."""
        src = textwrap.dedent(source).strip()
        if "### BEGIN SOLUTION" not in src:
            raise ValueError(f"solution cell {grade_id!r} has no ### BEGIN SOLUTION marker")
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata.update(_nbgrader(self._id(grade_id, "solution"), solution=True))
        self.nb.cells.append(cell)

    def tests(self, grade_id: str, points: float, source: str) -> None:
        """Autograded tests: a visible check, then ### BEGIN/END HIDDEN TESTS."""
        src = textwrap.dedent(source).strip()
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata.update(_nbgrader(self._id(grade_id, "tests"), grade=True, locked=True,
                                       points=points))
        self.nb.cells.append(cell)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.validate(self.nb)
        nbformat.write(self.nb, path)
