"""What runs inside one rank: set the process up, run the learner's function, report back.

The launcher (supervisor.py) starts one process per rank with `rank_main` as its target. A rank
talks to the launcher through plain pipes (protocol.Pipe):

    out, err   the rank's file descriptors 1 and 2, so native messages (gloo, NCCL) are kept
    msg        messages to the launcher (protocol.py): Started, then Returned or Raised
    dump       where faulthandler writes every thread's stack when the launcher asks (SIGUSR1)
    release    the launcher says "everyone has returned": only then is the group torn down;
               or, on a hang, "write your flight record" (flight.py), which a thread of the
               rank answers while the main thread waits in a collective

The last one matters: a rank that returns early must not destroy its process group while a
peer still waits in a collective, or the peer sees "connection closed" instead of the real
problem (a collective that only some ranks called). A function that destroys the group
itself is told so (Returned.destroyed_group).

Nothing a rank starts outlives it: the rank is the subreaper of its descendants (they stay
below it even when they leave its session) and kills them as it ends (processes.py).

The rank's context (dpmp_lab.context: `rank()`, `world_size()`, `device()`) is set here as the
rank starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import faulthandler
import linecache
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist
import torch.overrides
from torch.distributed import c10d_logger
from torch.distributed import distributed_c10d as c10d

import dpmp_lab
import dpmp_lab.integrity as integrity
from dpmp_lab import context
from dpmp_lab.context import RankContext, nccl_backend
from dpmp_lab.i18n.messages import _
from dpmp_lab.launcher import audit, collective_inputs, flight, processes, serialize
from dpmp_lab.launcher.protocol import (
    MAX_RESULT_BYTES,
    Message,
    Raised,
    Returned,
    Started,
    exception_name,
)
from dpmp_lab.render import human_bytes
from dpmp_lab.trace import trace as record_trace  # (the facade's dl.trace)

REAP_S = 1.0  # at the end of a rank: time for the processes it killed to end
RELEASE = b"done"        # on the release pipe: every rank returned, tear the group down
WRITE_RECORD = b"record"  # on the release pipe: a hang; write this rank's flight record


@dataclass
class RankSpec:
    """Everything the launcher hands one rank (plain data: it crosses the process boundary)."""

    rank: int
    world_size: int
    backend: str
    store_path: str  # a FileStore in a directory of this launch's own
    flight_dir: str  # where this rank's flight record goes when asked (flight.py)
    pg_timeout: float
    threads: int
    payload: bytes  # cloudpickle of (fn, args, kwargs)
    environ: dict[str, str]  # the caller's os.environ, plus the launch's own variables
    sys_path: list[str]
    cwd: str
    source_lines: dict[str, tuple] = field(default_factory=dict)  # notebook cells, for tracebacks
    trace: bool = False
    device_audit: bool = False  # see audit.py: cpu:0 stands in for the GPU, misplaced data fails
    max_result_bytes: int = MAX_RESULT_BYTES
    start_method: str = "forkserver"   # how the process was started, so how it will end


def rank_main(spec: RankSpec, out_w: Connection, err_w: Connection, msg_w: Connection,
              dump_w: Connection, release_r: Connection) -> None:
    """Entry point of a rank process (the target of multiprocessing.Process)."""
    processes.become_subreaper()
    _own_process_group()
    _die_with_parent()
    _redirect_output(out_w.fileno(), err_w.fileno())
    out_w.close()
    err_w.close()
    faulthandler.enable(file=sys.stderr, all_threads=True)  # SIGSEGV/SIGABRT print a stack
    faulthandler.register(signal.SIGUSR1, file=dump_w, all_threads=True)
    _apply_caller_state(spec)
    _send(msg_w, Started(main_thread=threading.get_ident()))
    released = _listen(spec, release_r)
    try:
        _run(spec, msg_w, released)
    finally:  # its report is sent: what the function started ends with the rank
        processes.kill_tree(os.getpid(), include_self=False)
        processes.reap_children(REAP_S)


def _run(spec: RankSpec, msg_w: Connection, released: threading.Event) -> None:
    try:
        dpmp_lab.load()   # before any code of the learner's: spawned ranks load it here
        with audit.auditing() if spec.device_audit else contextlib.nullcontext():
            fn, args, kwargs = _load_payload(spec)
            context.enter(_init_process_group(spec))
            with collective_inputs.checked():
                value, trace = _call_user(fn, args, kwargs, spec.trace)
            destroyed = not dist.is_initialized()  # fn called dist.destroy_process_group()
        if integrity.grading():   # the rank's code may not have changed what grades it
            integrity.verify()
        _send_result(msg_w, value, trace, limit=spec.max_result_bytes, destroyed_group=destroyed)
    except BaseException as exc:
        _flush_all()
        flight.dump(spec.flight_dir, spec.rank, spec.backend)  # a timeout: what was in flight
        _send(msg_w, _describe(exc))
        _flush_all()
        return  # the launcher stops every rank now; tearing the group down here could hang
    _flush_all()
    released.wait()
    # Every rank has reported. A forked rank ends with os._exit (multiprocessing's fork and
    # forkserver), where no destructor runs and the OS closes the group's sockets: tearing the
    # group down first would only wait 20-40 ms for gloo's pairs to close, a third of a small
    # launch. A spawned rank ends through the interpreter's exit, whose destructors would.
    if dist.is_initialized() and spec.start_method == "spawn":
        dist.destroy_process_group()
    _flush_all()


# -- process setup -------------------------------------------------------------------------


def _own_process_group() -> None:
    # The launcher stops a rank with killpg, which also reaches anything the rank started.
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def _die_with_parent() -> None:
    """If the launching process dies (kernel restarted), take this rank down with it.

    A forkserver child inherits a pipe that keeps the forkserver alive while any child lives;
    closing it lets the forkserver exit when the kernel dies, and this rank follows its parent.
    """
    server = getattr(forkserver, "_forkserver", None)
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        try:
            os.close(server._forkserver_alive_fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="dpmp-parent-watch", daemon=True).start()


def _redirect_output(out_fd: int, err_fd: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdout = sys.__stdout__ = open(  # noqa: SIM115 - lives as long as the process
        1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
    sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
        2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )


def _apply_caller_state(spec: RankSpec) -> None:
    """Make this rank see the caller's environment, import path and working directory.

    A forkserver child is a copy of a server started long ago; without this it would see the
    environment of that moment, not the notebook's current one.
    """
    os.environ.clear()
    os.environ.update(spec.environ)
    sys.path[:] = spec.sys_path
    try:
        os.chdir(spec.cwd)
    except OSError:
        pass
    linecache.cache.update(spec.source_lines)
    torch.set_num_threads(spec.threads)
    # torch reads TORCH_DISTRIBUTED_DEBUG when torch.distributed is imported, long before this
    # rank existed (the forkserver preloads torch): read it again from the caller's environment
    dist.set_debug_level_from_env()


def _load_payload(spec: RankSpec) -> tuple[Any, tuple, dict]:
    try:
        # In a device audit every tensor that arrives is marked as living on the CPU, as it
        # would on a GPU server.
        return audit.loads(spec.payload) if spec.device_audit else serialize.loads(spec.payload)
    except BaseException as exc:
        raise RuntimeError(_(
            "rank {rank} could not load the function and its arguments: {kind}: {error}").format(
                rank=spec.rank, kind=type(exc).__name__, error=exc)
        ) from exc


def _init_process_group(spec: RankSpec) -> RankContext:
    timeout = datetime.timedelta(seconds=spec.pg_timeout)
    local_rank = spec.rank  # launch() starts every rank on this machine
    backend = spec.backend
    if spec.device_audit:
        dev = audit.AUDIT_DEVICE
    elif backend == "nccl":
        torch.cuda.set_device(local_rank)
        # Graded runs compare with the kernel's fp32/fp64 reference: no TF32 shortcuts.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dev = torch.device("cuda", local_rank)
        backend = nccl_backend()
    else:
        dev = torch.device("cpu")
    store = dist.FileStore(spec.store_path, spec.world_size)
    store.set_timeout(timeout)
    dist.init_process_group(
        backend,
        store=store,
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=timeout,
    )
    # A group fn makes (dist.new_group) takes torch's default timeout, 30 minutes (10 on nccl):
    # a collective on it that not every member joins would wait for the launch's own timeout.
    # It waits the launch's process-group timeout instead, as the default group does.
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    return RankContext(spec.rank, spec.world_size, dev)


def _call_user(fn, args, kwargs, traced: bool) -> tuple[Any, Any]:
    if not traced:
        return fn(*args, **kwargs), None
    with record_trace() as t:
        value = fn(*args, **kwargs)
    return value, t


# -- reporting -----------------------------------------------------------------------------


def _send(conn, message: Message) -> None:
    conn.send_bytes(serialize.dumps(message))


def _send_result(conn, value, trace, *, limit: int, destroyed_group: bool) -> None:
    try:
        pickled = serialize.dumps(value)
    except Exception as exc:
        raise TypeError(_(
            "the function returned a {kind} that cannot be sent back to the notebook "
            "({error_kind}: {error}). Return plain Python values, numbers or tensors (for a "
            "DTensor, return .full_tensor() or .to_local()).").format(
                kind=type(value).__name__, error_kind=type(exc).__name__, error=exc)
        ) from exc
    pickled_trace = serialize.dumps(trace)
    check_result_size(len(pickled) + len(pickled_trace), limit)
    _send(conn, Returned(value=pickled, trace=pickled_trace, destroyed_group=destroyed_group))


def check_result_size(size: int, limit: int) -> None:
    """Refuse a result over the launch's max_result_bytes here, where the error names the
    rank, instead of making the notebook read it."""
    if size > limit:
        raise ValueError(_(
            "the function's result is {pickled} pickled ({size:,} bytes), over the launch's "
            "limit of {most} (max_result_bytes={limit:,}). Return less (a summary, a slice, a "
            "smaller dtype), or raise the limit: dl.launch(..., max_result_bytes=...).").format(
                pickled=human_bytes(size), size=size, most=human_bytes(limit), limit=limit)
        )


def _describe(exc: BaseException) -> Raised:
    """What the launcher is told about an exception in this rank."""
    kind = type(exc)
    name = exception_name(kind)
    exitcode = None
    if isinstance(exc, SystemExit):
        exitcode = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    report = traceback.TracebackException(kind, exc, exc.__traceback__)
    _drop_plumbing(report)
    return Raised(exc_type=name, message=str(exc), traceback="".join(report.format()),
                  exitcode=exitcode)


# Frames that only wrap the learner's call: this module's, torch's logging decorator, the
# device audit's mode, the tracer's dispatcher kernel and the check of a collective's tensors.
# (Each named by its module's file, so that a module renamed fails here, at import.)
PLUMBING = (__file__, c10d_logger.__file__, audit.__file__,
            sys.modules[record_trace.__module__].__file__, contextlib.__file__,
            torch.overrides.__file__, collective_inputs.__file__)


def _drop_plumbing(report: traceback.TracebackException | None, seen: set | None = None) -> None:
    seen = set() if seen is None else seen
    if report is None or id(report) in seen:
        return
    seen.add(id(report))
    report.stack = traceback.StackSummary.from_list(
        [f for f in report.stack if not f.filename.endswith(PLUMBING)]
    )
    _drop_plumbing(report.__cause__, seen)
    _drop_plumbing(report.__context__, seen)


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (ValueError, OSError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers (printf from native code)
    except (OSError, AttributeError):
        pass


def _listen(spec: RankSpec, release_r: Connection) -> threading.Event:
    """Answer the launcher's requests on the release pipe from a thread of their own: a rank
    stuck in a collective still writes its flight record (the wait releases the GIL)."""
    released = threading.Event()

    def listen() -> None:
        try:
            while release_r.recv_bytes() == WRITE_RECORD:
                flight.dump(spec.flight_dir, spec.rank, spec.backend)
        except (EOFError, OSError):
            pass  # the launcher is gone: nothing to wait for
        released.set()

    threading.Thread(target=listen, name="dpmp-release", daemon=True).start()
    return released
