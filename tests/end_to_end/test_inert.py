"""What a page may show of a learner's notebook (dpmp_lab/instructor/markup.py, inert.py): each
vector removed, what the course's own notebooks and the library draw kept, and where nbgrader
runs it. tests/end_to_end/test_inert_pages.py loads the pages in Chromium."""

from __future__ import annotations

import copy
import glob
import json
import os
import sys
import time
from html.parser import HTMLParser
from xml.etree.ElementTree import canonicalize

import nbformat
import pytest
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from nbgrader.converters import Autograde
from traitlets.config import Config

import dpmp_lab as dl
from dpmp_lab.instructor import nbgrader_plugin
from dpmp_lab.instructor.inert import (
    FEEDBACK_CSP,
    RICH_BUDGET,
    RICH_LIMIT,
    Budget,
    InertFeedbackExporter,
    InertNotebook,
    inert_data,
    inert_notebook,
    inert_output,
    shown_as_source,
    with_csp,
)
from dpmp_lab.instructor.markup import (
    HTML_TAGS,
    MAX_DEPTH,
    as_cleaned,
    clean_html,
    clean_svg,
    link_is_inert,
    markdown_is_inert,
    picture_is_inert,
    text_of,
)
from dpmp_lab.launcher.progress import Progress
from dpmp_lab.render import Table
from tests.conftest import ROOT
from tests.support.inert_vectors import (
    ASSIGNMENT,
    HIDDEN,
    MARK,
    MARKDOWN,
    NOTEBOOK,
    OWN,
    OWN_INTRO,
    gradebook,
    live_parts,
    vector_notebook,
)

# -- links and pictures --------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "javascript:alert(1)", "JaVaScRiPt:alert(1)", " javascript:alert(1)", "\x01javascript:x",
    "java\tscript:alert(1)", "java\nscript:x", "vbscript:x", "data:text/html,<script>x</script>",
    "data:image/png;base64,AAAA", "file:///etc/passwd", "other.html", "../../x", "//evil.org/x",
    ""])
def test_a_link_that_could_run_or_reach_the_learner_s_files_is_not_inert(url):
    assert not link_is_inert(url)


@pytest.mark.parametrize("url", ["https://pytorch.org/docs", "http://a.b/c?d=1&e=2",
                                 "mailto:ada@example.org", "#section", " https://x.org"])
def test_web_links_and_fragments_are_inert(url):
    assert link_is_inert(url)


def test_a_picture_is_inert_from_the_web_or_a_raster_data_url_only():
    assert picture_is_inert("https://x.org/a.png")
    assert picture_is_inert("data:image/png;base64,AAAA")
    assert picture_is_inert("DATA:image/jpeg;base64,AAAA")
    for url in ("data:image/svg+xml;base64,AAAA", "javascript:x", "a.png", "data:text/html,x"):
        assert not picture_is_inert(url), url


# -- HTML ------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", [
    "<script>alert(1)</script>", '<img src="x" onerror="alert(1)">',
    '<svg onload="alert(1)"></svg>', '<a href="javascript:alert(1)">x</a>',
    '<a href=" JAVA\tSCRIPT:alert(1)">x</a>', '<iframe srcdoc="<script>x</script>"></iframe>',
    '<object data="data:text/html,x"></object>', '<embed src="x.swf">',
    "<style>body{display:none}</style>", '<b onmouseover="alert(1)">b</b>',
    '<form action="https://x.org"><input name="token"></form>', '<math><mi xlink:href="x">',
    '<details open ontoggle="alert(1)">', '<base href="https://evil.org/">',
    '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">',
    '<link rel="stylesheet" href="https://evil.org/x.css">'])
def test_clean_html_leaves_no_element_or_attribute_that_runs_or_fetches(vector):
    cleaned = clean_html(vector)
    reader = _Elements()
    reader.feed(cleaned)
    assert reader.tags <= HTML_TAGS, cleaned
    for tag, name, value in reader.attributes:
        assert name in ("title", "colspan", "rowspan", "align", "style") or (
            tag, name) == ("a", "href") and link_is_inert(value), cleaned
    assert clean_html(cleaned) == cleaned


