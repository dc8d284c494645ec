"""A graded notebook that runs nothing a learner wrote, in the two pages that show it: the
feedback page (generate_feedback's HTML, opened by learners and instructors) and formgrader's
submission page, which the instructor's Jupyter server serves on its own origin, where a
script could use the instructor's session to run code. nbconvert would paste a learner's
HTML, SVG, JavaScript and markdown into both as they are.

- outputs: text/plain always (made from the other forms when missing); PNG and JPEG, with a
  width and height only when they are numbers; text/html and image/svg+xml cleaned
  (markup.py); text/markdown when it is inert as a learner's markdown cell; those three up
  to a size (RICH_LIMIT, RICH_BUDGET). Everything else (application/javascript, widget
  views, LaTeX, PDF, unknown types) goes. Streams and errors are text, which the page
  escapes.
- markdown cells: the notebook's own (locked, and byte for byte the gradebook's source) as
  they are; a learner's when it is inert (markup.markdown_is_inert); any other, and every
  raw cell of the learner's, is shown as its source in a code block.
- attachments keep PNG, JPEG and GIF; the notebook's widget state (metadata.widgets) goes; a
  grade_id that could leave its HTML attribute takes its cell's nbgrader metadata with it
  (the templates print grade_ids unescaped); execution counts are numbers or nothing
  (nbconvert refuses to render a notebook with any other, so the page would be missing).

`InertNotebook` does it as an nbgrader preprocessor; `configure` sets the two pages up (see
nbgrader_plugin.configure for where it runs). The feedback page also carries a
Content-Security-Policy that lets no script run (`InertFeedbackExporter`); formgrader's page
runs formgrader's own scripts, so there the notebook itself must be inert.
"""

from __future__ import annotations

import os
import re
from typing import Any

from nbconvert.exporters import HTMLExporter
from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor

from dpmp_lab.instructor.markup import (
    clean_html,
    clean_svg,
    markdown_is_inert,
    markdown_renders,
    text_of,
)

RASTER = ("image/png", "image/jpeg")
ATTACHMENT_TYPES = ("image/png", "image/jpeg", "image/gif")
SHOWN_AS_SOURCE = ("*dpmp_lab shows this cell as its source: it held HTML, or a link or "
                   "picture, that could run script in this page.*")
FEEDBACK_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
                "font-src data:; base-uri 'none'; form-action 'none'")

LEAVES_ATTRIBUTE = re.compile(r"[<>\"'&]")
# Cleaning takes time, quadratic in places (a 290 kB table: 3.5 s), and formgrader spends it on
# every view of a submission, so an output's HTML, SVG or markdown is cleaned up to this size,
# and a notebook's up to this total; past them it is dropped (its text/plain stays). The
# library's largest table is 40 kB.
RICH_LIMIT = 100_000
RICH_BUDGET = 1_000_000


class Budget:
    """Characters of rich output (HTML, SVG, markdown) still to clean in one notebook."""

    def __init__(self, left: int = RICH_BUDGET) -> None:
        self.left = left

    def allows(self, text: str | None) -> bool:
        if text is None or len(text) > min(RICH_LIMIT, self.left):
            return False
        self.left -= len(text)
        return True


def shown_as_source(source: str) -> str:
    """Markdown that shows `source` as text: a note, then a fence longer than any run of
    tildes in it, so nothing inside can close it."""
    runs = [len(r) for r in re.findall(r"~+", source)]
    fence = "~" * max(3, max(runs, default=0) + 1)
    return f"{SHOWN_AS_SOURCE}\n\n{fence}\n{source}\n{fence}\n"


def _text(value: Any) -> str | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return value if isinstance(value, str) else None


