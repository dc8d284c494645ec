"""Small idioms the modules share: argument checks, the wording of rank lists and values in
messages, and where the package sits. Imports nothing from dpmp_lab, nor torch: the instructor's
tools use it in processes that never load torch (the ones that need it: _torch_helpers.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The package's folder, and the folder that holds it (a checkout's root in an editable install):
# the one place that reads a file's position, so that moving a module moves nothing else.
PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE_HOME = PACKAGE_DIR.parent


def whole_number(name: str, value: Any, *, at_least: int = 1, at_most: int | None = None,
                 what: str = "") -> int:
    """`value` as an int from at_least to at_most, or a TypeError/ValueError that names `name`.

    bool is refused although it is an int: `world_size=True` is a mistake, not 1. `what` ends
    the ValueError's sentence ("a pipeline needs at least 1 stage").
    """
    if isinstance(value, bool) or not isinstance(value, int):
        from dpmp_lab.i18n.messages import _  # here: the catalogues' module imports this one
        raise TypeError(_("{name} must be an int, not {kind} ({value!r})").format(
            name=name, kind=type(value).__name__, value=value))
    if value < at_least or (at_most is not None and value > at_most):
        from dpmp_lab.i18n.messages import _  # here: the catalogues' module imports this one
        limits = (_("from {low} to {high}").format(low=at_least, high=at_most)
                  if at_most is not None else _("at least {low}").format(low=at_least))
        raise ValueError(_("{name}={value}: {what}").format(
            name=name, value=value, what=what or _("it must be {limits}").format(limits=limits)))
    return value


def positive_seconds(name: str, value: Any) -> None:
    """None, or a number of seconds > 0."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or value <= 0):
        from dpmp_lab.i18n.messages import _  # here: the catalogues' module imports this one
        raise ValueError(_("{name} must be a positive number of seconds, got {value!r}").format(
            name=name, value=value))


def ranks_text(ranks: Iterable[int]) -> str:
    """'rank 2' or 'ranks 0, 1, 3': the start of a sentence about some ranks (in the library's
    language of the moment)."""
    from dpmp_lab.i18n.messages import _  # here: the catalogues' module imports this one

    ranks = list(ranks)
    if len(ranks) == 1:
        return _("rank {rank}").format(rank=ranks[0])
    return _("ranks {ranks}").format(ranks=", ".join(str(r) for r in ranks))


def short_repr(value: Any, limit: int = 40) -> str:
    """repr(value), cut to `limit` characters with '...'."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def indent(text: str, n: int = 2) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in text.splitlines())


def tail(text: str, lines: int = 15) -> str:
    """The last `lines` lines of text."""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def ipython_shell() -> str | None:
    """'kernel' in a Jupyter kernel, 'terminal' in terminal IPython, else None (a script, a
    rank). Never imports IPython: if nothing imported it, this is no IPython session."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython else None
    shell = get() if get else None
    if shell is None:
        return None
    return "kernel" if getattr(shell, "kernel", None) is not None else "terminal"
