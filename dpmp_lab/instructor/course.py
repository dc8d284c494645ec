"""The nbgrader course: solutions/ (instructor notebooks) -> course/ (what learners open).

    dpmp-lab release                     # regenerate every course/NN_name from solutions/
    dpmp-lab grade 02_data_parallel      # autograde submitted/*/02_data_parallel + feedback

Thin wrappers over nbgrader's own commands, run from the checkout's root where
nbgrader_config.py says where things live, so instructors can equally call nbgrader directly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dpmp_lab import i18n
from dpmp_lab._helpers import PACKAGE_DIR, PACKAGE_HOME, tail
from dpmp_lab.i18n import messages
from dpmp_lab.instructor.nbgrader_steps import Step, command

ASSIGNMENT = re.compile(r"\d\d_[a-z0-9_]+")
COURSE_ID = "dpmp_lab"   # as nbgrader_config.py names the course in the gradebook


def repo_root() -> Path:
    """The checkout this package runs from (the folder holding solutions/ and course/)."""
    root = PACKAGE_HOME
    if not (root / "solutions").is_dir():
        raise RuntimeError(f"no solutions/ folder next to dpmp_lab in {root}: the course "
                           "commands need a checkout of the project, not an installed wheel")
    return root


def gradebook_url(root: Path | None = None) -> str:
    """nbgrader's gradebook of the course in `root` (nbgrader's default place for it)."""
    return f"sqlite:///{(root or repo_root()) / 'gradebook.db'}"


def open_to_others(root: Path, names: Iterable[str]) -> list[Path]:
    """The parts of `root` named in `names` that an account other than their owner may read
    or enter: a group or others bit on the part itself (a folder no one else may enter keeps
    everything in it, whatever its modes)."""
    return [part for part in (Path(root) / name for name in names)
            if part.exists() and part.stat().st_mode & 0o077]


def no_such_assignment(names: list[str], root: Path) -> str:
    """Why `names` are not assignments of the course in `root`: missing, or misnamed (a folder
    of solutions/ counts only when named as ASSIGNMENT says, which is easy to miss)."""
    why = f"no such assignment in {root / 'solutions'}: {', '.join(names)}"
    if any(not ASSIGNMENT.fullmatch(n) for n in names):
        why += (" (an assignment is a folder of solutions/ named like 00_launch: two digits, an "
                "underscore, then lower-case letters, digits and underscores)")
    return why


def assignments(root: Path | None = None) -> list[str]:
    """The assignment names in solutions/, in course order: ['00_launch', '01_...', ...]."""
    root = root or repo_root()
    return sorted(p.name for p in (root / "solutions").iterdir()
                  if p.is_dir() and ASSIGNMENT.fullmatch(p.name))


def nbgrader(*args: str, root: Path | None = None, check: bool = True,
             capture: bool = False, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    """Run `nbgrader args...` in the course root with this Python's tools on PATH (nbgrader
    calls helper programs such as alembic by name); `env`: variables added for this run (a
    kernel in the sandbox keeps DPMP_LAB_* ones, e.g. the device audit's)."""
    return nbgrader_steps([Step(args, env or {})], root=root, check=check, capture=capture)


def nbgrader_steps(steps: list[Step], *, root: Path | None = None, check: bool = True,
                   capture: bool = False) -> subprocess.CompletedProcess:
    """Run several nbgrader commands in one process, in the course root, stopping at the first
    that fails (nbgrader_steps.py: each process of its own would import nbgrader again)."""
    root = root or repo_root()
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(command(steps), cwd=root, env=env, text=True, capture_output=capture)
    if check and done.returncode:
        last = tail(done.stderr or "", 40)
        what = "; ".join(" ".join(s.args) for s in steps)
        raise RuntimeError(f"`nbgrader {what}` failed (exit {done.returncode}) in "
                           f"{root}" + (f":\n{last}" if last else ""))
    return done


def release(names: list[str] | None = None, *, root: Path | None = None,
            into: str | None = None) -> list[str]:
    """Regenerate course/NN_name (or into/NN_name) from solutions/ for each assignment.

    Without `into` the gradebook records the assignments too, as `nbgrader generate_assignment`
    does; with it (a scratch folder, e.g. to compare against course/) nothing is recorded.
    """
    root = root or repo_root()
    names = names or assignments(root)
    unknown = sorted(set(names) - set(assignments(root)))
    if unknown:
        raise ValueError(no_such_assignment(unknown, root))
    extra = ("--no-db", f"--CourseDirectory.release_directory={into}") if into else ()
    nbgrader_steps([Step(("generate_assignment", name, "--force", *extra)) for name in names],
                   root=root, capture=True)
    return names


def release_folder(root: Path, language: str = "en") -> Path:
    """Where the release in `language` lives: course/ for English (nbgrader's release
    directory), course-<language>/ beside it for a translation."""
    return root / ("course" if language == i18n.SOURCE else f"course-{language}")


def language_release(root: Path, language: str = "en") -> Path:
    """release_folder(root, language), written from the English release the first time a
    checkout is asked for it (a learner's `bootstrap.py course --lang ja`); as it is otherwise:
    an instructor's release is `dpmp-lab release --lang`'s to write."""
    folder = release_folder(root, language)
    if (language != i18n.SOURCE and not folder.is_dir() and (root / "solutions").is_dir()
            and release_folder(root).is_dir()):
        translated_release(assignments(root), language, root=root)
    return folder


def _solution(root: Path, name: str) -> Any:
    import nbformat

    return nbformat.read(root / "solutions" / name / f"{name}.ipynb", as_version=4)


def update_translations(language: str, *, root: Path | None = None) -> None:
    """Every catalogue of `language` in step with every notebook of solutions/."""
    root = root or repo_root()
    every = {name: _solution(root, name) for name in assignments(root)}
    catalogues = {**i18n.update(language, every),
                  messages.DOMAIN: i18n.update_library(language, PACKAGE_DIR)}
    for domain, po in catalogues.items():
        path = i18n.catalogue_path(language, domain)
        text = po.__unicode__()
        if not path.exists() or path.read_text(encoding="utf-8") != text:   # only what changed
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")


def untranslated(names: list[str], language: str, *, root: Path | None = None) -> list[str]:
    """What the catalogues of `language` lack for the assignments `names` (one line each),
    the library's own messages included (every notebook shows them)."""
    root = root or repo_root()
    unknown = sorted(set(names) - set(assignments(root)))
    if unknown:
        raise ValueError(no_such_assignment(unknown, root))
    return [*(line for name in names
              for line in i18n.problems(_solution(root, name), language, name)),
            *i18n.library_problems(language, PACKAGE_DIR)]


def translated_release(names: list[str], language: str, *, root: Path | None = None,
                       partial: bool = False) -> list[str]:
    """Write course-<language>/NN_name from course/NN_name (the English release, which must be
    current) through the language's catalogues: the same cells, grade ids and points, the text
    in `language`, each translated locked cell's checksum its own (nbgrader's Validate checks
    them; autograde puts the gradebook's English back and the grader translates it again).
    Refused while a catalogue lacks a translation, unless `partial` (English left there)."""
    import nbformat
    from nbgrader.utils import compute_checksum

    root = root or repo_root()
    lacking = untranslated(names, language, root=root)
    if lacking and not partial:
        raise ValueError(f"the {i18n.NAMES[language]} catalogues lack {len(lacking)} "
                         "translations:\n  " + "\n  ".join(lacking[:20])
                         + ("\n  ..." if len(lacking) > 20 else "")
                         + "\n(`dpmp-lab translations update` brings them in step with the "
                         "notebooks; --partial releases with English where they lack one)")
    for name in names:
        english = release_folder(root) / name
        target = release_folder(root, language) / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(english, target, ignore=NOT_COPIED)
        for path in sorted(target.glob("*.ipynb")):
            nb = i18n.translate(nbformat.read(path, as_version=4), language, name,
                                strict=not partial)
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                if "checksum" in meta:
                    meta["checksum"] = compute_checksum(cell)
            nbformat.write(nb, path)
    return names


# What a learner's copy of the course holds: the release, the package and how to install and
# start it. Never solutions/ (the hidden tests), tests/ (wrong answers and their fixes), the
# gradebook, submissions or the instructor's nbgrader_config.py.
LEARNER_FILES = ("course", "dpmp_lab", "bootstrap.py", "pyproject.toml", "constraints.txt",
                 "environment.yml", "README.md", "docs", "INSTRUCTORS.md", "ARCHITECTURE.md",
                 "CHANGELOG.md", "LICENSE")
NOT_COPIED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")


def learner_copy(dest: Path, *, root: Path | None = None,
                 language: str = i18n.SOURCE) -> list[str]:
    """Lay out a course a learner can be given, into the new folder `dest` (`python3
    bootstrap.py course` works there): `course/` from the course root `root` (its release, in
    `language`: course-LANG/ for a translation, which JupyterLab then opens in that language),
    the rest of LEARNER_FILES from this package's checkout. The names copied."""
    checkout = PACKAGE_HOME
    root = root or repo_root()
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"{dest} is not empty: the learners' copy goes into a new folder")
    missing = [n for n in ("dpmp_lab", "bootstrap.py", "pyproject.toml")
               if not (checkout / n).exists()]
    release = release_folder(root, language)
    if missing or not release.is_dir():
        raise ValueError(f"a learners' copy needs {release.name}/ in {root} and "
                         f"{', '.join(missing)} in {checkout}" if missing else
                         f"no {release.name}/ in {root}: run `dpmp-lab release"
                         f"{'' if language == i18n.SOURCE else ' --lang ' + language}` there "
                         "first")
    dest.mkdir(parents=True, exist_ok=True)
    for name in LEARNER_FILES:
        source = release if name == "course" else checkout / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=NOT_COPIED)
        elif source.is_file():
            shutil.copy2(source, dest / name)
    readable_by_all(dest)
    return [name for name in LEARNER_FILES if (dest / name).exists()]


def readable_by_all(folder: Path) -> None:
    """Everything under `folder` readable (folders entered) by every account: a copy for
    learners taken from a checkout closed to them would otherwise keep its closed modes."""
    for path in (folder, *folder.rglob("*")):
        if not path.is_symlink():
            mode = path.stat().st_mode
            path.chmod(mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0))