def inert_data(data: dict, budget: Budget | None = None) -> dict:
    """A display's MIME bundle with only what is inert (see the module's docstring); `budget`:
    the notebook's, shared by its outputs."""
    budget = budget or Budget()
    kept: dict[str, Any] = {}
    for mime in RASTER:
        if _text(data.get(mime)) is not None:
            kept[mime] = _text(data[mime])
    html = _text(data.get("text/html"))
    markdown = _text(data.get("text/markdown"))
    svg = _text(data.get("image/svg+xml"))
    cleaned = {"text/html": clean_html(html) if budget.allows(html) else None,
               "image/svg+xml": clean_svg(svg) if budget.allows(svg) else None,
               "text/markdown": markdown if budget.allows(markdown)
               and markdown_is_inert(markdown) else None}
    kept.update((mime, value) for mime, value in cleaned.items() if value is not None)
    plain = _text(data.get("text/plain"))
    if plain is None:
        shown = text_of(html) if html else text_of(svg) if svg else markdown or ""
        dropped = sorted(m for m in data if m not in kept)
        plain = shown if shown.strip() or not dropped else (
            f"[output not shown: {', '.join(dropped)}]")
    kept["text/plain"] = plain
    return kept


def _sizes(metadata: Any) -> dict:
    """Of an output's metadata, only a picture's width and height, and only numbers: the
    template writes them into the <img> tag unquoted."""
    sizes: dict[str, dict] = {}
    for mime in RASTER:
        given = (metadata or {}).get(mime)
        if isinstance(given, dict):
            numbers = {k: v for k, v in given.items() if k in ("width", "height")
                       and isinstance(v, (int, float)) and not isinstance(v, bool)}
            if numbers:
                sizes[mime] = numbers
    return sizes


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def inert_output(out: Any, budget: Budget | None = None) -> NotebookNode | None:
    """The output rebuilt from its inert parts, or None for a kind nbformat does not know."""
    kind = out.get("output_type")
    if kind == "stream":
        name = out.get("name") if out.get("name") in ("stdout", "stderr") else "stdout"
        return new_output("stream", name=name, text=_text(out.get("text")) or "")
    if kind == "error":
        trace = [_text(t) or "" for t in out.get("traceback") or []]
        return new_output("error", ename=_text(out.get("ename")) or "",
                          evalue=_text(out.get("evalue")) or "", traceback=trace)
    if kind in ("display_data", "execute_result"):
        data = out.get("data") if isinstance(out.get("data"), dict) else {}
        made = new_output(kind, data=inert_data(data, budget),
                          metadata=_sizes(out.get("metadata")))
        if kind == "execute_result":
            made.execution_count = _count(out.get("execution_count"))
        return made
    return None


def own_sources(place: dict) -> dict[str, tuple[str, str]] | None:
    """{grade_id: (cell type, source)} of the assignment's locked cells as the gradebook holds
    them; `place`: db_url, assignment and notebook (as nbgrader's resources name them), or
    None without them (every cell is then judged as a learner's)."""
    if not all(place.get(k) for k in ("db_url", "assignment", "notebook")):
        return None
    sqlite = place["db_url"].removeprefix("sqlite:///")
    if sqlite != place["db_url"] and not os.path.isfile(sqlite):
        return None   # opening it would make an empty gradebook there
    try:
        with Gradebook(place["db_url"]) as gb:
            notebook = gb.find_notebook(place["notebook"], place["assignment"])
            return {c.name: (c.cell_type, c.source) for c in notebook.source_cells if c.locked}
    except MissingEntry:
        return None


def _nbgrader(cell: Any) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def _raster(attachments: Any) -> dict:
    """The attachments' PNG, JPEG and GIF forms; one with none of them goes (nbconvert fails
    on an empty one, and says a missing one is missing)."""
    kept = {name: {m: v for m, v in bundle.items() if m in ATTACHMENT_TYPES}
            for name, bundle in (attachments or {}).items() if isinstance(bundle, dict)}
    return {name: bundle for name, bundle in kept.items() if bundle}


