"""The grading server's own paths, masked in what a learner is sent back.

A traceback in feedback names every file it passed through: this checkout, the virtual
environment, the Python installation, the grader's scratch course. They tell a learner nothing
they need (the frame's file and line stay: `dpmp_lab/check/numbers.py`,
`<site-packages>/torch/...`) and tell anyone reading the page how the server is laid out. The
autograded notebook the instructor reads keeps them.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterable

from dpmp_lab._helpers import PACKAGE_DIR, PACKAGE_HOME


def server_paths(extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """(absolute folder, what it is shown as), longest first, so that the most precise name
    wins: the package, site-packages, the standard library, the environment, the checkout, and
    `extra` (the grader's scratch course, say). Each also as IPython writes it, `~/...`."""
    places = [(str(PACKAGE_DIR), "dpmp_lab")]
    places += [(p, "<site-packages>") for p in [*site.getsitepackages(),
                                                site.getusersitepackages(),
                                                sysconfig.get_paths()["purelib"],
                                                sysconfig.get_paths()["platlib"]]]
    places += [(sysconfig.get_paths()[k], "<python>") for k in ("stdlib", "platstdlib")]
    places += [(p, "<python>") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    places += [(str(PACKAGE_HOME), "<course>"), *extra]
    home = os.path.expanduser("~")
    seen: dict[str, str] = {}
    for path, label in places:
        path = os.path.normpath(path)
        if path in ("", "/", home) or path in seen:
            continue
        seen[path] = label
        if home != "/" and path.startswith(home + os.sep):
            seen.setdefault("~" + path[len(home):], label)
    return sorted(seen.items(), key=lambda p: -len(p[0]))


def mask_paths(text: str, places: list[tuple[str, str]]) -> str:
    """`text` with each folder of `places` (server_paths) replaced by its name, where it
    stands as a whole folder (`/srv/venv2` is not `/srv/venv`)."""
    if not places:
        return text
    pattern = re.compile("|".join(rf"{re.escape(path)}(?![\w.-])" for path, _ in places))
    names = dict(places)
    return pattern.sub(lambda m: names[m.group(0)], text)


__all__ = ["mask_paths", "server_paths"]
