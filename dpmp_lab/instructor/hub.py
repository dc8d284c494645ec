"""A JupyterHub for one course on one server: who gets which GPUs, which Jupyter config each
role starts with, and the hub's own settings (deploy/jupyterhub_config.py calls `configure`).

Every learner's JupyterLab runs as their own system account (JupyterHub's LocalProcessSpawner)
from the course's Python environment, with `CUDA_VISIBLE_DEVICES` set by a pre-spawn hook (a
fixed map, else round-robin over the server's GPUs in blocks of `gpus_per_user`, so several
learners may share a GPU), in a home only they can read, with nbgrader's Assignment List and
Validate button and nothing of the instructor's (no formgrader, no course list, no
create-assignment), in their language (LANGUAGE, LANGUAGE_MAP: JupyterLab's language pack, the
library's words, and the assignment's translation when they fetch it: `exchange.LanguageFetch`
of what `exchange.TranslatedRelease` released). The instructors' servers open the course root
with formgrader. Both share one nbgrader exchange; learners submit through
`exchange.PrivateSubmit`, so a submission is readable by its learner and the graders' group
only, and instructors collect through `exchange.OwnerCheckedCollect`, so no learner hands in
under another's name.

A service, not a session: every server runs within a memory, CPU and process limit of its
own (`hub_spawner.LimitedSpawner`, cgroups; systemd's units where systemd runs the machine,
through jupyterhub-systemdspawner), told its share of the cores (DPMP_LAB_CORES); servers and
kernels idle for CULL_IDLE seconds are stopped (jupyterhub-idle-culler, Jupyter's kernel
culler); the hub can stop and start again, under systemd or `hub_supervisor`, without
stopping a learner's server; learners come and go while it runs (a roster file that
`hub_roster` follows, or the admin panel of an instructor); another authenticator (a
university's single sign-on) and its settings plug in by name and a config file of the
server's own.

The settings come from DPMP_LAB_HUB_* environment variables (`HubSettings.from_env`), checked
before the hub starts: bad input is one clear error, never a hub that half works. Nothing here
imports jupyterhub: the classes are named by their entry points.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from pathlib import Path
from typing import Any

from dpmp_lab import i18n
from dpmp_lab.instructor import course, hub_supervisor
from dpmp_lab.instructor.course import COURSE_ID
from dpmp_lab.instructor.hub_settings import (  # noqa: F401 (HubSettings: re-exported)
    PREFIX,
    HubConfigError,
    HubSettings,
)

# what a learner's JupyterLab leaves out of nbgrader: the instructor's tools
LEARNER_SERVER_OFF = ("nbgrader.server_extensions.formgrader",
                      "nbgrader.server_extensions.course_list")
LEARNER_LAB_OFF = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:course-list",
                   "@jupyter/nbgrader:create-assignment")
PRIVATE_SUBMIT = "dpmp_lab.instructor.exchange.PrivateSubmit"
LANGUAGE_FETCH = "dpmp_lab.instructor.exchange.LanguageFetch"
TRANSLATED_RELEASE = "dpmp_lab.instructor.exchange.TranslatedRelease"
LIMITED_SPAWNER = "dpmp_lab.instructor.hub_spawner.LimitedSpawner"
SYSTEMD_SPAWNER = "systemdspawner.SystemdSpawner"
ROSTER_SERVICE = "dpmp_lab.instructor.hub_roster"
# a service of the hub's, run so that it ends with the hub (hub_supervisor.SERVICE)
SERVICE = (sys.executable, "-c", hub_supervisor.SERVICE)
OWNER_CHECKED_COLLECT = "dpmp_lab.instructor.exchange.OwnerCheckedCollect"
APP_SETTINGS = "--LabApp.app_settings_dir"


# What of the checkout the hub runs from no learner may read: the hidden tests (solutions/),
# the wrong answers and their fixes (tests/), the history of both (.git), and grading's
# config, state and output. Learners' servers need the package and .venv, nothing of these.
CHECKOUT_PRIVATE = ("solutions", "tests", ".git", "nbgrader_config.py", "gradebook.db",
                    "submitted", "autograded", "feedback", "reports", ".dpmp_grading")


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


def systemd_runs() -> bool:
    """Whether systemd manages this machine (sd_booted's test)."""
    return Path("/run/systemd/system").is_dir()


def nbgrader_config(settings: HubSettings, role: str) -> str:
    """The nbgrader_config.py of a role: the course and its exchange; the instructor's also
    the course root (formgrader, the command line) and that root's own config."""
    lines = ["c = get_config()  # noqa: F821",
             f"c.CourseDirectory.course_id = {COURSE_ID!r}",
             f"c.Exchange.root = {str(settings.exchange)!r}"]
    if role == "learner":
        lines += [f"c.ExchangeFactory.submit = {PRIVATE_SUBMIT!r}",
                  f"c.ExchangeFactory.fetch_assignment = {LANGUAGE_FETCH!r}"]
    else:
        lines += [f"c.CourseDirectory.root = {str(settings.course)!r}",
                  f"c.ExchangeFactory.collect = {OWNER_CHECKED_COLLECT!r}",
                  f"c.ExchangeFactory.release_assignment = {TRANSLATED_RELEASE!r}",
                  f"load_subconfig({str(settings.course / 'nbgrader_config.py')!r})  # noqa: F821"]
    return "\n".join(lines) + "\n"


def kernel_culling(settings: HubSettings) -> dict:
    """Jupyter's own culler: a kernel idle for CULL_IDLE seconds is shut down (its memory, and
    its rank starter's, given back) while its server runs on."""
    if not settings.cull_idle:
        return {}
    return {"MappingKernelManager": {"cull_idle_timeout": settings.cull_idle,
                                     "cull_interval": cull_every(settings.cull_idle),
                                     "cull_connected": False}}


def cull_every(idle: int) -> int:
    """How often the cullers look: a third of the idle time, between 1 s and 5 minutes."""
    return max(1, min(300, idle // 3))


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
                {"ServerApp": {"jpserver_extensions": dict.fromkeys(off_server, False)},
                 **kernel_culling(settings)}),
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
    """Before a user's server starts: their GPUs, their language (the library's, JupyterLab's
    and the notebooks' a fetch gives), their role's config, their folder (the course root for
    an instructor, for a learner their home, made private)."""
    user = spawner.user.name
    role = settings.role(user)
    home = Path(pwd.getpwnam(user).pw_dir)
    if role == "learner" and home.is_dir() and home.stat().st_uid == pwd.getpwnam(user).pw_uid:
        home.chmod(0o700)
    bindir = str(Path(settings.python).parent)
    language = settings.language_for(user)
    spawner.environment = {
        **spawner.environment,
        "CUDA_VISIBLE_DEVICES": settings.gpus_for(user),
        "DPMP_LAB_CORES": str(settings.cores),
        i18n.LANGUAGE_ENV: language,   # the library's words, and the notebooks a fetch gives
        "JUPYTER_CONFIG_PATH": str(settings.config_dir(role)),
        "PATH": bindir + os.pathsep + "/usr/local/bin:/usr/bin:/bin",
    }
    lab = i18n.lab_settings(language)   # JupyterLab's own words: its language pack
    spawner.args = [a for a in spawner.args if not a.startswith(APP_SETTINGS)] + (
        [] if lab is None else [f"{APP_SETTINGS}={lab}"])
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
    authenticate(c, settings)
    c.JupyterHub.db_url = f"sqlite:///{settings.private / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(settings.private / "jupyterhub_cookie_secret")
    c.JupyterHub.cleanup_servers = False   # a restart of the hub leaves learners working
    c.ConfigurableHTTPProxy.command = [str(proxy)]
    c.ConfigurableHTTPProxy.pid_file = str(settings.private / "proxy.pid")
    if settings.ssl_cert is not None:
        c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = str(settings.ssl_cert), str(settings.ssl_key)
    spawn(c, settings)
    services(c, settings)
    if settings.extra_config is not None:   # last: the server's own word wins
        code = compile(settings.extra_config.read_text(), str(settings.extra_config), "exec")
        exec(code, {"c": c, "get_config": lambda: c, "__file__": str(settings.extra_config)})


def authenticate(c: Any, settings: HubSettings) -> None:
    """Who may log in: the instructors (admins, except with the one shared password of a
    trial: the admin panel adds and removes learners while the hub runs), the learners, the
    roster's (`hub_roster` follows the file); checked by JupyterHub's own allowed_users,
    which every authenticator honours."""
    shared = settings.password and not settings.authenticator
    if settings.authenticator:
        c.JupyterHub.authenticator_class = settings.authenticator
    elif shared:
        c.JupyterHub.authenticator_class = "shared-password"
        c.SharedPasswordAuthenticator.user_password = settings.password
    else:
        c.JupyterHub.authenticator_class = "pam"
    c.Authenticator.allowed_users = set(settings.users)
    if not shared:   # one password for all grants no admin: the roster does the admin's part
        c.Authenticator.admin_users = set(settings.instructors)
    c.Authenticator.allow_existing_users = True   # added by the admin panel or the roster


def spawn(c: Any, settings: HubSettings) -> None:
    """Each server as its user's process, within its limits: systemd's units where systemd
    runs the machine (jupyterhub-systemdspawner, when installed), cgroups otherwise."""
    if systemd_runs() and _installed("systemdspawner"):
        c.JupyterHub.spawner_class = SYSTEMD_SPAWNER
        c.SystemdSpawner.unit_extra_properties = {"TasksMax": str(settings.processes)}
        c.SystemdSpawner.isolate_tmp = True
        c.SystemdSpawner.disable_user_sudo = True
    else:
        c.JupyterHub.spawner_class = LIMITED_SPAWNER
        c.LimitedSpawner.processes = settings.processes
    c.Spawner.mem_limit = settings.memory
    c.Spawner.cpu_limit = settings.cpus
    c.Spawner.cmd = [settings.python, "-m", "jupyterhub.singleuser"]
    c.Spawner.default_url = "/lab"
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 60
    c.Spawner.pre_spawn_hook = lambda spawner: pre_spawn(settings, spawner)


def services(c: Any, settings: HubSettings) -> None:
    """The idle culler and the roster's follower, started and stopped by the hub, each with
    the scopes it needs and no more."""
    listed, roles = [], []
    if settings.cull_idle:
        listed.append({"name": "idle-culler", "command": [
            *SERVICE, "jupyterhub_idle_culler", f"--timeout={settings.cull_idle}",
            f"--cull-every={cull_every(settings.cull_idle)}"]})
        roles.append({"name": "idle-culler", "services": ["idle-culler"], "scopes": [
            "list:users", "read:users:activity", "read:servers", "delete:servers"]})
    if settings.roster is not None:
        listed.append({"name": "roster", "command": [
            *SERVICE, ROSTER_SERVICE, "--roster", str(settings.roster),
            "--keep", ",".join(settings.instructors + settings.learners)]})
        roles.append({"name": "roster", "services": ["roster"], "scopes": [
            "list:users", "read:users", "admin:users", "admin:servers"]})
    c.JupyterHub.services = listed
    c.JupyterHub.load_roles = roles


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
