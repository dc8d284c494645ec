"""One graded notebook in two kernels, and the grader between them.

    the learner's kernel (sandbox)    the learner's cells and the notebook's own cells they need
    the harness (a sandbox of its     the graded test cells, with the hidden tests, and the
    own, dpmp_lab/harness/remote.py)  notebook's own cells they need (dpmp_lab/harness/plan.py)

The harness asks for the learner's names and calls the learner's functions through a unix socket
to this process (`Relay`), which does each request as one line run in the learner's kernel
(dpmp_lab/harness/agent.py) and answers with what that line wrote, read as bytes within a bound
(submitted.read_small: a regular file, never followed through a link), and with the text the learner's code printed,
which counts against the test cell's output limit like any output. The learner's kernel and the
harness never reach each other: they share no folder and no socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode

from dpmp_lab import i18n
from dpmp_lab.harness.exchange import ANSWER, MAX_BYTES, REQUEST
from dpmp_lab.harness.plan import Plan, Where
from dpmp_lab.i18n.messages import LANGUAGE_ENV, N_
from dpmp_lab.instructor import sandbox, submitted
from dpmp_lab.instructor.sandbox_kernel import SandboxedKernelManager
from dpmp_lab.launcher.starting import WARM_ENV

FRAME = struct.Struct(">Q")
SOCKET = "relay"          # the relay's socket, in the harness's socket folder
RELAYED_TEXT = 1 << 20    # characters of the learner's printing that one request passes on
SETTLE_S = 10             # an interrupted request's line to end, at most


async def run_step(client: NotebookClient, source: str, index: int) -> NotebookNode:
    """Run `source` in `client`'s kernel as if it were cell `index` (its outputs count there),
    without touching the notebook's own cell; the step's cell, with its outputs."""
    step = nbformat.v4.new_code_cell(source)
    kept = client.nb.cells[index]
    try:
        await client.async_execute_cell(step, index, store_history=False)
    finally:
        client.nb.cells[index] = kept
    return step


def update_display(update: Callable[[str, dict], None], display_id: str, msg: dict) -> None:
    """nbclient's update of a display by its id, where a display shown by a step (a cell run
    at another cell's place: the harness's request, a cell both kernels run) has no output of
    the notebook to update."""
    with contextlib.suppress(IndexError, KeyError):
        update(display_id, msg)


def install_line(socket_path: str, names: frozenset[str]) -> str:
    """What turns a fresh kernel into the harness (remote.install)."""
    return (f"__import__('dpmp_lab.harness.remote', fromlist=['install']).install("
            f"get_ipython(), {socket_path!r}, {sorted(names)!r})")


class HarnessClient(NotebookClient):
    """Runs cells in the harness's kernel. Its messages go through `process` first (the
    grader's output limits); a reply with an error that printed none gets one, as nbgrader's
    Execute does, so a timed-out test cell scores zero."""

    def __init__(self, nb: NotebookNode, km: AsyncKernelManager,
                 process: Callable[[dict, Any, int], None], **kw: Any) -> None:
        super().__init__(nb, km=km, **kw)
        self._process = process
        self.on_cell_executed = self._error_if_missing

    def process_message(self, msg: dict, cell: Any, cell_index: int) -> Any:
        self._process(msg, cell, cell_index)
        return super().process_message(msg, cell, cell_index)

    def _update_display_id(self, display_id: str, msg: dict) -> None:
        update_display(super()._update_display_id, display_id, msg)

    @staticmethod
    def _error_if_missing(cell: Any, execute_reply: dict, **_: Any) -> None:
        content = execute_reply["content"]
        if content["status"] == "error" and not any(
                o.output_type == "error" and o.ename == content.get("ename")
                for o in cell.outputs):
            cell.outputs.append(nbformat.v4.new_output(
                "error", ename=content.get("ename", "Error"), evalue=content.get("evalue", ""),
                traceback=content.get("traceback") or [f"{content.get('ename')}: "
                                                       f"{content.get('evalue', '')}"]))


class Relay:
    """Serves the harness's requests on a unix socket: each is written for the learner's kernel,
    done there by one line (agent.serve), and answered with what that line wrote.

    With a cell time limit, a request gets what is left of the harness cell's time less a
    margin: past it the learner's kernel is interrupted and the request answered as stopped,
    before the harness cell's own limit. A learner's function that never returns then costs
    the cell that called it, not every cell after it (the harness and the kernel stay in step)."""

    def __init__(self, learner: NotebookClient, exchange: Path, exchange_inside: str,
                 socket_path: str, cell_timeout: float | None = None) -> None:
        self.learner = learner
        self.exchange, self.exchange_inside = exchange, exchange_inside
        self.socket_path = socket_path
        self.index = 0                        # the harness cell being run: outputs count there
        self.cell_started = time.monotonic()  # ... and when it began
        self.cell_timeout = cell_timeout
        self.requests = 0
        self.failure: BaseException | None = None   # the learner's kernel died, a limit was hit

    def time_left(self) -> float | None:
        """Seconds a request may still run in the learner's kernel (None: no limit)."""
        if not self.cell_timeout:
            return None
        margin = min(max(1.5 * SETTLE_S, self.cell_timeout / 5), self.cell_timeout / 2)
        return self.cell_timeout - margin - (time.monotonic() - self.cell_started)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Relay]:
        server = await asyncio.start_unix_server(self._serve, path=self.socket_path)
        os.chmod(self.socket_path, 0o777)   # the harness's kernel runs as the sandbox's user
        try:
            yield self
        finally:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)

    def raise_failure(self) -> None:
        """Raise, in the grader, what stopped the learner's kernel during the last harness cell."""
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    size = FRAME.unpack(await reader.readexactly(FRAME.size))[0]
                except asyncio.IncompleteReadError:
                    return
                if size > MAX_BYTES:
                    await self._answer(writer, {"ok": False, "error": "a request too large"})
                    return
                header, answer = await self._do(await reader.readexactly(size))
                await self._answer(writer, header, answer)
        finally:
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, header: dict, answer: bytes = b"") -> None:
        data = json.dumps(header).encode()
        writer.write(FRAME.pack(len(data)) + data + FRAME.pack(len(answer)) + answer)
        await writer.drain()

    async def _do(self, request: bytes) -> tuple[dict, bytes]:
        if self.failure is not None:
            return _error(N_("your kernel is gone: {why}"), why=str(self.failure))
        self.requests += 1
        n = self.requests
        asked, answered = self.exchange / REQUEST.format(n), self.exchange / ANSWER.format(n)
        asked.write_bytes(request)
        os.chmod(asked, 0o644)
        line = (f"__import__('dpmp_lab.harness.agent', fromlist=['serve']).serve("
                f"{self.exchange_inside!r}, {n})")
        try:
            step = await self._step(line)
        except _Stopped as exc:
            return _error(*exc.args)
        except DeadKernelError as exc:
            self.failure = exc
            return _error(N_("your kernel died"))
        except Exception as exc:   # noqa: BLE001 - a limit hit: the grader raises it after
            self.failure = exc
            return _error("{what}: {why}", what=type(exc).__name__, why=str(exc))
        finally:
            with contextlib.suppress(OSError):
                asked.unlink()
        outputs, error = _relayed(step.outputs)
        try:
            answer = (b"" if error
                      else submitted.read_small(self.exchange, answered.name, MAX_BYTES))
        except (OSError, submitted.NotData) as exc:
            error = (N_("your kernel wrote no answer to the grader's request ({why})"),
                     {"why": str(exc)})
            answer = b""
        finally:
            with contextlib.suppress(OSError):
                answered.unlink()
        if answer is None:
            error = (N_("your kernel ran the grader's request without answering it: a cell of "
                        "yours changes what the kernel runs (an input transformer?)"), {})
            answer = b""
        if error:
            return {**_error(*error)[0], "outputs": outputs}, b""
        return {"ok": True, "outputs": outputs}, answer

    async def _step(self, line: str) -> NotebookNode:
        """The request's line in the learner's kernel, within the time left (_Stopped past it,
        the kernel interrupted and ready again)."""
        left = self.time_left()
        if left is None:
            return await run_step(self.learner, line, self.index)
        if left < 1:
            raise _Stopped(N_("no time was left in this cell for your code to run"))
        learner = self.learner
        saved = learner.timeout, learner.interrupt_on_timeout, learner.error_on_timeout
        # past the time left nbclient interrupts the kernel, waits for the interrupted line to
        # end and answers with this error: the kernel is then ready for the next request
        learner.timeout = max(1, int(left))   # nbclient counts whole seconds
        learner.interrupt_on_timeout, learner.error_on_timeout = True, _TIMED_OUT
        started = time.monotonic()
        try:
            step = await run_step(learner, line, self.index)
        finally:
            learner.timeout, learner.interrupt_on_timeout, learner.error_on_timeout = saved
        # the interrupted line's own error comes back as its output: KeyboardInterrupt
        if time.monotonic() - started >= int(left) and any(
                out.output_type == "error" and out.get("ename") in ("KeyboardInterrupt",
                                                                    _TIMED_OUT["ename"])
                for out in step.outputs):
            raise _Stopped(N_("your code had not returned after {seconds} s, this cell's time "
                              "less the grader's margin, and was stopped there (a loop that "
                              "never ends?)"), {"seconds": int(left)})
        return step


