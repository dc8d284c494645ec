"""nbgrader's side of grades a class can trust: how a submission is executed, judged and fed
back. nbgrader_config.py calls `configure(c)`; `dpmp-lab grade` adds one job's settings.

- `GuardedExecute` replaces nbgrader's Execute step: the learner's cells run in the learner's
  kernel, in the sandbox (sandbox_kernel.py), and the graded test cells in a harness of their
  own, which no code of the submission reaches (two_kernels.py, dpmp_lab/harness); output of
  both is counted as it arrives and a cell or a notebook over its limit ends the job. The
  learner's cells are scanned first (scan.py): a finding (a write into the library's code, an
  escape hatch) zeroes every graded cell with the reasons as its error, without running the
  notebook, and is written to the job's report, from which `dpmp-lab grade` flags the
  submission for manual grading.
- `InTheLearnersLanguage` ends autograde's sanitizing: nbgrader's OverwriteCells has put the
  gradebook's English back into every locked cell; a notebook released in another language
  (its metadata says which, checked against dpmp_lab.i18n.LANGUAGES) gets those cells in that
  language again, from the grader's own catalogues, so its tests fail with messages, and its
  feedback reads, in the learner's language. GuardedExecute counts such a cell as the
  notebook's own: its source is the gradebook's, translated by the grader.
- `HideHiddenTests` runs in generate_feedback: it removes the hidden tests from the cells
  (nbgrader's ClearHiddenTests) and masks every line of them wherever it appears in an
  output (a traceback of a failed hidden assert prints its line), so feedback never carries
  the hidden tests; and it masks the server's paths in the outputs (server_paths.py).
- `nbgrader export` uses grades_export.GradesExport.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.util import ensure_async
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.converters import Autograde
from nbgrader.preprocessors import ClearHiddenTests, Execute, GetGrades, NbGraderPreprocessor
from traitlets import Bool, Integer, Unicode

from dpmp_lab import i18n
from dpmp_lab.harness.plan import Kind, Plan, plan
from dpmp_lab.instructor import inert, scan
from dpmp_lab.instructor.grades_export import GradesExport
from dpmp_lab.instructor.limits import Limits
from dpmp_lab.instructor.markup import as_cleaned
from dpmp_lab.instructor.sandbox_kernel import SandboxedKernelManager
from dpmp_lab.instructor.server_paths import mask_paths, server_paths
from dpmp_lab.instructor.two_kernels import harness_beside, run_notebook, update_display

FORGED = "TamperingDetected"
HIDDEN_LINE = "[a line of the hidden tests]"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
IMPORTS = ("import ", "from ")


class OutputLimitExceeded(RuntimeError):
    """A cell or the notebook printed more than its limit: the job ends here."""


def _nbgrader(cell: Any) -> dict:
    return cell.metadata.get("nbgrader", {}) if cell.cell_type == "code" else {}


def split_cells(nb: Any, own: dict[str, str] | None = None) -> tuple[list, list, list]:
    """(the learner's cells, the notebook's own cells, the graded test cells).

    The notebook's own cells are its locked ones, and where `own` (grade_id -> source, from
    the gradebook) is given, only those with that id and that source: a cell the learner added,
    or marked locked themselves, is theirs, and scanned like their answers."""
    code = [c for c in nb.cells if c.cell_type == "code"]

    def is_own(cell: Any) -> bool:
        meta = _nbgrader(cell)
        if own is None:
            return bool(meta.get("locked")) and not meta.get("solution")
        return own.get(meta.get("grade_id", "")) == cell.source

    given = [c for c in code if is_own(c)]
    mine = [c for c in code if not is_own(c)]
    tests = [c for c in given if _nbgrader(c).get("grade")]
    return mine, given, tests


def locked_cells(resources: Any, language: str = i18n.SOURCE,
                 kind: str | None = "code") -> dict[str, str] | None:
    """{grade_id: source} of the assignment's locked cells (of cell type `kind`, or all), as
    the gradebook holds them (what nbgrader's OverwriteCells put back) in `language` (the
    grader's own translation), or None outside an autograde. Nothing of the submission's
    metadata but its language decides it."""
    info = (resources or {}).get("nbgrader") or {}
    if not info.get("db_url") or not info.get("notebook"):
        return None
    try:
        with Gradebook(info["db_url"]) as gb:
            notebook = gb.find_notebook(info["notebook"], info["assignment"])
            return {c.name: i18n.translate_source(c.cell_type, c.source, language,
                                                  info["notebook"])
                    for c in notebook.source_cells
                    if c.locked and (kind is None or c.cell_type == kind)}
    except MissingEntry:
        return None


def own_cells(resources: Any, language: str = i18n.SOURCE) -> dict[str, str] | None:
    """{grade_id: source} of the assignment's locked code cells, in `language`."""
    return locked_cells(resources, language)


class InTheLearnersLanguage(NbGraderPreprocessor):
    """The locked cells nbgrader restored in English, written in the notebook's language: every
    cell whose grade id the gradebook holds as locked gets the gradebook's source, translated,
    whatever the submission's metadata says of it (a test cell marked unlocked by hand is still
    the notebook's own)."""

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        language = i18n.language_of(nb)
        if language != i18n.SOURCE:
            locked = locked_cells(resources, language, kind=None) or {}
            for cell in nb.cells:
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                if grade_id in locked:
                    cell.source = locked[grade_id]
        return nb, resources


def _fails(out: Any) -> bool:
    """What makes nbgrader give a test cell zero: an error, or anything on stderr."""
    return out.output_type == "error" or (out.output_type == "stream"
                                          and out.get("name") == "stderr")


def mark_forged(nb: Any, reasons: list[str]) -> str:
    """Zero every graded cell of `nb`, with the reasons as its error; the message."""
    message = ("this notebook cannot be graded automatically: "
               + "; ".join(reasons[:12]) + (" ..." if len(reasons) > 12 else "")
               + ". Every graded cell scores 0 and your instructor is told; if this is a "
               "mistake, remove those lines and submit again.")
    for cell in nb.cells:
        if _nbgrader(cell).get("grade"):
            cell.outputs.append(nbformat.v4.new_output(
                "error", ename=FORGED, evalue=message, traceback=[f"{FORGED}: {message}"]))
    return message


def _size(value: Any) -> int:
    """Roughly the bytes a message's content holds (its strings, and 8 per item)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(k) + _size(v) for k, v in value.items()) + 8
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value) + 8
    return 8


class GuardedExecute(Execute):
    """nbgrader's Execute in two kernels: the learner's cells in the learner's kernel (in the
    sandbox), the graded test cells in the harness (two_kernels.py); output limits over both.
    The scan of the learner's cells comes first: a notebook it flags is not run."""

    sandbox = Bool(True, help="Run both kernels in the sandbox (sandbox.py)").tag(config=True)
    cell_output_bytes = Integer(Limits().cell_output_kb * 1024,
                                help="Output bytes one cell may send").tag(config=True)
    notebook_output_bytes = Integer(Limits().notebook_output_mb * 2**20,
                                    help="Output bytes a notebook may send").tag(config=True)
    report_path = Unicode("", help="Where to write what this run found, as JSON, for "
                          "`dpmp-lab grade` (empty: nowhere)").tag(config=True)
    harness_dir = Unicode("", help="A short empty folder for the harness's sockets, which its "
                          "maker removes (default: a new temporary one)").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.sandbox:
            self.kernel_manager_class = SandboxedKernelManager
        self.store_widget_state = False   # widget state and its buffers are never kept
        # graded, a kernel has nothing left to save: stopped at once, not after the seconds a
        # graceful shutdown waits for it and for what it started
        self.shutdown_kernel = "immediate"
        self._bytes: dict[int, int] = {}
        self.found: dict = {}

    def preprocess(self, nb: Any, resources: Any = None, km: Any = None) -> tuple[Any, Any]:
        NotebookClient.__init__(self, nb, km)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        own = own_cells(resources, i18n.language_of(nb))
        for cell in nb.cells:   # fail closed: a cell with a locked cell's id runs that cell
            grade_id = _nbgrader(cell).get("grade_id")
            if own is not None and grade_id in own and cell.source != own[grade_id]:
                cell.source = own[grade_id]
        mine, given, tests = split_cells(nb, own)
        self._bytes = {}
        self.found = {"sandbox": self.sandbox, "limit": None, "forgery": [], "harness": True}
        # read before anything runs: a notebook the scan flags scores zero whatever it would
        # print, so its code is not run at all
        reasons = scan.scan([c.source for c in mine], context=[c.source for c in given])
        failure: BaseException | None = None
        try:
            if reasons:
                self.nb.metadata.setdefault("language_info", {"name": "python"})
            else:
                run_sync(self._run)(plan_of(nb, mine, given, tests))
        except BaseException as exc:   # a limit, a dead kernel: raised after the report
            failure = exc
        try:
            if reasons:
                self.found["forgery"] = reasons
                mark_forged(nb, reasons)
        finally:
            self._write_report()
        if failure is not None:
            raise failure
        return self.nb, self.resources

    async def _run(self, the_plan: Plan) -> None:
        settings = {"timeout": self.timeout, "allow_errors": True,
                    "interrupt_on_timeout": self.interrupt_on_timeout,
                    "error_on_timeout": self.error_on_timeout,
                    "extra_arguments": list(self.extra_arguments),
                    "store_widget_state": False, "shutdown_kernel": "immediate",
                    "raise_on_iopub_timeout": self.raise_on_iopub_timeout}
        folder = Path(self.harness_dir) if self.harness_dir else None
        async with harness_beside(self, the_plan.learner_names, self._count, folder,
                                  **settings) as (harness, relay):
            reply = await self.async_wait_for_reply(await ensure_async(self.kc.kernel_info()))
            if reply and "language_info" in reply["content"]:
                self.nb.metadata["language_info"] = reply["content"]["language_info"]
            await run_notebook(self, harness, relay, the_plan)

    def process_message(self, msg: dict, cell: Any, cell_index: int) -> Any:
        self._count(msg, cell, cell_index)
        return super().process_message(msg, cell, cell_index)

    def _update_display_id(self, display_id: str, msg: dict) -> None:
        update_display(super()._update_display_id, display_id, msg)

    def _count(self, msg: dict, cell: Any, cell_index: int) -> None:
        """Count a message of either kernel against the output limits (comm buffers too)."""
        size = _size(msg.get("content")) + sum(len(b) for b in msg.get("buffers") or ())
        self._bytes[cell_index] = self._bytes.get(cell_index, 0) + size
        total = sum(self._bytes.values())
        if self._bytes[cell_index] > self.cell_output_bytes:
            self._over(f"one cell printed more than its output limit of "
                       f"{self.cell_output_bytes // 1024} KiB")
        if total > self.notebook_output_bytes:
            self._over(f"the notebook printed more than its output limit of "
                       f"{self.notebook_output_bytes // 2**20} MiB")

    def _over(self, why: str) -> None:
        self.found["limit"] = why
        raise OutputLimitExceeded(why)

    def _write_report(self) -> None:
        if self.report_path:
            path = Path(self.report_path)
            path.with_suffix(".tmp").write_text(json.dumps(self.found))
            path.with_suffix(".tmp").replace(path)


