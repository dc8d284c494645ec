"""What a class got wrong: `dpmp-lab report NAME`.

After a deadline an instructor asks what to re-teach. The grader already knows why each learner
lost points: a failed dl.check names the likely mistake and carries its key ("[hint:
comm.all_reduce_for_all_gather]", check/hints.py). This module reads nbgrader's gradebook (the
points per graded cell) and the autograded notebooks (the error each failed cell shows), and
counts, for each graded cell, the learners with full, partial and zero marks and, among the
failures, the likely mistakes by key, each with one example. A failure without a key (a test
cell's own assert) is grouped by its exception and message with the numbers masked, so "for
n=10 ..." and "for n=7 ..." count as one mistake; the stub left in place counts as "not
attempted". Examples show no learner's name; the names appear only when asked for.
(Grades out: grades_export.py, nbgrader's `export`.)
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from matplotlib.figure import Figure
from nbgrader.api import MissingEntry

from dpmp_lab import i18n
from dpmp_lab.check.hints import HINT_TAG
from dpmp_lab.instructor.course import gradebook_url
from dpmp_lab.instructor.grading_job import open_gradebook
from dpmp_lab.render import Table

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ADVICE = "(?:" + "|".join(map(re.escape, i18n.LIKELY_MISTAKE.values())) + ")"   # any language
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
BRACKETS = re.compile(r"\[[^\[\]]*\]")

NOT_ATTEMPTED = "not_attempted"      # the release's stub (raise NotImplementedError()) left
TIMEOUT = "timeout"                  # nbgrader's cell time limit interrupted the cell
TAMPERING = "tampering"              # integrity's scan zeroed the notebook


@dataclass
class Mistake:
    """One likely mistake in one cell: how many learners made it, one example of its message."""

    key: str
    count: int
    example: str
    learners: list[str] = field(default_factory=list)
    also: list[str] = field(default_factory=list)   # the other keys its messages carried


@dataclass
class CellCounts:
    """A graded cell: learners with full, partial and zero marks, and the mistakes behind it."""

    notebook: str
    cell: str
    points: float
    full: int = 0
    partial: int = 0
    zero: int = 0
    not_graded: int = 0      # submissions grading could not run (zero, flagged for manual)
    flagged: int = 0         # submissions suspected of forgery (zero, flagged for manual)
    mistakes: list[Mistake] = field(default_factory=list)


@dataclass
class ClassReport:
    assignment: str
    cells: list[CellCounts]
    totals: dict[str, tuple[float, float]]       # learner -> (score, max score)
    not_graded: dict[str, str]                   # learner -> why (grade_class's record)
    flagged: dict[str, list[str]] = field(default_factory=dict)   # learner -> what was found


# -- a failure's key ----------------------------------------------------------------------------


def failure_keys(ename: str, evalue: str) -> list[str]:
    """The hint keys a failure carries, else one key: the words of its likely mistake, else its
    exception and message, with numbers and bracketed lists masked, so that the same mistake
    on other inputs gets the same key."""
    text = ANSI.sub("", evalue)
    keys = HINT_TAG.findall(text)
    if keys:
        return list(dict.fromkeys(keys))
    if "NotImplementedError" in ename or "NotImplementedError" in text:
        return [NOT_ATTEMPTED]   # also when the stub raised inside a rank (a LaunchError)
    if ename == "CellTimeoutError":
        return [TIMEOUT]
    if ename == "TamperingDetected":
        return [TAMPERING]
    advice = re.search(rf"{ADVICE} ?(.*)", text, re.S)
    if advice:   # a hint without a key: the mistake it names, not the numbers before it
        return [f"mistake: {_masked(advice.group(1))[:140]}"]
    masked = _masked(text)
    return [f"{ename}: {masked[:140]}" if masked else ename]


def _masked(text: str) -> str:
    """One line, with numbers and bracketed lists masked: the same words on other inputs."""
    masked = " ".join(NUMBER.sub("#", text).split())
    while BRACKETS.search(masked):
        masked = BRACKETS.sub("<...>", masked)
    return masked


def _first_errors(path: Path) -> dict[str, tuple[str, str]]:
    """{grade_id: (ename, evalue)} of the first error each graded cell of a notebook shows.

    A NameError in a graded cell after a solution cell that failed (the release's stub raising
    NotImplementedError, say) is that cell's failure: the name was never defined because of it.
    """
    nb = nbformat.read(path, as_version=4)
    out: dict[str, tuple[str, str]] = {}
    earlier: tuple[str, str] | None = None
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if c.cell_type != "code":
            continue
        errors = [(o.get("ename", ""), o.get("evalue", "")) for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        if errors and meta.get("solution") and not meta.get("grade"):
            earlier = errors[0]
        if errors and meta.get("grade"):
            out[meta["grade_id"]] = (earlier if errors[0][0] == "NameError" and earlier
                                     else errors[0])
    return out


def _anonymised(text: str, learner: str) -> str:
    text = ANSI.sub("", text).strip()
    if learner:   # as a whole word, so that learner "eve" leaves "every" alone
        text = re.sub(rf"(?<![\w-]){re.escape(learner)}(?![\w-])", "<learner>", text)
    return text if len(text) <= 800 else text[:800] + " ..."


def _cell_order(root: Path, name: str) -> list[str]:
    """The graded cells of the assignment's notebooks in the order they appear."""
    order = []
    for path in sorted((root / "solutions" / name).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        order += [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                  if c.metadata.get("nbgrader", {}).get("grade")]
    return order


def _gradebook_of(root: Path) -> str:
    if not (root / "gradebook.db").exists():
        raise ValueError(f"no gradebook.db in {root}: nothing graded there yet "
                         "(dpmp-lab grade NAME)")
    return gradebook_url(root)


def class_report(name: str, root: Path) -> ClassReport:
    """Count the class's results and mistakes for assignment `name` in course root `root`."""
    state_file = root / ".dpmp_grading" / f"{name}.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    not_graded = {s: v.get("reason", "") for s, v in state.items() if not v.get("graded", True)}
    flagged = {s: v["flagged"] for s, v in state.items()
               if v.get("graded", True) and v.get("flagged")}
    cells: dict[tuple[str, str], CellCounts] = {}
    totals: dict[str, tuple[float, float]] = {}
    found: dict[tuple[str, str], dict[str, list[tuple[str, str]]]] = {}
    aliases: dict[tuple[str, str, str], set[str]] = {}
    with open_gradebook(_gradebook_of(root)) as gb:
        try:
            assignment = gb.find_assignment(name)
        except MissingEntry:
            raise ValueError(f"{name} is not in the gradebook: grade it first "
                             f"(dpmp-lab grade {name})") from None
        for nb in assignment.notebooks:
            for gc in nb.grade_cells:
                cells[(nb.name, gc.name)] = CellCounts(nb.name, gc.name, gc.max_score)
        for sub in gb.assignment_submissions(name):
            student = sub.student_id
            totals[student] = (sub.score, sub.max_score)
            for nb in sub.notebooks:
                path = root / "autograded" / student / name / f"{nb.name}.ipynb"
                errors = _first_errors(path) if path.exists() else {}
                for g in nb.grades:
                    counts = cells[(nb.name, g.name)]
                    score = g.score or 0.0
                    if student in not_graded:
                        counts.not_graded += 1
                        continue
                    if student in flagged:
                        counts.flagged += 1
                        continue
                    if score >= g.max_score:
                        counts.full += 1
                        continue
                    if score > 0:
                        counts.partial += 1
                    else:
                        counts.zero += 1
                    ename, evalue = errors.get(g.name, ("", ""))
                    example = f"{ename}: {evalue}" if ename else ""
                    # one failure, one count: under the last key its message carries (the
                    # grader's own diagnosis comes after an exercise's words for it)
                    *others, key = failure_keys(ename, evalue) if ename else ["no error shown"]
                    found.setdefault((nb.name, g.name), {}).setdefault(key, []).append(
                        (student, example))
                    aliases.setdefault((nb.name, g.name, key), set()).update(others)
    for where, by_key in found.items():
        mistakes = []
        for key, hits in by_key.items():
            hits.sort()
            learner, example = hits[0]
            mistakes.append(Mistake(key, len(hits), _anonymised(example, learner),
                                    [s for s, _ in hits],
                                    sorted(aliases.get((*where, key), ()))))
        cells[where].mistakes = sorted(mistakes, key=lambda m: (-m.count, m.key))
    order = {c: i for i, c in enumerate(_cell_order(root, name))}
    ordered = sorted(cells.values(), key=lambda c: (c.notebook, order.get(c.cell, 1 << 30)))
    return ClassReport(name, ordered, totals, not_graded, flagged)


# -- showing it ---------------------------------------------------------------------------------


def _gist(text: str, width: int = 110) -> str:
    """An example in one line: its likely-mistake lines where it has them, else its start."""
    advice = re.search(rf"{ADVICE} ?(.*?)(?:\n\[hint:|$)", ANSI.sub("", text), re.S)
    line = " ".join((advice.group(1) if advice else text).split())
    return line if len(line) <= width else line[:width - 3] + "..."


def cell_table(report: ClassReport) -> Table:
    """A row per graded cell: its points and how many learners got full, partial, zero."""
    return Table(["graded cell", "points", "full", "partial", "zero", "not graded", "flagged"],
                 [[c.cell, f"{c.points:g}", c.full, c.partial, c.zero, c.not_graded,
                   c.flagged] for c in report.cells])


def text_report(report: ClassReport, names: bool = False) -> str:
    """The terminal's view: a table of cells, each cell's mistakes, the spread of totals."""
    out = [f"{report.assignment}: {len(report.totals)} learner(s)"
           + (f", {len(report.not_graded)} not graded" if report.not_graded else "")]
    out.append(str(cell_table(report)))
    for c in report.cells:
        if not c.mistakes:
            continue
        out.append(f"\n{c.cell}: why points were lost")
        for m in c.mistakes:
            out.append(f"  {m.count:>4} x {m.key}"
                       + (f" (also keyed {', '.join(m.also)})" if m.also else ""))
            out.append(f"         e.g. {_gist(m.example)}")
            if names:
                out.append(f"         learners: {', '.join(m.learners)}")
    if report.not_graded:
        out.append("\nnot graded (zero, flagged for manual grading):")
        for learner, why in sorted(report.not_graded.items()):
            out.append(f"  {learner if names else '<learner>'}: {why}")
    if report.flagged:
        out.append("\nflagged for manual grading, a forgery suspected (zero until you look):")
        for learner, reasons in sorted(report.flagged.items()):
            out.append(f"  {learner if names else '<learner>'}: {reasons[0]}"
                       + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""))
    out.append("\n" + text_histogram(report))
    return "\n".join(out)


