"""Run the whole course on the GPUs of this machine and say which backend each cell ran on.

    .venv/bin/python tools/gpu_course.py                 # every solution notebook
    .venv/bin/python tools/gpu_course.py 00_launch 02_data_parallel --json out.json

Each solution notebook (answers and hidden tests included) is executed headless with
backend="auto", as a learner's kernel would run it: a launch gets nccl when the machine has a
GPU per rank (on a 1-GPU machine that is the world-size-1 launches only) and gloo on the CPU
otherwise. Every launch appends a line to $DPMP_LAB_LAUNCH_LOG, so the summary counts, per
notebook, the cells whose launches ran on nccl, on gloo only, and the cells that failed.
An instructor runs this once on a new server; it exits 1 if any notebook failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]


def run_notebook(name: str, timeout: int) -> dict:
    """Execute solutions/<name>; return counts of cells per backend, launches and the error."""
    path = ROOT / "solutions" / name / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="dpmp_lab-gpu-course-") as tmp:
        log = Path(tmp) / "launches.jsonl"
        log.touch()
        os.environ["DPMP_LAB_LAUNCH_LOG"] = str(log)
        os.environ.pop("DPMP_LAB_DEVICE_AUDIT", None)   # real devices here, not the audit
        per_cell: dict[int, list[dict]] = {}
        seen = 0

        def executed(cell, cell_index, **_):
            nonlocal seen
            lines = log.read_text().splitlines()
            if len(lines) > seen:
                per_cell[cell_index] = [json.loads(x) for x in lines[seen:]]
                seen = len(lines)

        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        client.on_cell_executed = executed
        start, error = time.monotonic(), None
        try:
            client.execute()
        except CellExecutionError as exc:
            error = str(exc).strip().splitlines()[-1][:300]
        wall = time.monotonic() - start
    launches = [entry for entries in per_cell.values() for entry in entries]
    nccl_cells = sum(any("nccl" in e["backend"] for e in es) for es in per_cell.values())
    return {
        "notebook": name,
        "code_cells": sum(c.cell_type == "code" for c in nb.cells),
        "cells_with_launches": len(per_cell),
        "cells_on_nccl": nccl_cells,
        "cells_on_gloo_only": len(per_cell) - nccl_cells,
        "launches_nccl": sum("nccl" in e["backend"] for e in launches),
        "launches_gloo": sum("nccl" not in e["backend"] for e in launches),
        "launches_failed": sum(e["outcome"] != "ok" for e in launches),
        "seconds": round(wall, 1),
        "error": error,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks (default: every one)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--json", default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())

    from dpmp_lab.launcher.launch import visible_gpus

    print(f"GPUs visible: {visible_gpus()}", flush=True)
    rows = []
    for name in names:
        print(f"running {name} ...", flush=True)
        rows.append(run_notebook(name, args.timeout))
        r = rows[-1]
        print(f"  {r['cells_with_launches']} cells launched ranks: {r['cells_on_nccl']} on nccl, "
              f"{r['cells_on_gloo_only']} on gloo only ({r['launches_nccl']} nccl / "
              f"{r['launches_gloo']} gloo launches, {r['launches_failed']} expected to fail); "
              f"{r['seconds']} s; " + ("ok" if r["error"] is None else f"FAILED: {r['error']}"),
              flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("cells_with_launches", "cells_on_nccl",
                                                  "cells_on_gloo_only", "launches_nccl",
                                                  "launches_gloo")}
    failed = [r["notebook"] for r in rows if r["error"] is not None]
    print(f"summary: {len(rows)} notebooks, {total['cells_with_launches']} cells launched ranks "
          f"({total['cells_on_nccl']} on nccl, {total['cells_on_gloo_only']} on gloo only; "
          f"{total['launches_nccl']} nccl and {total['launches_gloo']} gloo launches); "
          + (f"FAILED: {', '.join(failed)}" if failed else "every notebook passed"))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "total": total}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
