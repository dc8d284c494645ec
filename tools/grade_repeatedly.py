"""Run a solution notebook several times in a row and score each run as nbgrader's autograde
does (a graded cell earns its points when it raises no error), to show that its grading does
not fail by chance on a noisy machine.

    python tools/grade_repeatedly.py 08_performance --runs 5

Each run is a fresh kernel with NBGRADER_EXECUTION=autograde, so the notebook takes the same
path as under the grader. Prints one line per run (score, seconds, the cells that lost points)
and exits 1 if any run missed full marks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def score_once(name: str) -> tuple[float, float, list[str], float]:
    """(points earned, points possible, graded cells that failed, seconds) of one run."""
    folder = ROOT / "solutions" / name
    nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(folder)}}).execute()
    seconds = time.perf_counter() - start
    earned = possible = 0.0
    failed = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade"):
            continue
        points = float(meta.get("points", 0))
        possible += points
        if any(o.output_type == "error" for o in cell.outputs):
            failed.append(meta["grade_id"])
        else:
            earned += points
    return earned, possible, failed, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="assignment, e.g. 08_performance")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    full = 0
    for run in range(1, args.runs + 1):
        earned, possible, failed, seconds = score_once(args.name)
        full += earned == possible
        print(f"run {run}: {earned:g}/{possible:g} points in {seconds:.1f} s"
              + (f"; lost: {', '.join(failed)}" if failed else ""), flush=True)
    print(f"{full} of {args.runs} runs with full marks")
    return 0 if full == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