_TIMED_OUT = {"ename": "RelayTimeout", "evalue": "stopped at the request's time limit",
              "traceback": []}


class _Stopped(Exception):
    """A request stopped at its time limit; the learner's kernel is ready again. Its args: the
    message (a template) and its fields."""


def _error(message: str, fields: dict | None = None, **more: str | int) -> tuple[dict, bytes]:
    """A failed request's answer: the message as a template and its fields apart, so that the
    harness says it in the notebook's language (the grader's own process speaks English)."""
    return {"ok": False, "error": message, "fields": {**(fields or {}), **more}}, b""


def _relayed(outputs: list) -> tuple[list[dict], tuple[str, dict] | None]:
    """(what the learner's kernel printed, as text the harness prints again; the error that
    stopped the request's line, as a template and its fields, or None)."""
    relayed: list[dict] = []
    size, error = 0, None
    for out in outputs:
        if out.output_type == "stream":
            text = out.get("text", "")
            relayed.append({"kind": "stream", "name": out.get("name", "stdout"), "text": text})
        elif out.output_type in ("display_data", "execute_result"):
            text = out.get("data", {}).get("text/plain", "")
            relayed.append({"kind": "display", "text": text if isinstance(text, str) else ""})
        elif out.output_type == "error":
            error = (N_("your kernel could not answer the grader: {what}: {why}"),
                     {"what": str(out.get("ename")), "why": str(out.get("evalue"))})
            continue
        size += len(relayed[-1]["text"])
        if size > RELAYED_TEXT:
            relayed[-1]["text"] = relayed[-1]["text"][:max(0, RELAYED_TEXT - size)] + "\n[...]"
            break
    return relayed, error


