"""A profiled step drawn per rank: compute on one lane, communication on the lane under it.

    _, prof = dl.bench.profile(step)          # inside each rank
    dl.viz.profile(res)                       # in the notebook: res.values are the Profiles

Overlap is seen where a communication box sits under backward compute: the collective was
issued while gradients were still being computed. Re-exported by dpmp_lab.viz.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from dpmp_lab.i18n.messages import _
from dpmp_lab.profiling import Interval, Profile
from dpmp_lab.render import Picture, svg_start

__all__ = ["ProfilePicture", "profile"]

_COLOUR = {"forward": "#4e79a7", "backward": "#f28e2b", "other": "#9c9c9c", "comm": "#59a14f"}
_CHAR = {"forward": "F", "backward": "B", "other": "o", "comm": "="}


class ProfilePicture(Picture):
    """Per rank two lanes over time (ms): compute (F forward, B backward, o other) and comm
    (= a collective from its issue to the end of its execution, | where it was issued)."""

    def __init__(self, profiles: Sequence[Profile], *, title: str = "", width: int = 96):
        if not profiles:
            raise ValueError(_("dl.viz.profile needs at least one Profile"))
        self.profiles = sorted(profiles, key=lambda p: p.rank)
        self.end = max(max(p.wall, 1e-9) for p in self.profiles)
        self.title = title   # "" for ours, in the reader's language
        self.width = width

    def _lane_text(self, intervals: Sequence[Interval], issues: Sequence[float] = ()) -> str:
        line = ["."] * self.width
        scale = self.width / self.end
        for iv in intervals:
            a = min(int(iv.start * scale), self.width - 1)
            b = max(int(iv.end * scale), a + 1)
            line[a:b] = _CHAR[iv.kind] * (b - a)
        for t in issues:
            line[min(int(t * scale), self.width - 1)] = "|"
        return "".join(line[:self.width])

    def _title(self) -> str:
        return self.title or _("profiled step per rank")

    @staticmethod
    def _lanes(p: Profile) -> tuple[str, str]:
        return (_("rank {rank} compute").format(rank=p.rank),
                _("rank {rank} comm").format(rank=p.rank))

    @staticmethod
    def _verdict(p: Profile) -> str:
        return _("{verdict}, exposed comm {share}").format(
            verdict=_("overlapped") if p.overlapped() else _("no overlap"),
            share=f"{p.comm_share():.0%}")

    def __str__(self) -> str:
        out = [self._title()]
        pad = max(len(label) for p in self.profiles for label in self._lanes(p)) + 1
        for p in self.profiles:
            compute, comm = self._lanes(p)
            out.append(f"{compute.ljust(pad)}|{self._lane_text(p.compute)}|")
            out.append(f"{comm.ljust(pad)}|{self._lane_text(p.comm, p.issues)}| "
                       f"{self._verdict(p)}")
        out.append(" " * pad + "0" + f"{self.end:.3g}".rjust(self.width + 1) + " " + _("ms"))
        out.append(_("F forward  B backward  o other compute  = communication  | issued"))
        return "\n".join(out)

    def _repr_svg_(self) -> str:
        label_w, plot_w, right_w, lane_h, top = 110, 720, 190, 18, 34
        rows = len(self.profiles)
        height = top + rows * (2 * lane_h + 12) + 50
        x_of = lambda t: label_w + t / self.end * plot_w  # noqa: E731
        out = [svg_start(label_w + plot_w + right_w, height),
               f'<text x="4" y="16">{html.escape(self._title())}</text>']
        for i, p in enumerate(self.profiles):
            y = top + i * (2 * lane_h + 12)
            compute, comm = (html.escape(label) for label in self._lanes(p))
            out.append(f'<text x="4" y="{y + 13}">{compute}</text>'
                       f'<text x="4" y="{y + lane_h + 13}">{comm}</text>')
            out.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{2 * lane_h}" '
                       'fill="#f4f4f4"/>')
            for lane, intervals in ((0, p.compute), (1, p.comm)):
                for iv in intervals:
                    x, w = x_of(iv.start), max(x_of(iv.end) - x_of(iv.start), 0.5)
                    out.append(f'<rect x="{x:.1f}" y="{y + lane * lane_h + 1}" width="{w:.1f}" '
                               f'height="{lane_h - 2}" fill="{_COLOUR[iv.kind]}" '
                               f'fill-opacity="0.85"><title>{html.escape(iv.name)} '
                               f"({iv.kind}): {iv.start:.3f}-{iv.end:.3f} ms</title></rect>")
            for t in p.issues:
                out.append(f'<line x1="{x_of(t):.1f}" x2="{x_of(t):.1f}" y1="{y + lane_h}" '
                           f'y2="{y + 2 * lane_h}" stroke="black" stroke-width="1"/>')
            out.append(f'<text x="{label_w + plot_w + 6}" y="{y + lane_h + 4}">'
                       f"{html.escape(self._verdict(p))}</text>")
        y = top + rows * (2 * lane_h + 12) + 4
        for k in range(6):
            t = self.end * k / 5
            out.append(f'<text x="{x_of(t):.1f}" y="{y + 10}" text-anchor="middle">{t:.3g}'
                       "</text>")
        x = label_w
        for kind, label in (("forward", _("forward")), ("backward", _("backward")),
                            ("other", _("other compute")),
                            ("comm", _("collective, issue to end"))):
            out.append(f'<rect x="{x}" y="{y + 22}" width="12" height="12" '
                       f'fill="{_COLOUR[kind]}"/><text x="{x + 16}" y="{y + 32}">'
                       f"{html.escape(label)}</text>")
            x += 40 + sum(13 if ord(c) > 0x2E80 else 7 for c in label)   # CJK is wider
        out.append(f'<text x="{x}" y="{y + 32}">'
                   f'{html.escape(_("time (ms); a black tick: issued"))}</text></svg>')
        return "".join(out)


def profile(profiles: Any, *, title: str = "", width: int = 96) -> ProfilePicture:
    """Draw Profiles: a launch's result whose ranks returned a Profile (or a tuple holding
    one, as dl.bench.profile returns), or a list of Profiles."""
    values = list(getattr(profiles, "values", None) or
                  (profiles if isinstance(profiles, (list, tuple)) else [profiles]))
    found = []
    for v in values:
        if isinstance(v, Profile):
            found.append(v)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, Profile) for x in v):
            found.extend(x for x in v if isinstance(x, Profile))
        else:
            raise TypeError(_("dl.viz.profile draws dl.bench.Profile objects (what "
                              "dl.bench.profile returns in each rank), not {kind}").format(
                kind=type(v).__name__))
    return ProfilePicture(found, title=title, width=width)
