"""launch(): start N ranks of a function from a notebook cell, stream their output, collect results.

    res = dl.launch(fn, *args, world_size=4)
    res.values      per-rank return values (res[r] is res.values[r])
    res.output      per-rank stdout+stderr text

How it works, top to bottom:
  1. check the request before any process starts (bad input is a ValueError/TypeError);
  2. pickle fn, args and kwargs with cloudpickle, so functions defined in a notebook travel;
  3. give the launch a rendezvous of its own: a FileStore in a fresh temporary directory, so
     two launches (two learners on one server) never collide, and no port is guessed;
  4. start one process per rank (forkserver with torch preloaded: fast after the first launch);
  5. run an event loop over every rank's pipes: print output lines live as "[rank r] ...",
     receive results, notice ranks that raise, die or hang;
  6. stop every rank, close every pipe, and return or raise LaunchError / LaunchTimeout.
"""

from __future__ import annotations

import codecs
import json
import linecache
import multiprocessing as mp
import os
import re
import selectors
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dpmp_lab import integrity, serialize, worker
from dpmp_lab.progress import Progress

START_METHODS = ("forkserver", "fork", "spawn")
BACKENDS = ("auto", "gloo", "nccl")
# torch._dynamo: the first torch.optim optimizer a rank creates imports it (0.9 s here), which
# would otherwise be paid by every launch that trains; the forkserver pays it once.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "dpmp_lab"]

_STOP_GRACE_S = 0.2  # after a first failure: time for the other ranks to report their own
_DRAIN_S = 2.0  # after stopping: time to collect the last output of killed ranks
_EXIT_WAIT_S = 5.0  # after every rank returned: time for the ranks to tear down and exit
_DUMP_WAIT_S = 2.0  # on a hang: time for faulthandler to write the stuck ranks' stacks


# -- results and errors ----------------------------------------------------------------------


@dataclass
class LaunchResult:
    """What every rank returned and printed."""

    values: list[Any]
    output: list[str]
    traces: list[Any] | None = None
    backend: str = "gloo"      # what the ranks' default group was initialised with
    wall_time: float = 0.0
    device_audit: bool = False

    @property
    def world_size(self) -> int:
        return len(self.values)

    @property
    def backends(self) -> dict[str, str]:
        """Which backend moved which kind of tensor: {"cuda": "nccl", "cpu": "gloo"} on GPUs."""
        return backends_of(self.backend)

    def describe(self) -> str:
        """One line: where the ranks computed and which backend served which device."""
        n = self.world_size
        served = ", ".join(f"{dev.upper()} tensors through {name}"
                           for dev, name in self.backends.items())
        if self.device_audit:
            where = (f"{n} ranks on the CPU under the device audit (dl.device() is cpu:0, its "
                     "stand-in for a GPU)")
        elif "cuda" in self.backends:
            where = f"{n} ranks on cuda:0..cuda:{n - 1}" if n > 1 else "1 rank on cuda:0"
        else:
            where = f"{n} rank{'s' if n > 1 else ''} on the CPU"
        return f"{where}; {served}; {self.wall_time:.2f} s"

    def __getitem__(self, rank: int) -> Any:
        return self.values[rank]

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __repr__(self) -> str:
        shown = ", ".join(_short_repr(v) for v in self.values)
        return (
            f"LaunchResult(world_size={self.world_size}, backend={self.backend!r}, "
            f"wall_time={self.wall_time:.2f}s, values=[{shown}])"
        )


