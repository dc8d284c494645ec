"""The library's own words in the learner's language: what dl.check, the launcher and dl.viz
say inside a failure or a table.

`_("...")` marks a message (a `str.format` template where it has fields, filled after the
lookup) and returns it in the language DPMP_LAB_LANG names, from that language's catalogue
`library.po`; English where the variable names English or no language this package knows, and
where the catalogue lacks the message. `N_("...")` marks a message kept in a constant, looked
up with `_()` where it is used, so that the language is the one of that moment.

Who sets the language: the grader, for both kernels of a notebook released in another language
(two_kernels.py, from the notebook's metadata); `dpmp-lab lab`, for the kernels of a course in
another language; anyone, with `os.environ["DPMP_LAB_LANG"] = "ja"`. Ranks inherit it.
`dpmp-lab translations update` collects the marked messages into the catalogue.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import polib

SOURCE = "en"
LANGUAGES = ("en", "ja")
LANGUAGE_ENV = "DPMP_LAB_LANG"
DOMAIN = "library"
MARKERS = ("_", "N_")


def language() -> str:
    """The language the library speaks now."""
    chosen = os.environ.get(LANGUAGE_ENV, SOURCE).strip()
    return chosen if chosen in LANGUAGES else SOURCE


def _(message: str) -> str:
    """`message` in the language of the moment (English where it has no translation)."""
    chosen = language()
    if chosen == SOURCE:
        return message
    path = _HERE / chosen / f"{DOMAIN}.po"
    stamp = path.stat().st_mtime_ns if path.exists() else 0
    return _table(path, stamp).get(message, message)


def N_(message: str) -> str:   # noqa: N802 - gettext's name for a message marked, not looked up
    """`message` as it is: marks it for the catalogue; `_()` translates it where it is used."""
    return message


_HERE = Path(__file__).resolve().parent   # the catalogues: <language>/<domain>.po


@functools.lru_cache(maxsize=8)
def _table(path: Path, stamp: int) -> dict[str, str]:
    if not path.exists():
        return {}
    return {e.msgid: e.msgstr for e in polib.pofile(str(path), wrapwidth=0)
            if e.msgstr and not e.obsolete and "fuzzy" not in e.flags}


def marked(package: Path) -> dict[str, list[str]]:
    """{message: [where]} of every `_("...")` and `N_("...")` in the package's modules. `N_`
    around anything but one string literal is an error (the catalogue could not hold it); `_`
    of a name looks up what an `N_` marked."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in MARKERS):
                continue
            literal = (len(node.args) == 1 and not node.keywords
                       and isinstance(node.args[0], ast.Constant)
                       and isinstance(node.args[0].value, str))
            if not literal and node.func.id == "_" and len(node.args) == 1:
                continue
            if not literal:
                raise ValueError(f"{where}:{node.lineno}: {node.func.id}() takes one string "
                                 "literal (fields are filled after the lookup, with .format)")
            found.setdefault(node.args[0].value, []).append(f"{where}:{node.lineno}")
    return found


__all__ = ["DOMAIN", "LANGUAGES", "LANGUAGE_ENV", "MARKERS", "N_", "SOURCE", "_", "language",
           "marked"]