def _bins(report: ClassReport) -> tuple[list[float], float]:
    """The totals of the graded submissions (not those grading could not run) and the top."""
    scores = [s for who, (s, _) in report.totals.items() if who not in report.not_graded]
    top = max((m for _, m in report.totals.values()), default=0.0)
    return scores, top


def text_histogram(report: ClassReport, width: int = 40) -> str:
    """Total scores, one bar per whole point: the spread in a terminal."""
    scores, top = _bins(report)
    if not scores:
        return "no graded submissions"
    counts = Counter(int(s) for s in scores)
    most = max(counts.values())
    lines = [f"total score (out of {top:g}): learners"
             + (f" ({len(report.not_graded)} not graded, not shown)" if report.not_graded
                else "")]
    for points in range(int(top) + 1):
        n = counts.get(points, 0)
        lines.append(f"{points:>6} | {'#' * round(width * n / most)} {n or ''}".rstrip())
    return "\n".join(lines)


def csv_report(report: ClassReport, names: bool = False) -> str:
    """One row per graded cell (its counts) and per mistake in it (key, count, example)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["assignment", "notebook", "cell", "points", "full", "partial", "zero",
                "not_graded", "flagged", "mistake", "learners_with_mistake", "example"]
               + (["learners"] if names else []))
    for c in report.cells:
        w.writerow([report.assignment, c.notebook, c.cell, f"{c.points:g}", c.full, c.partial,
                    c.zero, c.not_graded, c.flagged, "", "", ""] + ([""] if names else []))
        for m in c.mistakes:
            w.writerow([report.assignment, c.notebook, c.cell, "", "", "", "", "", "", m.key,
                        m.count, m.example] + ([" ".join(m.learners)] if names else []))
    return buf.getvalue()


def histogram_png(report: ClassReport) -> bytes:
    """The spread of total scores as a PNG (matplotlib, drawn off-screen)."""
    scores, top = _bins(report)
    fig = Figure(figsize=(6, 2.6), dpi=100)   # no pyplot: nothing global, no GUI backend
    ax = fig.subplots()
    edges = [x - 0.5 for x in range(int(top) + 2)]
    ax.hist(scores, bins=edges, color="#4e79a7", edgecolor="white")
    ax.set_xlabel(f"total score (out of {top:g})")
    ax.set_ylabel("learners")
    ax.set_title(f"{report.assignment}: {len(scores)} graded learner(s)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def html_report(report: ClassReport, names: bool = False) -> str:
    """A page with the picture of the totals, the cell table and each cell's mistakes."""
    png = base64.b64encode(histogram_png(report)).decode()
    esc = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>{esc(report.assignment)}: class "
             "report</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
             "td,th{padding:2px 8px;text-align:left;vertical-align:top}"
             "pre{white-space:pre-wrap;background:#f6f6f6;padding:4px;margin:2px 0}</style>",
             f"<h1>{esc(report.assignment)}</h1>",
             f"<p>{len(report.totals)} learner(s)"
             + (f", {len(report.not_graded)} not graded" if report.not_graded else "") + "</p>",
             f"<img alt='spread of total scores' src='data:image/png;base64,{png}'>",
             "<h2>Graded cells</h2>", cell_table(report)._repr_html_()]
    for c in report.cells:
        if not c.mistakes:
            continue
        parts.append(f"<h3>{esc(c.cell)}: why points were lost</h3><table>"
                     "<tr><th>learners</th><th>likely mistake</th><th>an example</th></tr>")
        for m in c.mistakes:
            who = f"<br><small>{esc(', '.join(m.learners))}</small>" if names else ""
            also = f"<br><small>also {esc(', '.join(m.also))}</small>" if m.also else ""
            parts.append(f"<tr><td>{m.count}</td><td><code>{esc(m.key)}</code>{also}{who}</td>"
                         f"<td><pre>{esc(m.example)}</pre></td></tr>")
        parts.append("</table>")
    if report.not_graded:
        parts.append("<h2>Not graded</h2><ul>" + "".join(
            f"<li>{esc(s if names else '<learner>')}: {esc(why)}</li>"
            for s, why in sorted(report.not_graded.items())) + "</ul>")
    if report.flagged:
        parts.append("<h2>Flagged for manual grading (a forgery suspected)</h2><ul>" + "".join(
            f"<li>{esc(s if names else '<learner>')}:<ul>"
            + "".join(f"<li><code>{esc(r)}</code></li>" for r in reasons) + "</ul></li>"
            for s, reasons in sorted(report.flagged.items())) + "</ul>")
    return "\n".join(parts)


def write_html(report: ClassReport, root: Path, names: bool = False) -> Path:
    """reports/<assignment>.html in the course root."""
    out = root / "reports" / f"{report.assignment}.html"
    out.parent.mkdir(exist_ok=True)
    out.write_text(html_report(report, names), encoding="utf-8")
    return out