@dataclass
class RankFailure:
    """Why one rank did not return: an exception, a signal, an early exit, or a hang."""

    rank: int
    reason: str  # "exception" | "signal" | "exit" | "timeout"
    exc_type: str | None = None
    message: str = ""
    traceback: str = ""
    exitcode: int | None = None
    signal: signal.Signals | None = None
    output_tail: str = ""

    def describe(self) -> str:
        if self.reason == "exception":
            head = f"rank {self.rank} raised {self.exc_type}: {self.message}"
            return head + "\n" + _indent(self.traceback.rstrip())
        if self.reason == "signal":
            head = (
                f"rank {self.rank} was killed by signal {self.signal.name} "
                f"({_SIGNAL_HINTS.get(self.signal.name, 'the process died')})"
            )
            if self.traceback:
                head += "\n" + _indent(self.traceback.rstrip())
        elif self.reason == "exit":
            head = f"rank {self.rank} exited with code {self.exitcode} before returning"
        else:
            head = f"rank {self.rank} did not finish: {self.message}"
            if self.traceback:
                head += "\n" + _indent(self.traceback.rstrip())
        if self.output_tail.strip():
            head += f"\n  last output of rank {self.rank}:\n" + _indent(self.output_tail.rstrip(), 4)
        return head


_SIGNAL_HINTS = {
    "SIGABRT": "aborted; with gloo this is often a collective whose tensors differ in size "
    "or dtype across ranks",
    "SIGSEGV": "segmentation fault in native code",
    "SIGKILL": "killed from outside, often by the out-of-memory killer",
    "SIGBUS": "bus error in native code, often shared memory running out",
    "SIGFPE": "arithmetic error in native code",
}


class LaunchError(RuntimeError):
    """One or more ranks failed. `.failures` maps rank -> RankFailure; the first is the cause."""

    def __init__(self, failures: dict[int, RankFailure], *, output: list[str],
                 finished: list[int], stopped: list[int], world_size: int,
                 summary: str | None = None, hint: str | None = None):
        self.failures = failures
        self.output = output
        self.finished = finished
        self.stopped = stopped
        self.world_size = world_size
        self.hint = hint
        self.summary = summary or self._default_summary()
        super().__init__(self.report())

    def _default_summary(self) -> str:
        ranks = _ranks_text(list(self.failures))
        return f"{ranks} of {self.world_size} failed"

    def report(self) -> str:
        lines = [self.summary]
        for failure in self.failures.values():
            lines.append(failure.describe())
        if self.finished:
            lines.append(f"{_ranks_text(self.finished)} had returned.")
        if self.stopped:
            lines.append(f"{_ranks_text(self.stopped)}: stopped by the launcher (they were "
                         "waiting on the ranks above, or lost their connection to them).")
        if self.hint:
            lines.append(f"Hint: {self.hint}")
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own frames, which never help a learner.
        return [f"{type(self).__name__}: " + self.report()]


class LaunchTimeout(LaunchError):
    """Some ranks did not finish in time: a hang, most often a collective not every rank called."""

    def _default_summary(self) -> str:
        ranks = _ranks_text(list(self.failures))
        return f"{ranks} of {self.world_size} did not finish"


# -- the public entry point -------------------------------------------------------------------


def launch(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 4,
    backend: str = "auto",
    timeout: float = 120.0,
    start_method: str = "forkserver",
    trace: bool = False,
    env: dict[str, str] | None = None,
    threads: int | None = None,
    pg_timeout: float | None = None,
    stream: bool = True,
    progress: bool | None = None,
    device_audit: bool | None = None,
    **kwargs: Any,
) -> LaunchResult:
    """Run `fn(*args, **kwargs)` on `world_size` ranks, each in its own process with the default
    process group initialised, and return what every rank returned.

    backend:      "auto" (nccl when there is one GPU per rank, else gloo), "gloo" or "nccl".
    timeout:      seconds for the whole launch; past it the stuck ranks are named (LaunchTimeout).
    pg_timeout:   process-group timeout (default min(timeout, 30)): a collective that not every
                  rank joins fails after this long instead of torch's default of minutes.
    start_method: "forkserver" (default: torch preloaded, ~0.1 s a launch), "fork", "spawn".
    trace:        record every collective and p2p op each rank issues inside fn; one
                  dl.Trace per rank comes back in `res.traces`.
    env:          extra environment variables for the ranks.
    threads:      torch threads per rank (default: cores // world_size, at least 1).
    stream:       print every rank's output live, prefixed "[rank r]".
    progress:     show each rank's state (starting, running, done, failed) under the cell
                  while it runs: a widget in Jupyter, text elsewhere in IPython (default: when
                  streaming in IPython; never outside IPython).
    device_audit: run on the CPU as if each rank had a GPU, and fail where the code would put
                  data on the wrong device there (see dpmp_lab/audit.py). Default: on when the
                  environment has DPMP_LAB_DEVICE_AUDIT=1.
    """
    if integrity.grading():   # a hidden test is about to launch: is the grader intact?
        integrity.verify()
    request = _check_request(fn, world_size, backend, timeout, start_method, env, threads,
                             pg_timeout, device_audit)
    payload = _pickle_payload(fn, args, kwargs)
    outcome = "failed"
    try:
        res = _Launch(request, payload, trace=trace, stream=stream,
                      progress=stream if progress is None else progress).run()
        outcome = "ok"
        return res
    except KeyboardInterrupt:
        outcome = "interrupted"
        # raised afresh, so the learner reads one line instead of the event loop's stack
        raise KeyboardInterrupt(f"interrupted: all {world_size} ranks were stopped") from None
    finally:
        _log_launch(request, outcome)


