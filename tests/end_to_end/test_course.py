"""The course: solution notebooks run, course/ matches solutions/, nbgrader's real round trip
gives the solutions full marks, and the grading (nbgrader's, or the one-job grading that runs
every test cell where nbgrader does) gives the blank release zero and every wrong answer in
tests/course_variants/ exactly the points it should lose."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import dataclasses
import functools
import json
import os
import re
import shutil
import stat
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dpmp_lab.harness.cells import EVERYTHING, cells_to_rerun, read_cells, spoils
from dpmp_lab.instructor import course
from dpmp_lab.instructor.nbgrader_steps import Step
from tests.conftest import ROOT, stray_processes
from tests.support import checkpoints
from tests.support.notebook_sources import (
    cells_by_kind,
    grade_ids,
    source_notebook,
    translated,
    variants,
    with_replacements,
)

# Grading every submission of every assignment takes many minutes on 2 cores; the fixture's
# time counts against the first test that uses it.
pytestmark = [pytest.mark.timeout(4800), pytest.mark.slow]

# DPMP_LAB_ASSIGNMENTS=02_data_parallel,04_pipeline: only those (an author's quick round trip)
_ONLY = [a for a in os.environ.get("DPMP_LAB_ASSIGNMENTS", "").split(",") if a]
ASSIGNMENTS = [a for a in course.assignments(ROOT) if not _ONLY or a in _ONLY]
GRADE_JOBS = int(os.environ.get("DPMP_LAB_GRADE_JOBS", "4"))   # assignments graded at once


def test_there_are_assignments():
    assert course.assignments(ROOT)[:1] == ["00_launch"]
    assert ASSIGNMENTS, f"DPMP_LAB_ASSIGNMENTS={_ONLY} names no assignment"


# -- the instructor notebooks -----------------------------------------------------------------


# The device audit (every launch runs as if each rank had a GPU, so a tensor of the notebook's on
# the wrong device under nccl fails) is on in all of nbgrader's grading here: of the solution
# (or of the sample variant that stands in for it, by_nbgrader_in_full), of the device mistakes
# below ("solution_device_<cell>") and of the variants; the plain run on the CPU is the one-job
# grading's.


def device_mistakes(name: str) -> dict[str, nbformat.NotebookNode]:
    """{the mistaken cell: the solution notebook with that device mistake written in}."""
    from tests.course_variants import solution_editor

    return {cell: with_replacements(source_notebook(name), solution_editor(name)(cell, edit))
            for mistake_of, cell, _, edit, _ in DEVICE_MISTAKES if mistake_of == name}


def _errors_in(path: Path) -> dict[str, str]:
    """{grade_id: error text} of the cells of a graded notebook that raised."""
    nb = nbformat.read(path, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(o.get("traceback", []))
            for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.output_type == "error"}


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solution_notebook_runs_with_every_hidden_test_passing(graded, name):
    """Under the device audit, graded by nbgrader: the solution, or where nbgrader grades a
    sample variant, that variant, whose every other cell is the solution's and passes."""
    student, loses = nbgrader_in_full(name)
    cells = scores_of(graded, name, student)
    assert cells and all(score == top for cell, (score, top) in cells.items()
                         if cell not in loses), cells
    assert set(graded["audit"][name]["(solution)"]) <= loses


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
     ("device audit: an all_gather was handed a CPU tensor", "dl.device()", "cell, line")),
    ("02_data_parallel", "sharded_momentum_sgd", "sharded_momentum_sgd_tests",
     ("grad_shard = torch.empty_like(self.momentum)",
      "grad_shard = torch.empty(self.shard_size, dtype=self.momentum.dtype)"),
     ("device audit: a reduce_scatter was handed a CPU tensor", "dl.device()", "cell, line")),
    # torch makes a stage's buffers on the device it is told, in its own code, which the audit
    # leaves unmarked: the test cell compares that device with dl.device() (the seventh
    # learner pass: the stages told the CPU passed every check)
    ("10_pipeline_schedules", "torch_step", "torch_step_tests",
     ("PipelineStage(pieces[k], k, v * p, dev) for k in mine]",
      "PipelineStage(pieces[k], k, v * p, torch.device(\"cpu\"))\n              for k in mine]"),
     ("the device cpu", "dl.device()", "pp.torch_device")),
]


@pytest.mark.parametrize("name, cell, test_cell, edit, says", DEVICE_MISTAKES,
                         ids=[m[0] for m in DEVICE_MISTAKES])
def test_a_device_mistake_fails_its_test_cell_under_the_audit(graded, name, cell, test_cell,
                                                              edit, says):
    if name not in ASSIGNMENTS:
        pytest.skip(f"{name} is not among DPMP_LAB_ASSIGNMENTS")
    scores_of(graded, name, nbgrader_in_full(name)[0])   # fails clearly if that round trip did
    failed = graded["audit"][name][cell]
    assert test_cell in failed, f"{test_cell} passed: {sorted(failed)}"
    assert all(words in failed[test_cell] for words in says), failed[test_cell]


# -- recall questions without surface cues --------------------------------------------------------

OPTION = re.compile(r"^\* ([a-e])\) (.*)$")
ANSWER = re.compile(r"^(\w+)\s*=\s*[\"']([a-e])[\"']\s*$", re.M)


def multiple_choice(nb: nbformat.NotebookNode) -> list[tuple[dict[str, str], str]]:
    """(options, right letter) of every multiple-choice question: a markdown cell with options
    written `* a) ...` (continued on indented lines), answered in the next solution cell."""
    found, options = [], None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            opts: dict[str, str] = {}
            last = None
            for line in cell.source.splitlines():
                m = OPTION.match(line)
                if m:
                    last = m.group(1)
                    opts[last] = m.group(2).strip()
                elif last and line.startswith("  ") and line.strip():
                    opts[last] += " " + line.strip()
                else:
                    last = None
            options = opts if len(opts) >= 2 else options
        elif cell.metadata.get("nbgrader", {}).get("solution") and options:
            m = ANSWER.search(cell.source)
            if m and m.group(2) in options:
                found.append((options, m.group(2)))
            options = None
    return found


def longest_is_right(questions: list[tuple[dict[str, str], str]]) -> int:
    return sum(len(opts[right]) > max(len(t) for k, t in opts.items() if k != right)
               for opts, right in questions)


def test_recall_parser_reads_the_house_format():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("**Q.** Which?\n\n* a) short\n* b) a much longer "
                                              "option\n  that goes on\n* c) mid one"),
                nbformat.v4.new_code_cell("q = 'b'")]
    nb.cells[1].metadata["nbgrader"] = {"solution": True}
    [(opts, right)] = multiple_choice(nb)
    assert right == "b" and opts["b"] == "a much longer option that goes on"
    assert longest_is_right([(opts, right)]) == 1


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_the_right_option_is_not_the_longest_in_most_questions(name):
    questions = multiple_choice(source_notebook(name))
    assert questions, f"{name} has no multiple-choice question in the house format (* a) ...)"
    longest = longest_is_right(questions)
    assert longest * 2 <= len(questions), (
        f"{name}: in {longest} of {len(questions)} multiple-choice questions the right option "
        "is the longest one, a cue that gives the answer away: make the options similar in "
        "length, with real misconceptions as distractors")


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


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_course_folder_is_current(graded, name):
    """course/NN is what `dpmp-lab release` makes of solutions/NN: the round trip's own release
    (made in its scratch course by the generate_assignment step `dpmp-lab release` runs)
    against the committed one."""
    scores_of(graded, name, nbgrader_in_full(name)[0])   # fails clearly if that round trip did
    fresh, committed = graded["roots"][name] / "course" / name, ROOT / "course" / name
    files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(committed) for p in committed.rglob("*")
                           if p.is_file()), f"course/{name} has other files than solutions/"
    for rel in files:
        if rel.suffix == ".ipynb":
            assert _comparable(fresh / rel) == _comparable(committed / rel), (
                f"course/{name}/{rel} is stale: run `dpmp-lab release {name}`")
        else:
            assert (fresh / rel).read_bytes() == (committed / rel).read_bytes()


