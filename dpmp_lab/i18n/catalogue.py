"""The translations of the course: one gettext catalogue per notebook and language
(`dpmp_lab/i18n/<lang>/<notebook>.po`), and `common.po` for what every notebook shares
(nbgrader's "YOUR CODE HERE"). What only the hidden tests and the model answers say (a
test's message, a recall's explanation, a solution's comments) is no learner's to read: it
goes to the same files under the checkout's
`solutions/i18n/<lang>/` (domain "hidden/<notebook>"), which learners never get and the grader
reads beside the package's.

The English notebooks in solutions/ are the source. `update` brings a catalogue in step with
its notebook: a new piece comes in untranslated, a piece whose English changed comes back
marked fuzzy with the old translation beside it (a translator's tool lists both), and a piece
no longer in the notebook is kept as obsolete. `problems` says what a release in that language
would lack; `translate` writes the notebook in another language.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polib

from dpmp_lab._helpers import PACKAGE_HOME
from dpmp_lab.i18n.messages import DOMAIN, LANGUAGES, SOURCE, marked
from dpmp_lab.i18n.units import Piece, fields, hint_tags, pieces
from dpmp_lab.i18n.writing import differs, put_back

HERE = Path(__file__).resolve().parent
HIDDEN = "hidden/"        # a domain's prefix: under solutions/i18n, the grader's side only
HIDDEN_HOME = PACKAGE_HOME / "solutions" / "i18n"
COMMON = "common"
NAMES = {"en": "English", "ja": "日本語"}
# the words that introduce a check's hint, which `dpmp-lab report` finds in any language
LIKELY_MISTAKE = {"en": "Likely mistake:", "ja": "考えられる誤り："}
# what nbgrader writes into a release in place of a solution (nbgrader_config.py's stubs)
STUBS = (("comment", "YOUR CODE HERE"), ("markdown", "YOUR ANSWER HERE"))


def catalogue_path(language: str, domain: str) -> Path:
    if language not in LANGUAGES or language == SOURCE:
        raise ValueError(f"no catalogue for language {language!r}: "
                         f"translations exist for {', '.join(LANGUAGES[1:])}")
    if domain.startswith(HIDDEN):
        return HIDDEN_HOME / language / f"{domain[len(HIDDEN):]}.po"
    return HERE / language / f"{domain}.po"


def domains(domain: str) -> list[str]:
    """The catalogues a notebook's translation is looked up in, later ones first."""
    return [COMMON, domain, HIDDEN + COMMON, HIDDEN + domain]


def load(language: str, domain: str) -> polib.POFile:
    path = catalogue_path(language, domain)
    return polib.pofile(str(path), wrapwidth=0) if path.exists() else new_catalogue(language)


def new_catalogue(language: str) -> polib.POFile:
    """An empty catalogue of `language`, as every catalogue of the package starts."""
    po = polib.POFile(wrapwidth=0)
    po.metadata = {"Project-Id-Version": "dpmp_lab", "Language": language,
                   "MIME-Version": "1.0", "Content-Type": "text/plain; charset=UTF-8",
                   "Content-Transfer-Encoding": "8bit"}
    return po


def _secret_spans(source: str) -> list[tuple[int, int]]:
    """Where a cell's hidden tests and its model answer lie: what no release shows."""
    spans, start, offset = [], None, 0
    for line in source.splitlines(keepends=True):
        if "BEGIN HIDDEN TESTS" in line or "BEGIN SOLUTION" in line:
            start = offset
        elif ("END HIDDEN TESTS" in line or "END SOLUTION" in line) and start is not None:
            spans.append((start, offset))
            start = None
        offset += len(line)
    return spans + ([(start, offset)] if start is not None else [])


def notebook_pieces(nb: Any) -> list[tuple[str, Piece, bool]]:
    """(where, piece, hidden) for every piece of `nb`: where is the cell's grade id, or its
    index; hidden, whether no release shows it (it lies in the cell's hidden tests or model
    answer, or in a written answer's cell)."""
    out = []
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        where = meta.get("grade_id") or f"cell {index}"
        whole = cell.cell_type == "markdown" and meta.get("solution")
        spans = ([(0, len(cell.source))] if whole else
                 _secret_spans(cell.source) if cell.cell_type == "code" else [])
        out += [(where, piece, any(a <= piece.start < b for a, b in spans))
                for piece in pieces(cell.cell_type, cell.source)]
    return out


