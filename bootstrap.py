#!/usr/bin/env python3
"""Set up everything and start the course, or set up everything and run the tests.

    python3 bootstrap.py course     # JupyterLab on the course (extra args go to jupyter lab)
    python3 bootstrap.py test       # ruff, pycodestyle, then the whole pytest suite: tests/unit
                                    # first, then the rest (extra args go to pytest instead)
    python3 bootstrap.py hub        # JupyterHub for a class (deploy/jupyterhub_config.py; extra
                                    # args go to jupyterhub)

Both create .venv/ beside this file on first use and install the project into it; later runs
reuse it and reinstall only when pyproject.toml or constraints.txt changed.

torch: a torch already in .venv is kept, except a CPU build where `course` or `hub` finds an
NVIDIA GPU. Otherwise the tests, and the course or the hub on a machine without an NVIDIA GPU,
get the CPU build pinned in constraints.txt; the course or the hub on a machine with an NVIDIA
GPU gets the same torch version from PyPI, whose Linux wheel is the CUDA build.
The course installs pyproject's `course` and `instructor` extras, the hub `hub` (both and
jupyterhub), the tests `dev` (all of it). The hub and the tests also need JupyterHub's proxy,
configurable-http-proxy, which `npm ci` installs into deploy/node_modules from
deploy/package-lock.json.
Only the Python standard library is used here, so this runs on a fresh machine with nothing
but python3.

The browser test (tests/end_to_end/test_browser.py) needs a system Chromium, and the grading tests
need bubblewrap (the sandbox every submission is graded in); the hub test also needs npm. Only under
CI (CI=true) and as root does `test` install Debian's chromium, bubblewrap and npm with apt-get when
they are missing; a learner's machine never gets an apt-get call (there those tests skip and say
why).
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
CONSTRAINTS = ROOT / "constraints.txt"
STAMP = VENV / ".dpmp_lab-installed"
# the learners' nbgrader configuration (Validate's cell timeout), where every nbgrader of the
# environment reads it, wherever a notebook lies: pip's editable install leaves out
# pyproject's data-files, which put it there for a plain install
LEARNER_CONFIG = ROOT / "course" / "nbgrader_config.py"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LINTED = ("dpmp_lab", "tests", "benchmarks", "tools", "bootstrap.py")
# The test tiers, fastest first: pure units (no process started), launches of ranks, then end to
# end (kernels, nbgrader, the class, the hub, the browser). The test command runs the first
# alone and stops there if it fails.
TIERS = ("tests/unit", "tests/launches", "tests/end_to_end")
# pycodestyle's checks that the house style does not follow: hanging indents of 4 under an open
# bracket, operators at line breaks, lambdas assigned, E501 (ruff checks the length), l as a name
PYCODESTYLE_IGNORE = "E121,E123,E126,E226,E24,E704,W503,W504,E501,E731,E741"
# what tests/end_to_end/test_browser.py finds
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# pyproject's extras each command installs: a learner's (and an instructor's) course needs no
# test tools; the tests need everything ("dev" holds course and instructor)
EXTRAS = {"course": ("course", "instructor"), "hub": ("hub",), "test": ("dev",)}
HOLDS = {"dev": {"dev", "course", "instructor", "hub"}, "hub": {"hub", "course", "instructor"}}
DEPLOY = ROOT / "deploy"
# what runs the course on GPUs (a learner's machine, a class's hub) gets the CUDA build where
# nvidia-smi lists a GPU; the tests pin the CPU build
GPU_PURPOSES = ("course", "hub")
PROXY = DEPLOY / "node_modules" / ".bin" / "configurable-http-proxy"


def say(text: str) -> None:
    print(f"[bootstrap] {text}", flush=True)


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv() -> Path:
    python = venv_python()
    if not python.exists():
        if sys.version_info < (3, 10):  # noqa: UP036 - any python3 may run this file
            sys.exit(f"[bootstrap] Python >= 3.10 is needed, this is {sys.version.split()[0]}")
        say(f"creating {VENV.relative_to(ROOT)} with {sys.executable}")
        try:
            venv.EnvBuilder(with_pip=True).create(VENV)
        except Exception as exc:  # Debian's python3 without python3-venv lands here
            shutil.rmtree(VENV, ignore_errors=True)
            sys.exit(f"[bootstrap] could not create a virtual environment ({exc}). On Debian or "
                     "Ubuntu install it first: apt-get install python3-venv")
    return python


def installed_torch(python: Path) -> str | None:
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True, text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def has_nvidia_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def tested_torch() -> str:
    """The torch version constraints.txt pins (its CPU build's, without the +cpu)."""
    for line in CONSTRAINTS.read_text().splitlines():
        if line.startswith("torch=="):
            return line.split(";")[0].removeprefix("torch==").strip().removesuffix("+cpu")
    raise SystemExit("[bootstrap] constraints.txt pins no torch")


def constraints_for(purpose: str, python: Path) -> tuple[str, str]:
    """The constraints to install with, and a word on which torch that means."""
    others = [line for line in CONSTRAINTS.read_text().splitlines()
              if not line.strip().startswith("torch")]
    have = installed_torch(python)
    gpu = purpose in GPU_PURPOSES and has_nvidia_gpu()
    if have and not (gpu and "+cpu" in have):
        return "\n".join(others + [f"torch=={have}"]), f"keeping torch {have}"
    if gpu:
        if have:   # pip counts 2.13.0+cpu as torch==2.13.0: it has to go first
            subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "torch"], cwd=ROOT)
        cuda = f"torch=={tested_torch()}"   # PyPI's Linux wheel of that version is a CUDA build
        return "\n".join(others + [cuda]), (
            f"NVIDIA GPU found: {cuda} from PyPI (CUDA build)"
            + (f", replacing the CPU build {have}" if have else ""))
    return CONSTRAINTS.read_text(), "torch: the CPU build from constraints.txt"