def inert_cell(cell: Any, own: dict[str, tuple[str, str]] | None,
               budget: Budget | None = None) -> Any | None:
    """The cell made inert in place (None: a cell type nbformat does not know, dropped)."""
    if cell.get("cell_type") not in ("code", "markdown", "raw"):
        return None
    grade_id = _nbgrader(cell).get("grade_id")
    if grade_id is not None and (not isinstance(grade_id, str) or LEAVES_ATTRIBUTE.search(grade_id)):
        del cell.metadata["nbgrader"]
    if cell.cell_type == "code":
        budget = budget or Budget()
        outputs = (inert_output(o, budget) for o in cell.get("outputs") or [])
        cell.outputs = [o for o in outputs if o is not None]
        cell.execution_count = _count(cell.get("execution_count"))
        return cell
    if "attachments" in cell:
        cell.attachments = _raster(cell.attachments)
    mine = (own or {}).get(_nbgrader(cell).get("grade_id", "")) != (cell.cell_type, cell.source)
    if cell.cell_type == "raw":
        keep = not mine
    else:
        judge = markdown_is_inert if mine else markdown_renders
        keep = judge(cell.source, cell.get("attachments"))
    if not keep:
        cell.cell_type = "markdown"
        cell.source = shown_as_source(cell.source)
        for key in ("raw_mimetype", "format"):
            cell.metadata.pop(key, None)
    return cell


def inert_notebook(nb: Any, own: dict[str, tuple[str, str]] | None = None) -> Any:
    """The notebook made inert in place; `own`: own_sources(), the cells allowed their markup."""
    nb.metadata.pop("widgets", None)
    budget = Budget()
    nb.cells = [c for c in (inert_cell(c, own, budget) for c in nb.cells) if c is not None]
    return nb


class InertNotebook(NbGraderPreprocessor):
    """The notebook without anything a learner wrote that a page could run (inert_notebook),
    the notebook's own cells judged against the gradebook where nbgrader names one."""

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        return inert_notebook(nb, own_sources(self._gradebook(resources or {}))), resources

    def _gradebook(self, resources: dict) -> dict:
        """Where the notebook's own cells are recorded: nbgrader's converters say (autograde,
        generate_feedback); formgrader's submission page names the assignment and the
        notebook, and the course's configuration, which it renders with, the gradebook."""
        if resources.get("nbgrader") or "notebook_id" not in resources:
            return resources.get("nbgrader") or {}
        return {"db_url": CourseDirectory(config=self.config).db_url,
                "assignment": resources.get("assignment_id"),
                "notebook": resources["notebook_id"]}


def with_csp(html: str, policy: str = FEEDBACK_CSP) -> str:
    """The page with a Content-Security-Policy <meta> first in its <head>, before anything it
    could govern; ValueError for a page without a <head> (a template that does not write one
    would give a page without its policy)."""
    head = re.search(r"<head(\s[^>]*)?>", html, re.IGNORECASE)
    if head is None:
        raise ValueError("the feedback page has no <head> to put its Content-Security-Policy in")
    meta = f'\n<meta http-equiv="Content-Security-Policy" content="{policy}">'
    return html[:head.end()] + meta + html[head.end():]


class InertFeedbackExporter(HTMLExporter):
    """generate_feedback's HTMLExporter (GenerateFeedback still sets its template and
    preprocessors), with a Content-Security-Policy that runs no script: the feedback page
    needs none, and a learner's that got past InertNotebook would still not run."""

    def from_notebook_node(self, nb: Any, resources: Any = None, **kw: Any) -> tuple[str, Any]:
        html, resources = super().from_notebook_node(nb, resources, **kw)
        return with_csp(html), resources


def configure(c: Any) -> None:
    """Both pages inert (nbgrader_plugin.configure calls this; autograde and feedback list
    InertNotebook among their preprocessors there). Formgrader renders a submission with an
    HTMLExporter made from the course's configuration: InertNotebook runs there too, for a
    notebook autograded before this, elsewhere, or by an autograde that stopped half-way.
    Feedback runs it itself, after the hidden tests are masked in the outputs as the learner
    made them, so its exporter does not run it first."""
    c.GenerateFeedback.exporter_class = InertFeedbackExporter
    c.InertFeedbackExporter.preprocessors = []
    c.HTMLExporter.preprocessors = [InertNotebook]
    # A learner's heading would get an id: formgrader's script finds each score box by the id
    # of its cell (the grade_id), and a heading named like one would take its place.
    c.HTMLExporter.exclude_anchor_links = True


__all__ = ["FEEDBACK_CSP", "Budget", "InertFeedbackExporter", "InertNotebook", "configure", "inert_cell",
           "inert_data", "inert_notebook", "inert_output", "own_sources", "shown_as_source",
           "with_csp"]