def plan_of(nb: Any, mine: list, given: list, tests: list) -> Plan:
    """Where each code cell of `nb` runs (dpmp_lab/harness/plan.py), from split_cells' parts."""
    kinds = {**{id(c): Kind.LEARNER for c in mine}, **{id(c): Kind.OWN for c in given},
             **{id(c): Kind.TEST for c in tests}}
    return plan([(kinds[id(c)], c.source) if c.cell_type == "code" else None for c in nb.cells])


class HideHiddenTests(ClearHiddenTests):
    """Feedback without the hidden tests (not in the cells, not in any output) and without the
    server's paths in the outputs (server_paths.py: the package, the environment, the grader's
    scratch course, which is the working directory of nbgrader's feedback step)."""

    min_length = Integer(8, help="Hidden lines shorter than this are not masked in outputs "
                         "(`)` or `else:` say nothing)").tag(config=True)

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        hidden = hidden_lines(nb, self.begin_test_delimeter, self.end_test_delimeter,
                              self.min_length)
        # the markers too: a traceback through a hidden test shows the lines around it
        hidden |= {self.begin_test_delimeter, self.end_test_delimeter}
        hidden |= {as_cleaned(h) for h in hidden}   # as in HTML that autograde made inert
        nb, resources = super().preprocess(nb, resources)
        places = server_paths([(os.getcwd(), "<course>")])
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                mask_output(out, hidden)
                map_output_text(out, lambda text: mask_paths(text, places))
        return nb, resources


