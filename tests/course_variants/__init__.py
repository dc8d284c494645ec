"""Broken variants of each course notebook (one module per assignment, read by test_course)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def solution_editor(name: str) -> Callable[..., dict[str, str]]:
    """An `edit(grade_id, (old, new), ...)` for the solution cells of assignment `name`.

    A variant is a solution cell with one mistake written in, as an exact edit of the notebook's
    own source, so it follows the notebook as that changes; an edit that no longer matches
    exactly once raises when the variants are loaded, never a variant that tests nothing.
    """
    cells = json.loads((SOLUTIONS / name / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]
    sources = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in cells
               if c.get("metadata", {}).get("nbgrader", {}).get("solution")}

    def edit(grade_id: str, *edits: tuple[str, str]) -> dict[str, str]:
        src = sources[grade_id]
        for old, new in edits:
            if src.count(old) != 1:
                raise ValueError(f"variant edit of {grade_id!r} in {name} matches the notebook "
                                 f"{src.count(old)} times, not once: {old!r}")
            src = src.replace(old, new)
        return {grade_id: src}

    return edit
