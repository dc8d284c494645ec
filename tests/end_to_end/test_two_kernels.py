"""The two kernels of a graded notebook and the relay between them
(dpmp_lab/instructor/two_kernels.py), run for real on a notebook of three cells: the learner's
functions, a test cell that calls one that never returns, a test cell after it; released in
Japanese, so that the relay's words are seen to reach the learner in the notebook's language."""

from __future__ import annotations

import asyncio
import time

import nbformat
from nbclient import NotebookClient

from dpmp_lab.harness.plan import Kind, plan
from dpmp_lab.instructor.two_kernels import harness_beside, run_notebook

CELLS = [(Kind.LEARNER, "import dpmp_lab.harness.agent   # as a notebook's setup cell loads it\n\n\n"
                        "def spin():\n    while True:\n        pass\n\n\ndef fine():\n    return 3"),
         (Kind.TEST, "spin()"),
         (Kind.TEST, "print('after:', fine())")]
CELL_TIMEOUT = 10


def _graded() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for _, src in CELLS])
    nb.metadata["dpmp_lab"] = {"language": "ja"}
    the_plan = plan(CELLS)

    async def run() -> None:
        client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                allow_errors=True)
        async with harness_beside(client, the_plan.learner_names, timeout=CELL_TIMEOUT,
                                  allow_errors=True) as (harness, relay):
            await run_notebook(client, harness, relay, the_plan)

    asyncio.run(run())
    return nb


def test_a_learners_function_that_never_returns_costs_only_the_cell_that_called_it():
    """Past what is left of the test cell's time (less a margin), the relay interrupts the
    learner's kernel and answers that the code was stopped: the cell fails saying so, before its
    own limit, and the next cell's calls are answered. (The harness used to go on at its own
    limit while the learner's kernel still looped, and every later cell lost its marks.)"""
    started = time.monotonic()
    nb = _graded()
    errors = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    # "your code had not returned after N s, ..." in the notebook's language
    assert errors and "秒" in errors[0].evalue and "停止しました" in errors[0].evalue, errors
    assert "TimeoutError" not in errors[0].evalue
    printed = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert "after: 3" in printed, nb.cells[2].outputs
    assert time.monotonic() - started < 4 * CELL_TIMEOUT
