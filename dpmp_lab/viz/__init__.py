"""Pictures of the library's objects, in a notebook (SVG/HTML) and as plain text everywhere else.

Nothing here needs matplotlib or a running process group, so a learner can draw a layout in
the notebook kernel before launching anything, and grader messages stay readable in a terminal.

    dl.viz.grid(dp=2, tp=2, pp=2)     # which ranks share which group
    dl.viz.comm(res.traces)           # collectives per op, group and phase, one column per rank
    dl.viz.comm_chart(res)            # bytes per rank and group, as bars
    dl.viz.timeline(pp.one_f_one_b(4, 8))   # a pipeline schedule or a measured run
    dl.viz.collective("all_reduce")   # what every rank holds before and after a collective
    dl.viz.profile(res)               # dl.bench profiles: compute and communication per rank

This module sits on top: it reads traces, grids and pipeline schedules. The drawing primitives
(Table, human_bytes, the Picture base) live in dpmp_lab.render, below every module, and are
re-exported here, as are the collective pictures of dpmp_lab.viz.collective_picture and the
profile pictures of dpmp_lab.viz.profile_picture.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from dpmp_lab.grid import GridLayout
from dpmp_lab.i18n.messages import N_, _
from dpmp_lab.pp import PipelineResult, Schedule, measured_bubble
from dpmp_lab.render import PALETTE, Picture, Table, cell, human_bytes, svg_start
from dpmp_lab.trace import traces_of
from dpmp_lab.viz.collective_picture import COLLECTIVES, CollectivePicture, collective
from dpmp_lab.viz.profile_picture import ProfilePicture, profile

__all__ = ["COLLECTIVES", "CollectivePicture", "CommChart", "GridPicture", "ProfilePicture",
           "Table", "Timeline", "collective", "comm", "comm_chart", "grid", "human_bytes",
           "profile", "timeline"]

# -- communication ------------------------------------------------------------------------------


def comm(traces: Sequence[Any] | Any, *, bytes: bool = False) -> Table:
    """Collectives per (op, group, phase), one column per rank: what each rank issued.

    `traces`: the result of `dl.launch(..., trace=True)`, its `.traces`, or one Trace.
    With bytes=True the cells show the bytes instead of the counts.
    """
    traces = traces_of(traces)
    keys: dict[tuple, None] = {}
    for t in traces:
        for ev in t.events:
            keys.setdefault((ev.op, ev.group_label, ev.phase), None)
    rows = []
    for op, group, phase in keys:
        row: list[Any] = [op, group, phase]
        for t in traces:
            picked = [ev for ev in t.events
                      if (ev.op, ev.group_label, ev.phase) == (op, group, phase)]
            row.append(human_bytes(sum(e.nbytes for e in picked)) if bytes else len(picked))
        rows.append(row)
    ranks = [_("rank {rank}").format(rank=t.rank) if t.rank is not None
             else _("trace {i}").format(i=i) for i, t in enumerate(traces)]
    what = _("payload bytes") if bytes else _("calls")
    return Table([_("op"), _("group"), _("phase"), *ranks], rows,
                 title=_("communication ({what})").format(what=what))


class CommChart(Picture):
    """Bytes each rank sent, per group: one bar per (rank, group), so it shows at a glance
    which dimension of the grid carries the traffic (tp every layer, dp once per step)."""

    def __init__(self, rows: list[tuple[str, str, int]]):
        self.rows = rows                      # (rank label, group label, bytes)
        self.top = max((b for _, _, b in rows), default=0)

    def __str__(self) -> str:
        if not self.rows:
            return "no communication"
        width = 40
        who = max(len(r) for r, _, _ in self.rows)
        group = max(len(g) for _, g, _ in self.rows)
        lines = ["payload bytes per rank and group"]
        for rank, g, b in self.rows:
            bar = "#" * max(1, round(width * b / self.top)) if b else ""
            lines.append(f"{rank.ljust(who)}  {g.ljust(group)}  {bar} {human_bytes(b)}")
        return "\n".join(lines)

    def _repr_svg_(self) -> str:
        label_w, bar_w, row_h = 190, 380, 20
        groups = sorted({g for _, g, _ in self.rows})
        colour = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
        height = 24 + row_h * len(self.rows)
        out = [svg_start(label_w + bar_w + 90, height),
               '<text x="4" y="14">payload bytes per rank and group</text>']
        for i, (rank, g, b) in enumerate(self.rows):
            y = 22 + i * row_h
            w = bar_w * b / self.top if self.top else 0
            out.append(f'<text x="4" y="{y + 13}">{html.escape(rank)}, {html.escape(g)}</text>')
            out.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{row_h - 4}" '
                       f'fill="{colour[g]}"/>')
            out.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 13}">{human_bytes(b)}</text>')
        out.append("</svg>")
        return "".join(out)


def comm_chart(traces: Sequence[Any] | Any) -> CommChart:
    """A bar per (rank, group): the bytes of every call the rank issued on that group."""
    rows = []
    for i, t in enumerate(traces_of(traces)):
        per_group: dict[str, int] = {}
        for ev in t.events:
            key = cell(ev.group_label)
            per_group[key] = per_group.get(key, 0) + ev.nbytes
        rank = f"rank {t.rank}" if t.rank is not None else f"trace {i}"
        rows += [(rank, g, b) for g, b in per_group.items()]
    return CommChart(rows)


# -- process grid ---------------------------------------------------------------------------------


class GridPicture(Picture):
    """Ranks laid out as the articles draw them: a row is a DP group, a column a TP group.

    With pp > 1 there is one panel per pipeline stage; the same cell in every panel is a
    pipeline (pp) group. With cp > 1, one panel per (stage, cp rank): the same cell in the cp
    panels of a stage is a context-parallel (cp) group. ep groups (inside dp) are listed below.
    `str()` gives the text version, a notebook shows SVG.
    """

    def __init__(self, layout: GridLayout, highlight: int | None = None):
        self.layout = layout
        self.highlight = highlight

    def _panels(self) -> list[tuple[int, int, str]]:
        """(pp, cp, title) of every panel, in rank order."""
        L = self.layout
        out = []
        for pp in range(L.pp):
            for cp in range(L.cp):
                words = ([f"pipeline stage pp={pp}"] if L.pp > 1 else []) + \
                    ([f"cp={cp}"] if L.cp > 1 else [])
                out.append((pp, cp, ", ".join(words)))
        return out

    def _legend(self) -> list[str]:
        L = self.layout
        lines = ["a row is a data-parallel (dp) group: same model shard, different data",
                 "a column is a tensor-parallel (tp) group: one model split across ranks"]
        if L.pp > 1:
            lines.append("the same place in every stage is a pipeline (pp) group")
        if L.cp > 1:
            lines.append("the same place in every cp panel of a stage is a context-parallel (cp) "
                         "group: one sequence split across ranks")
        if L.ep > 1:
            lines.append("expert-parallel (ep) groups, inside the dp groups: "
                         + " ".join("(" + ",".join(map(str, g)) + ")" for g in L.groups("ep")))
        return lines

    def __str__(self) -> str:
        L = self.layout
        lines = [L.describe_sizes()]
        width = max(4, len(str(L.world_size - 1)) + 1)
        for pp, cp, title in self._panels():
            if title:
                lines.append(f"{title}:")
            header = " " * 8 + "".join(f"dp={d}".rjust(width + 3) for d in range(L.dp))
            lines.append(header)
            for tp in range(L.tp):
                cells = []
                for dp in range(L.dp):
                    r = L.rank_of(pp=pp, dp=dp, tp=tp, cp=cp)
                    text = f"[{r}]" if r == self.highlight else str(r)
                    cells.append(text.rjust(width + 3))
                lines.append(f"  tp={tp}".ljust(8) + "".join(cells))
        lines.extend(self._legend())
        return "\n".join(lines)

    def _repr_svg_(self) -> str:
        L = self.layout
        side, gap, margin, top = 46, 6, 50, 40
        panels = self._panels()
        panel_w = max(margin + L.dp * (side + gap) + 20, 150 if L.cp > 1 else 0)
        width = max(panel_w * len(panels), 260)
        legend = self._legend()
        height = top + L.tp * (side + gap) + 38 + 16 * len(legend)
        out = [svg_start(width, height)]
        for i, (pp, cp, title) in enumerate(panels):
            x0 = i * panel_w
            if title:
                out.append(f'<text x="{x0 + margin}" y="16">{title.replace("pipeline ", "")}'
                           "</text>")
            for dp in range(L.dp):
                x = x0 + margin + dp * (side + gap)
                out.append(f'<text x="{x + 8}" y="{top - 6}">dp={dp}</text>')
            for tp in range(L.tp):
                y = top + tp * (side + gap)
                out.append(f'<text x="{x0 + 4}" y="{y + side // 2 + 4}">tp={tp}</text>')
                for dp in range(L.dp):
                    x = x0 + margin + dp * (side + gap)
                    r = L.rank_of(pp=pp, dp=dp, tp=tp, cp=cp)
                    colour = PALETTE[tp % len(PALETTE)]
                    stroke = 'stroke="black" stroke-width="3"' if r == self.highlight else ""
                    out.append(f'<rect x="{x}" y="{y}" width="{side}" height="{side}" rx="6" '
                               f'fill="{colour}" fill-opacity="0.35" {stroke}/>')
                    out.append(f'<text x="{x + side // 2}" y="{y + side // 2 + 5}" '
                               f'text-anchor="middle" font-size="15">{r}</text>')
        y = top + L.tp * (side + gap) + 18
        words = {"a row is": "row (same colour) = dp group:", "a column is": "column = tp group:"}
        for j, line in enumerate(legend):
            for old, new in words.items():
                if line.startswith(old):
                    line = new + line.split(":", 1)[1]
            out.append(f'<text x="4" y="{y + 16 * j}">{line}</text>')
        out.append("</svg>")
        return "".join(out)


def grid(grid_or_none: Any = None, *, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1,
         ep: int = 1, highlight: int | None = None) -> GridPicture:
    """Draw a process grid: `dl.viz.grid(dp=2, tp=2)` or `dl.viz.grid(my_grid)`.

    Works in the notebook kernel without launching anything, so you can look at a layout
    before you build it.
    """
    if grid_or_none is None:
        layout = GridLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    else:
        layout = getattr(grid_or_none, "layout", grid_or_none)
        if not isinstance(layout, GridLayout):
            raise TypeError(_("dl.viz.grid takes a ProcessGrid or GridLayout, not "
                              "{kind}").format(kind=type(grid_or_none).__name__))
        if highlight is None:
            highlight = getattr(grid_or_none, "rank", None)
    return GridPicture(layout, highlight)


# -- pipeline timeline ----------------------------------------------------------------------------

# forward blue, backward orange, weight gradient green; chunk 1, 2, 3 of a rank in other shades
_KIND_COLOUR = {"F": ("#4e79a7", "#a0cbe8", "#2c4f73", "#7fa7d1"),
                "B": ("#f28e2b", "#ffbe7d", "#b5651d", "#f6aa5f"),
                "W": ("#59a14f", "#8cd17d", "#3b6e34", "#b6e3a8")}
_KIND_FILL = {"F": ">", "B": "<", "W": "="}
_KIND_WORD = {"F": "forward", "B": "backward", "W": "weight gradient"}


def _colour(span: Any) -> str:
    shades = _KIND_COLOUR[span.kind]
    return shades[getattr(span, "chunk", 0) % len(shades)]


def _label(span: Any) -> str:
    chunk = getattr(span, "chunk", 0)
    return f"{span.kind}{span.microbatch}" + (f".{chunk}" if chunk else "")


class Timeline(Picture):
    """Forward, backward and weight-gradient boxes per pipeline stage (or rank) over time,
    idle time (the bubble) shaded.

    `str()` draws text: an F box is its label filled with '>' (activations flow to later
    stages), a B box filled with '<' (gradients flow back), a W box with '=' (nothing flows),
    idle time is '.'; "F3.1" is micro-batch 3 through the rank's chunk 1. A notebook shows SVG
    with the idle time hatched and each chunk in its own shade. Spans are (kind, microbatch,
    start, end[, chunk]) in `unit`.
    """

    def __init__(self, rows: Sequence[tuple[str, Sequence[Any]]], *, unit: str,
                 title: str = "", width: int | None = None):
        self.rows = [(label, list(spans)) for label, spans in rows]
        self.unit = unit
        self.title = title
        self.end = max(s.end for _, spans in self.rows for s in spans)
        self.idle = measured_bubble([spans for _, spans in self.rows]).per_stage
        labels = max(len(_label(s)) for _, spans in self.rows for s in spans)
        # a schedule's integer steps get whole characters each; measured times get a fixed width
        per_step = labels + 1 if unit == "time steps" else None
        self.width = width or (int(self.end) * per_step if per_step else 96)

    def __str__(self) -> str:
        scale = self.width / self.end
        label_w = max(len(label) for label, _ in self.rows)
        out = [self.title] if self.title else []
        for (label, spans), idle in zip(self.rows, self.idle, strict=True):
            line = ["."] * self.width
            for s in spans:
                a = min(round(s.start * scale), self.width - 1)
                b = max(round(s.end * scale), a + 1)
                text = _label(s)
                text = (text + _KIND_FILL[s.kind] * (b - a))[:b - a] if b - a >= len(text) \
                    else s.kind * (b - a)
                line[a:b] = list(text)
            out.append(f"{label.ljust(label_w)} |{''.join(line[:self.width])}| "
                       + _("idle {share}").format(share=f"{idle:.0%}"))
        out.append(" " * (label_w + 1) + "0" + f"{self.end:.4g}".rjust(self.width + 1)
                   + f" {_(self.unit)}")
        return "\n".join(out)

    def _repr_svg_(self) -> str:
        label_w, plot_w, right_w, row_h, top = 130, 720, 80, 28, 34
        height = top + len(self.rows) * row_h + 62
        x_of = lambda t: label_w + t / self.end * plot_w  # noqa: E731
        total_w = max(label_w + plot_w + right_w, int(len(self.title) * 6.5) + 8)
        out = [svg_start(total_w, height),
               '<defs><pattern id="dpmp-idle" width="6" height="6" patternUnits="userSpaceOnUse" '
               'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eee"/>'
               '<line x1="0" y1="0" x2="0" y2="6" stroke="#bbb" stroke-width="2"/></pattern>'
               "</defs>",
               f'<text x="4" y="16">{html.escape(self.title)}</text>']
        for i, ((label, spans), idle) in enumerate(zip(self.rows, self.idle, strict=True)):
            y = top + i * row_h
            out.append(f'<text x="4" y="{y + 17}">{html.escape(label)}</text>')
            out.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{row_h - 4}" '
                       'fill="url(#dpmp-idle)"/>')
            for s in spans:
                x, w = x_of(s.start), max(x_of(s.end) - x_of(s.start), 0.5)
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 4}" '
                           f'fill="{_colour(s)}" stroke="white" stroke-width="0.5">'
                           f"<title>{_label(s)}: {s.start:g}-{s.end:g} "
                           f"{html.escape(_(self.unit))}</title></rect>")
                if w >= 6 * len(_label(s)):
                    out.append(f'<text x="{x + w / 2:.1f}" y="{y + 16}" text-anchor="middle" '
                               f'fill="white">{_label(s)}</text>')
            share = html.escape(_("idle {share}").format(share=f"{idle:.0%}"))
            out.append(f'<text x="{label_w + plot_w + 6}" y="{y + 17}">{share}</text>')
        y = top + len(self.rows) * row_h + 14
        for k in range(6):
            t = self.end * k / 5
            out.append(f'<text x="{x_of(t):.1f}" y="{y}" text-anchor="middle">{t:.3g}</text>')
        out.append(f'<text x="{label_w + plot_w / 2}" y="{y + 16}" text-anchor="middle">'
                   f"{html.escape(_('time ({unit})').format(unit=_(self.unit)))}</text>")
        legend_y = y + 34
        spans = [s for _, row in self.rows for s in row]
        kinds = [k for k in _KIND_COLOUR if any(s.kind == k for s in spans)]
        x = label_w
        for k in kinds:
            out.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" '
                       f'fill="{_KIND_COLOUR[k][0]}"/><text x="{x + 16}" y="{legend_y}">'
                       f"{_KIND_WORD[k]}</text>")
            x += 40 + 7 * len(_KIND_WORD[k])
        out.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" '
                   f'fill="url(#dpmp-idle)"/><text x="{x + 16}" y="{legend_y}">'
                   "idle (bubble)</text>")
        if any(getattr(s, "chunk", 0) for s in spans):
            out.append(f'<text x="{x + 120}" y="{legend_y}">lighter/darker: chunk 1, 2, ... '
                       "(F3.1 = micro-batch 3 through chunk 1)</text>")
        out.append("</svg>")
        return "".join(out)


def timeline(schedule_or_run: Any, *, width: int | None = None) -> Timeline:
    """Draw a pipeline step: `dl.viz.timeline(pp.one_f_one_b(4, 8))` (simulated time steps),
    or `dl.viz.timeline(res)` for a launch whose ranks returned pp.run_schedule's
    PipelineResult (measured, in ms from the first action). `width`: text columns of the time
    axis.
    """
    if isinstance(schedule_or_run, Schedule):
        s = schedule_or_run
        rows = [(s.row_label(i), spans) for i, spans in enumerate(s.spans)]
        return Timeline(rows, unit=N_("time steps"), title=s.describe(), width=width)
    results = list(getattr(schedule_or_run, "values", schedule_or_run))
    if not results or not all(isinstance(r, PipelineResult) for r in results):
        raise TypeError(_("dl.viz.timeline draws a pp.Schedule, or the PipelineResults of a "
                          "run (a launch whose ranks return pp.run_schedule(...), or a list of "
                          "them)"))
    results.sort(key=lambda r: (r.index, r.rank))
    t0 = min(s.start for r in results for s in r.spans)
    rows = [(f"stage {r.index} (rank {r.rank})",
             [s._replace(start=(s.start - t0) * 1e3, end=(s.end - t0) * 1e3) for s in r.spans])
            for r in results]
    bubble = measured_bubble(results).overall
    title = (f"{results[0].schedule}, measured: p={results[0].n_ranks} stages, "
             f"m={1 + max(s.microbatch for s in results[0].spans)} micro-batches; "
             f"bubble {bubble:.1%}")
    return Timeline(rows, unit=N_("ms"), title=title, width=width)