def harness_manager(learner: AsyncKernelManager, folder: Path, kernel_name: str) -> Any:
    """The harness's kernel manager: a sandbox of its own beside a sandboxed learner's kernel
    (no file of the submission, no folder of the learner's kernel), else a plain kernel."""
    if not isinstance(learner, SandboxedKernelManager):
        return AsyncKernelManager(kernel_name=kernel_name)
    return SandboxedKernelManager(
        kernel_name=kernel_name, socket_dir=str(folder),
        job_dir=str(Path(learner.job_dir) / "harness"), copy_cwd=False,
        hidden=[*learner.hidden, learner.job_dir, learner.socket_dir])


@contextlib.asynccontextmanager
async def harness_beside(learner: NotebookClient, names: frozenset[str],
                         process: Callable[[dict, Any, int], None] = lambda *_: None,
                         folder: Path | None = None,
                         **settings: Any) -> AsyncIterator[tuple[HarnessClient, Relay]]:
    """The learner's kernel and the harness beside it, started at once, the relay between
    them, and the harness installed, asking for the learner's `names`; both kernels stopped on
    the way out. `process` sees every message of the harness first (output limits); `folder`:
    a short empty one for the harness's sockets, which its maker removes (default: a new
    temporary one, removed here); `settings` are the harness client's."""
    made = folder is None
    folder = Path(tempfile.mkdtemp(prefix="dph-")) if made else folder   # socket paths: ~107
    try:
        if learner.km is None:
            learner.km = learner.create_kernel_manager()
        manager = harness_manager(learner.km, folder, learner.kernel_name or "python3")
        harness = HarnessClient(learner.nb, manager, process, **settings)
        if isinstance(learner.km, SandboxedKernelManager):
            outside, inside = learner.km.exchange, sandbox.EXCHANGE
        else:
            outside = folder / "exchange"
            outside.mkdir()
            inside = str(outside)
        # the library speaks the notebook's language in both kernels (and their ranks)
        spoken = {**os.environ, LANGUAGE_ENV: i18n.language_of(learner.nb)}
        # the harness launches only the library's references, rarely: no forkserver warmed
        # up at dpmp_lab's import (torch loaded once more, for nothing, in every job)
        env = {**spoken, WARM_ENV: "0"}
        # both processes start before either is waited for: each spends a second or two
        # importing torch
        await asyncio.gather(learner.async_start_new_kernel(env=spoken),
                             harness.async_start_new_kernel(cwd=str(folder), env=env))
        async with learner.async_setup_kernel(), \
                harness.async_setup_kernel(cleanup_kc=True):
            relay = Relay(learner, outside, inside, str(folder / SOCKET),
                          cell_timeout=settings.get("timeout"))
            async with relay.serving():
                step = await run_step(harness, install_line(relay.socket_path, names), 0)
                errors = [o for o in step.outputs if o.output_type == "error"]
                if errors:
                    raise RuntimeError("the harness could not start: "
                                       + "\n".join(errors[0].traceback))
                yield harness, relay
    finally:
        if made:
            shutil.rmtree(folder, ignore_errors=True)


async def run_notebook(learner: NotebookClient, harness: HarnessClient, relay: Relay,
                       plan: Plan) -> None:
    """Every code cell of the notebook where the plan says, in order. A failure of the
    learner's kernel during a harness cell is raised after that cell."""
    for index, cell in enumerate(learner.nb.cells):
        where = plan.where.get(index)
        if cell.cell_type != "code" or where is None:
            continue
        if where in (Where.LEARNER, Where.BOTH):
            await learner.async_execute_cell(cell, index,
                                             execution_count=learner.code_cells_executed + 1)
        if where is Where.HARNESS or where is Where.BOTH:
            relay.index, relay.cell_started = index, time.monotonic()
            if where is Where.HARNESS:
                await harness.async_execute_cell(cell, index,
                                                 execution_count=learner.code_cells_executed + 1)
                learner.nb.cells[index] = cell
            else:
                await run_step(harness, cell.source, index)
            relay.raise_failure()


__all__ = ["SOCKET", "HarnessClient", "Relay", "harness_beside", "harness_manager", "install_line",
           "run_notebook", "run_step", "update_display"]
