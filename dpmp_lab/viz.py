"""Pictures and tables that render in a notebook (HTML/SVG) and as plain text everywhere else.

Nothing here needs matplotlib or a running process group, so a learner can draw a layout in
the notebook kernel before launching anything, and grader messages stay readable in a terminal.

    dl.viz.grid(dp=2, tp=2, pp=2)     # which ranks share which group
    dl.viz.comm(res.traces)           # collectives per op, group and phase, one column per rank
    dl.viz.comm_chart(res)            # bytes per rank and group, as bars
    dl.viz.timeline(pp.one_f_one_b(4, 8))   # a pipeline schedule or a measured run
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


class Table:
    """A small table: `str()` gives aligned text, a notebook shows HTML."""

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "",
                 marks: Sequence[bool] | None = None, note: str = ""):
        self.columns = list(columns)
        self.rows = [[_cell(v) for v in row] for row in rows]
        self.title = title
        self.marks = list(marks) if marks is not None else [False] * len(self.rows)
        self.note = note

    def __str__(self) -> str:
        cells = [self.columns] + self.rows
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        numeric = [all(_is_number(r[i]) for r in self.rows) and self.rows for i in
                   range(len(self.columns))]

        def line(row: list[str], mark: str = "") -> str:
            parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(row, widths, numeric, strict=True)]
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


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return "(" + ",".join(str(v) for v in value) + ")"
    return str(value)


def _is_number(text: str) -> bool:
    return text.replace(".", "", 1).replace(" ", "").lstrip("-").isdigit() or text == "-"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': sizes the way the articles quote them (4 MiB of gradients)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# -- communication ------------------------------------------------------------------------------


def comm(traces: Sequence[Any] | Any, *, bytes: bool = False) -> Table:
    """Collectives per (op, group, phase), one column per rank: what each rank issued.

    `traces`: the result of `dl.launch(..., trace=True)`, its `.traces`, or one Trace.
    With bytes=True the cells show the bytes instead of the counts.
    """
    from dpmp_lab.trace import traces_of

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
    ranks = [f"rank {t.rank}" if t.rank is not None else f"trace {i}"
             for i, t in enumerate(traces)]
    what = "payload bytes" if bytes else "calls"
    return Table(["op", "group", "phase", *ranks], rows, title=f"communication ({what})")


class CommChart:
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

    __repr__ = __str__

    def _repr_svg_(self) -> str:
        label_w, bar_w, row_h = 190, 380, 20
        groups = sorted({g for _, g, _ in self.rows})
        colour = {g: _PALETTE[i % len(_PALETTE)] for i, g in enumerate(groups)}
        height = 24 + row_h * len(self.rows)
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 90}" '
               f'height="{height}" font-family="sans-serif" font-size="12">',
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
    from dpmp_lab.trace import traces_of

    rows = []
    for i, t in enumerate(traces_of(traces)):
        per_group: dict[str, int] = {}
        for ev in t.events:
            key = _cell(ev.group_label)
            per_group[key] = per_group.get(key, 0) + ev.nbytes
        rank = f"rank {t.rank}" if t.rank is not None else f"trace {i}"
        rows += [(rank, g, b) for g, b in per_group.items()]
    return CommChart(rows)


# -- process grid ---------------------------------------------------------------------------------

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7"]


class GridPicture:
    """Ranks laid out as the articles draw them: a row is a DP group, a column a TP group.

    With pp > 1 there is one panel per pipeline stage; the same cell in every panel is a
    pipeline (pp) group. `str()` gives the text version, a notebook shows SVG.
    """

    def __init__(self, layout: Any, highlight: int | None = None):
        self.layout = layout
        self.highlight = highlight

    def __str__(self) -> str:
        L = self.layout
        lines = [L.describe_sizes()]
        width = max(4, len(str(L.world_size - 1)) + 1)
        for pp in range(L.pp):
            if L.pp > 1:
                lines.append(f"pipeline stage pp={pp}:")
            header = " " * 8 + "".join(f"dp={d}".rjust(width + 3) for d in range(L.dp))
            lines.append(header)
            for tp in range(L.tp):
                cells = []
                for dp in range(L.dp):
                    r = L.rank_of(pp=pp, dp=dp, tp=tp)
                    text = f"[{r}]" if r == self.highlight else str(r)
                    cells.append(text.rjust(width + 3))
                lines.append(f"  tp={tp}".ljust(8) + "".join(cells))
        lines.append("a row is a data-parallel (dp) group: same model shard, different data")
        lines.append("a column is a tensor-parallel (tp) group: one model split across ranks")
        if L.pp > 1:
            lines.append("the same place in every stage is a pipeline (pp) group")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_svg_(self) -> str:
        L = self.layout
        cell, gap, margin, top = 46, 6, 50, 40
        panel_w = margin + L.dp * (cell + gap) + 20
        width = max(panel_w * L.pp, 260)
        height = top + L.tp * (cell + gap) + 70
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               'font-family="sans-serif" font-size="12">']
        for pp in range(L.pp):
            x0 = pp * panel_w
            if L.pp > 1:
                out.append(f'<text x="{x0 + margin}" y="16">stage pp={pp}</text>')
            for dp in range(L.dp):
                x = x0 + margin + dp * (cell + gap)
                out.append(f'<text x="{x + 8}" y="{top - 6}">dp={dp}</text>')
            for tp in range(L.tp):
                y = top + tp * (cell + gap)
                out.append(f'<text x="{x0 + 4}" y="{y + cell // 2 + 4}">tp={tp}</text>')
                for dp in range(L.dp):
                    x = x0 + margin + dp * (cell + gap)
                    r = L.rank_of(pp=pp, dp=dp, tp=tp)
                    colour = _PALETTE[tp % len(_PALETTE)]
                    stroke = 'stroke="black" stroke-width="3"' if r == self.highlight else ""
                    out.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" rx="6" '
                               f'fill="{colour}" fill-opacity="0.35" {stroke}/>')
                    out.append(f'<text x="{x + cell // 2}" y="{y + cell // 2 + 5}" '
                               f'text-anchor="middle" font-size="15">{r}</text>')
        y = top + L.tp * (cell + gap) + 18
        out.append(f'<text x="4" y="{y}">row (same colour) = dp group: same shard, '
                   "different data</text>")
        out.append(f'<text x="4" y="{y + 16}">column = tp group: one model split across '
                   "ranks</text>")
        if L.pp > 1:
            out.append(f'<text x="4" y="{y + 32}">same place in each stage = pp group</text>')
        out.append("</svg>")
        return "".join(out)

    def save(self, path: str) -> None:
        """Write the SVG picture to `path` (for slides and handouts)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._repr_svg_())