LOG_ENV = "DPMP_LAB_LAUNCH_LOG"


def _log_launch(request: _Request, outcome: str) -> None:
    """Append one JSON line per launch to $DPMP_LAB_LAUNCH_LOG, when set: how
    tools/gpu_course.py counts the cells that ran on each backend."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    backend = worker.nccl_backend() if request.backend == "nccl" else request.backend
    line = json.dumps({"world_size": request.world_size, "backend": backend,
                       "device_audit": request.device_audit, "outcome": outcome})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


@dataclass
class _Request:
    world_size: int
    backend: str
    timeout: float
    pg_timeout: float
    start_method: str
    env: dict[str, str]
    threads: int
    device_audit: bool = False


AUDIT_ENV = "DPMP_LAB_DEVICE_AUDIT"


def audit_requested() -> bool:
    """Whether DPMP_LAB_DEVICE_AUDIT asks every launch for a device audit."""
    return os.environ.get(AUDIT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def backends_of(backend: str) -> dict[str, str]:
    """{"cuda": "nccl", "cpu": "gloo"} for "cpu:gloo,cuda:nccl"; {"cpu": "gloo"} for "gloo"."""
    if ":" not in backend:
        return {"cuda": backend} if backend == "nccl" else {"cpu": backend}
    pairs = (part.split(":", 1) for part in backend.split(","))
    return dict(sorted(((dev, name) for dev, name in pairs), key=lambda p: p[0] != "cuda"))


def _check_request(fn, world_size, backend, timeout, start_method, env, threads,
                   pg_timeout, device_audit=None) -> _Request:
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on every rank, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    if start_method not in mp.get_all_start_methods():
        raise ValueError(f"start_method {start_method!r} is not available on {sys.platform}")
    if sys.platform == "win32":
        raise RuntimeError("dl.launch runs on Linux and macOS; on Windows use WSL2.")
    for name, value in (("timeout", timeout), ("pg_timeout", pg_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or value <= 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    env = dict(env or {})
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {key!r}: {value!r}")
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed support")
    if dist.is_initialized():
        raise RuntimeError(
            "a default process group is already initialised in this process (a cell called "
            "dist.init_process_group?). launch() starts its own ranks, each with its own group: "
            "call dist.destroy_process_group() here first."
        )
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if device_audit is None:
        device_audit = audit_requested()
    if device_audit and backend == "nccl":
        raise ValueError("the device audit runs on the CPU with gloo (cpu:0 stands in for the "
                         "GPU): launch with backend='auto' or 'gloo' to audit")
    return _Request(
        world_size=world_size,
        backend="gloo" if device_audit else _resolve_backend(backend, world_size),
        device_audit=bool(device_audit),
        timeout=float(timeout),
        pg_timeout=float(pg_timeout) if pg_timeout is not None else min(float(timeout), 30.0),
        start_method=start_method,
        env=env,
        threads=threads or max(1, _cores() // world_size),
    )


def visible_gpus() -> int:
    """GPUs this process could use, counted without initialising CUDA (NVML, as torch does)."""
    if not torch.backends.cuda.is_built():
        return 0
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


def _resolve_backend(backend: str, world_size: int) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "gloo":
        return "gloo"
    gpus = visible_gpus()
    enough = gpus >= world_size and dist.is_nccl_available()
    if backend == "auto":
        return "nccl" if enough else "gloo"
    if not dist.is_nccl_available():
        raise ValueError("backend='nccl' was asked for, but this torch build has no NCCL")
    if not enough:
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: world_size={world_size}, but {gpus} "
            "GPU(s) are visible. Use backend='gloo' (or 'auto') to run on the CPU."
        )
    return "nccl"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _pickle_payload(fn, args, kwargs) -> bytes:
    """Pickle fn, args and kwargs; when that fails, say which one cannot travel."""
    try:
        return serialize.dumps((fn, args, kwargs))
    except Exception as exc:
        parts = [("the function", fn)]
        parts += [(f"positional argument {i} ({type(a).__name__})", a) for i, a in enumerate(args)]
        parts += [(f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in kwargs.items()]
        for what, obj in parts:
            try:
                serialize.dumps(obj)
            except Exception as part_exc:
                raise ValueError(
                    f"{what} cannot be sent to the ranks: {type(part_exc).__name__}: {part_exc}. "
                    "Every rank is a separate process, so fn and its arguments are pickled; "
                    "create objects such as locks, open files or process groups inside fn."
                ) from part_exc
        raise ValueError(f"the launch cannot be pickled: {type(exc).__name__}: {exc}") from exc


def _notebook_sources() -> dict[str, tuple]:
    """linecache entries of code that exists only in memory (notebook cells), for tracebacks."""
    return {
        name: entry
        for name, entry in list(linecache.cache.items())
        if len(entry) == 4 and entry[1] is None
    }


def _context(start_method: str):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # only takes effect when the server starts
    return ctx


# -- one launch -----------------------------------------------------------------------------


@dataclass
class _Rank:
    rank: int
    proc: Any
    out: Any
    err: Any
    msg: Any
    dump: Any
    release: Any
    state: str = "starting"  # starting -> running -> returned | failed | stopped
    value: Any = None
    trace: Any = None
    main_thread: int | None = None
    exited: bool = False
    chunks: list[str] = field(default_factory=list)
    dumps: list[str] = field(default_factory=list)


class _Launch:
    def __init__(self, request: _Request, payload: bytes, *, trace: bool, stream: bool,
                 progress: bool = False):
        self.req = request
        self.progress = Progress(request.world_size, progress) if progress else None
        self.payload = payload
        self.trace = trace
        self.stream = stream
        self.ranks: list[_Rank] = []
        self.failures: dict[int, RankFailure] = {}  # in the order they were noticed
        self.stuck: list[_Rank] = []
        self.stopping = False
        self.sel = selectors.DefaultSelector()
        self.partial: dict[tuple[int, str], str] = {}
        self.decoders: dict[tuple[int, str], Any] = {}

    # the whole life of a launch
    def run(self) -> LaunchResult:
        t0 = time.monotonic()
        # Why not a TCPStore on port 0: its client and server look up each peer's address
        # (::ffff:127.0.0.1) by reverse DNS, and where DNS is slow or unreachable that stalls
        # a launch by 5 s or more. A file store needs no network and no name lookups.
        rendezvous = tempfile.mkdtemp(prefix="dpmp_lab-")
        try:
            self._start_ranks(os.path.join(rendezvous, "store"))
            outcome = self._watch(deadline=t0 + self.req.timeout)
            self._wind_down(outcome)
        except BaseException:
            self._kill_all()
            raise
        finally:
            self._close()
            shutil.rmtree(rendezvous, ignore_errors=True)
            if self.progress is not None:   # whatever did not finish was stopped by us
                self.progress.close([r.state if r.state in ("returned", "failed") else "stopped"
                                     for r in self.ranks])
        wall = time.monotonic() - t0
        if outcome != "returned":
            raise self._error(outcome)
        return LaunchResult(
            values=[r.value for r in self.ranks],
            output=[self._text(r) for r in self.ranks],
            traces=[r.trace for r in self.ranks] if self.trace else None,
            backend=worker.nccl_backend() if self.req.backend == "nccl" else self.req.backend,
            wall_time=wall,
            device_audit=self.req.device_audit,
        )

    def _start_ranks(self, store_path: str) -> None:
        ctx = _context(self.req.start_method)
        environ = dict(os.environ)
        environ.update(self._launch_environ())
        environ.update(self.req.env)
        common = dict(
            world_size=self.req.world_size,
            backend=self.req.backend,
            store_path=store_path,
            pg_timeout=self.req.pg_timeout,
            threads=self.req.threads,
            payload=self.payload,
            sys_path=list(sys.path),
            cwd=os.getcwd(),
            source_lines=_notebook_sources(),
            trace=self.trace,
            device_audit=self.req.device_audit,
        )
        for r in range(self.req.world_size):
            env_r = dict(environ, RANK=str(r), LOCAL_RANK=str(r))
            spec = worker.RankSpec(rank=r, environ=env_r, **common)
            out_r, out_w = ctx.Pipe(duplex=False)
            err_r, err_w = ctx.Pipe(duplex=False)
            msg_r, msg_w = ctx.Pipe(duplex=False)
            dump_r, dump_w = ctx.Pipe(duplex=False)
            rel_r, rel_w = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=worker.rank_main,
                args=(spec, out_w, err_w, msg_w, dump_w, rel_r),
                name=f"dpmp_lab-rank{r}",
            )
            rank = _Rank(r, proc, out_r, err_r, msg_r, dump_r, rel_w)
            self.ranks.append(rank)
            try:
                proc.start()
            finally:
                for conn in (out_w, err_w, msg_w, dump_w, rel_r):
                    conn.close()
            self.sel.register(out_r, selectors.EVENT_READ, (rank, "out"))
            self.sel.register(err_r, selectors.EVENT_READ, (rank, "err"))
            self.sel.register(msg_r, selectors.EVENT_READ, (rank, "msg"))
            self.sel.register(dump_r, selectors.EVENT_READ, (rank, "dump"))
            self.sel.register(proc.sentinel, selectors.EVENT_READ, (rank, "exit"))

    def _launch_environ(self) -> dict[str, str]:
        env = {
            "WORLD_SIZE": str(self.req.world_size),
            "LOCAL_WORLD_SIZE": str(self.req.world_size),
            "MPLBACKEND": "Agg",  # ranks have no display, and the kernel's inline backend is not theirs
            "OMP_NUM_THREADS": str(self.req.threads),
        }
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = "lo0" if sys.platform == "darwin" else "lo"
        return env

    # the event loop: until every rank returned, one failed, or time ran out
    def _watch(self, deadline: float) -> str:
        while True:
            if self.failures:
                return "failed"
            if all(r.state == "returned" for r in self.ranks):
                return "returned"
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            self._pump(min(deadline - now, 1.0))
            if self.progress is not None:
                self.progress.update([r.state for r in self.ranks])

    def _wind_down(self, outcome: str) -> None:
        if outcome == "returned":
            for r in self.ranks:
                self._release(r)
            self._pump_until(lambda: all(r.exited for r in self.ranks), _EXIT_WAIT_S)
        elif outcome == "failed":
            self._pump_until(lambda: all(r.state in ("returned", "failed") for r in self.ranks),
                             _STOP_GRACE_S)
        elif outcome == "timeout":
            self.stuck = [r for r in self.ranks if r.state not in ("returned", "failed")]
            for r in self.stuck:
                _signal(r.proc, signal.SIGUSR1)
            self._pump_until(lambda: all(self._knows_where(r) for r in self.stuck),
                             _DUMP_WAIT_S)
        self._kill_all()
        self._pump_until(lambda: not self._open_streams(), _DRAIN_S)
        self._flush_partial_lines()

    # reading the pipes
    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout=max(timeout, 0.0)):
            rank, kind = key.data
            if kind in ("out", "err"):
                self._read_output(rank, kind, key.fileobj)
            elif kind == "dump":
                data = _read(key.fileobj)
                if data:
                    rank.dumps.append(data.decode("utf-8", "replace"))
                else:
                    self._unregister(key.fileobj)
            elif kind == "msg":
                self._read_message(rank, key.fileobj)
            elif kind == "exit":
                self._unregister(key.fileobj)
                self._on_exit(rank)

    def _pump_until(self, done: Callable[[], bool], seconds: float) -> None:
        end = time.monotonic() + seconds
        while not done():
            left = end - time.monotonic()
            if left <= 0 or not self.sel.get_map():
                return
            self._pump(min(left, 0.1))

    def _read_output(self, rank: _Rank, kind: str, conn) -> None:
        data = _read(conn)
        key = (rank.rank, kind)
        decoder = self.decoders.setdefault(key, codecs.getincrementaldecoder("utf-8")("replace"))
        text = decoder.decode(data, final=not data)
        if not data:
            self._unregister(conn)
        if not text:
            return
        rank.chunks.append(text)
        lines = (self.partial.pop(key, "") + text).split("\n")
        if lines[-1]:
            self.partial[key] = lines[-1]
        for line in lines[:-1]:
            self._show(rank.rank, kind, line)

    def _show(self, rank: int, kind: str, line: str) -> None:
        if self.stream:
            stream = sys.stdout if kind == "out" else sys.stderr
            stream.write(f"[rank {rank}] {line}\n")

    def _flush_partial_lines(self) -> None:
        for (rank, kind), line in sorted(self.partial.items()):
            self._show(rank, kind, line)
        self.partial.clear()
        if self.stream:
            sys.stdout.flush()
            sys.stderr.flush()

    def _read_message(self, rank: _Rank, conn) -> None:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            self._unregister(conn)
            return
        message = serialize.loads(data)
        kind = message[0]
        if kind == "started":
            rank.state = "running"
            rank.main_thread = message[2]
        elif kind == "returned":
            rank.state = "returned"
            rank.value, rank.trace = message[1], message[2]
        elif kind == "raised":
            exc_type, text, tb, exitcode = message[1:]
            rank.state = "failed"
            self.failures.setdefault(rank.rank, RankFailure(
                rank=rank.rank, reason="exception", exc_type=exc_type, message=text,
                traceback=tb, exitcode=exitcode,
            ))

    def _on_exit(self, rank: _Rank) -> None:
        rank.exited = True
        # A result may still sit in the pipe: read it before deciding the rank died.
        while rank.msg in self.sel.get_map() and rank.msg.poll(0):
            self._read_message(rank, rank.msg)
        if rank.state in ("returned", "failed"):
            return
        if self.stopping:
            rank.state = "stopped"
            return
        rank.state = "failed"
        code = rank.proc.exitcode
        if code is not None and code < 0:
            sig = signal.Signals(-code)
            failure = RankFailure(rank.rank, "signal", exitcode=code, signal=sig)
        else:
            failure = RankFailure(rank.rank, "exit", exitcode=code)
        # faulthandler printed the stack of a fatal signal into stderr: lift it out.
        text = self._text(rank)
        before, _, dump = text.partition("Fatal Python error:")
        failure.traceback = _stack_from_dump(dump, rank.main_thread)
        failure.output_tail = _tail(before if failure.traceback else text)
        self.failures.setdefault(rank.rank, failure)

    def _release(self, rank: _Rank) -> None:
        try:
            rank.release.send_bytes(b"done")
        except OSError:
            pass

    # stopping and cleaning up
    def _kill_all(self) -> None:
        self.stopping = True
        for r in self.ranks:
            if r.proc.pid is not None and r.proc.exitcode is None:
                _signal(r.proc, signal.SIGKILL)

    def _open_streams(self) -> bool:
        return any(key.data[1] in ("out", "err") for key in self.sel.get_map().values())

    def _unregister(self, fileobj) -> None:
        try:
            self.sel.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def _close(self) -> None:
        for r in self.ranks:
            if r.proc.pid is not None:
                r.proc.join(timeout=5.0)
                if r.proc.exitcode is None:  # never seen: SIGKILL cannot be ignored
                    _signal(r.proc, signal.SIGKILL)
                    r.proc.join(timeout=5.0)
            for conn in (r.out, r.err, r.msg, r.dump, r.release):
                self._unregister(conn)
                conn.close()
            try:
                self._unregister(r.proc.sentinel)
                r.proc.close()
            except ValueError:
                pass
        self.sel.close()

    # building the error
    def _error(self, outcome: str) -> LaunchError:
        finished = [r.rank for r in self.ranks if r.state == "returned"]
        output = [self._text(r) for r in self.ranks]
        common = dict(output=output, finished=finished, world_size=self.req.world_size)
        if outcome == "timeout":
            failures = {
                r.rank: RankFailure(
                    r.rank, "timeout",
                    message=f"still running after {self.req.timeout:g} s (launch timeout)",
                    traceback=self._where_stuck(r),
                    output_tail=_tail(self._text(r)),
                )
                for r in sorted(self.stuck, key=lambda r: r.rank)
            }
            return LaunchTimeout(failures, stopped=[], hint=_hang_hint(failures), **common)
        # A rank that crashes takes its connections with it: its peers then fail with
        # "connection closed". Those are consequences; report the cause.
        causes = {k: f for k, f in self.failures.items() if not _lost_a_peer(f)}
        causes = causes or dict(self.failures)
        stopped = sorted(r.rank for r in self.ranks
                         if r.rank not in causes and r.state != "returned")
        if all(_is_collective_timeout(f) for f in causes.values()):
            causes = dict(sorted(causes.items()))
            for f in causes.values():
                f.reason = "timeout"
                p2p = _p2p_wait(f.traceback)
                f.message = (
                    f"waited {self.req.pg_timeout:g} s in a {p2p} whose partner never posted the "
                    f"matching {'recv' if p2p == 'send' else 'send'} (process-group timeout)"
                    if p2p else
                    f"waited {self.req.pg_timeout:g} s in a collective that not every rank "
                    f"joined (process-group timeout)")
            return LaunchTimeout(causes, stopped=stopped, hint=_hang_hint(causes), **common)
        return LaunchError(causes, stopped=stopped, hint=_hint_for(causes), **common)

    def _knows_where(self, rank: _Rank) -> bool:
        # A rank caught inside the launcher's own code was just reporting an error (its
        # process-group timeout fired at the same moment): wait for that report instead.
        dump = "".join(rank.dumps)
        whole = worker.__file__ in dump  # a dump ends with the launcher's frames
        return rank.rank in self.failures or (
            whole and bool(_stack_from_dump(dump, rank.main_thread)))

    def _where_stuck(self, rank: _Rank) -> str:
        stack = _stack_from_dump("".join(rank.dumps), rank.main_thread)
        if not stack and rank.rank in self.failures:
            # Its process-group timeout fired while the launcher asked: that traceback says it.
            stack = self.failures[rank.rank].traceback
        return stack

    def _text(self, rank: _Rank) -> str:
        return "".join(rank.chunks)


_HANG_HINT = (
    "a rank that never finishes is usually waiting in a collective that another rank did not "
    "call: a collective inside `if rank == ...`, a different number of loop iterations per rank, "
    "or collectives issued in a different order. The stack above shows where each rank waited."
)
_P2P_HANG_HINT = (
    "a send or recv that never completes: its partner never posted the matching recv or send "
    "(or posted it with another peer or tag), or every rank sent first and waits for a receiver "
    "that is itself sending (gloo's blocking send returns only once the receiver took the data). "
    "Post both directions at once with isend/irecv (or dist.batch_isend_irecv) and wait on "
    "them, or order them (even ranks send first, odd ranks receive first). The stack above "
    "shows where each rank waited."
)
_P2P_FUNCTIONS = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                  "recv_object_list")
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<name>\w+)')


def _p2p_wait(stack: str) -> str | None:
    """"send" or "recv" when the innermost torch.distributed call of a stack is point-to-point."""
    calls = [m.group("name") for m in _FRAME_RE.finditer(stack)
             if "distributed_c10d" in m.group("file")]
    if not calls or calls[-1] not in _P2P_FUNCTIONS:
        return None
    return "recv" if "recv" in calls[-1] else "send"


def _hang_hint(failures: dict[int, RankFailure]) -> str:
    if any(_p2p_wait(f.traceback) for f in failures.values()):
        return _P2P_HANG_HINT
    return _HANG_HINT


def _hint_for(failures: dict[int, RankFailure]) -> str | None:
    first = next(iter(failures.values()))
    text = first.output_tail + first.message
    if "size doesn't match" in text or "Mismatch" in text:
        return "the ranks passed tensors of different shapes or dtypes to the same collective."
    if first.reason == "signal" and first.signal and first.signal.name == "SIGKILL":
        return "the machine may have run out of memory: try smaller tensors or fewer ranks."
    return None


_TIMEOUT_RE = re.compile(r"timed out|timeout", re.IGNORECASE)
_PEER_LOST_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|connectFullMesh failed|Broken pipe",
    re.IGNORECASE,
)


def _lost_a_peer(failure: RankFailure) -> bool:
    return failure.reason == "exception" and bool(_PEER_LOST_RE.search(failure.message))


def _is_collective_timeout(failure: RankFailure) -> bool:
    return (
        failure.reason == "exception"
        and failure.exc_type is not None
        and ("DistBackendError" in failure.exc_type or "RuntimeError" in failure.exc_type
             or "DistError" in failure.exc_type)
        and bool(_TIMEOUT_RE.search(failure.message))
    )


# -- small helpers ----------------------------------------------------------------------------


def _read(conn) -> bytes:
    try:
        return os.read(conn.fileno(), 65536)
    except OSError:
        return b""


def _signal(proc, sig: int) -> None:
    """Signal a rank and everything it started (each rank leads its own process group)."""
    try:
        os.killpg(proc.pid, sig)
        return
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _indent(text: str, n: int = 2) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in text.splitlines())


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _short_repr(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_DUMP_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")


def _stack_from_dump(dump: str, main_thread: int | None) -> str:
    """Turn faulthandler's dump of a stuck rank into a traceback of its main thread.

    faulthandler writes "most recent call first" without source lines; a learner reads
    tracebacks the other way round, with the code shown, so reverse it and add the source
    (notebook cells included: the kernel's linecache has them).
    """
    blocks: dict[int | None, list[str]] = {}
    current: int | None = None
    for line in dump.splitlines():
        head = _DUMP_THREAD.match(line)
        if head:
            current = int(head.group(1), 16)
            blocks[current] = []
        elif _DUMP_FRAME.match(line):
            blocks.setdefault(current, []).append(line)
    frames = list(reversed(blocks.get(main_thread) or next(iter(blocks.values()), [])))
    parsed = [_DUMP_FRAME.match(line) for line in frames]
    # Everything up to the launcher's own frames is process start-up: show what came after.
    starts = [i for i, m in enumerate(parsed) if m.group("file") == worker.__file__]
    parsed = parsed[starts[-1] + 1:] if starts else parsed
    out = ["Traceback (most recent call last):"] if parsed else []
    for m in parsed:
        path, lineno, name = m.group("file"), int(m.group("line")), m.group("name")
        if path.endswith(worker.PLUMBING) or os.sep + "multiprocessing" + os.sep in path:
            continue
        out.append(f'  File "{path}", line {lineno}, in {name}')
        source = linecache.getline(path, lineno).strip()
        if source:
            out.append(f"    {source}")
    return "\n".join(out) if len(out) > 1 else ""
