"""What every rank holds before and after one collective, drawn for any number of ranks:
`dl.viz.collective("all_reduce")`, `dl.viz.collective("broadcast", root=2)`.

A picture is a table of symbols per rank (x_r is rank r's tensor, x_r[c] its chunk c, x0+x1 a
sum) that `CollectivePicture.expected` also turns into numbers, so a notebook can hold the
picture next to what torch's collective really returned.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import torch

from dpmp_lab.i18n.messages import _
from dpmp_lab.render import PALETTE, Picture, Table, svg_start

__all__ = ["COLLECTIVES", "CollectivePicture", "collective"]

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


class CollectivePicture(Picture):
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
        if len(inputs) != self.n:
            raise ValueError(_("the picture has {n} ranks but got {inputs} inputs").format(
                n=self.n, inputs=len(inputs)))
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
        parts = [_("x_r = rank r's tensor")]
        if any(c is not None for b in boxes for _p, c in b.pieces):
            parts.append(_("x_r[c] = its chunk c (torch.tensor_split into {n})").format(n=self.n))
        if any(len(b.pieces) > 1 for b in boxes):
            parts.append(_("x0+x1 = their sum"))
        if any(b.kind == "empty" for b in boxes):
            parts.append(_("- = a buffer whose old contents do not matter"))
        if any(b.kind == "scratch" for b in boxes):
            parts.append(_("? = scratch, do not read"))
        return "; ".join(parts)

    def __str__(self) -> str:
        rows = [[r, " | ".join(b), " | ".join(a)]
                for r, (b, a) in enumerate(zip(self.before, self.after, strict=True))]
        return str(Table([_("rank"), _("before"), _("after")], rows, title=self.title,
                         note=f"{self.note}\n{self.legend}"))

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
        out = [svg_start(total_w, height),
               '<defs><marker id="dpmp-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
               'markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" '
               'fill="#555"/></marker>']
        gradients = {tuple(b.ranks) for boxes in self._after + self._before for b in boxes
                     if len(set(b.ranks)) > 1}
        for ranks in sorted(gradients):
            stops = []
            for i, r in enumerate(ranks):
                colour = PALETTE[r % len(PALETTE)]
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
            style = f'fill="{PALETTE[box.ranks[0] % len(PALETTE)]}" fill-opacity="0.45" ' \
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
        raise TypeError(_("op must be the name of a collective, e.g. 'all_reduce', not "
                          "{kind}").format(kind=type(op).__name__))
    name = op.strip().lower().replace("-", "_").replace(" ", "_")
    name = _COLLECTIVE_ALIASES.get(name, name)
    if name not in COLLECTIVES:
        squashed = name.replace("_", "")
        guess = [c for c in COLLECTIVES if c.replace("_", "") == squashed]
        hint = _(" (did you mean {known!r}?)").format(known=guess[0]) if guess else ""
        raise ValueError(_("unknown collective {op!r}{hint}; dl.viz.collective draws: "
                           "{names}").format(op=op, hint=hint, names=", ".join(COLLECTIVES)))
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(_("n is a number of ranks, not {n!r}").format(n=n))
    if not 1 <= n <= _MAX_DRAWN_RANKS:
        raise ValueError(_("n must be between 1 and {most} ranks to draw, not {n}").format(
            most=_MAX_DRAWN_RANKS, n=n))
    if name == "send_recv" and n < 2:
        raise ValueError(_("send_recv needs at least 2 ranks: one to send, one to receive"))
    if root is not None:
        if name not in _ROOTED:
            raise ValueError(_("{name} has no root: every rank plays the same part (only "
                               "{rooted} take root=)").format(
                name=name, rooted=", ".join(_ROOTED)))
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < n:
            raise ValueError(_("root must be a rank between 0 and {last}, not {root!r}").format(
                last=n - 1, root=root))
    elif name in _ROOTED:
        root = 0
    return CollectivePicture(name, n, root)
