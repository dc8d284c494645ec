"""The sandbox an untrusted submission runs in: bubblewrap (Linux), built from a whitelist.

A learner's notebook is code the instructor did not write, executed by nbgrader in a kernel of
its own. Inside the sandbox that kernel, and every rank it launches, sees:

    /usr /bin /lib ...      the system, read-only (and from /etc only what programs need)
    python, venv, dpmp_lab  this interpreter's prefixes and site-packages, and the package's
                            own folder, read-only: never the checkout around it, never an entry
                            of the grader's PYTHONPATH or sys.path
    /job/work               a private copy of the submission's folder: its working directory
    /job/home, /tmp         a private home and temp folder
    /dev/shm                a folder of the job's (bounded and measured with its disk)
    /job/exchange           the grader's requests from the harness and the answers
    the kernel folder       the connection file and ipc sockets, at the same path as outside

and nothing else: not the course root (gradebook, solutions/, other learners, feedback), not
the grader's scratch folders, not the instructor's home, no network but its own loopback,
no process outside its own pid namespace (so nothing it starts survives it), no capability.
It runs as an unprivileged host user, never mapped to root: graded as root, the sandbox
(bwrap, which stays root to make the mounts) drops to SANDBOX_UID before the command starts,
so neither its environment nor its memory (/proc/1/...) is the sandbox's to read or write;
graded as another user, a user namespace maps the sandbox's user to that one. bwrap itself
starts with an empty environment: only what `env` gives the command exists inside. Limits
(memory, processes, disk, time) are the job's, in limits.py.

Only the standard library (and the package's own words, i18n) here: `dpmp-lab doctor` asks
`problem()` on machines without jupyter. The kernel manager that starts a kernel this way is
in sandbox_kernel.py.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from dpmp_lab._helpers import PACKAGE_DIR
from dpmp_lab.i18n.messages import _

WORK = "/job/work"     # the kernel's working directory inside
HOME = "/job/home"
EXCHANGE = "/job/exchange"   # the harness's requests and the kernel's answers
SHM = "/dev/shm"
# graded as root, the sandbox runs as this host user (nobody): no file of the machine is its
SANDBOX_UID = SANDBOX_GID = 65534

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# from /etc, what the dynamic linker, Python, torch, matplotlib and name lookups read; not
# shadow files, ssh keys, sudoers or the machine's secrets
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf",
       "hosts", "host.conf", "localtime", "timezone", "ssl/certs", "ca-certificates",
       "fonts", "mime.types", "os-release", "alternatives", "matplotlibrc")
# environment variables a kernel keeps (by prefix); everything else, the instructor's tokens
# and keys included, stays outside
KEEP_ENV = ("LANG", "LC_", "TZ", "TERM", "PYTHONHASHSEED", "PYTHONWARNINGS",
            "DPMP_LAB_", "NBGRADER_", "CUDA_", "NCCL_", "GLOO_", "TORCH_", "OMP_", "MKL_",
            "OPENBLAS_", "MPLBACKEND", "NVIDIA_", "PYDEVD_")


def bwrap() -> str | None:
    """The bubblewrap program, or None."""
    return shutil.which("bwrap")


def problem() -> str | None:
    """Why the sandbox cannot run here, or None when it works (checked once per process by
    running `true` in it, the way a kernel is run), in the language of the moment."""
    if not sys.platform.startswith("linux"):
        return _("the sandbox is Linux-only (bubblewrap); this is {platform}: grade on a "
                 "Linux machine, or pass --no-sandbox to run submissions unsandboxed"
                 ).format(platform=sys.platform)
    if bwrap() is None:
        return _("bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap; "
                 "Fedora: dnf install bubblewrap)")
    found = _probe()
    if found is None:
        return None
    could_start, detail = found
    if not could_start:
        return _("bubblewrap could not start: {error}").format(error=detail)
    return _("bubblewrap refused to start a sandbox: {why} (unprivileged user namespaces may be "
             "off: sysctl kernel.unprivileged_userns_clone, or AppArmor's "
             "apparmor_restrict_unprivileged_userns on Ubuntu)").format(why=detail)


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[bool, str] | None:
    """None when a sandbox runs; else (whether bwrap started, what went wrong), kept apart
    from the words so that problem() speaks the language of the moment."""
    # a folder of its own: a pid is no name another process (in another pid namespace, or
    # once this one is gone) cannot have too
    scratch = Path(tempfile.mkdtemp(prefix="dpmp-sandbox-probe-"))
    rw = {scratch / "work": WORK, scratch / "home": HOME, scratch / "tmp": "/tmp"}
    for path in rw:
        path.mkdir(parents=True, exist_ok=True)
    give_to_sandbox(*rw)
    try:
        done = subprocess.run(argv(["/bin/sh", "-c", "test -w /job/work && ! test -w /usr"],
                                   rw=rw, env={"PATH": "/usr/bin:/bin"}),
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode:
        return True, (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return None


def argv(command: Sequence[str], *, rw: dict[Path, str], env: dict[str, str],
         chdir: str = WORK, hidden: Iterable[Path] = ()) -> list[str]:
    """The command line that runs `command` in the sandbox (`env -i bwrap ...`).

    rw: writable folders, outside path -> path inside (see `give_to_sandbox`). env: the whole
    environment inside. hidden: folders that must not be visible even where a read-only bind
    would contain them (the course root, the grader's scratch): masked with an empty tmpfs.
    """
    args = ["/usr/bin/env", "-i", bwrap() or "bwrap", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev"]
    if os.geteuid() == 0:
        # no user namespace: the command becomes SANDBOX_UID (setpriv), unprivileged on the host
        args[3:3] = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                     "--unshare-cgroup-try"]
        command = [shutil.which("setpriv") or "setpriv", f"--reuid={SANDBOX_UID}",
                   f"--regid={SANDBOX_GID}", "--clear-groups", "--inh-caps=-all",
                   "--bounding-set=-all", "--no-new-privs", "--", *command]
    else:
        args[3:3] = ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID),
                     "--gid", str(SANDBOX_GID), "--cap-drop", "ALL"]
        if "--disable-userns" in _bwrap_help():   # bubblewrap >= 0.8: no nested namespaces
            args.insert(4, "--disable-userns")
    for device in sorted(glob.glob("/dev/nvidia*")):   # a GPU server's devices, for nccl
        args += ["--dev-bind", device, device]
    hidden = [Path(h).resolve() for h in hidden]
    ro = [Path(p) for p in (*SYSTEM, *(os.path.join("/etc", n) for n in ETC), "/sys")
          if os.path.lexists(p)] + python_paths(hidden)
    for path in ro:
        if path.is_symlink() and str(path) in SYSTEM:   # /lib -> usr/lib on merged-/usr
            args += ["--symlink", os.readlink(path), str(path)]
        else:
            args += [*_above(path, ro), "--ro-bind", str(path), str(path)]
    for h in hidden:   # a hidden folder inside a bound one: an empty tmpfs over it
        if any(h.is_relative_to(path) for path in ro):
            args += ["--tmpfs", str(h)]
            args += [a for path in ro if path.is_relative_to(h) and path != h
                     for a in (*_above(path, ro, [h]), "--ro-bind", str(path), str(path))]
    for outside, inside in sorted(rw.items(), key=lambda kv: len(kv[1])):
        args += [*_above(Path(inside), ro), "--bind", str(outside), inside]
    # what runs the kernel, under a folder that is private inside (a checkout in /tmp, under
    # the job's own /tmp): bound again on top, or the kernel could not start
    inside_rw = [Path(inside) for inside in rw.values()]
    args += [a for path in ro if any(path.is_relative_to(inside) for inside in inside_rw)
             for a in (*_above(path, ro, inside_rw), "--ro-bind", str(path), str(path))]
    args += ["--remount-ro", "/", "--chdir", chdir, "--clearenv"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return [*args, "--", *command]


def _above(path: Path, ro: Sequence[Path], over: Sequence[Path] = ()) -> list[str]:
    """bwrap's arguments that make the folders above a mount point traversable by the sandbox's
    user (bwrap, run as root, would make them root's own with mode 0700): every one that is not
    part of a read-only bind, or that lies under a folder mounted over one (`over`)."""
    return [a for folder in reversed(path.parents) if folder != Path("/")
            and (not any(folder.is_relative_to(p) for p in ro)
                 or any(folder.is_relative_to(o) for o in over))
            for a in ("--perms", "0755", "--dir", str(folder))]


def give_to_sandbox(*paths: Path) -> None:
    """Make `paths` (and what they hold) the sandbox user's, so that it can write them when
    grading runs as root (elsewhere the sandbox's user is the grader's own: nothing to do)."""
    if os.geteuid() != 0:
        return
    for top in paths:
        for folder, dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, n) for n in (*dirs, *files))]:
                os.lchown(name, SANDBOX_UID, SANDBOX_GID)


@functools.lru_cache(maxsize=1)
def _bwrap_help() -> str:
    try:
        return subprocess.run([bwrap() or "bwrap", "--help"], capture_output=True,
                              text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def python_paths(hidden: Sequence[Path] = ()) -> list[Path]:
    """What this interpreter needs to run the kernel and the ranks, read-only: its prefixes,
    its site-packages and the dpmp_lab package's own folder, minus anything that would reveal
    a hidden folder. Never sys.path or PYTHONPATH: an editable install, or a grader that puts
    the checkout on PYTHONPATH, would bind the whole checkout (solutions/, tests/, .git); the
    package is reached through its folder alone."""
    here = PACKAGE_DIR
    wanted = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.exec_prefix),
              Path(sys.executable).resolve().parent.parent, here}
    wanted |= {Path(p) for p in site.getsitepackages() if p}
    keep = []
    for path in wanted:
        try:
            path = path.resolve()
        except OSError:
            continue
        if not path.is_dir() or path == Path("/"):
            continue
        if any(h == path or h.is_relative_to(path) for h in hidden) and path != here:
            continue
        keep.append(path)
    # a folder inside another one is bound with it
    return sorted(p for p in keep if not any(p != q and p.is_relative_to(q) for q in keep))


def kernel_env(env: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment inside: what `env` has of KEEP_ENV, a PATH of this interpreter and the
    system, and home, temp and cache folders that are the sandbox's own."""
    kept = {k: v for k, v in env.items() if k.startswith(KEEP_ENV)}
    bindir = os.path.dirname(sys.executable)
    kept.update({
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        # the package's parent: inside, it holds the package's folder alone
        "PYTHONPATH": str(PACKAGE_DIR.parent),
        "HOME": HOME, "TMPDIR": "/tmp", "USER": "nobody",
        "IPYTHONDIR": f"{HOME}/.ipython", "MPLCONFIGDIR": f"{HOME}/.config/matplotlib",
        "XDG_CACHE_HOME": f"{HOME}/.cache", "JUPYTER_RUNTIME_DIR": f"{HOME}/.jupyter-runtime",
        # the sandbox's only network interface; gloo and nccl would look for another one
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": env.get("NCCL_SOCKET_IFNAME", "lo"),
    })
    kept.update(extra or {})
    return kept


__all__ = ["EXCHANGE", "HOME", "SANDBOX_GID", "SANDBOX_UID", "SHM", "WORK", "argv", "bwrap",
           "give_to_sandbox", "kernel_env", "problem", "python_paths"]
