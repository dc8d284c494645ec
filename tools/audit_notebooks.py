"""Run solution notebooks under the device audit and list every cell that fails, for authors.

    .venv/bin/python tools/audit_notebooks.py 02_data_parallel      # or several, or none = all

Unlike the test (which stops at the first failing cell), this runs every cell and prints each
failure's first lines, so a notebook can be fixed in one pass.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def audit(name: str) -> int:
    path = ROOT / "solutions" / name / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    os.environ["DPMP_LAB_DEVICE_AUDIT"] = "1"
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    failed = 0
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                failed += 1
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
                text = "\n".join(out.traceback)
                print(f"== {name} cell {i} ({grade_id}): {out.ename}")
                print("\n".join(text.splitlines()[:8]))
    print(f"{name}: {failed} failing cell(s) under the device audit")
    return failed


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
    sys.exit(1 if sum(audit(n) for n in names) else 0)