# -- what a learner sees before hand-in -----------------------------------------------------------
# Every variant that names "visible" cells must fail them in their visible part, the part a
# learner runs before hand-in. The one-job grading below runs each test cell's visible part
# and its hidden part as two steps, so it knows which part failed; a sample of variants is also
# run exactly as the learner has it (hidden tests stripped, a fresh kernel) to show that the
# hidden tests of earlier cells change nothing.

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)


def visible_variants() -> list[tuple[str, dict]]:
    return [(name, v) for name in ASSIGNMENTS for v in variants(name) if v.get("visible")]


def learner_view_sample() -> list[tuple[str, dict]]:
    """Of each notebook, the variant with visible cells whose last one comes first (its run
    stops there), the first such in the file on a tie."""
    def last_visible(name: str, v: dict) -> int:
        return max(grade_ids(name).index(cell) for cell in v["visible"])

    first: dict[str, tuple[int, dict]] = {}
    for name, v in visible_variants():
        at = last_visible(name, v)
        if name not in first or at < first[name][0]:
            first[name] = (at, v)
    return [(name, v) for name, (_, v) in first.items()] + device_mistake_views()


def device_mistake_views() -> list[tuple[str, dict]]:
    """The first device mistake (00's, the shortest view) as the learner meets it on a laptop:
    its visible check launches under the device audit, as the grader does, and fails there."""
    from tests.course_variants import solution_editor

    return [(name, {"name": f"(device mistake) {cell}", "replace": solution_editor(name)(cell, edit),
                    "visible": [test_cell], "visible_says": [says[0]]})
            for name, cell, test_cell, edit, says in DEVICE_MISTAKES[:1]
            if name in ASSIGNMENTS]


def _learner_view(name: str, variant: dict) -> nbformat.NotebookNode:
    """`name` as its learner has it with the mistake written in: hidden tests stripped, up to
    the visible test cells the variant names."""
    nb = with_replacements(source_notebook(name), variant["replace"])
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = HIDDEN.sub("", cell.source)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    nb.cells = nb.cells[:max(ids.index(cell) for cell in variant["visible"]) + 1]
    return nb


def _learner_views(sample: list[tuple[str, dict]],
                   env: dict[str, str]) -> dict[tuple[str, str], dict[str, str] | Exception]:
    """Run the learner's view of each (notebook, variant) of `sample`; {(name, variant name):
    {grade_id: error text} of the cells that failed, or what stopped the run}. One plain kernel
    (no GRADING) runs them one after the other, each from the namespace of a new kernel in its
    notebook's folder: starting a kernel and its rank server costs more CPU than most of these
    runs."""
    scratch = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell()])   # for plumbing
    client = NotebookClient(scratch, timeout=600, kernel_name="python3",
                            allow_errors=True, resources={"metadata": {"path": str(ROOT)}})
    out: dict[tuple[str, str], dict[str, str] | Exception] = {}
    with client.setup_kernel(env=env):
        # the names a new kernel has (not %reset: it takes __spec__ from __main__, where
        # multiprocessing looks for it at every launch)
        start = nbformat.v4.new_code_cell("_fresh_names = {*globals(), '_fresh_names', '_name'}")
        client.execute_cell(start, 0, store_history=False)
        for name, variant in sample:
            client.nb, nb = scratch, _learner_view(name, variant)
            fresh = nbformat.v4.new_code_cell(
                "for _name in [n for n in globals() if n not in _fresh_names]:\n"
                "    del globals()[_name]\n"
                f"__import__('os').chdir({str(ROOT / 'solutions' / name)!r})")
            try:
                client.execute_cell(fresh, 0, store_history=False)
                if any(o.output_type == "error" for o in fresh.outputs):
                    raise RuntimeError(f"the kernel could not start {name} afresh: "
                                       f"{fresh.outputs}")
                client.nb = nb
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type == "code":
                        client.execute_cell(cell, index)
            except Exception as exc:   # that notebook's test reports it
                out[(name, variant["name"])] = exc
                continue
            out[(name, variant["name"])] = {
                c.metadata["nbgrader"]["grade_id"]: "\n".join(o.get("traceback", []))
                for c in nb.cells if c.cell_type == "code"
                for o in c.outputs if o.output_type == "error"}
    return out


@pytest.mark.parametrize("name, variant", visible_variants(),
                         ids=[f"{n}: {v['name']}" for n, v in visible_variants()])
def test_classic_mistake_fails_the_visible_test_before_hand_in(graded, name, variant):
    """The mistake written in, each test cell's visible part run before its hidden part: the
    visible cells the variant names fail there, with the grader's hint."""
    failed = one_job_result(graded, name)[variant["name"]].visible
    for cell in variant["visible"]:
        assert cell in failed, (f"{name}, {variant['name']!r}: the visible test {cell} passes, "
                                "so the learner learns of the mistake only after hand-in")
    for words in variant.get("visible_says", []):
        assert any(words in text for text in failed.values()), (
            f"{name}, {variant['name']!r}: the visible failure does not say {words!r}")
    for words in variant.get("visible_never_says", []):   # a hint that would mislead here
        assert not any(words in text for text in failed.values()), (
            f"{name}, {variant['name']!r}: the visible failure says {words!r}, a hint for "
            "another mistake")


@pytest.mark.parametrize("name, variant", learner_view_sample(),
                         ids=[f"{n}: {v['name']}" for n, v in learner_view_sample()])
def test_the_learner_sees_the_same_failure_without_the_hidden_tests(graded, name, variant):
    failed = graded["learner"][(name, variant["name"])]
    if isinstance(failed, Exception):
        pytest.fail(f"running {name} with {variant['name']!r} failed: {failed}")
    assert set(variant["visible"]) == set(failed), (   # and nothing before them fails
        f"{name}, {variant['name']!r}: in the learner's view {sorted(failed)} fail")
    for words in variant.get("visible_says", []):
        assert any(words in text for text in failed.values()), words


# -- grading: nbgrader's real round trip, and every variant in one job per notebook --------------
# A variant changes one or a few solution cells, and a notebook run is mostly spent before
# them. So each notebook runs once in one job, as nbgrader's autograde would (GRADING on): one
# learner's kernel and one harness beside it (dpmp_lab/instructor/two_kernels.py), each cell
# where GuardedExecute runs it (dpmp_lab/harness/plan.py), saving both kernels' namespaces
# before each cell where a variant starts; then each variant
# re-runs the notebook from its first changed cell, with its own sources, after the namespace
# saved there is put back. nbgrader's real round trip (release, submit, autograde, feedback)
# grades every variant that writes into the grader (it would spoil a shared kernel, and only
# nbgrader's scan zeroes it), one sample variant of each notebook whose tests hand the
# learner's side code of their own (hands_over_its_own_code), which is graded both ways: both
# must give exactly `loses`, and the solution of every other notebook (nbgrader_in_full: a
# sample passes every test cell but its own, so the solution would only repeat it). The blank
# release is one more variant of the one-job grading ("(release)": every graded cell lost).
# After its changed cells a variant re-runs only the cells that read a name whose value differs
# from the solution's at that point (tests/support/checkpoints.py compares them after each cell it
# runs; dpmp_lab/harness/cells.py reads which names each cell reads), with the solution's values and
# random state put back where it skipped; a result other than the variant's `loses` is checked by
# re-running the whole rest of the notebook, and the sample nbgrader grades is the variant that
# the sources alone say skips the most.