def hidden_lines(nb: Any, begin: str = "BEGIN HIDDEN TESTS", end: str = "END HIDDEN TESTS",
                 min_length: int = 8) -> set[str]:
    """The stripped lines between the hidden-test markers of every cell that no visible part
    of the notebook holds too, even within a longer line (a check called in both parts is no
    secret), imports aside."""
    hidden, visible, inside = set(), set(), False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            if begin in line:
                inside = True
            elif end in line:
                inside = False
            elif len(line.strip()) >= min_length and not line.lstrip().startswith(IMPORTS):
                (hidden if inside else visible).add(line.strip())
        inside = False
    return {h for h in hidden if not any(h in v for v in visible)}


def _masked(text: str, hidden: set[str]) -> str:
    lines = ANSI.sub("", text).split("\n")
    return "\n".join(HIDDEN_LINE if any(h in line for h in hidden) else line for line in lines)


def map_output_text(out: Any, change: Callable[[str], str]) -> None:
    """Apply `change` to every text an output shows: a stream, an error's value and
    traceback, a result's text forms."""
    if out.get("output_type") == "stream":
        out["text"] = change(out.get("text", ""))
    elif out.get("output_type") == "error":
        out["evalue"] = change(out.get("evalue", ""))
        out["traceback"] = [change(t) for t in out.get("traceback", [])]
    else:
        data = out.get("data", {})
        for mime in ("text/plain", "text/html", "text/markdown", "text/latex"):
            if isinstance(data.get(mime), str):
                data[mime] = change(data[mime])