def grid(grid_or_none: Any = None, *, dp: int = 1, tp: int = 1, pp: int = 1,
         highlight: int | None = None) -> GridPicture:
    """Draw a process grid: `dl.viz.grid(dp=2, tp=2)` or `dl.viz.grid(my_grid)`.

    Works in the notebook kernel without launching anything, so you can look at a layout
    before you build it.
    """
    from dpmp_lab.grid import GridLayout

    if grid_or_none is None:
        layout = GridLayout(dp=dp, tp=tp, pp=pp)
    else:
        layout = getattr(grid_or_none, "layout", grid_or_none)
        if not isinstance(layout, GridLayout):
            raise TypeError(f"dl.viz.grid takes a ProcessGrid or GridLayout, not "
                            f"{type(grid_or_none).__name__}")
        if highlight is None:
            highlight = getattr(grid_or_none, "rank", None)
    return GridPicture(layout, highlight)


# -- pipeline timeline ----------------------------------------------------------------------------

_KIND_COLOUR = {"F": "#4e79a7", "B": "#f28e2b"}
_KIND_FILL = {"F": ">", "B": "<"}


class Timeline:
    """Forward and backward boxes per pipeline stage over time, idle time (the bubble) shaded.

    `str()` draws text: an F box is its label filled with '>' (activations flow to later
    stages), a B box filled with '<' (gradients flow back), idle time is '.'. A notebook shows
    SVG with the idle time hatched. Spans are (kind, microbatch, start, end) in `unit`.
    """

    def __init__(self, rows: Sequence[tuple[str, Sequence[Any]]], *, unit: str,
                 title: str = "", width: int | None = None):
        from dpmp_lab.pp import measured_bubble

        self.rows = [(label, list(spans)) for label, spans in rows]
        self.unit = unit
        self.title = title
        self.end = max(s.end for _, spans in self.rows for s in spans)
        self.idle = measured_bubble([spans for _, spans in self.rows]).per_stage
        labels = max(len(f"{s.kind}{s.microbatch}") for _, spans in self.rows for s in spans)
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
                text = f"{s.kind}{s.microbatch}"
                text = (text + _KIND_FILL[s.kind] * (b - a))[:b - a] if b - a >= len(text) \
                    else s.kind * (b - a)
                line[a:b] = list(text)
            out.append(f"{label.ljust(label_w)} |{''.join(line[:self.width])}| "
                       f"idle {idle:.0%}")
        out.append(" " * (label_w + 1) + "0" + f"{self.end:.4g}".rjust(self.width + 1)
                   + f" {self.unit}")
        return "\n".join(out)

    __repr__ = __str__

    def _repr_svg_(self) -> str:
        label_w, plot_w, right_w, row_h, top = 130, 720, 80, 28, 34
        height = top + len(self.rows) * row_h + 62
        x_of = lambda t: label_w + t / self.end * plot_w  # noqa: E731
        total_w = max(label_w + plot_w + right_w, int(len(self.title) * 6.5) + 8)
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" '
               f'height="{height}" font-family="sans-serif" font-size="12">',
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
                           f'fill="{_KIND_COLOUR[s.kind]}" stroke="white" stroke-width="0.5">'
                           f"<title>{s.kind}{s.microbatch}: {s.start:g}-{s.end:g} "
                           f"{self.unit}</title></rect>")
                if w >= 18:
                    out.append(f'<text x="{x + w / 2:.1f}" y="{y + 16}" text-anchor="middle" '
                               f'fill="white">{s.kind}{s.microbatch}</text>')
            out.append(f'<text x="{label_w + plot_w + 6}" y="{y + 17}">idle {idle:.0%}</text>')
        y = top + len(self.rows) * row_h + 14
        for k in range(6):
            t = self.end * k / 5
            out.append(f'<text x="{x_of(t):.1f}" y="{y}" text-anchor="middle">{t:.3g}</text>')
        out.append(f'<text x="{label_w + plot_w / 2}" y="{y + 16}" text-anchor="middle">'
                   f"time ({html.escape(self.unit)})</text>")
        legend_y = y + 34
        out.append(f'<rect x="{label_w}" y="{legend_y - 10}" width="12" height="12" '
                   f'fill="{_KIND_COLOUR["F"]}"/><text x="{label_w + 16}" y="{legend_y}">'
                   "forward</text>")
        out.append(f'<rect x="{label_w + 90}" y="{legend_y - 10}" width="12" height="12" '
                   f'fill="{_KIND_COLOUR["B"]}"/><text x="{label_w + 106}" y="{legend_y}">'
                   "backward</text>")
        out.append(f'<rect x="{label_w + 190}" y="{legend_y - 10}" width="12" height="12" '
                   f'fill="url(#dpmp-idle)"/><text x="{label_w + 206}" y="{legend_y}">'
                   "idle (bubble)</text>")
        out.append("</svg>")
        return "".join(out)

    def save(self, path: str) -> None:
        """Write the SVG picture to `path`."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._repr_svg_())


def timeline(schedule_or_run: Any, *, width: int | None = None) -> Timeline:
    """Draw a pipeline step: `dl.viz.timeline(pp.one_f_one_b(4, 8))` (simulated time steps),
    or `dl.viz.timeline(res)` for a launch whose ranks returned pp.run_schedule's
    PipelineResult (measured, in ms from the first action). `width`: text columns of the time
    axis.
    """
    from dpmp_lab.pp import PipelineResult, Schedule, measured_bubble

    if isinstance(schedule_or_run, Schedule):
        s = schedule_or_run
        rows = [(f"stage {i}", spans) for i, spans in enumerate(s.spans)]
        return Timeline(rows, unit="time steps", title=s.describe(), width=width)
    results = list(getattr(schedule_or_run, "values", schedule_or_run))
    if not results or not all(isinstance(r, PipelineResult) for r in results):
        raise TypeError("dl.viz.timeline draws a pp.Schedule, or the PipelineResults of a run "
                        "(a launch whose ranks return pp.run_schedule(...), or a list of them)")
    results.sort(key=lambda r: (r.stage, r.rank))
    t0 = min(s.start for r in results for s in r.spans)
    rows = [(f"stage {r.stage} (rank {r.rank})",
             [s._replace(start=(s.start - t0) * 1e3, end=(s.end - t0) * 1e3) for s in r.spans])
            for r in results]
    bubble = measured_bubble(results).overall
    title = (f"{results[0].schedule}, measured: p={results[0].n_stages} stages, "
             f"m={len(results[0].spans) // 2} micro-batches; bubble {bubble:.1%}")
    return Timeline(rows, unit="ms", title=title, width=width)


# -- collectives ----------------------------------------------------------------------------------

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
               "gather", "scatter", "send_recv")
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_COLLECTIVE_ALIASES = {"send/recv": "send_recv", "send": "send_recv", "recv": "send_recv",
                       "p2p": "send_recv"}
_MAX_DRAWN_RANKS = 16


class _Box:
    """One buffer: the sum of `pieces` (rank, chunk), chunk None meaning the whole tensor.

    kind "empty" is a buffer whose old contents do not matter (it is about to be written);
    "scratch" is a buffer the operation may have overwritten with something you must not use.
    """

    def __init__(self, pieces: Sequence[tuple[int, int | None]] = (), kind: str = "data"):
        self.pieces = tuple(pieces)
        self.kind = kind

    @property
    def label(self) -> str:
        if self.kind == "empty":
            return "-"
        if self.kind == "scratch":
            return "?"
        names = [f"x{r}" if c is None else f"x{r}[{c}]" for r, c in self.pieces]
        if len(names) > 4:
            names = [names[0], "...", names[-1]]
        return "+".join(names)

    @property
    def ranks(self) -> list[int]:
        return [r for r, _ in self.pieces]


def _states(op: str, n: int, root: int) -> tuple[list[list[_Box]], list[list[_Box]], str, str]:
    """(before, after, what happens, where training uses it) for `op` on n ranks."""
    def whole(r: int) -> _Box:
        return _Box([(r, None)])

    def chunks(r: int) -> list[_Box]:
        return [_Box([(r, c)]) for c in range(n)]

    empty, scratch, ranks = _Box(kind="empty"), _Box(kind="scratch"), range(n)
    total = _Box([(r, None) for r in ranks])
    if op == "broadcast":
        return ([[whole(r)] if r == root else [empty] for r in ranks],
                [[whole(root)] for _ in ranks],
                f"rank {root} sends its tensor to every rank",
                "Data parallel starts with one: every replica takes rank 0's initial weights.")
    if op == "reduce":
        return ([[whole(r)] for r in ranks],
                [[total] if r == root else [scratch] for r in ranks],
                f"the sum of every rank's tensor arrives at rank {root} only",
                "The other ranks' tensors may now hold partial sums (gloo leaves them "
                "there): never read them.")
    if op == "all_reduce":
        return ([[whole(r)] for r in ranks], [[total] for _ in ranks],
                "every rank ends with the sum of every rank's tensor",
                "Data parallel's gradient sync. A ring does it as reduce_scatter + all_gather: "
                f"each rank sends 2(n-1)/n = {2 * (n - 1) / n:.2f} x the tensor.")
    if op == "all_gather":
        return ([[whole(r)] for r in ranks], [[whole(s) for s in ranks] for _ in ranks],
                "every rank ends with every rank's tensor, concatenated in rank order",
                "Tensor parallel's forward: Y = [Y0 | Y1 | ...] from each rank's block of "
                "columns.")
    if op == "reduce_scatter":
        return ([chunks(r) for r in ranks],
                [[_Box([(s, r) for s in ranks])] for r in ranks],
                "rank r ends with chunk r of the sum",
                "The first half of a ring all_reduce; ZeRO shards gradients with it, sequence "
                "parallelism uses it instead of an all_reduce.")
    if op == "all_to_all":
        return ([chunks(r) for r in ranks],
                [[_Box([(s, r)]) for s in ranks] for r in ranks],
                "rank r sends its chunk c to rank c: the chunks are transposed",
                "Mixture of experts: every rank sends each other rank the tokens for its "
                "experts.")
    if op == "gather":
        return ([[whole(r)] for r in ranks],
                [[whole(s) for s in ranks] if r == root else [whole(r)] for r in ranks],
                f"rank {root} collects every rank's tensor, in rank order",
                "The other ranks keep their tensor and receive nothing.")
    if op == "scatter":
        return ([chunks(r) if r == root else [empty] for r in ranks],
                [[_Box([(root, r)])] for r in ranks],
                f"rank {root} hands chunk r of its tensor to rank r",
                "The other ranks only provide a buffer to receive into.")
    return ([[whole(r)] for r in ranks], [[whole((r - 1) % n)] for r in ranks],
            "every rank sends its tensor to rank r+1 and receives rank r-1's (one ring step)",
            "Point to point: pipeline stages hand activations on this way, and ring "
            "collectives are built from such steps.")


class CollectivePicture:
    """What every rank holds before and after one collective.

    x_r is rank r's tensor and x_r[c] its chunk c (torch.tensor_split into n chunks); a box
    that lists several pieces holds their sum. `str()` gives a table, a notebook shows SVG with
    one colour per rank the data came from. `before` and `after` are the labels, per rank.
    """

    def __init__(self, op: str, n: int, root: int | None):
        self.op, self.n, self.root = op, n, root
        self._before, self._after, self.summary, self.note = _states(op, n, root or 0)

    @property
    def before(self) -> list[list[str]]:
        return [[b.label for b in boxes] for boxes in self._before]

    @property
    def after(self) -> list[list[str]]:
        return [[b.label for b in boxes] for boxes in self._after]

    @property
    def title(self) -> str:
        return f"{self.op} on {self.n} ranks: {self.summary}"

    def expected(self, inputs: Sequence[Any]) -> list[Any]:
        """What each rank's output holds when rank r's tensor is inputs[r]: the picture turned
        into numbers, to hold next to a live run. None where the picture shows scratch."""
        import torch

        if len(inputs) != self.n:
            raise ValueError(f"the picture has {self.n} ranks but got {len(inputs)} inputs")
        flat = [torch.as_tensor(x).flatten() for x in inputs]

        def value(box: _Box) -> Any:
            return sum(flat[r] if c is None else torch.tensor_split(flat[r], self.n)[c]
                       for r, c in box.pieces)

        return [None if any(b.kind != "data" for b in boxes)
                else torch.cat([value(b) for b in boxes]) for boxes in self._after]

    @property
    def legend(self) -> str:
        """What the symbols in this picture mean (only the ones it uses)."""
        boxes = [b for boxes in self._before + self._after for b in boxes]
        parts = ["x_r = rank r's tensor"]
        if any(c is not None for b in boxes for _, c in b.pieces):
            parts.append(f"x_r[c] = its chunk c (torch.tensor_split into {self.n})")
        if any(len(b.pieces) > 1 for b in boxes):
            parts.append("x0+x1 = their sum")
        if any(b.kind == "empty" for b in boxes):
            parts.append("- = a buffer whose old contents do not matter")
        if any(b.kind == "scratch" for b in boxes):
            parts.append("? = scratch, do not read")
        return "; ".join(parts)

    def __str__(self) -> str:
        rows = [[r, " | ".join(b), " | ".join(a)]
                for r, (b, a) in enumerate(zip(self.before, self.after, strict=True))]
        return str(Table(["rank", "before", "after"], rows, title=self.title,
                         note=f"{self.note}\n{self.legend}"))

    __repr__ = __str__

    def _repr_svg_(self) -> str:
        row_h, box_h, top, left, gap = 30, 22, 44, 62, 4

        def width(box: _Box) -> int:
            return max(30, 7 * len(box.label) + 12)

        def span(boxes: list[_Box]) -> int:
            return sum(width(b) + gap for b in boxes)

        before_w = max(span(b) for b in self._before)
        after_x = left + before_w + 56
        total_w = max(after_x + max(span(a) for a in self._after) + 10,
                      int(6.2 * max(len(self.title), len(self.note), len(self.legend))) + 12)
        height = top + self.n * row_h + 46
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{height}" '
               'font-family="sans-serif" font-size="12">',
               '<defs><marker id="dpmp-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
               'markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" '
               'fill="#555"/></marker>']
        gradients = {tuple(b.ranks) for boxes in self._after + self._before for b in boxes
                     if len(set(b.ranks)) > 1}
        for ranks in sorted(gradients):
            stops = []
            for i, r in enumerate(ranks):
                colour = _PALETTE[r % len(_PALETTE)]
                stops.append(f'<stop offset="{i / len(ranks):.3f}" stop-color="{colour}"/>'
                             f'<stop offset="{(i + 1) / len(ranks):.3f}" '
                             f'stop-color="{colour}"/>')
            out.append(f'<linearGradient id="{_gradient_id(ranks)}">{"".join(stops)}'
                       "</linearGradient>")
        out.append("</defs>")
        out.append(f'<text x="4" y="16">{html.escape(self.title)}</text>')
        out.append(f'<text x="{left}" y="{top - 8}" fill="#555">before</text>')
        out.append(f'<text x="{after_x}" y="{top - 8}" fill="#555">after</text>')
        for r in range(self.n):
            y = top + r * row_h
            out.append(f'<text x="4" y="{y + 15}">rank {r}</text>')
            out += _draw_boxes(self._before[r], left, y, box_h, gap, width)
            mid = y + box_h / 2
            out.append(f'<line x1="{left + before_w + 8}" y1="{mid}" x2="{after_x - 10}" '
                       f'y2="{mid}" stroke="#555" marker-end="url(#dpmp-arrow)"/>')
            out += _draw_boxes(self._after[r], after_x, y, box_h, gap, width)
        y = top + self.n * row_h + 14
        out.append(f'<text x="4" y="{y}">{html.escape(self.note)}</text>')
        out.append(f'<text x="4" y="{y + 18}" fill="#555">{html.escape(self.legend)}</text>')
        out.append("</svg>")
        return "".join(out)

    def save(self, path: str) -> None:
        """Write the SVG picture to `path` (for slides and handouts)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._repr_svg_())


