"""Each rank's state under the launching cell: starting, running, done, failed (or stopped).

In JupyterLab it is a row of coloured labels (ipywidgets) that change while the ranks run; where
widgets do not render (nbclient, nbconvert, a text console) the same output carries a line of
text, kept up to date; in a terminal IPython a single line is printed when the launch ends.
Nothing is shown outside IPython, so scripts and tests keep their plain output.
"""

from __future__ import annotations

import sys
from typing import Any

from dpmp_lab._helpers import ipython_shell
from dpmp_lab.i18n.messages import N_, _
from dpmp_lab.launcher.protocol import RankState

# what the learner reads for each state (in the language of the moment: `_(word)`); the English
# word also names the label's colour and its CSS class
_WORDS = {RankState.STARTING: N_("starting"), RankState.RUNNING: N_("running"),
          RankState.RETURNED: N_("done"), RankState.FAILED: N_("failed"),
          RankState.STOPPED: N_("stopped")}
_COLOURS = {"starting": "#bbb", "running": "#4e79a7", "done": "#59a14f", "failed": "#e15759",
            "stopped": "#999"}


class Progress:
    """Shows rank states; call update(states) when one changes and close(states) at the end."""

    def __init__(self, world_size: int, enabled: bool | None = None):
        shell = ipython_shell()
        self.active = shell is not None if enabled is None else enabled and shell is not None
        self.kernel = shell == "kernel"
        self.states = [RankState.STARTING] * world_size
        self.labels: list[Any] = []
        self.box: Any = None
        self.handle: Any = None
        if self.active and self.kernel:
            self._display()

    def _display(self) -> None:
        # only in a kernel, where IPython is loaded; ipywidgets is optional
        from IPython.display import display

        try:
            import ipywidgets as widgets
        except ImportError:
            widgets = None
        if widgets is not None:
            self.labels = [widgets.HTML(self._label(r, s)) for r, s in enumerate(self.states)]
            self.box = widgets.HBox(self.labels)
            self.box.add_class("dpmp-lab-progress")
        self.handle = display(self, display_id=True)

    def _label(self, rank: int, state: str) -> str:
        word = _WORDS.get(state, state)
        return (f'<span class="dpmp-rank dpmp-rank-{word}" style="background:{_COLOURS[word]};'
                'color:white;border-radius:4px;padding:1px 6px;margin-right:4px;'
                'font-family:monospace">' + _("rank {rank}: {state}").format(
                    rank=rank, state=_(word)) + '</span>')

    def text(self) -> str:
        return _("ranks: {states}").format(states=", ".join(
            f"{r} {_(_WORDS.get(s, s))}" for r, s in enumerate(self.states)))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        bundle = {"text/plain": self.text()}
        if self.box is not None:
            try:
                bundle.update(self.box._repr_mimebundle_() or {})
            except Exception:  # a widget problem must not break the learner's cell: text only
                self.box = None
            bundle["text/plain"] = self.text()
        if self.box is None:
            bundle["text/html"] = '<div class="dpmp-lab-progress">' + "".join(
                self._label(r, s) for r, s in enumerate(self.states)) + "</div>"
        return bundle

    def update(self, states: list[RankState]) -> None:
        if not self.active or states == self.states:
            return
        self.states = list(states)
        for label, (r, s) in zip(self.labels, enumerate(self.states), strict=False):
            label.value = self._label(r, s)
        if self.handle is not None:
            self.handle.update(self)

    def close(self, states: list[RankState]) -> None:
        if not self.active:
            return
        self.update(states)
        if not self.kernel:
            print(f"[dpmp_lab] {self.text()}", file=sys.stderr)

    def __repr__(self) -> str:
        return self.text()
