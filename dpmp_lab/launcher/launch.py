"""launch(): start N ranks of a function from a notebook cell, stream their output, collect results.

    res = dl.launch(fn, *args, world_size=4)
    res.values      per-rank return values (res[r] is res.values[r])
    res.output      per-rank stdout+stderr text

How it works, top to bottom, and where each step lives:
  1. check the request before any process starts (here: bad input is a ValueError/TypeError);
  2. pickle fn, args and kwargs with cloudpickle (serialize.py), so functions defined in a
     notebook travel;
  3. start one process per rank (starting.py: a forkserver with torch preloaded, fast after
     the first launch), with a rendezvous of the launch's own: a FileStore in a fresh
     temporary directory, so two launches never collide and no port is guessed (supervisor.py);
  4. watch every rank's pipes: print output lines live as "[rank r] ..." (lines.py), receive
     results (protocol.py), notice ranks that raise, die or hang (supervisor.py, ranks.py);
  5. stop every rank, close every pipe, and return, or raise the LaunchError / LaunchTimeout
     that names the failing ranks and why (failures.py).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpmp_lab._helpers import positive_seconds, short_repr, whole_number
from dpmp_lab.context import nccl_backend
from dpmp_lab.i18n.messages import N_, _
from dpmp_lab.launcher import serialize
from dpmp_lab.launcher.cores import usable_cores
from dpmp_lab.launcher.failures import (
    UNGUARDED_EXIT,
    LaunchError,
    LaunchTimeout,
    RankFailure,
    UnguardedLaunch,
)
from dpmp_lab.launcher.protocol import MAX_RESULT_BYTES
from dpmp_lab.launcher.ranks import Request
from dpmp_lab.launcher.starting import PRELOAD, START_METHODS, WARM_ENV, importing_main, warm_up
from dpmp_lab.launcher.supervisor import Supervisor

__all__ = [  # the launcher's public names, wherever they are defined
    "AUDIT_ENV", "BACKENDS", "DEBUG_ENV", "LOG_ENV", "PRELOAD", "START_METHODS", "WARM_ENV",
    "LaunchError", "LaunchResult", "LaunchTimeout", "RankFailure", "UnguardedLaunch",
    "audit_refused", "audit_requested", "backends_of", "launch", "ranks_have_gpus", "route_launches",
    "usable_cores", "visible_gpus", "warm_up",
]

BACKENDS = ("auto", "gloo", "nccl")
LOG_ENV = "DPMP_LAB_LAUNCH_LOG"
AUDIT_ENV = "DPMP_LAB_DEVICE_AUDIT"
DEBUG_ENV = "TORCH_DISTRIBUTED_DEBUG"   # torch's: OFF, INFO or DETAIL
# where launches go instead, when a grading harness says so (route_launches)
_route: Callable[[Any, tuple, dict, dict], LaunchResult | None] | None = None


def route_launches(route: Callable[[Any, tuple, dict, dict], LaunchResult | None]) -> None:
    """From now on every launch first asks `route(fn, args, kwargs, options)`, and returns its
    result unless it is None. A grading harness (dpmp_lab/harness/remote.py) sends there the
    launches of the learner's code, which must run in the learner's sandbox."""
    global _route
    _route = route


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
        through = _("{device} tensors through {backend}")
        served = ", ".join(through.format(device=dev.upper(), backend=name)
                           for dev, name in self.backends.items())
        if self.device_audit:
            where = (N_("{n} ranks on the CPU under the device audit (dl.device() is cpu:0, its "
                        "stand-in for a GPU)") if n > 1 else
                     N_("1 rank on the CPU under the device audit (dl.device() is cpu:0, its "
                        "stand-in for a GPU)"))
        elif "cuda" in self.backends:
            where = N_("{n} ranks on cuda:0..cuda:{last}") if n > 1 else N_("1 rank on cuda:0")
        else:
            where = N_("{n} ranks on the CPU") if n > 1 else N_("{n} rank on the CPU")
        return _("{where}; {served}; {seconds:.2f} s").format(
            where=_(where).format(n=n, last=n - 1), served=served, seconds=self.wall_time)

    def __getitem__(self, rank: int) -> Any:
        return self.values[rank]

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values)

    def __repr__(self) -> str:
        shown = ", ".join(short_repr(v) for v in self.values)
        return (
            f"LaunchResult(world_size={self.world_size}, backend={self.backend!r}, "
            f"wall_time={self.wall_time:.2f}s, values=[{shown}])"
        )


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
    max_result_bytes: int = MAX_RESULT_BYTES,
    debug: bool = False,
    fn_kwargs: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> LaunchResult:
    """Run `fn(*args, **kwargs)` on `world_size` ranks, each in its own process with the default
    process group initialised, and return what every rank returned.

    fn_kwargs:    keyword arguments for fn whose names are the launcher's own options below
                  (`timeout`, `env`, ...): `launch(fn, fn_kwargs={"timeout": 5})` calls
                  fn(timeout=5); other keyword arguments may go either way.

    backend:      "auto" (nccl when there is one GPU per rank, else gloo), "gloo" or "nccl".
    timeout:      seconds the ranks may run, from when they are started (a first launch's
                  wait for the forkserver to import torch is not theirs); past it the
                  stuck ranks are named (LaunchTimeout).
    pg_timeout:   process-group timeout (default min(timeout, 30)): a collective that not every
                  rank joins fails after this long instead of torch's default of minutes.
    start_method: "forkserver" (default: torch preloaded, ~0.1 s a launch), "fork", "spawn".
    trace:        record every collective and p2p op each rank issues inside fn; one
                  dl.Trace per rank comes back in `res.traces`.
    env:          extra environment variables for the ranks (TORCH_DISTRIBUTED_DEBUG among
                  them takes effect: each rank reads it again before its process group starts).
    threads:      torch threads per rank (default: cores // world_size, at least 1).
    stream:       print every rank's output live, prefixed "[rank r]".
    progress:     show each rank's state (starting, running, done, failed) under the cell
                  while it runs: a widget in Jupyter, text elsewhere in IPython (default: when
                  streaming in IPython; never outside IPython).
    device_audit: run on the CPU as if each rank had a GPU, and fail where the code would put
                  data on the wrong device there (see dpmp_lab/launcher/audit.py). Default: on when the
                  environment has DPMP_LAB_DEVICE_AUDIT=1 (dl.check.launch, a check's launch,
                  turns it on where the ranks have no GPU each, unless it is 0).
    max_result_bytes: the most one rank may return, pickled (default 256 MiB): past it the rank
                  fails with its result's size, and the notebook never reads it.
    debug:        torch's own checks in the ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL): before each
                  collective the ranks compare op, shapes and dtypes, so one that ranks call
                  differently fails at once, naming both ranks' ops and shapes, instead of
                  hanging until the process-group timeout. Each collective costs more.
    """
    if importing_main():
        # This process is a rank being started, and multiprocessing is importing the main
        # script in it: the script launches at its top level, unguarded. Leave quietly; the
        # launch in the script's own process sees this exit code and explains it, once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(UNGUARDED_EXIT)
    if fn_kwargs is not None:
        if not isinstance(fn_kwargs, Mapping) or not all(isinstance(k, str) for k in fn_kwargs):
            raise TypeError(_("fn_kwargs must map names to values, got {value}").format(
                value=short_repr(fn_kwargs)))
        both = sorted(set(fn_kwargs) & set(kwargs))
        if both:
            raise TypeError(_("launch() got {names} both as a keyword argument and in "
                              "fn_kwargs: give each once").format(names=", ".join(both)))
        kwargs = {**kwargs, **fn_kwargs}
    if _route is not None:
        options = {"world_size": world_size, "backend": backend, "timeout": timeout,
                   "start_method": start_method, "trace": trace, "env": env,
                   "threads": threads, "pg_timeout": pg_timeout, "stream": stream,
                   "progress": progress, "device_audit": device_audit,
                   "max_result_bytes": max_result_bytes, "debug": debug}
        routed = _route(fn, args, kwargs, options)
        if routed is not None:
            return routed
    request = _check_request(fn, world_size, backend, timeout, start_method, env, threads,
                             pg_timeout, device_audit, max_result_bytes, debug)
    payload = _pickle_payload(fn, args, kwargs)
    outcome = "failed"
    try:
        t0 = time.monotonic()
        ranks = Supervisor(request, payload, trace=trace, stream=stream,
                           progress=stream if progress is None else progress).run()
        outcome = "ok"
        return LaunchResult(
            values=[r.value for r in ranks],
            output=[r.output for r in ranks],
            traces=[r.trace for r in ranks] if trace else None,
            backend=_initialised_backend(request),
            wall_time=time.monotonic() - t0,
            device_audit=request.device_audit,
        )
    except KeyboardInterrupt:
        outcome = "interrupted"
        # raised afresh, so the learner reads one line instead of the event loop's stack
        raise KeyboardInterrupt(_("interrupted: all {n} ranks were stopped").format(
            n=world_size)) from None
    finally:
        _log_launch(request, outcome)


def _initialised_backend(request: Request) -> str:
    return nccl_backend() if request.backend == "nccl" else request.backend


def _log_launch(request: Request, outcome: str) -> None:
    """Append one JSON line per launch to $DPMP_LAB_LAUNCH_LOG, when set: how
    tools/gpu_course.py counts the cells that ran on each backend."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = json.dumps({"world_size": request.world_size, "backend": _initialised_backend(request),
                       "device_audit": request.device_audit, "outcome": outcome})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def audit_requested() -> bool:
    """Whether DPMP_LAB_DEVICE_AUDIT asks every launch for a device audit."""
    return os.environ.get(AUDIT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def audit_refused() -> bool:
    """Whether DPMP_LAB_DEVICE_AUDIT asks that no launch be audited, a check's included."""
    return os.environ.get(AUDIT_ENV, "").strip().lower() in ("0", "false", "no", "off")


def backends_of(backend: str) -> dict[str, str]:
    """{"cuda": "nccl", "cpu": "gloo"} for "cpu:gloo,cuda:nccl"; {"cpu": "gloo"} for "gloo"."""
    if ":" not in backend:
        return {"cuda": backend} if backend == "nccl" else {"cpu": backend}
    pairs = (part.split(":", 1) for part in backend.split(","))
    return dict(sorted(((dev, name) for dev, name in pairs), key=lambda p: p[0] != "cuda"))


def ranks_have_gpus(backend: str, world_size: int) -> bool:
    """Whether a launch with `backend` gives each of its `world_size` ranks a GPU of its own."""
    if backend == "gloo" or (":" in backend and "cuda" not in backends_of(backend)):
        return False
    return _resolve_backend("auto", world_size) == "nccl"   # the one rule for a GPU per rank


def visible_gpus() -> int:
    """GPUs this process could use, counted without initialising CUDA (NVML, as torch does)."""
    if not torch.backends.cuda.is_built():
        return 0
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


# -- checking the request ---------------------------------------------------------------------


def _main_without_a_file() -> str | None:
    """What the main script was read from when it names a file that is not there (python -
    reads it from standard input: "<stdin>"), else None. A rank that multiprocessing starts
    afresh runs the main script's file again, which then fails in every rank."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None or not isinstance(path, str):
        return None
    return None if os.path.exists(path) else path


def _check_request(fn, world_size, backend, timeout, start_method, env, threads,
                   pg_timeout, device_audit=None, max_result_bytes=MAX_RESULT_BYTES,
                   debug=False) -> Request:
    if not callable(fn):
        raise TypeError(_("launch() needs a function to run on every rank, got {kind}").format(
            kind=type(fn).__name__))
    whole_number("world_size", world_size)
    if start_method not in START_METHODS:
        raise ValueError(_("start_method must be one of {methods}, got {method!r}").format(
            methods=START_METHODS, method=start_method))
    if start_method not in mp.get_all_start_methods():
        raise ValueError(_("start_method {method!r} is not available on {platform}").format(
            method=start_method, platform=sys.platform))
    if sys.platform == "win32":
        raise RuntimeError(_("dl.launch runs on Linux and macOS; on Windows use WSL2."))
    if start_method != "fork" and _main_without_a_file():
        raise RuntimeError(_(
            "this script was read from {source}, and every rank started with "
            "start_method={method!r} imports the main script again from its file to "
            "find the function it runs: there is none. Save it and run `python script.py` "
            "(with the launch under `if __name__ == \"__main__\":`), or pass "
            "start_method=\"fork\".").format(source=_main_without_a_file(), method=start_method))
    positive_seconds("timeout", timeout)
    positive_seconds("pg_timeout", pg_timeout)
    if threads is not None:
        whole_number("threads", threads)
    whole_number("max_result_bytes", max_result_bytes)
    env = dict(env or {})
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(_("env must map str to str, got {key!r}: {value!r}").format(
                key=key, value=value))
    if not isinstance(debug, bool):
        raise TypeError(_("debug must be True or False, got {debug!r}").format(debug=debug))
    if debug:
        env[DEBUG_ENV] = "DETAIL"
    if not dist.is_available():
        raise RuntimeError(_("this torch build has no torch.distributed support"))
    if dist.is_initialized():
        raise RuntimeError(_(
            "a default process group is already initialised in this process (a cell called "
            "dist.init_process_group?). launch() starts its own ranks, each with its own group: "
            "call dist.destroy_process_group() here first."))
    if backend not in BACKENDS:
        raise ValueError(_("backend must be one of {backends}, got {backend!r}").format(
            backends=BACKENDS, backend=backend))
    if device_audit is None:
        device_audit = audit_requested()
    if device_audit and backend == "nccl":
        raise ValueError(_("the device audit runs on the CPU with gloo (cpu:0 stands in for the "
                           "GPU): launch with backend='auto' or 'gloo' to audit"))
    return Request(
        world_size=world_size,
        backend="gloo" if device_audit else _resolve_backend(backend, world_size),
        device_audit=bool(device_audit),
        timeout=float(timeout),
        pg_timeout=float(pg_timeout) if pg_timeout is not None else min(float(timeout), 30.0),
        start_method=start_method,
        env=env,
        threads=threads or max(1, usable_cores() // world_size),
        max_result_bytes=max_result_bytes,
    )


def _resolve_backend(backend: str, world_size: int) -> str:
    if backend == "gloo":
        return "gloo"
    gpus = visible_gpus()
    enough = gpus >= world_size and dist.is_nccl_available()
    if backend == "auto":
        return "nccl" if enough else "gloo"
    if not dist.is_nccl_available():
        raise ValueError(_("backend='nccl' was asked for, but this torch build has no NCCL"))
    if not enough:
        raise ValueError(_(
            "backend='nccl' needs one GPU per rank: world_size={world_size}, but {gpus} "
            "GPU(s) are visible. Use backend='gloo' (or 'auto') to run on the CPU.").format(
                world_size=world_size, gpus=gpus))
    return "nccl"


def _pickle_payload(fn, args, kwargs) -> bytes:
    """Pickle fn, args and kwargs; when that fails, say which one cannot travel."""
    try:
        return serialize.dumps((fn, args, kwargs))
    except Exception as exc:
        parts = [(_("the function"), fn)]
        parts += [(_("positional argument {i} ({kind})").format(i=i, kind=type(a).__name__), a)
                  for i, a in enumerate(args)]
        parts += [(_("keyword argument {name!r} ({kind})").format(name=k, kind=type(v).__name__),
                   v) for k, v in kwargs.items()]
        for what, obj in parts:
            try:
                serialize.dumps(obj)
            except Exception as part_exc:
                raise ValueError(_(
                    "{what} cannot be sent to the ranks: {error}. Every rank is a separate "
                    "process, so fn and its arguments are pickled; create objects such as "
                    "locks, open files or process groups inside fn.").format(
                        what=what, error=f"{type(part_exc).__name__}: {part_exc}")
                ) from part_exc
        raise ValueError(_("the launch cannot be pickled: {error}").format(
            error=f"{type(exc).__name__}: {exc}")) from exc
