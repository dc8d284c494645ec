"""The settings of the course's hub: DPMP_LAB_HUB_* environment variables, read and checked
before the hub starts (`HubSettings.from_env`), so that bad input is one clear error, never a
hub that half works; the roster file the hub follows while it runs; the server's GPUs. What the
hub does with them is hub.py's.
"""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dpmp_lab.i18n.messages import LANGUAGES, SOURCE

PREFIX = "DPMP_LAB_HUB_"
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
GPU_ID = re.compile(r"\d+")
MEMORY = re.compile(r"(\d+(?:\.\d+)?)([KMGT])", re.IGNORECASE)
BYTES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class HubConfigError(ValueError):
    """A DPMP_LAB_HUB_* setting the hub cannot start with; the message says which and why."""


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


def _per_user(text: str, what: str, form: str, value) -> dict:
    """`alice=X; bob=Y` -> {"alice": value("X"), "bob": value("Y")}; an entry without `=`,
    or whose value `value` turns into None, is refused as not USER=`form`."""
    mapping = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        user, sep, given = entry.partition("=")
        parsed = value(given.strip()) if sep else None
        if parsed is None:
            raise HubConfigError(f"{PREFIX}{what}: {entry!r} is not USER={form}")
        [name] = _names(user, what) or ("",)
        mapping[name] = parsed
    return mapping


def parse_gpu_map(text: str) -> dict[str, tuple[str, ...]]:
    """`alice=0,1; bob=2` -> {"alice": ("0", "1"), "bob": ("2",)}: fixed GPUs for some users."""
    return _per_user(text, "GPU_MAP", "GPU[,GPU...]", lambda g: _gpu_ids(g, "GPU_MAP"))


def parse_language_map(text: str) -> dict[str, str]:
    """`alice=ja; bob=ja` -> {"alice": "ja", "bob": "ja"}: the course's language for some
    users, where it is not the hub's LANGUAGE."""
    return _per_user(text, "LANGUAGE_MAP",
                     f"LANGUAGE, the language one of {', '.join(LANGUAGES)}",
                     lambda language: language if language in LANGUAGES else None)


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
    memory: str = "4G"            # each server's memory limit, kernels and ranks included
    cpus: float = 2.0             # each server's CPU time, in CPUs
    processes: int = 4096         # processes and threads a server may run at once
    cull_idle: int = 3600         # seconds idle before a server or kernel stops; 0: never
    roster: Path | None = None    # a CSV whose `id` column names learners, read while running
    authenticator: str | None = None  # another authenticator, by entry point or class
    extra_config: Path | None = None  # the server's own config for it, read last
    ssl_cert: Path | None = None
    ssl_key: Path | None = None
    language: str = SOURCE        # the course's language for every user not in language_map
    language_map: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.instructors:
            raise HubConfigError(f"{PREFIX}INSTRUCTORS: name at least one instructor")
        both = sorted(set(self.instructors) & set(self.learners))
        if both:
            raise HubConfigError(f"both instructor and learner: {', '.join(both)}")
        if not (self.course / "nbgrader_config.py").is_file():
            raise HubConfigError(f"{PREFIX}COURSE={self.course}: no nbgrader_config.py "
                                 "there (the instructor's course root)")
        memory_bytes(self.memory)
        if not 0 < self.cpus <= 4096:
            raise HubConfigError(f"{PREFIX}CPUS={self.cpus}: a number of CPUs above 0")
        if self.processes < 64 or self.cull_idle < 0:
            raise HubConfigError(f"{PREFIX}PROCESSES={self.processes} (at least 64) or "
                                 f"{PREFIX}CULL_IDLE={self.cull_idle} (0 or more seconds)")
        if (self.ssl_cert is None) != (self.ssl_key is None):
            raise HubConfigError(f"{PREFIX}SSL_CERT and {PREFIX}SSL_KEY go together")
        for what, path in (("SSL_CERT", self.ssl_cert), ("SSL_KEY", self.ssl_key),
                           ("ROSTER", self.roster), ("CONFIG", self.extra_config)):
            if path is not None and not path.is_file():
                raise HubConfigError(f"{PREFIX}{what}={path}: no such file")
        if self.roster is not None:
            read_roster(self.roster)   # a bad roster stops the hub before it starts
        if self.extra_config is not None:
            check_owned_by_root(self.extra_config, "CONFIG")
        if self.gpus_per_user < 1 or (self.gpus and self.gpus_per_user > len(self.gpus)):
            raise HubConfigError(f"{PREFIX}GPUS_PER_USER={self.gpus_per_user}: between 1 and "
                                 f"the server's {len(self.gpus)} GPUs")
        self._only_users(self.gpu_map, "GPU_MAP")
        missing = sorted({g for gs in self.gpu_map.values() for g in gs} - set(self.gpus))
        if missing:
            raise HubConfigError(f"{PREFIX}GPU_MAP: no such GPU on this server: "
                                 f"{', '.join(missing)} (it has {', '.join(self.gpus) or 'none'})")
        if self.language not in LANGUAGES:
            raise HubConfigError(f"{PREFIX}LANGUAGE={self.language!r}: one of "
                                 f"{', '.join(LANGUAGES)}")
        self._only_users(self.language_map, "LANGUAGE_MAP")
        if self.password is not None and len(self.password) < 8:
            raise HubConfigError(f"{PREFIX}PASSWORD: at least 8 characters")
        if not os.access(self.python, os.X_OK):
            raise HubConfigError(f"{PREFIX}PYTHON={self.python} is not a program")

    def _only_users(self, mapping: Mapping[str, object], what: str) -> None:
        unknown = sorted(set(mapping) - set(self.users))
        if unknown:
            raise HubConfigError(f"{PREFIX}{what} names no user of the course: "
                                 f"{', '.join(unknown)}")

    @property
    def users(self) -> tuple[str, ...]:
        """Instructors, then learners, then the roster's learners (read now: a learner added
        to it while the hub runs comes last, so nobody else's GPUs move)."""
        listed = self.instructors + self.learners
        extra = read_roster(self.roster) if self.roster is not None else ()
        return listed + tuple(u for u in extra if u not in listed)

    @property
    def cores(self) -> int:
        """DPMP_LAB_CORES of every server: the whole CPUs of its share, at least one."""
        return max(1, math.floor(self.cpus))

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
        path = lambda key: Path(get(key)).resolve() if get(key) else None  # noqa: E731
        numbers = {}
        for key, kind, default in (("CPUS", float, "2"), ("PROCESSES", int, "4096"),
                                   ("CULL_IDLE", int, "3600")):
            try:
                numbers[key] = kind(get(key, default))
            except ValueError:
                raise HubConfigError(f"{PREFIX}{key}={get(key)!r} is not a number") from None
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
            memory=get("MEMORY", "4G"),
            cpus=numbers["CPUS"],
            processes=numbers["PROCESSES"],
            cull_idle=numbers["CULL_IDLE"],
            roster=path("ROSTER"),
            authenticator=get("AUTHENTICATOR") or None,
            extra_config=path("CONFIG"),
            ssl_cert=path("SSL_CERT"),
            ssl_key=path("SSL_KEY"),
            language=get("LANGUAGE", SOURCE).strip(),
            language_map=parse_language_map(get("LANGUAGE_MAP", "")),
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

    def language_for(self, user: str) -> str:
        """The language `user`'s course opens in: their entry of the map, else the hub's."""
        return self.language_map.get(user, self.language)

    def role(self, user: str) -> str:
        return "instructor" if user in self.instructors else "learner"

    def config_dir(self, role: str) -> Path:
        return self.state / "jupyter-config" / role

    @property
    def private(self) -> Path:
        """The hub's own files (database, cookie secret, proxy pid): root's alone."""
        return self.state / "hub"