def carried_entry(msgid: str, kind: str, places: list[str], known: dict[str, polib.POEntry],
                  stale: dict[str, polib.POEntry]) -> polib.POEntry:
    """The entry of `msgid` with the translation it had (`known`), or the nearest lost one
    (`stale`, taken from it) marked fuzzy, or none; found at `places`."""
    entry = known.get(msgid)
    if entry is None:
        entry = polib.POEntry(msgid=msgid, msgstr="")
        near = difflib.get_close_matches(msgid, list(stale), n=1, cutoff=0.6)
        if near:   # the English changed: the old translation, to be looked at again
            entry.msgstr = stale.pop(near[0]).msgstr
            entry.previous_msgid = near[0]
            entry.flags = ["fuzzy"]
    else:
        entry = copy.copy(entry)
        entry.obsolete = False
    entry.occurrences = [(place, "") for place in places]
    entry.comment = kind
    return entry


def update(language: str, notebooks: dict[str, Any]) -> dict[str, polib.POFile]:
    """Every catalogue of `language` in step with `notebooks` ({name: the English notebook}):
    {domain: catalogue}. A piece found in two notebooks or more goes to COMMON, the others to
    their notebook's; a piece only the hidden tests hold, to the HIDDEN domain of the same
    name; a translation follows its piece from one file to another; a piece whose English
    changed gets the nearest lost translation, marked fuzzy; a lost translation stays,
    obsolete, in the file that had it."""
    names = [*notebooks, COMMON]
    old = {domain: load(language, domain) for domain in names + [HIDDEN + n for n in names]}
    known = {e.msgid: e for po in old.values() for e in po if e.msgstr}
    found: dict[str, dict[str, tuple[str, list[str]]]] = {}
    shown: set[str] = set()    # pieces a learner's release holds somewhere
    for name, nb in notebooks.items():
        for where, piece, hidden in notebook_pieces(nb):
            kind, places = found.setdefault(piece.text, {}).setdefault(name, (piece.kind, []))
            places.append(f"{name}:{where}")
            if not hidden:
                shown.add(piece.text)
    for kind, text in STUBS:
        found[text] = {"(nbgrader)": (kind, ["nbgrader_config.py"]), "(release)": (kind, [])}
        shown.add(text)
    wanted = set(found)
    out = {}
    for domain, po in old.items():
        fresh = new_catalogue(language)
        fresh.metadata.update(po.metadata)
        stale = {e.msgid: e for e in po if e.msgstr and e.msgid not in wanted}
        base = domain.removeprefix(HIDDEN)
        for msgid, by_notebook in found.items():
            shared = len(by_notebook) > 1
            if (base == COMMON) != shared or (not shared and base not in by_notebook):
                continue
            if (msgid in shown) == domain.startswith(HIDDEN):
                continue
            kind = next(iter(by_notebook.values()))[0]
            places = [p for _, ps in by_notebook.values() for p in dict.fromkeys(ps)]
            fresh.append(carried_entry(msgid, kind, places, known, stale))
        for entry in stale.values():
            entry.obsolete, entry.occurrences = True, []
            fresh.append(entry)
        out[domain] = fresh
    return out


def entry_problem(entry: polib.POEntry) -> str | None:
    """What is wrong with one translated entry, or None."""
    if not entry.msgstr:
        return "not translated"
    if "fuzzy" in entry.flags:
        return "its English changed since it was translated (fuzzy)"
    if entry.comment == "string" and sorted(fields(entry.msgid)) != sorted(fields(entry.msgstr)):
        return "the translation's replacement fields differ from the English ones"
    if hint_tags(entry.msgid) != hint_tags(entry.msgstr):
        return "the translation's [hint: ...] tags differ from the English ones"
    return None


def problems(nb: Any, language: str, domain: str) -> list[str]:
    """What a release of `nb` in `language` would lack: each piece untranslated, stale or with
    broken fields, and each cell whose translation would not run as the English does."""
    entries = {e.msgid: e for d in domains(domain) for e in load(language, d) if not e.obsolete}
    out = []
    for where, piece, _ in notebook_pieces(nb):
        entry = entries.get(piece.text)
        why = entry_problem(entry) if entry is not None else "not in the catalogue"
        if why:
            out.append(f"{domain} {where}: {why}: {piece.text[:70]!r}")
    for index, cell in enumerate(translate(nb, language, domain, strict=False).cells):
        if cell.cell_type == "code":
            why = differs(nb.cells[index].source, cell.source)
            if why:
                out.append(f"{domain} cell {index}: {why}")
    return out