def _gradient_id(ranks: Sequence[int]) -> str:
    # named by content, so pictures sharing a page share identical definitions
    return "dpmp-sum-" + "-".join(str(r) for r in ranks)


def _draw_boxes(boxes: list[_Box], x: float, y: float, h: int, gap: int, width: Any) -> list[str]:
    out = []
    for box in boxes:
        w = width(box)
        if box.kind == "empty":
            style = 'fill="white" stroke="#999" stroke-dasharray="3,2"'
        elif box.kind == "scratch":
            style = 'fill="#eee" stroke="#999"'
        elif len(set(box.ranks)) > 1:
            style = f'fill="url(#{_gradient_id(box.ranks)})" fill-opacity="0.45" stroke="#555"'
        else:
            style = f'fill="{_PALETTE[box.ranks[0] % len(_PALETTE)]}" fill-opacity="0.45" ' \
                    'stroke="#555"'
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4" {style}/>')
        out.append(f'<text x="{x + w / 2}" y="{y + h / 2 + 4}" text-anchor="middle">'
                   f"{html.escape(box.label)}</text>")
        x += w + gap
    return out


def collective(op: str, n: int = 4, *, root: int | None = None) -> CollectivePicture:
    """Draw what each of n ranks holds before and after a collective:
    `dl.viz.collective("all_reduce")`, `dl.viz.collective("broadcast", root=2)`.

    op: one of COLLECTIVES (broadcast, reduce, all_reduce, all_gather, reduce_scatter,
    all_to_all, gather, scatter, send_recv). root: the source or destination rank of
    broadcast, reduce, gather and scatter (default 0).
    """
    if not isinstance(op, str):
        raise TypeError(f"op must be the name of a collective, e.g. 'all_reduce', not "
                        f"{type(op).__name__}")
    name = op.strip().lower().replace("-", "_").replace(" ", "_")
    name = _COLLECTIVE_ALIASES.get(name, name)
    if name not in COLLECTIVES:
        squashed = name.replace("_", "")
        guess = [c for c in COLLECTIVES if c.replace("_", "") == squashed]
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise ValueError(f"unknown collective {op!r}{hint}; dl.viz.collective draws: "
                         f"{', '.join(COLLECTIVES)}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n is a number of ranks, not {n!r}")
    if not 1 <= n <= _MAX_DRAWN_RANKS:
        raise ValueError(f"n must be between 1 and {_MAX_DRAWN_RANKS} ranks to draw, not {n}")
    if name == "send_recv" and n < 2:
        raise ValueError("send_recv needs at least 2 ranks: one to send, one to receive")
    if root is not None:
        if name not in _ROOTED:
            raise ValueError(f"{name} has no root: every rank plays the same part (only "
                             f"{', '.join(_ROOTED)} take root=)")
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < n:
            raise ValueError(f"root must be a rank between 0 and {n - 1}, not {root!r}")
    elif name in _ROOTED:
        root = 0
    return CollectivePicture(name, n, root)