def writes_into_the_grader(name: str, variant: dict) -> bool:
    """Whether the grader's scan flags the variant (as autograde reads the notebook: the
    learner's cells against the notebook's own)."""
    return _writes_into_the_grader(name, _replacing(variant))


def _replacing(variant: dict) -> tuple[tuple[str, str], ...]:
    """What `variant` replaces, as a key for the caches below (collecting the course's tests
    asks the same questions of each variant many times)."""
    return tuple(sorted(variant["replace"].items()))


@functools.cache
def _writes_into_the_grader(name: str, replace: tuple[tuple[str, str], ...]) -> bool:
    from dpmp_lab.instructor import scan
    from dpmp_lab.instructor.nbgrader_plugin import split_cells

    mine, given, _ = split_cells(with_replacements(source_notebook(name), dict(replace)))
    return bool(scan.scan([c.source for c in mine], context=[c.source for c in given]))


def _code_sources(nb: nbformat.NotebookNode) -> list[str | None]:
    return [c.source if c.cell_type == "code" else None for c in nb.cells]


def changed_cells(name: str, variant: dict) -> set[int]:
    """Indices of the cells `variant` replaces in `name`'s solution notebook."""
    ids = grade_ids(name)
    return {ids.index(cell) for cell in variant["replace"]}


# The notebooks' "the library's pieces stand in for yours while inside" helpers: they put the
# library's functions under the notebook's names for a launch and put the learner's back, so a
# cell that calls one reaches no name through globals() (cells_to_rerun's `swaps`).
NAMESPACE_SWAPS = {"03_tensor_parallel": frozenset({"library_versions"}),
                   "09_context_parallel": frozenset({"library_pieces"})}

# Test cells whose every launch puts the library's versions of earlier exercises' pieces under
# the learner's names, {notebook: {grade id: the notebook's dict of those stand-ins}}: 03's
# tests of Exercises 3 and 4 launch through launch_graded(..., library=...). A change to those
# pieces cannot reach such a cell, so a variant of Exercise 2 does not re-run the tests of 3
# and 4 (cells_to_rerun's `stood_in`; about 90 s of the suite). Checked by
# test_every_launch_of_a_cell_counting_on_stand_ins_has_them.
STOOD_IN = {"03_tensor_parallel": {"mlp_tests": "LIBRARY_F_AND_G",
                                   "mlp_comm_tests": "LIBRARY_F_AND_G",
                                   "attention_tests": "LIBRARY_LAYERS",
                                   "attention_comm_tests": "LIBRARY_LAYERS"}}
LAUNCH_WITH_STAND_INS = "launch_graded"   # its `library=`: {notebook name: the library's}


def _notebook_trees(name: str) -> list[tuple[str | None, ast.Module]]:
    """(grade id, parsed source) of each code cell of `name` that parses."""
    out = []
    for cell in source_notebook(name).cells:
        if cell.cell_type == "code":
            try:
                out.append((cell.metadata.get("nbgrader", {}).get("grade_id"),
                            ast.parse(cell.source)))
            except SyntaxError:   # a cell that starts with a magic names no dl.check function
                continue
    return out


def _literal_dict_keys(name: str) -> dict[str, frozenset[str]]:
    """The notebook's dicts written as literals at a cell's top level, by name: their string
    keys, a `**OTHER` inside one counting OTHER's."""
    literals = {node.targets[0].id: node.value for _, tree in _notebook_trees(name)
                for node in tree.body if isinstance(node, ast.Assign)
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Dict)}

    def keys(dict_name: str) -> frozenset[str]:
        out: set[str] = set()
        for key, value in zip(literals[dict_name].keys, literals[dict_name].values, strict=True):
            if key is None and isinstance(value, ast.Name) and value.id in literals:
                out |= keys(value.id)
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.add(key.value)
        return frozenset(out)
    return {n: keys(n) for n in literals}


@functools.cache
def stood_in(name: str) -> dict[int, frozenset[str]]:
    """STOOD_IN as cells_to_rerun takes it: {cell index: the names stood in there}."""
    ids = grade_ids(name)
    found = _literal_dict_keys(name)
    return {ids.index(cell): found[dict_name]
            for cell, dict_name in STOOD_IN.get(name, {}).items()}


# Cells that read the whole namespace (globals(), vars(), ...; a function they call counts):
# after any change before them they always run again in a variant's grading, so each is a
# choice, not an accident (07's tests once read ctx through vars(): every variant of the
# notebook re-ran its two heaviest test cells, 520 s of the suite).
READS_EVERYTHING = {"04_pipeline": {"code_mem"}, "05_hybrid": {"hybrid_comm_tests"},
                    "10_pipeline_schedules": {"code_21"}}   # a reveal asks if a name is set


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_only_the_chosen_cells_read_the_whole_namespace(name):
    nb = source_notebook(name)
    reading = read_cells(_code_sources(nb), swaps=NAMESPACE_SWAPS.get(name, frozenset()))
    whole = {nb.cells[i].metadata.get("nbgrader", {}).get("grade_id", str(i))
             for i in reading.code if EVERYTHING in reading.reads[i]}
    assert whole == READS_EVERYTHING.get(name, set())


def test_the_namespace_swaps_are_the_notebooks_own_and_put_back_what_they_replace():
    """Each named helper is defined in its notebook, reaches the namespace, and puts back what
    it replaced: it hands globals() to dl.check.stand_ins, which does (a rename or a rewrite
    fails here, not silently in the skipping)."""
    import ast

    for name, helpers in NAMESPACE_SWAPS.items():
        found = {}
        for cell in source_notebook(name).cells:
            if cell.cell_type == "code":
                found.update({node.name: node for node in ast.walk(ast.parse(cell.source))
                              if isinstance(node, ast.FunctionDef) and node.name in helpers})
        assert set(found) == helpers, f"{name} defines no {sorted(helpers - set(found))}"
        for helper, node in found.items():
            swaps = [n for n in ast.walk(node) if isinstance(n, ast.Call)
                     and ast.unparse(n.func) == "dl.check.stand_ins" and n.args
                     and ast.unparse(n.args[0]) == "globals()"]
            yields = [n for n in ast.walk(node) if isinstance(n, ast.Yield)]
            assert swaps and yields, f"{name}'s {helper} is not a swap through stand_ins"


