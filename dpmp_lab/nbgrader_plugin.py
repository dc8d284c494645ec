"""nbgrader's side of tamper evidence: a preprocessor that autograde runs after executing a
submission. It scans the learner's own cells (scan.scan) and, when one writes into the
grader's modules, zeroes every graded cell with the lines found as the error, so the grade
and the feedback both say why. nbgrader_config.py registers it; nothing else imports this.
"""

from __future__ import annotations

from typing import Any

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from dpmp_lab import scan


class TamperScan(Preprocessor):
    """Zero a submission whose cells replace the grader's functions, naming the lines."""

    enabled = Bool(True).tag(config=True)   # nbconvert's preprocessors are off by default

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        mine, given = [], []
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            meta = cell.metadata.get("nbgrader", {})
            (mine if meta.get("solution") else given).append(cell.source)
        found = scan.scan(mine, context=given)
        if not found:
            return nb, resources
        message = ("the grader's own functions are changed in your code, so this notebook "
                   "cannot be graded: " + "; ".join(found) + ". Remove those lines and "
                   "submit again.")
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
                cell.outputs.append(nbformat.v4.new_output(
                    "error", ename="TamperingDetected", evalue=message,
                    traceback=["TamperingDetected: " + message]))
        return nb, resources


def autograde_preprocessors(defaults: list) -> list:
    """nbgrader's autograde preprocessors with TamperScan right after execution."""
    names = [getattr(p, "__name__", str(p)) for p in defaults]
    at = names.index("Execute") + 1 if "Execute" in names else 0
    return [*defaults[:at], TamperScan, *defaults[at:]]