def memory_bytes(text: str) -> int:
    """'4G' -> 4 GiB in bytes (K, M, G, T: powers of 1024, as JupyterHub reads mem_limit)."""
    found = MEMORY.fullmatch(text.strip())
    if not found or float(found[1]) * BYTES[found[2].upper()] < 256 * 2**20:
        raise HubConfigError(f"{PREFIX}MEMORY={text!r}: a size such as 4G or 2048M, at least "
                             "256M (a kernel with torch and its rank starter need about 500M)")
    return int(float(found[1]) * BYTES[found[2].upper()])


def read_roster(path: Path) -> tuple[str, ...]:
    """The accounts of a roster CSV (nbgrader's `db student import` form: an `id` column, the
    account a learner logs in with; other columns are nbgrader's), in the file's order. One
    that any account may write is refused: a learner could let strangers in, or put everyone
    else out (the follower stops the servers of whoever leaves it)."""
    try:
        if path.stat().st_mode & 0o002:
            raise HubConfigError(f"{PREFIX}ROSTER={path}: any account may write it: `chmod o-w "
                                 f"{path}`")
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows, columns = list(reader), reader.fieldnames or ()
    except (OSError, UnicodeDecodeError, csv.Error) as bad:
        raise HubConfigError(f"{PREFIX}ROSTER={path}: cannot read it ({bad})") from None
    if "id" not in columns:   # an empty file too: one being written
        raise HubConfigError(f"{PREFIX}ROSTER={path}: no `id` column (the accounts), as "
                             "`nbgrader db student import` reads")
    names = tuple(dict.fromkeys((row.get("id") or "").strip() for row in rows))
    return _names(" ".join(n for n in names if n), "ROSTER")


def check_owned_by_root(path: Path, what: str) -> None:
    """A file the hub runs as root: nobody else may have written it."""
    st = path.stat()
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        raise HubConfigError(f"{PREFIX}{what}={path}: the hub runs it as root, so it must be "
                             f"root's and writable by root alone (`chown root {path} && "
                             f"chmod go-w {path}`)")