def test_every_launch_of_a_cell_counting_on_stand_ins_has_them():
    """Each cell of STOOD_IN launches only through LAUNCH_WITH_STAND_INS, itself or through
    the notebook's functions it calls, and every such launch is given the declared stand-ins
    (or a dict holding them all); a launch without them would run the learner's pieces, which
    a variant then changes without the cell running again."""
    for name, cells in STOOD_IN.items():
        trees = _notebook_trees(name)
        functions = {node.name: node for _, tree in trees for node in tree.body
                     if isinstance(node, ast.FunctionDef)}
        dicts = _literal_dict_keys(name)
        assert LAUNCH_WITH_STAND_INS in functions, f"{name} defines no {LAUNCH_WITH_STAND_INS}"
        for cell, dict_name in cells.items():
            tree = next((t for grade_id, t in trees if grade_id == cell), None)
            assert tree is not None and dicts.get(dict_name), f"{name}: {cell}, {dict_name}"
            launches, seen, todo = [], set(), [tree]
            while todo:
                for call in (n for n in ast.walk(todo.pop()) if isinstance(n, ast.Call)):
                    called = ast.unparse(call.func)
                    if called in (LAUNCH_WITH_STAND_INS, "dl.launch"):
                        launches.append(call)
                    elif called in functions and called not in seen:
                        seen.add(called)
                        todo.append(functions[called])
            assert launches, f"{name}'s {cell} launches nothing: nothing stands in"
            for call in launches:
                given = next((k.value for k in call.keywords if k.arg == "library"), None)
                assert ast.unparse(call.func) == LAUNCH_WITH_STAND_INS and isinstance(
                    given, ast.Name) and dicts.get(given.id, frozenset()) >= dicts[dict_name], (
                    f"{name}'s {cell}: {ast.unparse(call)} runs without {dict_name}")


def _cells_skipped(name: str, variant: dict, stand_ins: bool = True) -> int:
    """How many code cells after its first change the one-job grading of `variant` skips,
    reading the notebook alone (comparing values in the kernel makes it skip more); without
    counting on STOOD_IN, when not `stand_ins`."""
    return _skipped(name, _replacing(variant), stand_ins)


@functools.cache
def _skipped(name: str, replace: tuple[tuple[str, str], ...], stand_ins: bool) -> int:
    replacing = dict(replace)
    sources = _code_sources(with_replacements(source_notebook(name), replacing))
    changed = changed_cells(name, {"replace": replacing})
    after = [i for i, src in enumerate(sources) if src is not None and i >= min(changed)]
    return len(after) - len(cells_to_rerun(sources, changed,
                                           swaps=NAMESPACE_SWAPS.get(name, frozenset()),
                                           stood_in=stood_in(name) if stand_ins else None))


HANDS_OVER = {"on_learners_side", "stand_ins"}   # dl.check's ways to run a test's own code there


def hands_over_its_own_code(name: str) -> bool:
    """Whether a cell of the notebook's own (not a learner's) hands the learner's side a
    function of its own through dl.check (HANDS_OVER): the one path where a test's code runs in
    the learner's kernel, and so where the two ways of grading could part."""
    learners = set(cells_by_kind(source_notebook(name), "solution"))
    return any(isinstance(n, ast.Attribute) and n.attr in HANDS_OVER
               for grade_id, tree in _notebook_trees(name) if grade_id not in learners
               for n in ast.walk(tree))


@functools.cache
def by_nbgrader(name: str) -> list[int]:
    """Indices of the variants nbgrader grades for real: those that write into the grader,
    and, in a notebook whose tests hand the learner's side code of their own, of the others
    the one whose one-job grading skips the most cells. (Elsewhere the solution and the blank
    release show nbgrader's grading: every test cell of a notebook passes and fails there as
    in the one-job grading; the class of tests/end_to_end/grading_class.py grades 00's wrong
    answers.) Where the notebook's tests count on stand-ins (STOOD_IN), the one that skips the most
    cells thanks to them: nbgrader then shows the cells skipped for them pass."""
    flagged = [i for i, v in enumerate(variants(name)) if writes_into_the_grader(name, v)]
    others = [i for i in range(len(variants(name))) if i not in flagged]

    def skips(i: int) -> tuple[int, int, int]:
        skipped = _cells_skipped(name, variants(name)[i])
        return skipped - _cells_skipped(name, variants(name)[i], stand_ins=False), skipped, -i
    sample = max(others, key=skips, default=None) if hands_over_its_own_code(name) else None
    return sorted(flagged + ([] if sample is None else [sample]))


def graded_cells(nb: nbformat.NotebookNode) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")]


@functools.cache
def release_variant(name: str) -> dict:
    """The blank release as a variant of the one-job grading: every solution cell as the
    committed release has it (test_course_folder_is_current holds it equal to what nbgrader's
    generate_assignment writes), every graded cell lost."""
    released = nbformat.read(ROOT / "course" / name / f"{name}.ipynb", as_version=4)
    return {"name": "(release)", "loses": graded_cells(released),
            "replace": {c.metadata["nbgrader"]["grade_id"]: c.source for c in released.cells
                        if c.metadata.get("nbgrader", {}).get("solution")}}


@functools.cache
def nbgrader_in_full(name: str) -> tuple[str, frozenset[str]]:
    """(the student, the cells it loses) of the submission that shows nbgrader passing every
    test cell of `name` but its own: the sample of by_nbgrader where there is one (a solution
    with one mistake written in), else, where the notebook is translated, its Japanese hand-in
    (in_japanese), else the solution, graded too. (Grading both would only run the same
    notebook twice: the one-job grading runs the solution and shows the two ways agree.)"""
    sampled = [i for i in by_nbgrader(name) if not writes_into_the_grader(name, variants(name)[i])]
    if sampled:
        return f"variant{sampled[0]:02d}", frozenset(variants(name)[sampled[0]]["loses"])
    if in_japanese(name) is not None:
        return "ja", frozenset(variants(name)[in_japanese(name)]["loses"])
    return "solution", frozenset()


@functools.cache
def in_one_job(name: str) -> list[int]:
    return [i for i, v in enumerate(variants(name)) if not writes_into_the_grader(name, v)]


# where the first variant that fails visibly fails in a message of the library's (not all of
# which is translated), the one graded in Japanese instead: a check of the notebook's own speaks
IN_JAPANESE = {"04_pipeline": "DP x PP: the replicas' sum divided by dp x m (the micro-batches "
                              "counted again)"}


@functools.cache
def in_japanese(name: str) -> int | None:
    """The variant nbgrader grades in Japanese, where `name`'s Japanese catalogue is complete,
    in place of an English run (so the Japanese side costs no grading of its own): the sample
    nbgrader grades in full where there is one, else a wrong answer to a recall or prediction
    (every code cell stays the solution's, so the device audit of that run still covers the
    whole solution, and the hidden test's explanation is what fails, in Japanese), else the
    first whose visible test fails with a check's message. Handed in as "ja"."""
    if name not in translated("ja"):
        return None
    sampled = [i for i in by_nbgrader(name) if not writes_into_the_grader(name, variants(name)[i])]
    if sampled:
        return sampled[0]
    if name in IN_JAPANESE:
        return next(i for i, v in enumerate(variants(name)) if v["name"] == IN_JAPANESE[name])
    answers = [i for i, v in enumerate(variants(name)) if v["loses"]
               and all(re.search("recall|predict", cell) for cell in v["loses"])
               and not writes_into_the_grader(name, v)]
    return answers[0] if answers else next(
        (i for i, v in enumerate(variants(name))
         if v.get("visible") and not writes_into_the_grader(name, v)), None)


# A hostile Japanese hand-in (the red team's, issue 41): every test cell marked unlocked by
# hand (nbgrader still counts a grade cell as locked and keeps the flag), and an input
# transformer that turns any cell holding hidden tests into a print of its source. Graded
# where the gradebook's cells are decided by the gradebook, it runs nothing of the tests in
# the learner's kernel: zero on every cell, no hidden line in its feedback.
UNLOCKED_BY_HAND = "00_launch"
LEAKING_HOOK = """import base64
def _swap(lines):
    src = "".join(lines)
    if "BEGIN " "HIDDEN" in src:
        return ["print('LEAK', %r)\\n" % base64.b64encode(src.encode()).decode()]
    return lines
get_ipython().input_transformers_post.append(_swap)
"""