def pip_settings(python: Path) -> dict[str, str]:
    """pip's configuration as pip itself reads it (its files and PIP_* variables, the
    environment's over the install section's over the global one): {option: value}."""
    out = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True,
                         text=True).stdout
    found: dict[str, dict[str, str]] = {}
    for line in out.splitlines():   # global.find-links='/opt/wheels'
        where_key, _, value = line.partition("=")
        where, _, key = where_key.rpartition(".")
        try:
            found.setdefault(key, {})[where] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            continue
    return {key: next(by[w] for w in (":env:", "install", "global") if w in by)
            for key, by in found.items() if {":env:", "install", "global"} & set(by)}


def uv_sources(python: Path) -> tuple[list[str], dict[str, str]]:
    """uv's arguments and environment for the indexes, wheel folders, constraints and
    certificate pip is configured with, so that both install the same thing (uv reads no pip
    configuration); every index may offer every package, as with pip."""
    args, env = ["--index-strategy", "unsafe-best-match"], {}
    settings = pip_settings(python)
    for key, flag in (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
                      ("find-links", "--find-links"), ("constraint", "--constraint")):
        args += [part for value in settings.get(key, "").split() for part in (flag, value)]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    return args, env


def with_uv(python: Path) -> bool:
    """uv in .venv (the version constraints.txt pins), where it installs: it does what pip does
    in about a third of the time (the test command's install: 78 s with pip, 30 s with uv on
    the 2-core machine CI runs on), mostly by unpacking and compiling in parallel."""
    if subprocess.run([str(python), "-m", "uv", "--version"], capture_output=True).returncode == 0:
        return True
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "-c", str(CONSTRAINTS), "uv"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0


def pip_install(python: Path, constraints: str, extras: tuple[str, ...],
                extra: list[str]) -> bool:
    """The project with `extras` into .venv: with uv where uv installs here, else (or where uv
    fails: pip's message is the one a newcomer can search for) with pip."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(constraints + "\n")
    what = ["-c", f.name, "-e", f"{ROOT}[{','.join(extras)}]", *extra]
    try:
        if with_uv(python):
            args, env = uv_sources(python)
            cmd = [str(python), "-m", "uv", "pip", "install", "--python", str(python),
                   "--compile-bytecode", *args, *what]
            if subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}).returncode == 0:
                return True
            say("uv could not install it: pip tries")
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *what]
        return subprocess.run(cmd, cwd=ROOT).returncode == 0
    finally:
        os.unlink(f.name)


def install_learner_config(venv: Path) -> Path:
    """course/nbgrader_config.py as {venv}/etc/jupyter/nbgrader_config.py (nbgrader reads
    jupyter's config path, which holds sys.prefix/etc/jupyter); rewritten when it differs."""
    dest = venv / "etc" / "jupyter" / "nbgrader_config.py"
    text = LEARNER_CONFIG.read_text()
    if not dest.exists() or dest.read_text() != text:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    return dest


def ensure_installed(purpose: str) -> Path:
    python = ensure_venv()
    install_learner_config(VENV)
    digest = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()
    ).hexdigest()
    # the stamp: the digest, then the extras installed with it (one per line)
    digest_then_extras = STAMP.read_text().split("\n") if STAMP.exists() else [""]
    recorded = set(digest_then_extras[1:]) if digest_then_extras[0] == digest else set()
    if set(EXTRAS[purpose]) <= set().union(*(HOLDS.get(e, {e}) for e in recorded)):
        return python
    extras = tuple(sorted(set(EXTRAS[purpose]) | recorded))
    constraints, which_torch = constraints_for(purpose, python)
    say(f"installing dpmp_lab[{','.join(extras)}] into .venv ({which_torch})")
    ok = pip_install(python, constraints, extras, [])
    if not ok and "+cpu" in constraints and sys.platform.startswith("linux"):
        say(f"the CPU build of torch is not on this machine's indexes: trying {CPU_INDEX}")
        ok = pip_install(python, constraints, extras, ["--extra-index-url", CPU_INDEX])
    if not ok:
        sys.exit("[bootstrap] installation failed (see pip's message above)")
    STAMP.write_text("\n".join([digest, *extras]))
    return python


