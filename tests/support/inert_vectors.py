"""A graded notebook that holds every way a learner could get script into the feedback page or
formgrader's page (tests/end_to_end/test_inert.py, tests/end_to_end/test_inert_pages.py). Each
vector, if it runs, logs `PWNED:<name>` to the browser's console; the notebook's own cells and the
gradebook that says which they are come with it, and `live_parts`, what of a notebook a page would
still run."""

from __future__ import annotations

import warnings

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell
from nbgrader.api import Gradebook
from sqlalchemy.exc import SAWarning

from dpmp_lab.instructor.markup import clean_html, clean_svg, markdown_is_inert
from dpmp_lab.render import Table

ASSIGNMENT, NOTEBOOK = "a1", "nb"
MARK = "PWNED:"


def log(name: str) -> str:
    """JavaScript that says it ran (single quotes: it goes into double-quoted attributes)."""
    return f"console.log('{MARK}{name}')"


OWN_INTRO = "# Own intro\n\nThe notebook's <b>own</b> markup stays."
OWN_SECOND = "## Second own cell"
HIDDEN = "assert secret_hidden_check(x) < 43"
TEST_SOURCE = f"assert x == 1\n### BEGIN HIDDEN TESTS\n{HIDDEN}\n### END HIDDEN TESTS"
OWN = {"intro": ("markdown", OWN_INTRO), "second": ("markdown", OWN_SECOND),
       "test_answer": ("code", TEST_SOURCE)}

# name -> a learner's markdown cell that runs it
MARKDOWN = {
    "md-script": f"<script>{log('md-script')}</script>",
    "md-img": f'<img src="x" onerror="{log("md-img")}">',
    "md-link": f"[click me](javascript:{log('md-link')})",
    "md-iframe": f'<iframe srcdoc="&lt;script&gt;{log("md-iframe")}&lt;/script&gt;"></iframe>',
    "md-svg": f"<svg><script>{log('md-svg')}</script></svg>",
    "md-object": f'<object data="data:text/html,&lt;script&gt;{log("md-object")}&lt;/script&gt;">'
                 "</object>",
    "md-style": f"<style>@import 'x.css';</style><details open ontoggle=\"{log('md-style')}\">"
                "<summary>s</summary></details>",
}


def _display(data: dict, metadata: dict | None = None) -> nbformat.NotebookNode:
    return new_output("display_data", data=data, metadata=metadata or {})


def _outputs() -> list:
    table = Table(["op", "bytes"], [["all_reduce", 4096], ["send", 16]], title="comm",
                  marks=[True, False])
    return [
        _display({"text/html": "<b>html kept</b>"
                               f"<script>{log('html-script')}</script>"
                               f'<img src="x" onerror="{log("html-img")}">'
                               f'<svg onload="{log("html-svg")}"></svg>'
                               f'<a href="javascript:{log("html-link")}">html link</a>',
                  "text/plain": "<the html's text>"}),
        _display({"image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg" width="20" '
                                   f'height="20" onload="{log("svg-onload")}">'
                                   f"<script>{log('svg-script')}</script>"
                                   '<rect width="10" height="10" fill="#4e79a7"/></svg>',
                  "text/plain": "<a picture>"}),
        _display({"application/javascript": log("js"), "text/plain": "<some script>"}),
        _display({"text/markdown": f'<img src="x" onerror="{log("mdout-img")}"> '
                                   f"[markdown link](javascript:{log('mdout-link')})",
                  "text/plain": "<some markdown>"}),
        _display({"image/png": "AAAA", "text/plain": "<a broken picture>"},
                 {"image/png": {"width": f"1 onerror={log('png-width')}"}}),
        _display({"application/vnd.jupyter.widget-view+json":
                  {"model_id": "abc", "version_major": 2, "version_minor": 0},
                  "text/plain": "HBox()"}),
        new_output("execute_result", data={"text/html": table._repr_html_(),
                                           "text/plain": str(table)}, execution_count=1),
        new_output("stream", name="stdout", text=f"<script>{log('stream')}</script>\n"),
    ]