class _Elements(HTMLParser):
    """The elements and attributes of some HTML, as a parser reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.add(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]


def test_clean_html_shows_a_script_as_text_and_drops_ids_classes_and_fetching_styles():
    assert clean_html("<script>steal()</script>") == "&lt;script&gt;steal()&lt;/script&gt;"
    assert clean_html('<p id="predict_tests" class="nbgrader_cell tabbable">x</p>') == "<p>x</p>"
    styled = clean_html('<b style="color: red; position: fixed; background: url(https://e/x); '
                        'background-image: none; background: u\\72l(x)">b</b>')
    assert styled == '<b style="color: red">b</b>'


def test_the_library_s_tables_and_labels_keep_their_look():
    table = Table(["op", "bytes"], [["all_reduce", 4096], ["send", None]], title="comm",
                  marks=[True, False], note="one mark")
    cleaned = clean_html(table._repr_html_())
    assert ('<caption>comm</caption><thead><tr><th>op</th><th>bytes</th></tr></thead>'
            '<tbody><tr style="background: #fdd"><td>all_reduce</td><td>4096</td></tr>'
            "<tr><td>send</td><td>-</td></tr></tbody></table><p>one mark</p>") in cleaned
    schedule = dl.pp.one_f_one_b(4, 8)._repr_html_()
    assert clean_html(schedule).count("background: ") == schedule.count("background:")
    cleaned = clean_html(Progress(2, enabled=False)._repr_mimebundle_()["text/html"])
    for style in ("background", "color: white", "border-radius: 4px", "padding: 1px 6px",
                  "margin-right: 4px", "font-family: monospace"):
        assert style in cleaned, (style, cleaned)


def test_html_nested_too_deep_to_clean_in_time_is_dropped_at_once():
    started = time.monotonic()
    assert clean_html("<div>" * 50_000) is None
    assert clean_html("<b>" * (MAX_DEPTH + 1)) is None
    assert clean_html("<b>" * MAX_DEPTH + "<br>" * 1000) is not None   # void elements close
    assert time.monotonic() - started < 5   # html5lib alone: minutes


def test_as_cleaned_is_how_clean_html_writes_a_line():
    line = "assert f(\"a\") < 3 and x > 2 & y == 'z'"
    assert as_cleaned(line) in clean_html(f"<pre>seen: {line}</pre>")


def test_text_of_is_what_the_page_shows():
    assert text_of("<p>a &lt; b</p><script>x()</script><style>p{}</style> c") == "a < b c"


# -- SVG -------------------------------------------------------------------------------------


@pytest.mark.parametrize("picture", [
    dl.viz.grid(dp=2, tp=2), dl.viz.collective("all_reduce"), dl.viz.collective("reduce_scatter"),
    dl.viz.timeline(dl.pp.one_f_one_b(4, 8))], ids=lambda p: type(p).__name__)
def test_the_library_s_pictures_come_through_whole(picture):
    svg = picture._repr_svg_()
    assert canonicalize(clean_svg(svg)) == canonicalize(svg)


def test_clean_svg_keeps_the_shapes_and_drops_what_runs_links_or_fetches():
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
           'width="20" onload="alert(1)"><script>alert(2)</script>'
           '<a href="javascript:x"><rect width="1" onclick="x"/></a>'
           '<foreignObject><div xmlns="http://www.w3.org/1999/xhtml">x</div></foreignObject>'
           '<style>rect{fill:url(https://e/x)}</style><set attributeName="href" to="javascript:x"/>'
           '<animate attributeName="href" values="javascript:x"/><use xlink:href="https://e#x"/>'
           '<image href="https://e/x.png"/>'
           '<rect fill="url(https://e/x)" marker-end="url(#m)" style="x" width="2"/>'
           '<text x="1">a &lt; b</text></svg>')
    assert clean_svg(svg) == ('<svg width="20" xmlns="http://www.w3.org/2000/svg">'
                              '<rect marker-end="url(#m)" width="2" /><text x="1">a &lt; b</text>'
                              "</svg>")


@pytest.mark.parametrize("svg", [
    '<!DOCTYPE svg [<!ENTITY a "b">]><svg xmlns="http://www.w3.org/2000/svg">&a;</svg>',
    '<svg xmlns="http://www.w3.org/2000/svg">' + "<g>" * 5000 + "</g>" * 5000 + "</svg>",
    "<svg><script>x</script></svg>", "<html><script>x</script></html>", "not a picture", ""])
def test_clean_svg_refuses_a_document_with_a_dtd_or_that_is_no_svg(svg):
    assert clean_svg(svg) is None


# -- markdown --------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    *MARKDOWN.values(), "a <b>bold</b> word", "<!-- a comment -->", "<javascript:alert(1)>",
    "[x](javascript:alert(1))", "[x](<java&#9;script:alert(1)>)", "[x](&#x6A;avascript:x)",
    "[x][r]\n\n[r]: javascript:alert(1)", "![x](data:image/svg+xml;base64,AAAA)",
    "[x](data:text/html,hi)", "[x](other.html)", "![x](other.png)", "![x](attachment:p.png)"])
def test_markdown_with_raw_html_or_a_live_link_is_not_inert(source):
    assert not markdown_is_inert(source)


@pytest.mark.parametrize("source", [
    "# Title\n\nSome *text* with `<script>` in code and a < b > c.", "```\n<script>\n```",
    "    <script>indented code</script>", "&lt;script&gt; &amp; &nbsp;",
    "[docs](https://pytorch.org) and [a section](#top)", "$\\alpha < \\beta$",
    "| a | b |\n|---|---|\n| 1 | 2 |", "![x](data:image/png;base64,AAAA)"])
def test_markdown_without_html_and_with_web_links_is_inert(source):
    assert markdown_is_inert(source)


def test_a_picture_from_an_attachment_is_inert_when_the_attachment_is_raster():
    assert markdown_is_inert("![a](attachment:p.png)", {"p.png": {"image/png": "AAAA"}})


def test_the_course_s_own_markdown_is_inert_as_written():
    """So formgrader and feedback show every released notebook's text as the course wrote it,
    whether or not a gradebook says which cells are the notebook's own."""
    cells = [c for path in sorted(glob.glob(str(ROOT / "course" / "*" / "*.ipynb")))
             for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]
    assert len(cells) > 100
    assert [c.source[:80] for c in cells if not markdown_is_inert(c.source)] == []


