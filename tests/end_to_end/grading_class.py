"""One class of 00_launch, graded the documented way, shared by tests/class_grading.py
(grading a class: order, time limits, the report) and tests/end_to_end/grading_trust.py (every
attack on the grader is harmless).

The class: honest learners (the solution, the blank release, two wrong answers, a cell that
never ends, a kernel that kills itself) and one attacker per attack, each what a learner could
write in one solution cell (or one cell added), with the outcome that shows it harmless:
- reaching out (FULL: its own answers' marks, nothing outside its job reached): read and append
  to the gradebook, solutions/, nbgrader_config.py, another learner's submission and the
  checkout's solutions/, tests/ and .git (the grader puts the checkout on PYTHONPATH), from the
  cell and from two daemons (a new session, a double fork) that keep trying for a minute and a
  half; look for the other jobs; connect to the network; read bwrap's environment
  (/proc/1/environ), open its memory for writing, and say which host user it runs as; print
  where the package, torch and Python lie (feedback masks those paths);
- the kernel's shell (ZEROED: the tests never run there, so nothing it does reaches them): an
  input transformer that turns every later cell into `pass`, installed, through strings, from
  a cell that starts with a magic, which records every cell it sees and prints them,
  base64-encoded, from a cell the learner added; a hook that prints every cell, beside
  100 MiB of newlines written to the kernel's own standard output (LEAK, FULL: its own
  answers' marks, no hidden test in its feedback, and the output a pipe whose tail the grader
  keeps);
- answers that are not data (ZEROED): lists, floats and strings of subclasses whose `__eq__`,
  `__sub__`, `strip` and `lower` always agree, and a my_rows that keeps the library's reference
  in a default argument;
- writes into the library (FORGED: zero, flagged with the scan's reason): integrity's record
  emptied and the checks replaced through an alias; a function that reads the test's expected
  value from its caller's frame;
- limits (STOPPED): a 50 MB line, 3 GiB of memory, 40 MiB in its folder and 40 MiB in
  /dev/shm (64 MiB allowed), 200 processes, 100 MiB of widget buffers;
- files that are not data (LINKED: not graded, with the link named): the notebook a symbolic
  link to the course's solution, and a folder with links to the gradebook and /etc/shadow;
- markup (FULL, and nothing of it live in its autograded notebook or its feedback page): a
  learner's markdown and raw cells with script, HTML, SVG and JavaScript outputs, handed in
  with a submission_secret.txt that is not UTF-8 (its own marks, the class recorded).

One honest learner (LATE) handed in through an exchange after the due date, which the course
gives with nbgrader's penalty_method "zero": `nbgrader collect` leaves timestamp.txt and
submission_secret.txt beside the notebook; every other submission was placed by hand.

It is graded twice: the whole class with two jobs, in the sandbox, with tight limits, from a
course root given as a relative path and with a temp folder of its own (what is left in it is
ours to count); and two of the honest learners (AGAIN) alone, with one job, in a course of
their own and without cgroups (rlimits alone), to compare.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

import nbformat

from dpmp_lab.instructor import course, grading, grading_job, limits
from dpmp_lab.instructor.limits import Limits
from tests.conftest import ROOT
from tests.support.notebook_sources import source_notebook, variants, with_replacements

NAME = "00_launch"
VARIANTS = {v["name"]: v for v in variants(NAME)}
ROWS = VARIANTS["rows dropped when n does not divide"]
ALL_REDUCE = VARIANTS["all_reduce where all_gather belongs"]
HANGS = {"predict": "import time\nwhile True:\n    time.sleep(0.2)"}
KILLS = {"predict": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"}
PREDICT = "predicted_returned = [1, 1, 1]\npredicted_seen = []\n"

# learner -> what they hand in: "solution", "release", cells of the solution replaced, or
# ("release", cells): cells of the blank release filled in (an attack with nothing solved).
# Ids that no message contains by chance, so that the anonymity checks mean something.
HONEST = {"ada_l17": "solution", "ben_l17": "release", "cy_l17": ROWS["replace"],
          "dee_l17": ROWS["replace"], "eve_l17": ALL_REDUCE["replace"], "fay_l17": HANGS,
          "gus_l17": KILLS}
BROKEN = {"cy_l17": ROWS, "dee_l17": ROWS, "eve_l17": ALL_REDUCE}
NOT_GRADED = {"fay_l17", "gus_l17"}
VICTIM = "ada_l17"
DUE = datetime(2026, 12, 1, 12, 0)          # UTC, as nbgrader keeps it
LATE = {"dee_l17": ("2026-12-01 14:30:00.000000 UTC", "5eb" * 40)}   # timestamp, secret
# graded again with one job: a wrong answer (its partial score) and a dead kernel (the others
# would only cost their minutes again)
AGAIN = {"cy_l17", "gus_l17"}

SNAPSHOT = '''import sys
sys.modules["dpmp_lab.integrity"]._snapshot.clear()
c = dl.check
c.comm = lambda *args, **kwargs: None
c.close = lambda *args, **kwargs: None
'''
FRAME = '''import sys
def my_rows(n, rank, world):
    want = sys._getframe(2).f_locals["want"]     # check_rows -> its list -> here
    return range(want[rank][0], want[rank][-1] + 1) if want[rank] else range(0)
'''
# a cell that starts with a magic (no ast.parse reads it), a transformer that says it is
# IPython's, every cell it sees kept, and a cell added at the end that prints them
TRANSFORMER = ('%config InteractiveShell.ast_node_interactivity = "last_expr"\n'
               "import IPython.display\n"
               "_sh = IPython.get_ipython()\n_seen = []\n"
               "def _keep(lines):\n    if 'SEEN' in ''.join(lines):\n        return lines\n"
               "    _seen.append(''.join(lines))\n    return ['pass\\n']\n"
               "_keep.__module__ = 'IPython.core.inputtransformer2'\n"
               "getattr(_sh, 'input_transformers' + '_post').append(_keep)\n")
SEEN = ("import base64\n_sh.input_transformers_post.clear()\n"
        "print('SEEN', base64.b64encode('\\n'.join(_seen).encode()).decode())\n")
SUBCLASSES = {
    "predict": ("class _Yes(list):\n    def __eq__(self, other):\n        return True\n"
                "    def __ne__(self, other):\n        return False\n"
                "predicted_returned = _Yes([9])\npredicted_seen = _Yes([9])\n"),
    "my_rows": ("def my_rows(n, rank, world, _split=dl.models.shard_range):\n"
                "    return _split(n, rank, world)\n"),
    "recall": ("class _Yes(list):\n    def __eq__(self, other):\n        return True\n"
               "class _Near(float):\n    def __sub__(self, other):\n        return 0.0\n"
               "    def __eq__(self, other):\n        return True\n"
               "class _Says(str):\n    def strip(self):\n        return self\n"
               "    def lower(self):\n        return 'gloo'\n"
               "q_ranks = _Yes([7])\nq_group_sum = _Near(1.0)\nq_backend = _Says('nccl')\n"),
    "recall_failure_answer": ("class _Any(str):\n    def __eq__(self, other):\n"
                              "        return True\n    __hash__ = str.__hash__\n"
                              "q_failure = _Any('e')\n"),
}
# the shell reached through strings: nothing here names a hatch the scan knows
_SHELL_BY_STRINGS = ('import sys\n_sh = getattr(getattr(sys, "mod" + "ules")["IPy" + "thon"], '
                     '"get_" + "ipython")()\n')
LEAK = _SHELL_BY_STRINGS + ('getattr(_sh, "ev" + "ents").register("post_run_cell", '
                            'lambda result: print("CELL", result.info.raw_cell))\n') + PREDICT
FLOOD = 'print("x" * 50_000_000)\n'
MEMORY = "hog = bytearray(3 * 2**30)\n"
# 40 MiB in its folder and 40 MiB in /dev/shm: past the class's 64 MiB only if both count
DISK = ('for path in ("big.bin", "/dev/shm/big.bin"):\n    with open(path, "wb") as f:\n'
        '        for _ in range(40):\n            f.write(b"x" * 2**20)\n')
WIDGETS = ("import ipywidgets\nfor _ in range(5):\n"
           "    display(ipywidgets.Image(value=b'\\0' * 20 * 2**20, format='png'))\n")
# the kernel's own standard output, which ipykernel keeps aside when it sends fd 1 to the
# notebook, and bwrap's (pid 1's): neither is the notebook's, so the output limit never sees it
NEWLINES = ("import os, sys\nown = getattr(sys.stdout, '_original_stdstream_copy', None)\n"
            "for _ in range(100):\n    os.write(own if own is not None else 2, b'\\n' * 2**20)\n"
            "try:\n    with open('/proc/1/fd/1', 'wb') as out:\n"
            "        out.write(b'\\n' * 2**20)\nexcept OSError:\n    pass\n")
FORK = "import subprocess\nkids = [subprocess.Popen(['sleep', '30']) for _ in range(200)]\n"

FORGED = {"mal_snapshot": "library's code", "mal_frame": "call stack"}
ZEROED = {"mal_transformer", "mal_subclass"}
FULL = {"mal_reach", "mal_leak", "mal_markup"}   # the solution's answers: its marks, no more
LINKED = {"mal_linked_notebook": "00_launch.ipynb is a symbolic link",
          "mal_links": "is a symbolic link"}
STOPPED = {"mal_flood": "output limit", "mal_memory": "memory limit", "mal_disk": "disk limit",
           "mal_fork": "processes", "mal_widgets": "output limit"}
ATTACKERS = {*FULL, *FORGED, *ZEROED, *STOPPED, *LINKED}
# script in every place a page shows: outputs of the kinds a browser runs, a markdown cell and a
# raw cell the learner added
MARKUP = ("from IPython.display import HTML, SVG, Javascript, display\n"
          "display(HTML('<b>x</b><script>console.log(\"PWNED:html\")</script>'"
          "             '<img src=x onerror=\"console.log(1)\">'))\n"
          "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"console.log(2)\">'"
          "            '<script>console.log(3)</script></svg>'))\n"
          "display(Javascript('console.log(\"PWNED:js\")'))\n") + PREDICT
MARKUP_CELLS = (("markdown", "<script>console.log('PWNED:md')</script>\n"
                             "[click](javascript:console.log('PWNED:link'))"),
                ("raw", "<script>console.log('PWNED:raw')</script>"))
LIMITS = Limits(memory_mb=1536, processes=128, disk_mb=64, cell_output_kb=256,
                notebook_output_mb=4)
# a legitimate submission takes 10-40 s on the 2-core machine alone, and up to 90 s or more
# while the course's grading fixture runs beside it on the other test worker (the solution ran
# past a 90 s limit once so, a wrong answer took 68 s); the hang is stopped at this limit, paid
# once (on the class's worker, beside the longer course fixture)
LIMIT = 150.0


def stopped_here(summary: grading.Summary) -> set[str]:
    """The attackers a limit stops on this machine: memory and processes only where a cgroup
    holds them (an rlimit alone makes them the cell's own error, or lets them run)."""
    held = summary.limits_held
    return {learner for learner in STOPPED
            if not (learner == "mal_memory" and "memory: cgroup" not in held)
            and not (learner == "mal_fork" and "processes: cgroup" not in held)}


# what an attacker reads of the checkout the grader runs from (on the grader's PYTHONPATH),
# found from where the package lies (its source names no path of the server)
CHECKOUT = (f"solutions/{NAME}/{NAME}.ipynb", f"tests/course_variants/{NAME}.py", ".git/HEAD")


def not_graded_here(summary: grading.Summary) -> set[str]:
    """Who this grading leaves not graded: the dead and the hung, the attackers a limit stops
    on this machine, the links."""
    return NOT_GRADED | stopped_here(summary) | set(LINKED)


def reach(root: Path) -> str:
    """The reaching-out attack, aimed at the files of course root `root` and the checkout."""
    targets = [str(root / p) for p in ("gradebook.db", "nbgrader_config.py",
                                       f"solutions/{NAME}/{NAME}.ipynb",
                                       f"submitted/{VICTIM}/{NAME}/{NAME}.ipynb")]
    return f'''import glob, json, os, socket, subprocess, sys
TARGETS = {targets!r}
CHECKOUT = [os.path.join(os.path.dirname(os.path.dirname(dl.__file__)), p) for p in {CHECKOUT!r}]
found = {{}}
for path in TARGETS + CHECKOUT + [{str(root)!r}, {str(root / "submitted")!r}]:
    try:
        if os.path.isdir(path):
            found[path] = "LISTED " + " ".join(os.listdir(path))
        else:
            with open(path, "rb") as f:
                f.read(64)
            found[path] = "READ"
            with open(path, "ab") as f:
                f.write(b"pwned")
            found[path] = "WROTE"
    except OSError as exc:
        found[path] = type(exc).__name__
found["other jobs"] = glob.glob("/tmp/dpmp-grade-*") + glob.glob("/tmp/*/dpmp-grade-*")
try:
    found["environ"] = "GRADER" if b"DPMP_LAB_GRADING_RUN" in open("/proc/1/environ", "rb").read() \\
        else "CLEAN"
except OSError as exc:
    found["environ"] = type(exc).__name__
try:
    open("/proc/1/mem", "wb").close()
    found["memory"] = "WRITABLE"
except OSError as exc:
    found["memory"] = type(exc).__name__
uid = os.getuid()
for line in open("/proc/self/uid_map").read().splitlines():
    inside, outside, count = map(int, line.split())
    if inside <= uid < inside + count:
        found["host uid"] = outside + uid - inside
try:
    socket.create_connection(("1.1.1.1", 80), timeout=2)
    found["network"] = "CONNECTED"
except OSError as exc:
    found["network"] = type(exc).__name__
daemon = ("import time\\nfor _ in range(900):\\n    for p in %r:\\n        try:\\n"
          "            open(p, 'ab').write(b'pwned')\\n        except OSError:\\n"
          "            pass\\n    time.sleep(0.1)\\n" % (TARGETS,))
subprocess.Popen([sys.executable, "-c", daemon], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", daemon])
    os._exit(0)
print("WHERE", dl.__file__, torch.__file__, json.__file__)   # the server's layout
print("REACH", json.dumps(found))
''' + PREDICT


def attackers(root: Path) -> dict:
    return {"mal_reach": {"predict": reach(root)},
            "mal_snapshot": ("release", {"predict": SNAPSHOT + PREDICT}),
            "mal_frame": {"my_rows": FRAME},
            "mal_leak": {"predict": LEAK + NEWLINES},
            "mal_transformer": ("release", {"predict": TRANSFORMER}, SEEN),
            "mal_subclass": ("release", SUBCLASSES),
            "mal_flood": {"predict": FLOOD}, "mal_memory": {"predict": MEMORY},
            "mal_disk": {"predict": DISK},
            "mal_fork": {"predict": FORK}, "mal_widgets": {"predict": WIDGETS},
            "mal_linked_notebook": "solution",
            "mal_links": "solution", "mal_markup": ("solution", {"predict": MARKUP},
                                                    *MARKUP_CELLS)}


def links(root: Path) -> None:
    """The LINKED attackers' folders (their notebooks handed in first), and mal_markup's secret
    that is not UTF-8."""
    linked = root / "submitted" / "mal_linked_notebook" / NAME / f"{NAME}.ipynb"
    linked.unlink()
    linked.symlink_to(root / "solutions" / NAME / f"{NAME}.ipynb")
    folder = root / "submitted" / "mal_links" / NAME
    (folder / "gradebook.db").symlink_to(root / "gradebook.db")
    (folder / "data").mkdir()
    (folder / "data" / "shadow").symlink_to("/etc/shadow")
    (root / "submitted" / "mal_markup" / NAME / "submission_secret.txt").write_bytes(
        b"\xff\xfe not utf-8 \xc3\x28")


def course_root(path: Path) -> Path:
    path.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", path)
    shutil.copytree(ROOT / "solutions" / NAME, path / "solutions" / NAME)
    return path


_released: list[Path] = []   # one course root with 00_launch released, per test process


def released_root(path: Path) -> Path:
    """A course root with 00_launch recorded in its gradebook (nbgrader generate_assignment),
    copied from one made once per test process: each generate_assignment is an nbgrader
    process that imports torch."""
    if not _released:
        made = Path(tempfile.mkdtemp(prefix="dpmp-released-"))
        atexit.register(shutil.rmtree, made, True)
        grading.ensure_assignment(NAME, course_root(made / "root"))
        _released.append(made / "root")
    shutil.copytree(_released[0], path)
    return path


def hand_in(root: Path, learner: str, nb: nbformat.NotebookNode) -> None:
    folder = root / "submitted" / learner / NAME
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{NAME}.ipynb")


def notebook_of(handed, released: nbformat.NotebookNode) -> nbformat.NotebookNode:
    if handed == "solution":
        return source_notebook(NAME)
    if handed == "release":
        return released
    if isinstance(handed, tuple):   # cells of the release (or solution) filled in, cells added
        nb = copy.deepcopy(released if handed[0] == "release" else source_notebook(NAME))
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") in handed[1]:
                cell.source = handed[1][cell.metadata["nbgrader"]["grade_id"]]
        new = {"markdown": nbformat.v4.new_markdown_cell, "raw": nbformat.v4.new_raw_cell}
        nb.cells += [new[added[0]](added[1]) if isinstance(added, tuple)
                     else nbformat.v4.new_code_cell(added) for added in handed[2:]]
        return nb
    return with_replacements(source_notebook(NAME), handed)


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


def run_processes(run_id: str) -> list[str]:
    """Live processes of one grading run: every job process carries the run's id."""
    mark = f"DPMP_LAB_GRADING_RUN={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if mark not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    continue
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                found.append(entry)
    return found


def grade_the_class(base: Path) -> dict:
    """Both gradings; what the tests read of them."""
    two = course_root(base / "two")
    course.nbgrader("generate_assignment", NAME, "--force", root=two, capture=True)
    released = nbformat.read(two / "course" / NAME / f"{NAME}.ipynb", as_version=4)
    everyone = {**HONEST, **attackers(two)}
    for learner, handed in everyone.items():
        hand_in(two, learner, notebook_of(handed, released))
    one = course_root(base / "one")
    for learner in AGAIN:
        shutil.copytree(two / "submitted" / learner, one / "submitted" / learner)
    for learner, (stamp, secret) in LATE.items():
        (two / "submitted" / learner / NAME / "timestamp.txt").write_text(stamp)
        (two / "submitted" / learner / NAME / "submission_secret.txt").write_text(secret)
    links(two)
    grading.ensure_assignment(NAME, two)
    with grading_job.open_gradebook(course.gradebook_url(two)) as gb:
        gb.update_or_create_assignment(NAME, duedate=DUE)
    with open(two / "nbgrader_config.py", "a") as f:
        f.write('\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
    before = {p: tree_hash(two / p) for p in ("solutions", "nbgrader_config.py",
                                              f"submitted/{VICTIM}/{NAME}")}
    private_tmp = base / "tmp"
    private_tmp.mkdir()
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(private_tmp), str(private_tmp)
    lines: list[str] = []
    out = {"two": two, "one": one, "lines": lines, "before": before, "tmp": private_tmp,
           "everyone": set(everyone)}
    try:
        out["summary_two"] = grading.grade_class(NAME, root=Path(os.path.relpath(two)),
                                                 jobs=2, timeout=LIMIT, limits=LIMITS,
                                                 say=lines.append)
        out["left_two"] = run_processes(out["summary_two"].run_id)
        out["tmp_left"] = sorted(p.name for p in private_tmp.iterdir())
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
    # the second grading without cgroups, as on a machine that has none: rlimits alone must
    # grade honest learners the same
    mounts = limits.cgroup_mounts
    limits.cgroup_mounts = dict
    try:
        out["summary_one"] = grading.grade_class(NAME, root=one, jobs=1, timeout=LIMIT,
                                                 limits=LIMITS, say=lines.append)
    finally:
        limits.cgroup_mounts = mounts
    out["left_one"] = run_processes(out["summary_one"].run_id)
    out["outcomes"] = {o.student: o for o in out["summary_two"].outcomes}
    return out