def ensure_ci_packages() -> None:
    """CI only (CI=true, root, apt-get): Debian's chromium for the browser test and bubblewrap
    for the grading sandbox, when they are missing."""
    if os.environ.get("CI", "").lower() != "true" or os.name != "posix" or os.geteuid() != 0:
        return
    if not shutil.which("apt-get"):
        return
    wanted = ([] if any(shutil.which(name) for name in BROWSERS) else ["chromium"]) + (
        [] if shutil.which("bwrap") else ["bubblewrap"]) + (
        [] if shutil.which("npm") else ["npm"])
    if not wanted:
        return
    say(f"CI: installing Debian's {' and '.join(wanted)} (the browser test, the grading "
        "sandbox, the hub's proxy)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", *wanted]):
        if subprocess.run(cmd, env=env).returncode:
            sys.exit(f"[bootstrap] `{' '.join(cmd)}` failed: the tests need {', '.join(wanted)}")


def ensure_proxy(required: bool) -> None:
    """JupyterHub's proxy in deploy/node_modules, as deploy/package-lock.json pins it (`npm
    ci`), when it is missing; without npm the hub cannot start (`hub`) and its test skips."""
    if PROXY.exists():
        return
    if not shutil.which("npm"):
        if required:
            sys.exit("[bootstrap] npm is needed for JupyterHub's proxy (Debian or Ubuntu: "
                     "apt-get install npm)")
        say("no npm here: the JupyterHub test will skip (apt-get install npm)")
        return
    say("installing JupyterHub's proxy (configurable-http-proxy) into deploy/node_modules")
    cmd = ["npm", "ci", "--no-audit", "--no-fund", "--prefix", str(DEPLOY)]
    if subprocess.run(cmd, cwd=DEPLOY).returncode and required:
        sys.exit("[bootstrap] `npm ci` failed in deploy/ (see npm's message above)")


def run(cmd: list[str]) -> int:
    return subprocess.run(cmd, cwd=ROOT).returncode


def compile_package(python: Path) -> None:
    """Write the package's bytecode now (quick when it is current). Its install is editable, so
    pip compiled none of it, and where PYTHONDONTWRITEBYTECODE is set (the machines this project
    is built and tested on set it) no import writes it either: every kernel, rank server and
    grading job would compile the package's ~100 modules from source again, about 0.3
    CPU-seconds each (a tenth of the suite's CPU)."""
    subprocess.run([str(python), "-m", "compileall", "-q", str(ROOT / "dpmp_lab")], cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in EXTRAS:
        print(__doc__)
        return 2
    purpose, rest = argv[0], argv[1:]
    python = ensure_installed(purpose)
    compile_package(python)
    if purpose == "course":
        say("starting JupyterLab on the course (Ctrl-C to stop)")
        cmd = [str(python), "-m", "dpmp_lab.cli", "lab", *rest]
        if os.name == "posix":  # become JupyterLab, so Ctrl-C reaches it alone
            os.chdir(ROOT)
            os.execv(cmd[0], cmd)
        return run(cmd)
    if purpose == "hub":
        ensure_proxy(required=True)
        say("starting JupyterHub (deploy/jupyterhub_config.py), started again if it dies; "
            "Ctrl-C stops the hub, not the learners' servers")
        cmd = [str(python), "-m", "dpmp_lab.instructor.hub_supervisor",
               "-f", str(DEPLOY / "jupyterhub_config.py"), *rest]
        os.chdir(ROOT)
        os.execv(cmd[0], cmd)
    ensure_ci_packages()
    ensure_proxy(required=False)
    say("ruff")
    code = run([str(python), "-m", "ruff", "check", *LINTED])
    if code:
        return code
    say("pycodestyle (continuation lines and blank lines, which ruff checks only in preview)")
    code = run([str(python), "-m", "pycodestyle", "--max-line-length=100",
                f"--ignore={PYCODESTYLE_IGNORE}", *LINTED])
    if code:
        return code
    if rest:   # the caller chooses what to run
        say("pytest")
        return run([str(python), "-m", "pytest", *workers(rest), *rest])
    unit, *slower = TIERS
    say(f"pytest, the fast tier first: {unit} (no process started, seconds)")
    code = run([str(python), "-m", "pytest", "-n", "0", unit])
    if code:
        return code
    say(f"pytest: {', '.join(slower)}")
    return run([str(python), "-m", "pytest", *workers(rest), *slower])


def workers(rest: list[str]) -> list[str]:
    """Two pytest-xdist workers unless the arguments choose, on the 2-core machines the suite is
    timed on: the course's and the class's grading fixtures keep both cores busy for minutes,
    and the files that mostly wait (the hub, the browser) start right after them
    (tests/conftest.py's FIRST). A third worker, running those beside the fixtures, left fewer
    cores idle but gave 892 s and then 930 s for two workers' 901 and 906 s, and a test that
    times a hang failed under its load. Each file runs whole on one worker (tests/conftest.py's
    collection order, with --dist=loadfile)."""
    chosen = any(a in ("-n", "--numprocesses", "no:xdist")
                 or a.startswith(("-n", "--numprocesses=")) for a in rest)
    return [] if chosen else ["-n", "2"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