def unlocked_by_hand(name: str) -> nbformat.NotebookNode:
    from dpmp_lab import i18n

    nb = i18n.translate(nbformat.read(ROOT / "course" / name / f"{name}.ipynb", as_version=4),
                        "ja", name)
    first = True
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code" and first:
            cell.source, first = LEAKING_HOOK, False
        if meta.get("grade") and not meta.get("solution"):
            meta["locked"] = False
    return nb


def japanese_student(name: str) -> str:
    return "ja" if in_japanese(name) not in by_nbgrader(name) else f"variant{in_japanese(name):02d}"


def _submit(root: Path, student: str, name: str, nb: nbformat.NotebookNode) -> None:
    folder = root / "submitted" / student / name
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{name}.ipynb")


def _round_trip(root: Path, name: str) -> dict:
    """Release, submit (the solution unless a sample stands in for it, nbgrader_in_full; the
    device mistakes; the variants of by_nbgrader), autograde under the device audit, feedback,
    in one nbgrader process: in a scratch course of its own, so that one assignment's trouble
    stays its own. (The blank release is graded in the one-job grading, "(release)".)"""
    from nbgrader.api import Gradebook

    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / name, root / "solutions" / name)
    if nbgrader_in_full(name)[0] == "solution":
        _submit(root, "solution", name, source_notebook(name))
    for cell, nb in device_mistakes(name).items():
        _submit(root, f"solution_device_{cell}", name, nb)
    for i in by_nbgrader(name):
        if i != in_japanese(name):
            _submit(root, f"variant{i:02d}", name,
                    with_replacements(source_notebook(name), variants(name)[i]["replace"]))
    if in_japanese(name) is not None:   # as a learner of the Japanese release hands it in
        from dpmp_lab import i18n

        mistake = variants(name)[in_japanese(name)]["replace"]
        wrong = with_replacements(source_notebook(name), mistake)
        _submit(root, japanese_student(name), name, i18n.translate(wrong, "ja", name))
        if name == UNLOCKED_BY_HAND:
            _submit(root, "ja_unlocked", name, unlocked_by_hand(name))
    course.nbgrader_steps([   # one process, as `dpmp-lab grade` runs a job
        Step(("generate_assignment", name, "--force")),   # dpmp-lab release's step
        Step(("autograde", name, "--create"), {"DPMP_LAB_DEVICE_AUDIT": "1"}),
        Step(("generate_feedback", name, "--force"))], root=root, capture=True)
    scores = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for sub in gb.assignment_submissions(name):
            for notebook in sub.notebooks:
                scores[(name, sub.student_id)] = {g.name: (g.score, g.max_score)
                                                  for g in notebook.grades}
    return scores


@dataclasses.dataclass
class KernelGrade:
    failed: dict[str, str]    # graded cell -> error text, as nbgrader would zero it
    visible: dict[str, str]   # the cells among them whose visible part failed


def _split_at_hidden_tests(source: str) -> tuple[str, str]:
    """(visible part, hidden part) of a test cell; the marker sits at the top level."""
    at = source.find("### BEGIN HIDDEN TESTS")
    if at < 0 or (at and source[at - 1] != "\n"):
        return source, ""
    return source[:at], source[at:]


class _StepClient(NotebookClient):
    """Runs cells that are not the notebook's own (a test cell's visible or hidden part): an
    update of a display shown by such a step has no output of the notebook to update."""

    def _update_display_id(self, display_id: str, msg: dict) -> None:
        with contextlib.suppress(IndexError, KeyError):
            super()._update_display_id(display_id, msg)


# Kernel side of the one-job grading (tests/support/checkpoints.py, sent as source: the kernels run
# in the sandbox), under one name the notebook's own names cannot meet. The harness ignores the
# learner's names: it asks the learner's kernel for them again before every cell.
def _checkpoints_source(ignored: frozenset[str] = frozenset()) -> str:
    return (f"__dpmp_module = {{'__name__': 'checkpoints'}}\n"
            f"exec({Path(checkpoints.__file__).read_text()!r}, __dpmp_module)\n"
            f"__dpmp_checkpoints = __dpmp_module['Checkpoints']({sorted(ignored)!r})")


def _sandboxed() -> dict:
    """The kernel manager grading uses, where the sandbox runs (always under CI)."""
    from dpmp_lab.instructor import sandbox
    from dpmp_lab.instructor.sandbox_kernel import SandboxedKernelManager

    if sandbox.problem() is None or os.environ.get("CI") == "true":
        return {"kernel_manager_class": SandboxedKernelManager}
    return {}


async def _quietly(client: NotebookClient, source: str) -> str:
    """`source` run silently in `client`'s kernel (no cell, no pre-run hook: the harness does
    not ask the learner's kernel for anything); what it printed. Fails on an error."""
    msg_id = client.kc.execute(source, silent=True, store_history=False)
    printed, error = [], None
    while True:
        msg = await client.kc.get_iopub_msg(timeout=600)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            printed.append(content["text"])
        elif kind == "error":
            error = "\n".join(content["traceback"])
        elif kind == "status" and content["execution_state"] == "idle":
            break
    assert error is None, error
    return "".join(printed)


