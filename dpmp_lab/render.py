"""Drawing primitives: tables and pictures that show as HTML or SVG in a notebook and as plain
text everywhere else (a terminal, a grader's message).

This is the bottom layer of every picture and imports nothing from dpmp_lab, so any module can
draw itself with it (a trace's summary, cost's memory table) while dl.viz, on top, draws the
library's objects.
"""

from __future__ import annotations

import html
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

__all__ = ["PALETTE", "Picture", "Table", "cell", "human_bytes", "svg_start"]

# one colour per rank, group or tp place; the same order everywhere (Tableau 10)
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7"]


def cell(value: Any) -> str:
    """A value as a table cell shows it: None as '-', a group's ranks (0, 1) as '(0,1)'."""
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return "(" + ",".join(str(v) for v in value) + ")"
    return str(value)


def _width(text: str) -> int:
    """The columns `text` takes in a terminal: a wide character (Japanese) takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': sizes the way the articles quote them (4 MiB of gradients)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class Table:
    """A small table: `str()` gives aligned text, a notebook shows HTML.

    `marks` flags rows to point at (an arrow in text, a red background in HTML); `note` is a
    line under the table.
    """

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "",
                 marks: Sequence[bool] | None = None, note: str = ""):
        self.columns = list(columns)
        self.rows = [[cell(v) for v in row] for row in rows]
        self.title = title
        self.marks = list(marks) if marks is not None else [False] * len(self.rows)
        self.note = note

    def __str__(self) -> str:
        cells = [self.columns] + self.rows
        widths = [max(_width(r[i]) for r in cells) for i in range(len(self.columns))]
        numeric = [all(_is_number(r[i]) for r in self.rows) and self.rows for i in
                   range(len(self.columns))]

        def line(row: list[str], mark: str = "") -> str:
            pads = [" " * (w - _width(v)) for v, w in zip(row, widths, strict=True)]
            parts = [pad + v if num else v + pad
                     for v, pad, num in zip(row, pads, numeric, strict=True)]
            return ("  ".join(parts) + mark).rstrip()

        out = [self.title] if self.title else []
        out.append(line(self.columns))
        out += [line(r, "   <-" if m else "") for r, m in zip(self.rows, self.marks, strict=True)]
        if not self.rows:
            out.append("(none)")
        if self.note:
            out.append(self.note)
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = []
        for row, mark in zip(self.rows, self.marks, strict=True):
            style = ' style="background:#fdd"' if mark else ""
            cells = "".join(f"<td>{html.escape(v)}</td>" for v in row)
            body.append(f"<tr{style}>{cells}</tr>")
        if not self.rows:
            body.append(f'<tr><td colspan="{len(self.columns)}">(none)</td></tr>')
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        note = f"<p>{html.escape(self.note)}</p>" if self.note else ""
        return (f'<table class="dpmp-lab">{caption}<thead><tr>{head}</tr></thead>'
                f"<tbody>{''.join(body)}</tbody></table>{note}")


def _is_number(text: str) -> bool:
    return text.replace(".", "", 1).replace(" ", "").lstrip("-").isdigit() or text == "-"


class Picture(ABC):
    """A picture: `str()` draws it as text, a notebook shows `_repr_svg_()`, `save` writes
    the SVG to a file. Subclasses draw both versions from the same data."""

    @abstractmethod
    def __str__(self) -> str: ...

    @abstractmethod
    def _repr_svg_(self) -> str: ...

    def __repr__(self) -> str:
        return str(self)

    def save(self, path: str) -> None:
        """Write the SVG picture to `path` (for slides and handouts)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._repr_svg_())


def svg_start(width: float, height: float) -> str:
    """The opening tag every picture starts with: its size, and the house font."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="sans-serif" font-size="12">')