@pytest.mark.parametrize("source", [*MARKDOWN.values(), "~~~\n<script>x</script>\n~~~~~~",
                                    "```\n<script>x</script>\n```", "a\n\n~~~~"])
def test_shown_as_source_is_inert_and_shows_every_character(source):
    shown = shown_as_source(source)
    assert markdown_is_inert(shown)
    assert source in text_of(markdown2html_mistune(shown))


# -- outputs ---------------------------------------------------------------------------------


def test_inert_data_keeps_text_rasters_and_cleaned_html_and_svg_only():
    svg = dl.viz.grid(dp=2, tp=1)._repr_svg_()
    kept = inert_data({
        "text/plain": "text", "image/png": "iVBO", "image/jpeg": "/9j/",
        "text/html": "<b>b</b><script>x</script>", "image/svg+xml": svg,
        "text/markdown": "*fine*", "application/javascript": "x()", "text/latex": "$x$",
        "application/pdf": "JVBE", "application/vnd.jupyter.widget-view+json": {"model_id": "a"},
        "text/x-unknown": "?", "application/json": {"a": 1}})
    assert kept == {"text/plain": "text", "image/png": "iVBO", "image/jpeg": "/9j/",
                    "text/html": "<b>b</b>&lt;script&gt;x&lt;/script&gt;",
                    "image/svg+xml": clean_svg(svg), "text/markdown": "*fine*"}


def test_inert_data_makes_a_text_plain_when_there_is_none():
    assert inert_data({"text/html": "<p>a &lt; b</p><script>x()</script>"})["text/plain"] == \
        "a < b"
    assert inert_data({"application/javascript": "x()"}) == {
        "text/plain": "[output not shown: application/javascript]"}
    assert inert_data({"text/markdown": "<img src=x onerror=y>"})["text/plain"] == \
        "<img src=x onerror=y>"