async def _grade_in_one_job(name: str) -> dict[str, KernelGrade]:
    """{variant name: KernelGrade}, "(solution)" included, all in one job: one learner's kernel
    and one harness beside it, each cell where nbgrader's GuardedExecute runs it."""
    from nbclient.util import ensure_async

    from dpmp_lab.harness.plan import Where
    from dpmp_lab.instructor.nbgrader_plugin import plan_of, split_cells
    from dpmp_lab.instructor.two_kernels import harness_beside

    nb = source_notebook(name)   # nbclient puts each step into the client's copy
    client = _StepClient(copy.deepcopy(nb), timeout=600, kernel_name="python3", allow_errors=True,
                         resources={"metadata": {"path": str(ROOT / "solutions" / name)}},
                         **_sandboxed())
    the_plan = plan_of(client.nb, *split_cells(client.nb))   # a variant changes learner's cells
    todo = [variants(name)[i] for i in in_one_job(name)] + [release_variant(name)]
    first = {v["name"]: min(changed_cells(name, v)) for v in todo}
    earliest = min(first.values(), default=len(nb.cells))
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    after = {i: next((j for j in code if j > i), len(nb.cells)) for i in code}

    async def plumbing(source: str, index: int) -> str:
        """`source` in both kernels; what the learner's kernel printed, and the harness's."""
        step = nbformat.v4.new_code_cell(source)
        await client.async_execute_cell(step, index)
        errors = [o for o in step.outputs if o.output_type == "error"]
        assert not errors, "\n".join(errors[0].traceback)
        return ("".join(o.get("text", "") for o in step.outputs if o.output_type == "stream")
                + await _quietly(harness, source))

    async def execute(cell: nbformat.NotebookNode, index: int, grade: KernelGrade,
                      whole: bool = False) -> None:
        """One cell where the plan runs it; a test cell's visible part, then its hidden part,
        unless `whole` (as nbgrader runs it: its traceback shows the lines around the failure,
        which feedback must mask)."""
        meta = cell.metadata.get("nbgrader", {})
        where = the_plan.where[index]
        if where is not Where.HARNESS:
            step = nbformat.v4.new_code_cell(cell.source)
            await client.async_execute_cell(step, index)
        if where is Where.LEARNER:
            return
        parts = (_split_at_hidden_tests(cell.source) if meta.get("grade") and not whole
                 else (cell.source,))
        for n, part in enumerate(parts):
            if not part.strip():
                continue
            step = nbformat.v4.new_code_cell(part)
            # each part gets a cell's time for its requests to the learner's kernel, as
            # run_notebook gives each cell (the relay counts from the cell's start)
            relay.index, relay.cell_started = index, time.monotonic()
            await harness.async_execute_cell(step, index)
            relay.raise_failure()   # the learner's kernel lost: the job fails, saying why
            errors = ["\n".join(o.get("traceback", [])) for o in step.outputs
                      if o.output_type == "error"]
            if errors and meta.get("grade"):
                grade.failed[meta["grade_id"]] = errors[0]
                if n == 0:
                    grade.visible[meta["grade_id"]] = errors[0]
            if errors:
                break

    async def solution() -> KernelGrade:
        """The whole notebook, saving the namespace before each code cell from the earliest
        a variant changes, and at the end."""
        grade = KernelGrade({}, {})
        for index in code:
            if index >= earliest:
                await plumbing(f"__dpmp_checkpoints.save(globals(), {index})", index)
            await execute(nb.cells[index], index, grade)
        await plumbing(f"__dpmp_checkpoints.save(globals(), {len(nb.cells)})", code[-1])
        return grade

    async def in_full(cells: list, start: int, whole: bool = False) -> KernelGrade:
        grade = KernelGrade({}, {})
        await plumbing(f"__dpmp_checkpoints.restore(globals(), {start})", start)
        for index in (i for i in code if i >= start):
            await execute(cells[index], index, grade, whole)
        return grade

    async def skipping(cells: list, changed: set[int], ran: list[int], whole: bool = False,
                       ) -> KernelGrade:
        """From the first changed cell on, only the cells that are changed or read a name
        whose value differs from the solution's there (tests/support/checkpoints.py, in both
        kernels); a skipped cell is taken to do what it did in the solution's run, so the names it
        binds take the solution's values again, and the cell after it sees the solution's random
        state."""
        reading = read_cells([c.source if c.cell_type == "code" else None for c in cells],
                             swaps=NAMESPACE_SWAPS.get(name, frozenset()),
                             stood_in=stood_in(name))
        grade, dirty, behind = KernelGrade({}, {}), set(), False
        start = min(changed)
        later: dict[int, tuple[str, ...] | None] = {}   # what the cells after each one read
        read_later: set[str] = set()
        for index in reversed(code):
            later[index] = None if EVERYTHING in read_later else tuple(sorted(read_later))
            read_later |= reading.reads[index]
        await plumbing(f"__dpmp_checkpoints.restore(globals(), {start})", start)
        for index in (i for i in code if i >= start):
            if not dirty and index > max(changed):
                break   # the namespace is the solution's again: the rest would run as it did
            if index not in changed and not (dirty and spoils(reading.reads[index], dirty)):
                dirty -= reading.binds[index]
                behind = True
                continue
            if behind:
                from_here = None if later[index] is None or EVERYTHING in reading.reads[index] \
                    else tuple(sorted(set(later[index]) | reading.reads[index]))
                await plumbing(f"__dpmp_checkpoints.restore(globals(), {index}, "
                               f"{tuple(sorted(dirty))!r}, {from_here!r})", index)
                behind = False
            ran.append(index)
            await execute(cells[index], index, grade, whole)
            printed = await plumbing(
                f"print(__import__('json').dumps(__dpmp_checkpoints.differs(globals(), "
                f"{after[index]}, {later[index]!r})))", index)
            dirty = set().union(*(json.loads(line) for line in printed.splitlines()))
        return grade

    def as_expected(variant: dict, grade: KernelGrade) -> bool:
        return (set(grade.failed) == set(variant["loses"])
                and set(variant.get("visible", ())) <= set(grade.visible))

    results: dict = {"(skipping)": {}}
    client.reset_execution_trackers()
    async with harness_beside(client, the_plan.learner_names, timeout=600,
                              allow_errors=True) as (harness, relay):
        await client.async_wait_for_reply(await ensure_async(client.kc.kernel_info()))
        step = nbformat.v4.new_code_cell(_checkpoints_source())
        await client.async_execute_cell(step, 0)
        await _quietly(harness, _checkpoints_source(the_plan.learner_names))
        clock = time.monotonic()
        results["(solution)"] = await solution()
        results["(skipping)"]["(solution)"] = {"seconds": round(time.monotonic() - clock, 1)}
        for variant in sorted(todo, key=lambda v: -first[v["name"]]):
            clock, ran = time.monotonic(), []
            cells = with_replacements(nb, variant["replace"]).cells
            whole = variant["name"] == "(release)"   # its tracebacks as nbgrader's would be
            grade = first_grade = await skipping(cells, changed_cells(name, variant), ran, whole)
            # a skipping run that differs from what the variant should lose may have
            # missed a dependency: the whole rest of the notebook decides
            if not as_expected(variant, grade):
                grade = await in_full(cells, first[variant["name"]], whole)
            results[variant["name"]] = grade
            results["(skipping)"][variant["name"]] = {
                "ran": ran, "fell back": grade is not first_grade,
                "skipping lost": (sorted(first_grade.failed) if grade is not first_grade
                                  else None),
                "seconds": round(time.monotonic() - clock, 1)}
    return results


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """nbgrader's scores per (assignment, student, graded cell) after a real round trip, the
    one-job grades of every variant and the learner-view sample, GRADE_JOBS jobs at once
    (grading waits on kernels and rank processes starting far more than it computes); and what
    the cells nbgrader graded under the device audit raised."""
    base = tmp_path_factory.mktemp("courses")

    seconds: list[tuple[str, str, float, float]] = []   # (kind, name, start, duration)
    began = time.monotonic()

    def job(item: tuple) -> object:
        start = time.monotonic()
        try:
            return _job(item)
        finally:
            seconds.append((item[0], item[1], start - began, time.monotonic() - start))

    def _job(item: tuple) -> object:
        kind, name, *rest = item
        try:
            if kind == "nbgrader":
                return _round_trip(base / rest[0], name)
            if kind == "kernel":
                return asyncio.run(_grade_in_one_job(name))
            return _learner_views(rest[0], plain_env)
        except Exception as exc:   # reported by that assignment's tests, not by all of them
            return exc

    for name in ASSIGNMENTS:   # parse the variants here: ast.parse in several threads at once
        by_nbgrader(name)      # can fail on CPython 3.11 ("AST constructor recursion depth
        in_one_job(name)    # mismatch"), and these are cached for the jobs
    jobs = ([("learner", "(learner view)", learner_view_sample())]
            + [("kernel", n) for n in sorted(ASSIGNMENTS, key=lambda n: -len(variants(n)))]
            + [("nbgrader", n, n) for n in ASSIGNMENTS])
    # a learner's kernel and the audit's: no GRADING, whatever the one-job runs set, and the
    # checks' launches audited as on a learner's laptop
    plain_env = {k: v for k, v in os.environ.items()
                 if k not in ("NBGRADER_EXECUTION", "DPMP_LAB_DEVICE_AUDIT")}
    # the one-job runs: GRADING is True; no launch audited (nbgrader's round trip grades
    # under the audit, and the one-job runs would cost a tenth more under it)
    one_job = {"NBGRADER_EXECUTION": "autograde", "DPMP_LAB_DEVICE_AUDIT": "0"}
    before = {k: os.environ.get(k) for k in one_job}
    os.environ.update(one_job)
    try:
        with ThreadPoolExecutor(max_workers=GRADE_JOBS) as pool:
            done = list(pool.map(job, jobs))
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    out: dict = {"nbgrader": {}, "kernel": {}, "learner": {}, "audit": {}, "roots": {}}
    for (kind, name, *rest), result in zip(jobs, done, strict=True):
        if kind == "learner":
            out["learner"] = result if isinstance(result, dict) else {
                (n, v["name"]): result for n, v in rest[0]}
        else:
            out[kind][name] = result
    # A job that failed among others runs once more alone: a failure that only happens under
    # load is then reported as a warning with its first error, never hidden.
    out["roots"] = {name: base / name for name in ASSIGNMENTS}
    for kind in ("nbgrader", "kernel"):
        for name in [n for n, r in out[kind].items() if isinstance(r, Exception)]:
            first = out[kind][name]
            if kind == "nbgrader":
                out["roots"][name] = base / f"{name}-alone"
                out[kind][name] = job(("nbgrader", name, f"{name}-alone"))
            else:
                out[kind][name] = job((kind, name))
            if not isinstance(out[kind][name], Exception):
                warnings.warn(f"{kind} grading of {name} failed side by side and passed "
                              f"alone: {first}", stacklevel=1)
    for name, root in out["roots"].items():   # what the audited grading's cells raised
        if not isinstance(out["nbgrader"][name], Exception):
            students = {"(solution)": nbgrader_in_full(name)[0],
                        **{cell: f"solution_device_{cell}" for of, cell, *_ in DEVICE_MISTAKES
                           if of == name}}
            out["audit"][name] = {key: _errors_in(root / "autograded" / student / name
                                                  / f"{name}.ipynb")
                                  for key, student in students.items()}
    # how much the one-job runs skipped, for whoever looks at where the time goes
    (base / "skipping.json").write_text(json.dumps(
        {n: r["(skipping)"] for n, r in out["kernel"].items() if isinstance(r, dict)}, indent=1))
    (base / "jobs.json").write_text(json.dumps(sorted(seconds, key=lambda s: s[2]), indent=1))
    assert stray_processes() == []
    return out