def vector_notebook() -> nbformat.NotebookNode:
    """The notebook as autograde would write it before dpmp_lab's InertNotebook."""
    nb = new_notebook(metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "widgets": {"application/vnd.jupyter.widget-state+json": {
            "state": {"x": f"</script><script>{log('widget-state')}</script>"}}}})
    nb.cells.append(_locked(new_markdown_cell(OWN_INTRO), "intro"))
    nb.cells += [new_markdown_cell(source) for source in MARKDOWN.values()]
    # a locked cell the learner changed, and a learner's cell that calls itself locked
    nb.cells.append(_locked(new_markdown_cell(
        f'{OWN_SECOND} <img src="x" onerror="{log("md-changed")}">'), "second"))
    nb.cells.append(_locked(new_markdown_cell(
        f'<img src="x" onerror="{log("md-claimed")}">'), "made_up"))
    nb.cells.append(new_raw_cell(f"<script>{log('raw')}</script>",
                                 metadata={"raw_mimetype": "text/html"}))
    answer = new_code_cell("x = 1", outputs=_outputs())
    answer.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False,
                                   "grade_id": "answer", "schema_version": 3}
    nb.cells.append(answer)
    test = new_code_cell(TEST_SOURCE, execution_count=2, outputs=[
        new_output("error", ename="AssertionError", evalue="",
                   traceback=["AssertionError", f"----> 3 {HIDDEN}"]),
        _display({"text/html": f"<pre>seen: {HIDDEN}</pre>", "text/plain": f"seen: {HIDDEN}"}),
    ])
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                 "grade_id": "test_answer", "points": 1.0, "schema_version": 3}
    nb.cells.append(test)
    return nb


def _locked(cell: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    cell.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True,
                                 "grade_id": grade_id, "schema_version": 3}
    return cell


def gradebook(db_url: str, students: list[str]) -> dict[str, str]:
    """Record the assignment (the notebook's own cells, its graded cell) and a submission of
    each student, as release and autograde would; {student: submission notebook id}."""
    with warnings.catch_warnings(), Gradebook(db_url, "dpmp_lab") as gb:
        warnings.simplefilter("ignore", SAWarning)   # nbgrader's add_submission, every time
        gb.add_assignment(ASSIGNMENT)
        gb.add_notebook(NOTEBOOK, ASSIGNMENT)
        for name, (kind, source) in OWN.items():
            gb.add_source_cell(name, NOTEBOOK, ASSIGNMENT, cell_type=kind, locked=True,
                               source=source, checksum="")
        gb.add_source_cell("answer", NOTEBOOK, ASSIGNMENT, cell_type="code", locked=False,
                           source="# YOUR CODE HERE", checksum="")
        gb.add_solution_cell("answer", NOTEBOOK, ASSIGNMENT)
        gb.add_grade_cell("test_answer", NOTEBOOK, ASSIGNMENT, max_score=1, cell_type="code")
        ids = {}
        for student in students:
            gb.add_student(student)
            gb.add_submission(ASSIGNMENT, student)
            ids[student] = gb.find_submission_notebook(NOTEBOOK, ASSIGNMENT, student).id
    return ids


VECTORS = frozenset([*MARKDOWN, "md-changed", "md-claimed", "raw", "html-script", "html-img",
                     "html-svg", "html-link", "svg-onload", "svg-script", "js", "mdout-img",
                     "mdout-link", "png-width", "widget-state", "stream"])


def live_parts(nb: nbformat.NotebookNode, own: dict) -> list[str]:
    """Every place of the notebook that a page would still render as live markup with a
    vector in it: markdown that is not inert (the notebook's own allowed), HTML that cleaning
    would change, outputs other than the inert kinds, widget state."""
    found = ["widget state"] if "widgets" in nb.metadata else []
    for cell in nb.cells:
        mine = own.get(cell.metadata.get("nbgrader", {}).get("grade_id", "")) != (
            "markdown", cell.source)
        if cell.cell_type == "raw" or (cell.cell_type == "markdown" and mine
                                       and not markdown_is_inert(cell.source)):
            found.append(cell.source)
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            found += [m for m in data if m not in ("text/plain", "text/html", "image/png",
                                                   "image/jpeg", "image/svg+xml",
                                                   "text/markdown")]
            if "text/html" in data and clean_html(data["text/html"]) != data["text/html"]:
                found.append(data["text/html"])
            if "image/svg+xml" in data and clean_svg(data["image/svg+xml"]) != \
                    data["image/svg+xml"]:
                found.append(data["image/svg+xml"])
            if "text/markdown" in data and not markdown_is_inert(data["text/markdown"]):
                found.append(data["text/markdown"])
    return found
