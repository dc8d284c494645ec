"""Profiles of a step inside a rank: torch.profiler's events reduced to compute and
communication intervals, and the overlap between them read from their order.

    out, prof = dl.bench.profile(step)        # inside a rank (re-exported by dpmp_lab.bench)
    prof.overlapped(), prof.comm_share()
    dl.bench.profile(step, trace_dir="traces")   # and traces/rank<r>.json, a Chrome trace
    dl.viz.profile(res)                       # the per-rank picture (dpmp_lab.viz.profile_picture)

Compute intervals: forward is the top-level aten ops of the calling thread, backward is
autograd's evaluate_function nodes (on whatever thread the engine runs them), "other" is the
calling thread's work after backward began (dividing gradients, the optimizer). Communication:
from the c10d call that issued a collective to the end of the backend's execution of it
(gloo:* or nccl:*, matched by op in order).

With `trace_dir`, each rank also writes torch.profiler's own events as a Chrome trace,
rank<r>.json: what torch users open in Perfetto (ui.perfetto.dev) or chrome://tracing, and what
HolisticTraceAnalysis reads from an nccl run.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from dpmp_lab.context import device, synchronize

__all__ = ["Interval", "Profile", "intervals_from_events", "profile"]


class Interval(NamedTuple):
    """Something a rank did from start to end (ms from the start of the profile).

    kind: "forward", "backward" or "other" (compute on the calling thread after backward
    began: the optimizer, dividing gradients), or "comm" (a collective from its issue to the
    end of its execution)."""

    kind: str
    name: str
    start: float
    end: float


_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:")


def _op_key(name: str) -> str:
    """One key per collective whatever layer names it: c10d::allreduce_, gloo:all_reduce and
    nccl:all_reduce are 'allreduce'; c10d::_allgather_base_ and gloo:all_gather_into_tensor
    are 'allgather'."""
    key = name.split(":")[-1].replace("_", "").lower()
    for suffix in ("coalesced", "base", "tensor", "into", "single"):
        key = key.removesuffix(suffix)
    return key


@dataclass
class Profile:
    """One rank's profiled call, as intervals; `compute` holds forward and backward ones."""

    rank: int
    compute: list[Interval]
    comm: list[Interval]
    wall: float                                          # ms from first to last event
    issues: list[float] = field(default_factory=list)    # ms when each collective was issued
    trace_file: str | None = None                        # the Chrome trace written, if asked

    def overlapped(self) -> bool:
        """True when backward computed after a collective was issued: communication launched
        while gradients were still being computed (the issuing node itself not counted).

        This is the program's overlap, read from the order of intervals, so it does not depend
        on how fast this machine's network is: on gloo the execution shares the CPU cores."""
        return any(k.kind == "backward" and k.start > c.start
                   for c in self.comm for k in self.compute)

    def comm_share(self) -> float:
        """Share of the wall time with communication in flight and no compute running."""
        exposed = _measure(_subtract(_union(self.comm), _union(self.compute)))
        return exposed / self.wall if self.wall > 0 else 0.0


def _union(intervals: Iterable[Interval]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for iv in sorted(intervals, key=lambda i: i.start):
        if out and iv.start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], iv.end)
        else:
            out.append([iv.start, iv.end])
    return [(a, b) for a, b in out]


def _subtract(spans: list[tuple[float, float]],
              holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for a, b in spans:
        cut = a
        for h0, h1 in holes:
            if h1 <= cut or h0 >= b:
                continue
            if h0 > cut:
                out.append((cut, h0))
            cut = max(cut, h1)
        if cut < b:
            out.append((cut, b))
    return out


def _measure(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _is_comm(name: str) -> bool:
    return name.startswith(_COMM_PREFIXES)


def _is_compute(name: str) -> bool:
    return name.startswith(("aten::", "autograd::engine::evaluate_function"))


def _ancestors(ev: Any) -> Iterable[Any]:
    parent = ev.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def intervals_from_events(events: Sequence[Any], rank: int,
                          main_thread: int | None) -> Profile:
    """Reduce torch.profiler's FunctionEvents to a Profile (see the module docstring)."""
    if not events:
        return Profile(rank, [], [], 0.0)
    t0 = min(e.time_range.start for e in events)
    ms = lambda us: (us - t0) / 1e3  # noqa: E731
    compute, issued, executed = [], [], []
    for ev in events:
        name = ev.name
        if name.startswith("c10d::"):
            if not any(a.name.startswith("c10d::") for a in _ancestors(ev)):
                issued.append(ev)
        elif name.startswith(("gloo:", "nccl:")):
            executed.append(ev)
        elif _is_compute(name):
            above = list(_ancestors(ev))
            if any(_is_compute(a.name) or _is_comm(a.name) for a in above):
                continue
            if name.startswith("autograd::engine::evaluate_function"):
                compute.append(Interval("backward", name.split(": ", 1)[-1],
                                        ms(ev.time_range.start), ms(ev.time_range.end)))
            elif ev.thread == main_thread:
                compute.append(Interval("forward", name, ms(ev.time_range.start),
                                        ms(ev.time_range.end)))
    # what the calling thread computes after backward began (the optimizer, the 1/N of the
    # gradients) is not forward
    first_backward = min((k.start for k in compute if k.kind == "backward"), default=math.inf)
    compute = [k._replace(kind="other") if k.kind == "forward" and k.start > first_backward
               else k for k in compute]
    comm = []
    queues: dict[str, list[Any]] = {}
    for ev in sorted(executed, key=lambda e: e.time_range.start):
        queues.setdefault(_op_key(ev.name), []).append(ev)
    for ev in sorted(issued, key=lambda e: e.time_range.start):
        queue = queues.get(_op_key(ev.name), [])
        done = queue.pop(0).time_range.end if queue else ev.time_range.end
        comm.append(Interval("comm", ev.name.removeprefix("c10d::").rstrip("_"),
                             ms(ev.time_range.start), ms(max(done, ev.time_range.end))))
    compute.sort(key=lambda i: i.start)
    wall = ms(max(e.time_range.end for e in events))
    return Profile(rank, compute, comm, wall, [c.start for c in comm])


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile(fn: Callable[..., Any], *args: Any, trace_dir: str | os.PathLike | None = None,
            **kwargs: Any) -> tuple[Any, Profile]:
    """Run `fn(*args, **kwargs)` once under torch.profiler inside a rank: (its result, Profile).

    Warm the step up before profiling it: a first call's one-off setup would fill the picture.
    `trace_dir`: a folder (made if missing) where this rank writes its Chrome trace, named
    rank<r>.json by its global rank so that the ranks of one launch never overwrite each other.
    """
    activities = [ProfilerActivity.CPU]
    if device().type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    thread = None
    prof = torch_profile(activities=activities)
    with _quiet_native_stderr():        # kineto prints a line on stderr at start and at stop
        prof.start()
    try:
        with torch.profiler.record_function("dpmp_lab.bench.profile"):
            out = fn(*args, **kwargs)
            synchronize()
    finally:
        with _quiet_native_stderr():
            prof.stop()
    events = list(prof.events())
    for ev in events:
        if ev.name == "dpmp_lab.bench.profile":
            thread = ev.thread
    rank = dist.get_rank() if dist.is_initialized() else 0
    result = intervals_from_events(events, rank, thread)
    if trace_dir is not None:
        os.makedirs(trace_dir, exist_ok=True)
        result.trace_file = os.path.join(os.fspath(trace_dir), f"rank{rank}.json")
        prof.export_chrome_trace(result.trace_file)
    return out, result