@functools.lru_cache(maxsize=64)
def _translated(language: str, domain: str, stamps: tuple) -> dict[str, polib.POEntry]:
    return {e.msgid: e for d in domains(domain) for e in load(language, d)
            if not e.obsolete and e.msgstr}


def _stamp(path: Path) -> tuple:
    try:
        info = path.stat()
    except OSError:
        return (str(path), None)
    return (str(path), info.st_mtime_ns, info.st_size)


def translator(language: str, domain: str, strict: bool = True) -> Callable[[Piece], str | None]:
    """piece -> its translation (None: keep the English), from the catalogues of `domain`
    (`domains`: read again when one of them changed); `strict`: only entries without a
    problem."""
    entries = _translated(language, domain,
                          tuple(_stamp(catalogue_path(language, d)) for d in domains(domain)))

    def translate_piece(piece: Piece) -> str | None:
        entry = entries.get(piece.text)
        if entry is None or (strict and entry_problem(entry)):
            return None
        return entry.msgstr
    return translate_piece


def translate(nb: Any, language: str, domain: str, strict: bool = True) -> Any:
    """A copy of `nb` in `language` (English where a piece has no usable translation), its
    metadata saying which: `metadata.dpmp_lab.language`."""
    out = copy.deepcopy(nb)
    out.metadata.setdefault("dpmp_lab", {})["language"] = language
    if language == SOURCE:
        return out
    piece_in = translator(language, domain, strict)
    for cell in out.cells:
        found = pieces(cell.cell_type, cell.source)
        if found:
            cell.source = put_back(cell.source, found, piece_in)
    return out


def translate_source(cell_type: str, source: str, language: str, domain: str) -> str:
    """One cell's source in `language` (the grader's way back from the gradebook's English)."""
    if language == SOURCE:
        return source
    found = pieces(cell_type, source)
    return put_back(source, found, translator(language, domain)) if found else source


def lab_settings(language: str) -> Path | None:
    """The JupyterLab settings folder whose overrides.json picks `language`'s language pack
    (None for English, JupyterLab's own)."""
    folder = HERE / language / "jupyterlab"
    return folder if language != SOURCE and (folder / "overrides.json").exists() else None


def language_of_folder(folder: Path) -> str:
    """The language of the first notebook under `folder` (a course release), else English."""
    for path in sorted(folder.glob("*/*.ipynb")) + sorted(folder.glob("*.ipynb")):
        try:
            meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
        except (OSError, ValueError):
            continue
        language = (meta.get("dpmp_lab") or {}).get("language")
        return language if language in LANGUAGES else SOURCE
    return SOURCE


def language_of(nb: Any) -> str:
    """The language a notebook was released in (English when its metadata names none or one
    this package has no catalogue for: the metadata is the learner's to change)."""
    meta = nb.metadata.get("dpmp_lab", {})
    language = meta.get("language") if isinstance(meta, dict) else None
    return language if language in LANGUAGES else SOURCE


def update_library(language: str, package: Path) -> polib.POFile:
    """The library catalogue of `language` in step with the messages `package` marks: a new
    one untranslated, a changed one with its old translation marked fuzzy, a lost one kept
    obsolete."""
    old = load(language, DOMAIN)
    known = {e.msgid: e for e in old if e.msgstr}
    found = marked(package)
    stale = {e.msgid: e for e in old if e.msgstr and e.msgid not in found}
    fresh = new_catalogue(language)
    fresh.metadata.update(old.metadata)
    for msgid, places in found.items():
        fresh.append(carried_entry(msgid, "string", places, known, stale))
    for entry in stale.values():
        entry.obsolete, entry.occurrences = True, []
        fresh.append(entry)
    return fresh


def library_problems(language: str, package: Path) -> list[str]:
    """Each marked message the catalogue of `language` lacks, has stale or breaks."""
    entries = {e.msgid: e for e in load(language, DOMAIN) if not e.obsolete}
    out = []
    for msgid, places in marked(package).items():
        entry = entries.get(msgid)
        why = entry_problem(entry) if entry is not None else "not in the catalogue"
        if why:
            out.append(f"{DOMAIN} {places[0]}: {why}: {msgid[:70]!r}")
    return out


__all__ = ["COMMON", "HIDDEN", "LANGUAGES", "LIKELY_MISTAKE", "NAMES", "SOURCE", "carried_entry",
           "catalogue_path", "domains", "entry_problem", "library_problems", "new_catalogue",
           "lab_settings", "language_of", "language_of_folder", "load", "notebook_pieces",
           "problems", "translate", "translate_source", "translator", "update", "update_library"]