def scores_of(graded: dict, name: str, student: str) -> dict:
    result = graded["nbgrader"][name]
    if isinstance(result, Exception):
        pytest.fail(f"grading {name} failed: {result}")
    return result[(name, student)]


def one_job_result(graded: dict, name: str) -> dict[str, KernelGrade]:
    """What the one-job grading found for `name`, or the test's failure with its error."""
    result = graded["kernel"][name]
    if isinstance(result, Exception):
        pytest.fail(f"grading {name} in one job failed: {result}")
    return result


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solutions_get_full_marks(graded, name):
    """In the one-job grading (nbgrader's, where it grades the solution: the test above)."""
    assert one_job_result(graded, name)["(solution)"].failed == {}


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_unmodified_release_gets_zero_on_every_graded_cell(graded, name):
    failed = one_job_result(graded, name)["(release)"].failed
    cells = graded_cells(source_notebook(name))
    assert cells and sorted(failed) == sorted(cells), sorted(set(cells) - set(failed))


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_each_wrong_answer_loses_exactly_its_cells(graded, name):
    kernel = one_job_result(graded, name)
    for i, variant in enumerate(variants(name)):
        seen = []
        if i in by_nbgrader(name):
            cells = scores_of(graded, name, f"variant{i:02d}")
            seen.append(("nbgrader", {cell for cell, (score, top) in cells.items()
                                      if score < top}))
        if i in in_one_job(name):
            seen.append(("one-job grading", set(kernel[variant["name"]].failed)))
        for how, lost in seen:
            assert lost == set(variant["loses"]), (
                f"{name}, variant {variant['name']!r} ({how}): lost {sorted(lost)}, expected "
                f"to lose {sorted(variant['loses'])}")


def test_every_variant_is_graded_and_nbgrader_grades_a_sample_where_tests_hand_code_over():
    sampled = []
    for name in ASSIGNMENTS:
        everything = set(range(len(variants(name))))
        assert set(by_nbgrader(name)) | set(in_one_job(name)) == everything
        if set(by_nbgrader(name)) & set(in_one_job(name)):
            sampled.append(name)
    assert sampled == [n for n in ASSIGNMENTS if variants(n) and hands_over_its_own_code(n)]
    if set(ASSIGNMENTS) == set(course.assignments(ROOT)):   # not limited by DPMP_LAB_ASSIGNMENTS
        assert len(sampled) >= 3   # 03's and 09's stand-ins, 07's on_learners_side


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_feedback_holds_no_hidden_test(graded, name):
    """Not the solution's, not the blank release's, not a wrong answer's: no line of the
    hidden tests is in any feedback page, whatever failed and printed its traceback."""
    import html

    from dpmp_lab.instructor import nbgrader_plugin
    from dpmp_lab.instructor.nbgrader_plugin import hidden_lines

    student, _ = nbgrader_in_full(name)
    scores_of(graded, name, student)
    hidden = hidden_lines(source_notebook(name)) | {"BEGIN HIDDEN TESTS"}   # the marker too
    pages = sorted((graded["roots"][name] / "feedback").glob(f"*/{name}/{name}.html"))
    assert student in {p.parent.parent.name for p in pages}
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"{name}, feedback of {page.parent.parent.name}: {leaked[:3]}"
    # every test failing, as in the blank release, each test cell run whole as nbgrader runs
    # it: what each printed, masked as feedback masks a cell's output (HideHiddenTests), holds
    # no hidden line either (a traceback shows the lines around the failing one)
    masking = nbgrader_plugin.HideHiddenTests()
    hidden_here = hidden_lines(source_notebook(name), masking.begin_test_delimeter,
                               masking.end_test_delimeter, masking.min_length) | {
        masking.begin_test_delimeter, masking.end_test_delimeter}
    for cell, text in one_job_result(graded, name)["(release)"].failed.items():
        out = nbformat.v4.new_output("stream", name="stderr", text=text)
        nbgrader_plugin.mask_output(out, hidden_here)
        shown = re.sub(r"\x1b\[[0-9;]*m", "", out.text)   # as the page shows it, uncoloured
        leaked = [line for line in hidden if line in shown]
        assert not leaked, f"{name}, the release's {cell} shows {leaked[:3]} once masked"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_feedback_is_generated_and_explains_the_mistake(graded, name):
    scores_of(graded, name, nbgrader_in_full(name)[0])   # fails clearly if grading failed
    root = graded["roots"][name]
    pages = []
    for i in by_nbgrader(name):
        page = root / "feedback" / f"variant{i:02d}" / name / f"{name}.html"
        assert page.exists(), f"no feedback for {name} variant {i}"
        pages.append(page.read_text())
    assert not pages or any("Likely mistake" in p or "expected" in p or "Tampering" in p
                            for p in pages)


JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")


