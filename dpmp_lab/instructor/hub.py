"""A JupyterHub for one course on one server: who gets which GPUs, which Jupyter config each
role starts with, and the hub's own settings (deploy/jupyterhub_config.py calls `configure`).

Every learner's JupyterLab runs as their own system account (JupyterHub's LocalProcessSpawner)
from the course's Python environment, with `CUDA_VISIBLE_DEVICES` set by a pre-spawn hook (a
fixed map, else round-robin over the server's GPUs in blocks of `gpus_per_user`, so several
learners may share a GPU), in a home only they can read, with nbgrader's Assignment List and
Validate button and nothing of the instructor's (no formgrader, no course list, no
create-assignment). The instructors' servers open the course root with formgrader. Both
share one nbgrader exchange; learners submit through `exchange.PrivateSubmit`, so a
submission is readable by its learner and the graders' group only, and instructors collect
through `exchange.OwnerCheckedCollect`, so no learner hands in under another's name.

The settings come from DPMP_LAB_HUB_* environment variables (`HubSettings.from_env`), checked
before the hub starts: bad input is one clear error, never a hub that half works. Nothing here
imports jupyterhub: the classes are named by their entry points.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmp_lab.instructor import course
from dpmp_lab.instructor.course import COURSE_ID

PREFIX = "DPMP_LAB_HUB_"
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
GPU_ID = re.compile(r"\d+")
# what a learner's JupyterLab leaves out of nbgrader: the instructor's tools
LEARNER_SERVER_OFF = ("nbgrader.server_extensions.formgrader",
                      "nbgrader.server_extensions.course_list")
LEARNER_LAB_OFF = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:course-list",
                   "@jupyter/nbgrader:create-assignment")
PRIVATE_SUBMIT = "dpmp_lab.instructor.exchange.PrivateSubmit"
OWNER_CHECKED_COLLECT = "dpmp_lab.instructor.exchange.OwnerCheckedCollect"


# What of the checkout the hub runs from no learner may read: the hidden tests (solutions/),
# the wrong answers and their fixes (tests/), the history of both (.git), and grading's
# config, state and output. Learners' servers need the package and .venv, nothing of these.
CHECKOUT_PRIVATE = ("solutions", "tests", ".git", "nbgrader_config.py", "gradebook.db",
                    "submitted", "autograded", "feedback", "reports", ".dpmp_grading")


class HubConfigError(ValueError):
    """A DPMP_LAB_HUB_* setting the hub cannot start with; the message says which and why."""


def open_to_others(checkout: Path) -> list[Path]:
    """The private parts of `checkout` (CHECKOUT_PRIVATE) another account may read or enter."""
    return course.open_to_others(checkout, CHECKOUT_PRIVATE)


def check_checkout(checkout: Path) -> None:
    """Refuse to serve learners from a checkout whose hidden tests they could read."""
    open_parts = open_to_others(checkout)
    if open_parts:
        names = " ".join(str(p) for p in open_parts)
        raise HubConfigError(
            f"every learner's account could read {', '.join(p.name for p in open_parts)} in "
            f"{checkout}, the checkout the hub runs from (the hidden tests, the wrong answers "
            f"and their fixes, grading's state): `chmod go-rwx {names}` first (the hub and "
            "the learners' servers need only the package and .venv)")


def _listed(text: str, what: str, form: re.Pattern, kind: str) -> tuple[str, ...]:
    """The comma- or space-separated items of a setting, each of `form`, else which are not."""
    items = tuple(item for item in re.split(r"[,\s]+", text.strip()) if item)
    bad = [item for item in items if not form.fullmatch(item)]
    if bad:
        raise HubConfigError(f"{PREFIX}{what}: not a {kind}: {', '.join(bad)}")
    return items


def _names(text: str, what: str) -> tuple[str, ...]:
    return _listed(text, what, USER_NAME, "user name")


def _gpu_ids(text: str, what: str) -> tuple[str, ...]:
    return _listed(text, what, GPU_ID, "GPU number")


def server_gpus() -> tuple[str, ...]:
    """The GPUs of this server, by `nvidia-smi -L` (none without it)."""
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as hung:
        raise HubConfigError(f"`nvidia-smi -L` did not answer in 30 s: name the GPUs in "
                             f"{PREFIX}GPUS") from hung
    count = sum(line.startswith("GPU ") for line in done.stdout.splitlines())
    return tuple(str(i) for i in range(count)) if done.returncode == 0 else ()


def parse_gpu_map(text: str) -> dict[str, tuple[str, ...]]:
    """`alice=0,1; bob=2` -> {"alice": ("0", "1"), "bob": ("2",)}: fixed GPUs for some users."""
    mapping = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        user, sep, gpus = entry.partition("=")
        if not sep:
            raise HubConfigError(f"{PREFIX}GPU_MAP: {entry!r} is not USER=GPU[,GPU...]")
        [name] = _names(user, "GPU_MAP") or ("",)
        mapping[name] = _gpu_ids(gpus, "GPU_MAP")
    return mapping


@dataclass(frozen=True)
class HubSettings:
    """One course on one server. `course`: the instructor's course root (nbgrader_config.py,
    solutions/, the gradebook); `exchange`: nbgrader's exchange root; `state`: the hub's
    database, cookie secret and the roles' Jupyter config; `python`: the interpreter every
    single-user server runs (the course's environment, executable by every learner)."""

    course: Path
    exchange: Path
    state: Path
    instructors: tuple[str, ...]
    learners: tuple[str, ...]
    gpus: tuple[str, ...] = ()
    gpus_per_user: int = 1
    gpu_map: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    python: str = sys.executable
    password: str | None = None   # one password for all (trials, tests), else PAM

    def __post_init__(self) -> None:
        if not self.instructors:
            raise HubConfigError(f"{PREFIX}INSTRUCTORS: name at least one instructor")
        both = sorted(set(self.instructors) & set(self.learners))
        if both:
            raise HubConfigError(f"both instructor and learner: {', '.join(both)}")
        if not (self.course / "nbgrader_config.py").is_file():
            raise HubConfigError(f"{PREFIX}COURSE={self.course}: no nbgrader_config.py "
                                 "there (the instructor's course root)")
        if self.gpus_per_user < 1 or (self.gpus and self.gpus_per_user > len(self.gpus)):
            raise HubConfigError(f"{PREFIX}GPUS_PER_USER={self.gpus_per_user}: between 1 and "
                                 f"the server's {len(self.gpus)} GPUs")
        unknown = sorted(set(self.gpu_map) - set(self.users))
        if unknown:
            raise HubConfigError(f"{PREFIX}GPU_MAP names no user of the course: "
                                 f"{', '.join(unknown)}")
        missing = sorted({g for gs in self.gpu_map.values() for g in gs} - set(self.gpus))
        if missing:
            raise HubConfigError(f"{PREFIX}GPU_MAP: no such GPU on this server: "
                                 f"{', '.join(missing)} (it has {', '.join(self.gpus) or 'none'})")
        if self.password is not None and len(self.password) < 8:
            raise HubConfigError(f"{PREFIX}PASSWORD: at least 8 characters")
        if not os.access(self.python, os.X_OK):
            raise HubConfigError(f"{PREFIX}PYTHON={self.python} is not a program")

    @property
    def users(self) -> tuple[str, ...]:
        return self.instructors + self.learners

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HubSettings:
        """The settings from DPMP_LAB_HUB_* variables (docs/instructor-guide.md, "Running a
        class on a GPU server"); COURSE and INSTRUCTORS are required."""
        env = os.environ if environ is None else environ
        get = lambda key, default=None: env.get(PREFIX + key, default)  # noqa: E731
        if not get("COURSE"):
            raise HubConfigError(f"{PREFIX}COURSE is not set: the instructor's course root")
        per_user = get("GPUS_PER_USER", "1")
        if not per_user.isdigit():
            raise HubConfigError(f"{PREFIX}GPUS_PER_USER={per_user!r} is not a number")
        gpus = get("GPUS")
        return cls(
            course=Path(get("COURSE")).resolve(),
            exchange=Path(get("EXCHANGE", "/srv/nbgrader/exchange")),
            state=Path(get("STATE", "/srv/dpmp_lab_hub")),
            instructors=_names(get("INSTRUCTORS", ""), "INSTRUCTORS"),
            learners=_names(get("LEARNERS", ""), "LEARNERS"),
            gpus=server_gpus() if gpus is None else _gpu_ids(gpus, "GPUS"),
            gpus_per_user=int(per_user),
            gpu_map=parse_gpu_map(get("GPU_MAP", "")),
            python=get("PYTHON", sys.executable),
            password=get("PASSWORD") or None,
        )

    def gpus_for(self, user: str) -> str:
        """CUDA_VISIBLE_DEVICES for `user`: the fixed map, else the user's block in the
        round-robin over the server's GPUs (by their place in the roster); '' without GPUs."""
        if user in self.gpu_map:
            return ",".join(self.gpu_map[user])
        if not self.gpus or user not in self.users:
            return ""
        n, k = len(self.gpus), self.gpus_per_user
        start = self.users.index(user) * k
        return ",".join(self.gpus[(start + j) % n] for j in range(k))

    def role(self, user: str) -> str:
        return "instructor" if user in self.instructors else "learner"

    def config_dir(self, role: str) -> Path:
        return self.state / "jupyter-config" / role

    @property
    def private(self) -> Path:
        """The hub's own files (database, cookie secret, proxy pid): root's alone."""
        return self.state / "hub"


def nbgrader_config(settings: HubSettings, role: str) -> str:
    """The nbgrader_config.py of a role: the course and its exchange; the instructor's also
    the course root (formgrader, the command line) and that root's own config."""
    lines = ["c = get_config()  # noqa: F821",
             f"c.CourseDirectory.course_id = {COURSE_ID!r}",
             f"c.Exchange.root = {str(settings.exchange)!r}"]
    if role == "learner":
        lines.append(f"c.ExchangeFactory.submit = {PRIVATE_SUBMIT!r}")
    else:
        lines += [f"c.CourseDirectory.root = {str(settings.course)!r}",
                  f"c.ExchangeFactory.collect = {OWNER_CHECKED_COLLECT!r}",
                  f"load_subconfig({str(settings.course / 'nbgrader_config.py')!r})  # noqa: F821"]
    return "\n".join(lines) + "\n"


def write_role_configs(settings: HubSettings) -> dict[str, Path]:
    """Write each role's Jupyter config folder (JUPYTER_CONFIG_PATH of its servers), readable
    by all, and make the hub's private folder beside them; the state folder above both can
    be crossed but not listed."""
    settings.state.mkdir(parents=True, exist_ok=True)
    settings.state.chmod(0o711)
    settings.private.mkdir(exist_ok=True)
    settings.private.chmod(0o700)
    made = {}
    for role in ("learner", "instructor"):
        folder = settings.config_dir(role)
        (folder / "labconfig").mkdir(parents=True, exist_ok=True)
        off_server = LEARNER_SERVER_OFF if role == "learner" else ()
        off_lab = LEARNER_LAB_OFF if role == "learner" else ()
        files = {
            "nbgrader_config.py": nbgrader_config(settings, role),
            "jupyter_server_config.json": json.dumps(
                {"ServerApp": {"jpserver_extensions": dict.fromkeys(off_server, False)}}),
            "labconfig/page_config.json": json.dumps(
                {"disabledExtensions": dict.fromkeys(off_lab, True)}),
        }
        for name, text in files.items():
            (folder / name).write_text(text)
            (folder / name).chmod(0o644)
        for path in (folder.parent, folder, folder / "labconfig"):
            path.chmod(0o755)
        made[role] = folder
    return made


def prepare_exchange(settings: HubSettings) -> Path:
    """The exchange root, writable by all but sticky (nbgrader sets 777 and keeps a sticky
    bit: without it any learner could rename the course's folder and put one of their own in
    its place), and the course's folder in it, made now and owned by the first instructor,
    so that no learner makes it first. The course's folder."""
    instructor = settings.instructors[0]
    try:
        account = pwd.getpwnam(instructor)
    except KeyError:
        raise HubConfigError(f"{PREFIX}INSTRUCTORS: no account {instructor!r} on this "
                             "server") from None
    settings.exchange.mkdir(parents=True, exist_ok=True)
    settings.exchange.chmod(0o1777)
    course = settings.exchange / COURSE_ID
    if not course.exists():
        course.mkdir(mode=0o755)
        os.chown(course, account.pw_uid, account.pw_gid)
    if course.stat().st_uid != account.pw_uid:
        raise HubConfigError(f"{course} belongs to uid {course.stat().st_uid}, not to the "
                             f"instructor {instructor}: remove it (a learner may have made it)")
    return course


def pre_spawn(settings: HubSettings, spawner: Any) -> None:
    """Before a user's server starts: their GPUs, their role's config, their folder (the
    course root for an instructor, for a learner their home, made private)."""
    user = spawner.user.name
    role = settings.role(user)
    home = Path(pwd.getpwnam(user).pw_dir)
    if role == "learner" and home.is_dir() and home.stat().st_uid == pwd.getpwnam(user).pw_uid:
        home.chmod(0o700)
    bindir = str(Path(settings.python).parent)
    spawner.environment = {
        **spawner.environment,
        "CUDA_VISIBLE_DEVICES": settings.gpus_for(user),
        "JUPYTER_CONFIG_PATH": str(settings.config_dir(role)),
        "PATH": bindir + os.pathsep + "/usr/local/bin:/usr/bin:/bin",
    }
    spawner.notebook_dir = str(settings.course if role == "instructor" else home)


def configure(c: Any, settings: HubSettings, proxy: Path, checkout: Path) -> None:
    """Fill JupyterHub's config `c` for the course; `proxy`: configurable-http-proxy;
    `checkout`: the project's checkout the hub runs from, whose private parts learners must
    not be able to read (check_checkout)."""
    check_checkout(checkout)
    if not os.access(proxy, os.X_OK):
        raise HubConfigError(f"no proxy at {proxy}: install it with `npm ci --prefix "
                             f"{proxy.parents[2]}` (python3 bootstrap.py hub does)")
    write_role_configs(settings)
    prepare_exchange(settings)
    c.JupyterHub.authenticator_class = "shared-password" if settings.password else "pam"
    if settings.password:
        c.SharedPasswordAuthenticator.user_password = settings.password
    c.Authenticator.allowed_users = set(settings.users)
    c.JupyterHub.spawner_class = "localprocess"
    c.JupyterHub.db_url = f"sqlite:///{settings.private / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(settings.private / "jupyterhub_cookie_secret")
    c.ConfigurableHTTPProxy.command = [str(proxy)]
    c.ConfigurableHTTPProxy.pid_file = str(settings.private / "proxy.pid")
    c.Spawner.cmd = [settings.python, "-m", "jupyterhub.singleuser"]
    c.Spawner.default_url = "/lab"
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 60
    c.Spawner.pre_spawn_hook = lambda spawner: pre_spawn(settings, spawner)