def mask_output(out: Any, hidden: set[str]) -> None:
    """Replace every line of an output that holds a hidden line (ANSI colours removed)."""
    if hidden:
        map_output_text(out, lambda text: _masked(text, hidden))


def autograde_preprocessors(defaults: list) -> list:
    """nbgrader's autograde preprocessors with GuardedExecute in place of Execute, and
    InertNotebook last: the autograded notebook, which formgrader shows, is written inert."""
    return [GuardedExecute if p is Execute else p for p in defaults] + [inert.InertNotebook]


def feedback_preprocessors() -> list:
    """InertNotebook after HideHiddenTests, which masks hidden lines in HTML as it was made."""
    return [GetGrades, HideHiddenTests, inert.InertNotebook, CSSHTMLHeaderPreprocessor]


def configure(c: Any, job: dict | None = None) -> None:
    """Set nbgrader up for trusted grading (nbgrader_config.py calls this); `job`: one
    submission's settings from `dpmp-lab grade` (sandbox on or off, its folders, what the
    sandbox hides, output limits, where to write its report)."""
    c.Autograde.autograde_preprocessors = autograde_preprocessors(
        Autograde.class_traits()["autograde_preprocessors"].default())
    c.Autograde.sanitize_preprocessors = (
        Autograde.class_traits()["sanitize_preprocessors"].default() + [InTheLearnersLanguage])
    c.GenerateFeedback.preprocessors = feedback_preprocessors()
    inert.configure(c)   # the feedback page's CSP, formgrader's page
    c.ExportApp.plugin_class = GradesExport   # plain `nbgrader export` writes dpmp_lab's CSV
    job = job or {}
    if "sandbox" in job:
        c.GuardedExecute.sandbox = bool(job["sandbox"])
    for key in ("cell_output_bytes", "notebook_output_bytes", "report_path", "harness_dir"):
        if key in job:
            setattr(c.GuardedExecute, key, job[key])
    for key in ("job_dir", "socket_dir", "hidden"):
        if key in job:
            setattr(c.SandboxedKernelManager, key, job[key])


__all__ = ["GradesExport", "GuardedExecute", "HideHiddenTests", "InTheLearnersLanguage",
           "OutputLimitExceeded",
           "autograde_preprocessors", "configure", "feedback_preprocessors", "hidden_lines",
           "map_output_text", "mark_forged", "mask_output", "split_cells"]