@pytest.mark.parametrize("name", [n for n in ASSIGNMENTS if n in translated("ja")])
def test_a_japanese_hand_in_is_graded_alike_and_fed_back_in_japanese(graded, name):
    """The same cells lost as in English; the graded notebook's locked cells, the failing
    test's message and the feedback in Japanese, no hidden line in it (in either language)."""
    import html

    from dpmp_lab import i18n
    from dpmp_lab.instructor.nbgrader_plugin import hidden_lines

    assert in_japanese(name) is not None, f"{name} is translated but has no Japanese hand-in"
    variant, student = variants(name)[in_japanese(name)], japanese_student(name)
    lost = {cell for cell, (score, top) in scores_of(graded, name, student).items()
            if score < top}
    assert lost == set(variant["loses"])
    root = graded["roots"][name]
    graded_nb = nbformat.read(root / "autograded" / student / name / f"{name}.ipynb",
                              as_version=4)
    assert i18n.language_of(graded_nb) == "ja"
    first = next(c for c in graded_nb.cells if c.cell_type == "markdown")
    assert JAPANESE.search(first.source), first.source[:200]
    watched = set(variant.get("visible") or variant["loses"])   # the learner reads these fail
    shown = {c.metadata.nbgrader.grade_id: "".join(
        o.get("evalue", "") + "".join(o.get("traceback", []))
        for o in c.outputs if o.output_type == "error")
        for c in graded_nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") in watched}
    assert shown and any(JAPANESE.search(text) for text in shown.values()), shown
    page = root / "feedback" / student / name / f"{name}.html"
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    assert JAPANESE.search(text)
    hidden = (hidden_lines(source_notebook(name))
              | hidden_lines(i18n.translate(source_notebook(name), "ja", name)))
    leaked = [line for line in hidden if line in text]
    assert not leaked, leaked[:3]


@pytest.mark.parametrize("name", [n for n in ASSIGNMENTS if n == UNLOCKED_BY_HAND
                                  and n in translated("ja")])
def test_test_cells_unlocked_by_hand_in_a_japanese_hand_in_still_run_as_the_grader_s(
        graded, name):
    import html

    from dpmp_lab.instructor.nbgrader_plugin import hidden_lines

    cells = scores_of(graded, name, "ja_unlocked")
    assert cells and all(score == 0 for score, _ in cells.values()), cells
    page = graded["roots"][name] / "feedback" / "ja_unlocked" / name / f"{name}.html"
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    assert not re.search(r"LEAK\W+[A-Za-z0-9+/=]{40,}", text)   # the source the hook printed
    assert not [line for line in hidden_lines(source_notebook(name)) if line in text]


def test_a_learners_copy_holds_the_release_and_no_hidden_test(tmp_path, capsys, monkeypatch):
    from dpmp_lab import cli
    from dpmp_lab.instructor.nbgrader_plugin import hidden_lines

    dest = tmp_path / "for_learners"
    closed = []   # a checkout closed to other accounts, as a server's is: copied open
    real_copytree = shutil.copytree

    def copytree(source, target, *args, **kwargs):
        made = real_copytree(source, target, *args, **kwargs)
        Path(target).chmod(0o700)
        closed.append(target)
        return made
    monkeypatch.setattr(course.shutil, "copytree", copytree)
    assert cli.main(["learner-copy", str(dest)]) == 0
    assert closed and all(stat.S_IMODE(Path(p).stat().st_mode) & 0o005 == 0o005 for p in closed)
    assert all(p.stat().st_mode & 0o004 for p in dest.rglob("*") if not p.is_symlink())
    assert "bootstrap.py course" in capsys.readouterr().out
    assert sorted(p.name for p in dest.iterdir()) == sorted(course.LEARNER_FILES)
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix == ".ipynb" and p.parts[-3] != "course"]
    for name in course.assignments(ROOT):
        assert (dest / "course" / name / f"{name}.ipynb").read_bytes() == (
            ROOT / "course" / name / f"{name}.ipynb").read_bytes()
    hidden = {name: hidden_lines(source_notebook(name)) for name in course.assignments(ROOT)}
    for name, lines in hidden.items():   # a release holds no line of its own hidden tests
        text = (dest / "course" / name / f"{name}.ipynb").read_text()
        assert not [line for line in lines if json.dumps(line)[1:-1] in text], name
    # and no file holds a distinctive line of any of them
    distinctive = {line for lines in hidden.values() for line in lines if len(line) >= 40}
    for path in files:
        text = path.read_text(errors="replace")
        leaked = [line for line in distinctive if line in text or json.dumps(line)[1:-1] in text]
        assert not leaked, f"{path.relative_to(dest)} holds hidden test lines: {leaked[:3]}"
    assert cli.main(["learner-copy", str(dest)]) == 2   # never into a folder with files


def test_release_takes_a_course_root_and_refuses_an_unknown_assignment(tmp_path, capsys):
    """`dpmp-lab release --root DIR` releases into DIR/course, never into this checkout."""
    from dpmp_lab import cli

    root = tmp_path / "elsewhere"
    root.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / "00_launch", root / "solutions" / "00_launch")
    before = (ROOT / "course" / "00_launch" / "00_launch.ipynb").stat().st_mtime_ns
    assert cli.main(["release", "00_launch", "--root", str(root)]) == 0
    assert str(root / "course" / "00_launch") in capsys.readouterr().out
    assert (root / "course" / "00_launch" / "00_launch.ipynb").exists()
    assert (root / "gradebook.db").exists()
    assert (ROOT / "course" / "00_launch" / "00_launch.ipynb").stat().st_mtime_ns == before
    assert cli.main(["release", "00_launch", "--root", str(root),
                     "--due", "2026-12-15 17:00 Europe/Berlin"]) == 0
    assert "due 2026-12-15 16:00 UTC" in capsys.readouterr().out
    assert cli.main(["release", "00_launch", "--root", str(root)]) == 0   # kept on re-release
    capsys.readouterr()
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        assert str(gb.find_assignment("00_launch").duedate) == "2026-12-15 16:00:00"
    assert cli.main(["release", "00_launch", "--root", str(root), "--due", "soon"]) == 2
    assert "is not a date and time nbgrader reads" in capsys.readouterr().err
    assert cli.main(["release", "--root", str(root), "--due", "2026-12-15"]) == 2
    assert "--due needs the assignments" in capsys.readouterr().err
    assert cli.main(["release", "99_nothing", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"no such assignment in {root / 'solutions'}: 99_nothing" in err
    assert "two digits" not in err                     # well named, just not there
    (root / "solutions" / "11-MyTopic").mkdir()
    assert cli.main(["release", "11-MyTopic", "--root", str(root)]) == 2
    assert "named like 00_launch: two digits, an underscore" in capsys.readouterr().err
    copy = tmp_path / "for_learners"                   # that root's release, this package
    assert cli.main(["learner-copy", str(copy), "--root", str(root)]) == 0
    assert (copy / "course" / "00_launch" / "00_launch.ipynb").exists()
    assert not (copy / "course" / "01_collectives").exists()
    assert (copy / "bootstrap.py").exists() and (copy / "dpmp_lab" / "__init__.py").exists()


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_function_a_test_hands_the_learners_side_reads_a_hidden_name(name):
    """A test's rank-side helper travels to the learner's kernel by value, with the names it
    reads (dpmp_lab/harness/remote.py): none of them may be one a hidden part binds, so that
    what crosses is the visible tests' code and the arguments of the calls."""
    import ast

    from dpmp_lab.harness.cells import cell_names

    hidden_binds: set[str] = set()
    helpers: dict[str, frozenset[str]] = {}
    for cell in source_notebook(name).cells:
        if cell.cell_type != "code" or cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        visible, hidden = _split_at_hidden_tests(cell.source)
        if hidden:
            tree = ast.parse(hidden)
            hidden_binds |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                             and isinstance(n.ctx, ast.Store)}
            hidden_binds |= {n.name for n in ast.walk(tree)
                             if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        helpers.update(cell_names(visible).inside)
    for helper, reads in helpers.items():
        assert not reads & hidden_binds, (
            f"{name}: {helper} reads {sorted(reads & hidden_binds)}, bound in a hidden part")
