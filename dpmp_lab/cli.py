"""The `dpmp-lab` command: `doctor` checks this machine, `lab` opens the course in JupyterLab,
`release` regenerates course/ from solutions/ (`translations` keeps its catalogues), `learner-copy` lays out a course for learners,
`grade` autogrades submissions in parallel, each in a sandbox (nbgrader), `report` says what a
class got wrong, `grades` shows every learner's scores (as `nbgrader export`
writes them)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dpmp_lab import i18n
from dpmp_lab._helpers import PACKAGE_HOME
from dpmp_lab.instructor import course
from dpmp_lab.instructor.limits import Limits


def doctor(args: argparse.Namespace) -> int:
    """Print what this machine offers for the course and prove that launches work
    (launcher/doctor.py: the one command that needs torch)."""
    from dpmp_lab.launcher.doctor import check_machine

    return check_machine(args.world_size, args.backend, args.timeout)


def course_dir(language: str = i18n.SOURCE) -> Path:
    """The release (course/, course-LANG/) of this package's checkout, else the cwd."""
    here = course.language_release(PACKAGE_HOME, language)
    return here if here.is_dir() else Path.cwd()


def lab(args: argparse.Namespace) -> int:
    """Start JupyterLab on the course (replaces this process), in the notebooks' language."""
    language = args.lang or i18n.language_of_folder(Path(args.dir) if args.dir else course_dir())
    directory = Path(args.dir) if args.dir else course_dir(language)
    argv = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={directory}"]
    settings = i18n.lab_settings(language)
    if settings is not None and not any("app_settings_dir" in a for a in args.extra):
        argv.append(f"--LabApp.app_settings_dir={settings}")   # JupyterLab's own words too
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args.extra:
        argv.append("--allow-root")  # containers and cloud GPU boxes often run as root
    argv += args.extra
    print(f"starting JupyterLab on {directory}", flush=True)
    # the library's own messages in that language too, in every kernel it starts
    os.execve(sys.executable, argv, {**os.environ, i18n.LANGUAGE_ENV: language})
    return 0  # not reached


def release(args: argparse.Namespace) -> int:
    """Regenerate the learners' notebooks in course/ from the instructor's in solutions/."""
    root = args.root or course.repo_root()
    due = None
    if args.due is not None:
        from nbgrader.utils import parse_utc

        if not args.names:
            print("dpmp-lab release: --due needs the assignments it is for, by name",
                  file=sys.stderr)
            return 2
        try:
            due = parse_utc(args.due)
        except (ValueError, OverflowError) as exc:
            print(f"dpmp-lab release: --due {args.due!r} is not a date and time nbgrader reads "
                  f"({exc}); e.g. \"2026-12-15 17:00 Europe/Berlin\"", file=sys.stderr)
            return 2
    try:
        names = course.release(args.names or None, root=root)
        if args.lang != i18n.SOURCE:
            course.translated_release(names, args.lang, root=root, partial=args.partial)
    except ValueError as exc:
        print(f"dpmp-lab release: {exc}", file=sys.stderr)
        return 2
    if due is not None:
        from dpmp_lab.instructor.grading_job import open_gradebook

        with open_gradebook(course.gradebook_url(root)) as gb:
            for name in names:
                gb.update_or_create_assignment(name, duedate=due)
    for name in names:
        print(f"{root / 'course' / name} regenerated from {root / 'solutions' / name}"
              + (f", due {due:%Y-%m-%d %H:%M} UTC" if due is not None else ""))
        if args.lang != i18n.SOURCE:
            print(f"{course.release_folder(root, args.lang) / name} written from it in "
                  f"{i18n.NAMES[args.lang]}")
    return 0


def translations(args: argparse.Namespace) -> int:
    """Catalogues in step with solutions/ (update, all), what the named ones lack (check)."""
    root = args.root or course.repo_root()
    try:
        if args.action == "update":
            course.update_translations(args.lang, root=root)
        names = args.names or course.assignments(root)
        lacking = course.untranslated(names, args.lang, root=root)
    except ValueError as exc:
        print(f"dpmp-lab translations: {exc}", file=sys.stderr)
        return 2
    print(*lacking, f"{i18n.NAMES[args.lang]}: {len(lacking)} pieces of {len(names)} notebooks "
          "lack a translation", sep="\n")
    return 1 if lacking and args.action == "check" else 0


def learner_copy(args: argparse.Namespace) -> int:
    """A copy of the course for learners: the release notebooks and the package, nothing of
    the instructor's (no solutions/, tests/, gradebook or submissions)."""
    copied = course.learner_copy(args.dest, root=args.root, language=args.lang)
    print(f"{args.dest}: {', '.join(copied)}; learners start it with "
          "`python3 bootstrap.py course` there")
    return 0


