"""A Jupyter kernel started inside the sandbox (sandbox.py): what nbgrader executes a
submission in.

The grader (nbgrader, outside) and the kernel (inside) talk over ZeroMQ's ipc transport:
unix sockets in a short folder of the job's own, bound into the sandbox at the same path, so
the kernel needs no network and the grader never shares its files. The kernel's working
directory is a private copy of the folder nbgrader would have run it in, so nothing the
submission writes reaches nbgrader's autograded/ or feedback/ folders. Interrupts travel as
messages: a signal sent to the kernel's process group would stop at the sandbox's own session.

    c.Execute.kernel_manager_class = SandboxedKernelManager   # what nbgrader_plugin does
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, List, Unicode

from dpmp_lab.instructor import sandbox


class SandboxError(RuntimeError):
    """The sandbox cannot start on this machine (what is missing, and what to do)."""


class OutputTail:
    """Reads a pipe to its end in a thread of its own, keeping only its last `keep` bytes."""

    def __init__(self, pipe: Any, keep: int = 64 * 1024) -> None:
        self._kept = collections.deque(maxlen=max(1, keep // 4096))
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := pipe.read1(4096) if hasattr(pipe, "read1") else pipe.read(4096):
                self._kept.append(chunk)
            pipe.close()

    def text(self) -> str:
        return b"".join(self._kept).decode(errors="replace")


class SandboxedKernelManager(AsyncKernelManager):
    """An ipykernel in a bubblewrap sandbox, reached through ipc sockets."""

    job_dir = Unicode("", help="Folder for the sandbox's work/, home/ and tmp/ (default: a "
                      "new temporary folder, removed with the kernel)").tag(config=True)
    socket_dir = Unicode("", help="Short folder for the connection file and ipc sockets "
                         "(unix socket paths are limited to ~107 bytes; default: a new "
                         "temporary one)").tag(config=True)
    hidden = List(Unicode(), help="Folders masked in the sandbox even where a read-only "
                  "bind contains them (the course root, the grader's scratch)").tag(config=True)
    copy_cwd = Bool(True, help="Copy the folder the kernel is started in into its working "
                    "directory (the submission's files; the harness's kernel gets none)")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        why = sandbox.problem()
        if why:
            raise SandboxError(f"cannot sandbox the kernel: {why}")
        self._made: list[Path] = []
        if not self.socket_dir:
            self.socket_dir = self._made_dir("dpk-")
        if not self.job_dir:
            self.job_dir = self._made_dir("dpmp-job-")
        self.transport = "ipc"
        self.ip = os.path.join(self.socket_dir, "k")
        self.connection_file = os.path.join(self.socket_dir, "kernel.json")

    def _made_dir(self, prefix: str) -> str:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        self._made.append(path)
        return str(path)

    def folders(self) -> dict[Path, str]:
        """The sandbox's writable folders: outside path -> path inside."""
        job = Path(self.job_dir)
        return {job / "work": sandbox.WORK, job / "home": sandbox.HOME, job / "tmp": "/tmp",
                job / "shm": sandbox.SHM, job / "exchange": sandbox.EXCHANGE,
                Path(self.socket_dir): self.socket_dir}

    @property
    def exchange(self) -> Path:
        """Where the grader writes the harness's requests and the kernel its answers
        (dpmp_lab/harness/agent.py): at sandbox.EXCHANGE inside."""
        return Path(self.job_dir) / "exchange"

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        for outside in self.folders():
            outside.mkdir(parents=True, exist_ok=True)
        cwd = kw.get("cwd")
        if cwd and os.path.isdir(cwd) and self.copy_cwd:   # the submission's files, copied: never linked back
            shutil.copytree(cwd, Path(self.job_dir) / "work", dirs_exist_ok=True,
                            symlinks=True)
        hidden = [*self.hidden, os.getcwd(), self.job_dir]
        env = sandbox.kernel_env(kw.get("env") or dict(os.environ))
        kw["cwd"] = self.socket_dir
        kw["env"] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}   # bwrap's own: env -i
        # the kernel's own output: a pipe whose last lines are kept (`output_tail`), never a
        # file of the grader's that the kernel could fill through /proc/1/fd/1
        kw["stdout"], kw["stderr"] = subprocess.PIPE, subprocess.STDOUT
        self.kernel_spec.interrupt_mode = "message"
        sandbox.give_to_sandbox(*self.folders())
        wrapped = sandbox.argv(kernel_cmd, rw=self.folders(), env=env, hidden=hidden)
        await super()._async_launch_kernel(wrapped, **kw)
        self._tail = OutputTail(self.provisioner.process.stdout)

    @property
    def output_tail(self) -> str:
        """The last lines the kernel process printed outside any cell (startup errors)."""
        tail = getattr(self, "_tail", None)
        return tail.text() if tail else ""

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            for path in self._made:
                shutil.rmtree(path, ignore_errors=True)


__all__ = ["SandboxError", "SandboxedKernelManager"]