def test_rich_output_past_its_size_or_the_notebook_s_budget_is_dropped_for_its_text():
    big = "<p>" + "x" * RICH_LIMIT + "</p>"
    assert inert_data({"text/html": big}) == {"text/plain": "x" * RICH_LIMIT}
    page = "<p>" + "y" * (RICH_LIMIT - 10) + "</p>"
    outputs = [new_output("display_data", data={"text/html": page, "text/plain": "y"})
               for _ in range(RICH_BUDGET // RICH_LIMIT + 1)]
    made = inert_notebook(new_notebook(cells=[new_code_cell("y", outputs=outputs)]))
    kept = ["text/html" in out.data for out in made.cells[0].outputs]
    assert kept == [True] * (RICH_BUDGET // RICH_LIMIT) + [False]
    assert Budget(10).allows("x" * 10) and not Budget(10).allows("x" * 11)


def test_inert_output_rebuilds_each_kind_from_its_inert_parts():
    png = new_output("display_data", data={"image/png": "AAAA", "text/plain": "p"},
                     metadata={"image/png": {"width": "1 onerror=x()", "height": 20},
                               "filenames": {"image/png": "javascript:x"}, "isolated": True})
    assert inert_output(png).metadata == {"image/png": {"height": 20}}
    result = new_output("execute_result", data={"text/plain": "1"}, execution_count=3)
    assert inert_output(result) == result
    stream = inert_output({"output_type": "stream", "name": "<b>", "text": ["a", "b"]})
    assert (stream.name, stream.text) == ("stdout", "ab")
    error = inert_output({"output_type": "error", "ename": "E", "evalue": 1,
                          "traceback": ["t", None]})
    assert (error.ename, error.evalue, error.traceback) == ("E", "", ["t", ""])
    assert inert_output({"output_type": "update_display_data", "data": {}}) is None


# -- a notebook ------------------------------------------------------------------------------


def test_the_vector_notebook_is_live_before_and_inert_after():
    nb = vector_notebook()
    assert len(live_parts(nb, OWN)) >= 15
    made = inert_notebook(copy.deepcopy(nb), OWN)
    assert live_parts(made, OWN) == []
    assert made.cells[0].source == OWN_INTRO           # the notebook's own cell, as it was
    assert all(MARK in c.source for c in made.cells[1:11])   # each learner's cell, as its source
    assert [c.cell_type for c in made.cells] == ["markdown"] * 11 + ["code"] * 2
    assert inert_notebook(copy.deepcopy(made), OWN) == made   # once is enough


def test_without_a_gradebook_every_cell_is_the_learner_s():
    made = inert_notebook(vector_notebook(), None)
    assert made.cells[0].source == shown_as_source(OWN_INTRO)


def test_a_grade_id_that_could_leave_its_attribute_takes_the_nbgrader_metadata_with_it():
    cell = new_code_cell("x = 1")
    cell.metadata["nbgrader"] = {"grade_id": 'a"><img src=x onerror=alert(1)>', "grade": True}
    fine = new_code_cell("y = 2")
    fine.metadata["nbgrader"] = {"grade_id": "predict_tests-2", "grade": True}
    made = inert_notebook(new_notebook(cells=[cell, fine]))
    assert "nbgrader" not in made.cells[0].metadata
    assert made.cells[1].metadata["nbgrader"]["grade_id"] == "predict_tests-2"


def test_attachments_keep_raster_pictures_and_a_cell_that_needs_another_is_shown_as_source():
    cell = new_markdown_cell("![p](attachment:p.svg) ![q](attachment:q.png)")
    cell.attachments = {"p.svg": {"image/svg+xml": "PHN2Zz4=", "text/html": "<script>"},
                        "q.png": {"image/png": "AAAA", "text/html": "<b>"}}
    cell.metadata["nbgrader"] = {"grade_id": "intro", "locked": True}
    source = cell.source
    made = inert_notebook(new_notebook(cells=[cell]), {"intro": ("markdown", source)})
    assert made.cells[0].attachments == {"q.png": {"image/png": "AAAA"}}
    assert made.cells[0].source == shown_as_source(source)   # its own, but it would not render


def test_execution_counts_are_numbers_or_nothing():
    nb = new_notebook(cells=[new_code_cell("x", execution_count=3), new_code_cell("y")])
    nb.cells[1].execution_count = "<img src=x onerror=alert(1)>"   # nbconvert would refuse it
    made = inert_notebook(nb)
    assert [c.execution_count for c in made.cells] == [3, None]


# -- where nbgrader runs it ------------------------------------------------------------------


@pytest.fixture
def course_root(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))   # nbgrader's gradebook runs alembic
    gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", ["ada"])
    return tmp_path


def test_inert_notebook_reads_the_own_cells_from_the_gradebook_autograde_names(course_root):
    resources = {"nbgrader": {"db_url": f"sqlite:///{course_root / 'gradebook.db'}",
                              "assignment": ASSIGNMENT, "notebook": NOTEBOOK, "student": "ada"}}
    nb = vector_notebook()
    made, _ = InertNotebook().preprocess(copy.deepcopy(nb), resources)
    assert made == inert_notebook(nb, OWN)


def test_inert_notebook_finds_the_gradebook_from_formgrader_s_page(course_root):
    config = Config()
    config.CourseDirectory.root = str(course_root)
    resources = {"assignment_id": ASSIGNMENT, "notebook_id": NOTEBOOK, "student": "ada"}
    nb, _ = InertNotebook(config=config).preprocess(vector_notebook(), resources)
    assert nb.cells[0].source == OWN_INTRO
    elsewhere = Config()
    elsewhere.CourseDirectory.root = str(course_root / "elsewhere")
    (course_root / "elsewhere").mkdir()
    nb, _ = InertNotebook(config=elsewhere).preprocess(vector_notebook(), resources)
    assert nb.cells[0].source == shown_as_source(OWN_INTRO)
    assert list((course_root / "elsewhere").iterdir()) == []   # no gradebook made there


def test_configure_makes_every_page_inert():
    c = Config()
    nbgrader_plugin.configure(c)
    autograde = c.Autograde.autograde_preprocessors
    assert autograde[-1] is InertNotebook   # the autograded notebook is written inert
    assert autograde[:-1] == nbgrader_plugin.autograde_preprocessors(
        Autograde.class_traits()["autograde_preprocessors"].default())[:-1]
    feedback = c.GenerateFeedback.preprocessors
    assert feedback.index(InertNotebook) == feedback.index(nbgrader_plugin.HideHiddenTests) + 1
    assert c.GenerateFeedback.exporter_class is InertFeedbackExporter
    assert c.InertFeedbackExporter.preprocessors == []
    assert c.HTMLExporter.preprocessors == [InertNotebook]   # formgrader's exporter
    assert c.HTMLExporter.exclude_anchor_links is True


def test_hidden_lines_are_masked_in_html_that_autograde_made_inert():
    test = new_code_cell(f"### BEGIN HIDDEN TESTS\n{HIDDEN}\n### END HIDDEN TESTS")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                 "grade_id": "t", "points": 1}
    test.outputs = [new_output("display_data", data={"text/html": f"<pre>seen: {HIDDEN}</pre>",
                                                     "text/plain": f"seen: {HIDDEN}"})]
    nb = inert_notebook(new_notebook(cells=[test]))
    assert as_cleaned(HIDDEN) in nb.cells[0].outputs[0].data["text/html"]
    nb, _ = nbgrader_plugin.HideHiddenTests().preprocess(nb, {})
    assert "secret_hidden_check" not in json.dumps(nb)


def test_with_csp_puts_the_policy_first_in_the_head():
    page = with_csp('<!DOCTYPE html>\n<html>\n<head lang="en">\n<meta charset="utf-8" />'
                    "<script>x()</script></head><body><head></head></body></html>")
    assert page.startswith('<!DOCTYPE html>\n<html>\n<head lang="en">\n<meta http-equiv='
                           f'"Content-Security-Policy" content="{FEEDBACK_CSP}">\n<meta')
    assert page.count(FEEDBACK_CSP) == 1
    assert "script-src" not in FEEDBACK_CSP and "default-src 'none'" in FEEDBACK_CSP
    with pytest.raises(ValueError, match="no <head>"):
        with_csp("<p>a page without a head</p>")


def test_the_hidden_test_markers_are_masked_in_a_traceback_too():
    """A traceback through a hidden test shows the lines around the failing one: the marker,
    which says where hidden tests begin, is masked as they are."""
    test = new_code_cell(f"x = 1\n### BEGIN HIDDEN TESTS\n{HIDDEN}\n### END HIDDEN TESTS")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                 "grade_id": "t", "points": 1}
    test.outputs = [new_output("error", ename="AssertionError", evalue="",
                               traceback=["----> 2 ### BEGIN HIDDEN TESTS", f"      3 {HIDDEN}",
                                          "      4 ### END HIDDEN TESTS", "AssertionError"])]
    nb, _ = nbgrader_plugin.HideHiddenTests().preprocess(new_notebook(cells=[test]), {})
    shown = json.dumps(nb.cells[0].outputs)
    assert "HIDDEN TESTS" not in shown and "secret_hidden_check" not in shown
    assert "AssertionError" in shown