# The instructor's commands import nbgrader (and the report matplotlib), which the learners'
# install may lack: imported when such a command runs, so `doctor` and `lab` never need them.


def grade(args: argparse.Namespace) -> int:
    """Autograde submitted/*/<assignment> in parallel jobs, each submission in a sandbox of
    its own, and write feedback/ (nbgrader)."""
    from dpmp_lab.instructor import grading

    limits = Limits(memory_mb=args.memory, processes=args.processes, disk_mb=args.disk,
                    cell_output_kb=args.cell_output, notebook_output_mb=args.notebook_output)
    try:
        summary = grading.grade_class(args.assignment, root=args.root, jobs=args.jobs,
                                      timeout=args.timeout,
                                      cell_timeout=args.cell_timeout, force=args.force,
                                      students=args.student or None,
                                      sandboxed=not args.no_sandbox, limits=limits,
                                      device_audit=args.device_audit)
    except grading.SandboxUnavailable as exc:
        print(f"dpmp-lab grade: {exc}", file=sys.stderr)
        return 2
    flagged = any(o.flagged for o in summary.outcomes)
    return 1 if summary.failed or flagged else 0


def report(args: argparse.Namespace) -> int:
    """What the class got wrong in an assignment: the terminal table, reports/NAME.html, or CSV."""
    from dpmp_lab.instructor import class_report

    root = args.root or course.repo_root()
    rep = class_report.class_report(args.assignment, root)
    if args.csv:
        sys.stdout.write(class_report.csv_report(rep, names=args.names))
        return 0
    print(class_report.text_report(rep, names=args.names))
    if not args.no_html:
        print(f"\nwritten: {class_report.write_html(rep, root, names=args.names)}")
    return 0


def grades(args: argparse.Namespace) -> int:
    """Every learner's score per assignment: the rows `nbgrader export` writes with this
    course's exporter (instructor/grades_export.py), pseudonymised unless --names."""
    from dpmp_lab.instructor import grades_export

    root = args.root or course.repo_root()
    if args.platform and not args.names:
        raise ValueError(f"a {args.platform} import matches learners by their ids and names: "
                         "add --names (the output then holds them)")
    rows = grades_export.course_grades(root, args.assignments or None)
    if args.platform:
        text, blank = grades_export.lms_csv(rows, args.platform)
        sys.stdout.write(text)
        for line in blank:
            print(f"left blank: {line}", file=sys.stderr)
        return 0
    key = None if args.names else grades_export.read_key(root / grades_export.KEY_FILE)
    if args.csv:
        sys.stdout.write(grades_export.grades_csv(rows, key))
    else:
        print(grades_export.grades_table(rows, key))
    return 0


