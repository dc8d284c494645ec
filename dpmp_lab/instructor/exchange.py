"""nbgrader's exchange with private submissions that no other learner can replace, for a
course served by a JupyterHub.

nbgrader's own submit leaves each submission readable by every user of the server, hidden only
by a random folder name. `PrivateSubmit` closes the submission's folder to all but the learner
and its group: the inbound folder's (set-group-id, made by the instructor's release, so the
instructor's group), which the folder took when it was made. Another learner cannot enter it
even knowing its name. The learners' nbgrader_config.py names it (hub.py writes that file).

Anyone may write into the inbound folder, so a learner can hand in a folder named for another
learner (`ada+00_launch+<a later time>+x`); nbgrader's collect warns that its owner differs and
collects it all the same, as ada's newest submission. `OwnerCheckedCollect`, named by the
instructor's nbgrader_config.py (the command line and formgrader), leaves out every folder
whose owner is not the learner it names, and says so.

One assignment, each learner in their language: `TranslatedRelease` releases the English
notebooks as nbgrader does and, beside them in a hidden folder, the same assignment from every
translated release of the course root (`dpmp-lab release --lang ja` writes course-ja/);
`LanguageFetch` gives a learner the notebooks of their language (DPMP_LAB_LANG, which the hub
sets per learner) under the assignment's own names, so that their hand-in is the assignment's
notebook, graded in the language it was released in, and leaves the hidden folder out.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.fetch_assignment import ExchangeFetchAssignment
from nbgrader.exchange.default.release_assignment import ExchangeReleaseAssignment
from nbgrader.exchange.default.submit import ExchangeSubmit

from dpmp_lab.i18n import messages
from dpmp_lab.instructor.course import release_folder

# The folder is the gate: its files may keep the learner's group (nbgrader writes some after
# the copy has reset the folder's set-group-id bit), so they are readable by whoever enters.
SUBMISSION_FILE_MODE = 0o444
SUBMISSION_DIR_MODE = 0o2770     # the learner and the graders' group; others cannot enter


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, then the submission's folder closed to everyone but its learner and
    the graders' group."""

    def copy_files(self) -> None:
        super().copy_files()
        dest = os.path.join(self.inbound_path, self.assignment_filename)
        self.set_perms(dest, fileperms=SUBMISSION_FILE_MODE, dirperms=SUBMISSION_DIR_MODE)


NOT_THEIRS = "not-theirs:"   # marks the record of a folder its named learner does not own


def owner(path: str) -> str:
    """The account owning `path` (its uid when no account has it)."""
    uid = os.stat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's collect, without the submissions handed in under another learner's name:
    their records are set apart (their own group, never the named learner's newest) and left
    out, each with a warning naming who made it."""

    def _path_to_record(self, path: str) -> dict:
        record = super()._path_to_record(path)
        made_by = owner(path)
        if made_by != record["username"]:
            record["username"] = f"{NOT_THEIRS}{record['username']}:{made_by}"
        return record

    def copy_files(self) -> None:
        for record in self.src_records:
            if record["username"].startswith(NOT_THEIRS):
                named, made_by = record["username"].removeprefix(NOT_THEIRS).split(":", 1)
                self.log.warning(f"not collected: {record['filename']} names {named} but was "
                                 f"handed in by {made_by}")
        self.src_records = [r for r in self.src_records
                            if not r["username"].startswith(NOT_THEIRS)]
        super().copy_files()


TRANSLATIONS = ".translations"   # in a released assignment: <language>/ per translation


class TranslatedRelease(ExchangeReleaseAssignment):
    """nbgrader's release, with the assignment's translations beside it: course-<language>/NAME
    of the course root, where `dpmp-lab release --lang` wrote one, under .translations/."""

    def do_copy(self, src: str, dest: str) -> None:
        super().do_copy(src, dest)
        root, name = Path(self.coursedir.root), self.coursedir.assignment_id
        for language in messages.LANGUAGES:
            translated = release_folder(root, language) / name
            if language == messages.SOURCE or not translated.is_dir():
                continue
            if graded_cells(translated) != graded_cells(Path(src)):
                self.log.warning(f"not released with it: {translated}, whose graded cells are "
                                 f"not those of {src} (written from an older release: run "
                                 f"`dpmp-lab release {name} --lang {language}`)")
                continue
            shutil.copytree(translated, Path(dest) / TRANSLATIONS / language,
                            ignore=shutil.ignore_patterns(*self.coursedir.ignore))
            self.log.info(f"with its translation: {translated}")


def graded_cells(folder: Path) -> dict[str, list[tuple]]:
    """{notebook: its cells' grade ids and points}: what a translation must share with the
    release it was written from, or the gradebook would grade another notebook."""
    out = {}
    for path in sorted(folder.glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        out[path.name] = [(c.get("metadata", {}).get("nbgrader", {}).get("grade_id"),
                           c.get("metadata", {}).get("nbgrader", {}).get("points"))
                          for c in cells if c.get("metadata", {}).get("nbgrader")]
    return out


class LanguageFetch(ExchangeFetchAssignment):
    """nbgrader's fetch, the notebooks in the learner's language where the release has them
    (a notebook the learner already has is left as it is: a fetch that restores missing files
    restores only those)."""

    def do_copy(self, src: str, dest: str) -> None:
        had = set(os.listdir(dest)) if os.path.isdir(dest) else set()
        super().do_copy(src, dest)
        translations = Path(dest) / TRANSLATIONS
        mine = translations / messages.language()
        if messages.language() != messages.SOURCE and mine.is_dir():
            for notebook in sorted(mine.glob("*.ipynb")):
                if notebook.name not in had:
                    shutil.copyfile(notebook, Path(dest) / notebook.name)
        shutil.rmtree(translations, ignore_errors=True)