def _jobs(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be at least 1, got {n}")
    return n


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _root_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", type=Path, default=None,
                   help="the course root: nbgrader_config.py, solutions/, submitted/, "
                        "gradebook.db (default: this checkout)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpmp-lab", description=__doc__,
        epilog="dpmp-lab lab passes any other option to `jupyter lab` (e.g. --no-browser).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "doctor", help="check torch, GPUs, backends, and launches",
        description="Check this machine for the course: torch's version and build, the GPUs "
                    "nvidia-smi lists against those torch can use (and the driver the wheel "
                    "needs), which backend each world size gets, and a test launch. Exits 1, "
                    "saying the fix, when something is wrong.")
    p.add_argument("-n", "--world-size", type=int, default=2,
                   help="ranks of the test launch (default: 2)")
    p.add_argument("--backend", default="auto",
                   help="backend of the test launch: auto (nccl with one GPU per rank, else "
                        "gloo), gloo or nccl (default: auto)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds before a test launch counts as hung (default: 60)")
    p.set_defaults(func=doctor)
    p = sub.add_parser("lab", help="open the course in JupyterLab")
    p.add_argument("--dir", default=None, help="folder to open (default: the course)")
    p.add_argument("--lang", choices=i18n.LANGUAGES, default=None,
                   help="the course and JupyterLab in this language (default: the language the "
                        "folder's notebooks were released in)")
    p.set_defaults(func=lab)
    p = sub.add_parser("release", help="regenerate course/ from solutions/ (nbgrader)")
    p.add_argument("names", nargs="*", help="assignments (default: all)")
    p.add_argument("--due", default=None, metavar="WHEN",
                   help="the named assignments' due date in the gradebook, as nbgrader reads "
                        "it (\"2026-12-15 17:00 Europe/Berlin\"; UTC without a zone): a later "
                        "hand-in gets the course's late penalty")
    p.add_argument("--lang", choices=i18n.LANGUAGES, default=i18n.SOURCE,
                   help="also write the release in this language, course-LANG/ beside "
                        "course/ (the same assignments and points; default: en, English only)")
    p.add_argument("--partial", action="store_true",
                   help="with --lang: release even where a catalogue lacks a translation "
                        "(English left there), to look at a translation in progress")
    _root_option(p)
    p.set_defaults(func=release)
    p = sub.add_parser("translations", help="the catalogues of a language: update them from "
                       "solutions/, or check what they lack")
    p.add_argument("action", choices=["update", "check"])
    p.add_argument("names", nargs="*", help="assignments (default: all)")
    p.add_argument("--lang", choices=i18n.LANGUAGES[1:], default="ja",
                   help="the language (default: ja)")
    _root_option(p)
    p.set_defaults(func=translations)
    p = sub.add_parser("learner-copy", help="a copy of the course for learners (no "
                       "solutions/, tests/ or gradebook)")
    p.add_argument("dest", type=Path, help="a new folder")
    p.add_argument("--lang", choices=i18n.LANGUAGES, default=i18n.SOURCE,
                   help="the release in this language (`release --lang` writes it first)")
    _root_option(p)
    p.set_defaults(func=learner_copy)
    p = sub.add_parser("grade", help="autograde submitted/*/ASSIGNMENT, write feedback/")
    p.add_argument("assignment")
    p.add_argument("-j", "--jobs", type=_jobs, default=None,
                   help="submissions graded at once (default: the cores, at most the "
                        "submissions)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds one submission may take in all before it is stopped "
                        "(default 1800)")
    p.add_argument("--cell-timeout", type=int, default=None,
                   help="seconds per cell (default: nbgrader_config.py's Execute.timeout)")
    p.add_argument("--force", action="store_true",
                   help="regrade submissions that did not change since they were graded")
    p.add_argument("--student", action="append", default=[],
                   help="grade only this learner (repeatable)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run submissions WITHOUT the sandbox (Linux's bubblewrap): their code "
                        "can then read and change everything you can; for trusted code only")
    p.add_argument("--device-audit", action=argparse.BooleanOptionalAction, default=None,
                   help="every launch under the device audit, as if each rank had a GPU, so "
                        "that data on the wrong device costs its cells as on a GPU server "
                        "(default: on where nvidia-smi lists no GPU)")
    defaults = Limits()
    for flag, field, unit in (("--memory", "memory_mb", "MiB"),
                              ("--processes", "processes", "processes at once"),
                              ("--disk", "disk_mb", "MiB written"),
                              ("--cell-output", "cell_output_kb", "KiB printed by one cell"),
                              ("--notebook-output", "notebook_output_mb",
                               "MiB printed by a notebook")):
        p.add_argument(flag, type=_positive, default=getattr(defaults, field),
                       help=f"limit per submission: {unit} (default {getattr(defaults, field)})")
    _root_option(p)
    p.set_defaults(func=grade)
    p = sub.add_parser("report", help="what a class got wrong in ASSIGNMENT")
    p.add_argument("assignment")
    p.add_argument("--csv", action="store_true", help="CSV on stdout, for a spreadsheet")
    p.add_argument("--for", dest="platform", choices=["canvas", "moodle"], default=None,
                   help="CSV on stdout as that learning platform imports grades: one row per "
                        "learner, one column per assignment (needs --names; a submission "
                        "waiting for manual grading is left blank)")
    p.add_argument("--names", action="store_true",
                   help="show which learners made each mistake (default: anonymised)")
    p.add_argument("--no-html", action="store_true", help="do not write reports/NAME.html")
    _root_option(p)
    p.set_defaults(func=report)
    p = sub.add_parser("grades", help="each learner's score per assignment (what `nbgrader "
                       "export` writes to grades.csv)")
    p.add_argument("assignments", nargs="*", help="assignments (default: every graded one)")
    p.add_argument("--csv", action="store_true", help="CSV on stdout, for a spreadsheet")
    p.add_argument("--for", dest="platform", choices=["canvas", "moodle"], default=None,
                   help="CSV on stdout as that learning platform imports grades: one row per "
                        "learner, one column per assignment (needs --names; a submission "
                        "waiting for manual grading is left blank)")
    p.add_argument("--names", action="store_true",
                   help="learners' ids and names (default: pseudonyms, no names)")
    _root_option(p)
    p.set_defaults(func=grades)
    args, extra = parser.parse_known_args(argv)
    if extra and args.func is not lab:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    if args.func in (grade, report, grades, learner_copy):
        try:   # bad input to the instructor's commands: one line, not a traceback
            return args.func(args)
        except ValueError as exc:
            print(f"dpmp-lab {args.command}: {exc}", file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
