"""The library's classes that cross from the learner's side to the harness as data: what a rank or
a learner's function returns and the tests read (a Trace, a LaunchResult, a pipeline rank's
result, a schedule's spans), rebuilt in the harness by the class's own constructor. A class that
is not here crosses as an opaque handle, never as an object.
"""

from __future__ import annotations

import signal
from typing import Any

from dpmp_lab.bench import AlphaBeta, Sweep, Timing
from dpmp_lab.cost import Memory
from dpmp_lab.grid import GridLayout
from dpmp_lab.harness.codec import Allowed, NotData
from dpmp_lab.launcher.failures import RankFailure, Reason
from dpmp_lab.launcher.launch import LaunchResult
from dpmp_lab.models import GPTConfig
from dpmp_lab.moe import Routing
from dpmp_lab.pp.runner import PipelineResult
from dpmp_lab.pp.schedules import Action, Span
from dpmp_lab.trace import BackwardOverlap, CommEvent, GradReady, Trace


def _trace_fields(t: Trace) -> dict[str, Any]:
    return {"events": t.events, "grads_ready": t.grads_ready, "rank": t.rank,
            "problems": t.problems, "waits": t.waits, "written": t.written}


def _trace(values: dict[str, Any]) -> Trace:
    t = Trace()
    events, ready = values.pop("events"), values.pop("grads_ready")
    if not (type(events) is list and all(type(e) is CommEvent for e in events)
            and type(ready) is list and all(type(g) is GradReady for g in ready)):
        raise NotData("a Trace's events are not CommEvents")
    rank, problems, waits = values.pop("rank"), values.pop("problems"), values.pop("waits", [])
    written = values.pop("written", [])
    if values or not (rank is None or type(rank) is int) or type(problems) is not list:
        raise NotData("not a Trace")
    if type(waits) is not list or not all(type(w) is float for w in waits):
        raise NotData("a Trace's waits are not times")
    if type(written) is not list or not all(type(i) is int and 0 <= i < len(events)
                                            for i in written):
        raise NotData("a Trace's written calls are not its events")
    t.events, t.grads_ready, t.rank, t.problems = events, ready, rank, [str(p) for p in problems]
    t.waits, t.written = waits, written
    return t


def _named_tuple(cls: type) -> tuple:
    return (lambda obj: obj._asdict()), (lambda values: cls(**values))


ALLOWED = Allowed()
for _cls in (CommEvent, GradReady, BackwardOverlap, LaunchResult, RankFailure, Reason,
             signal.Signals, PipelineResult, Action, Timing, Sweep, AlphaBeta, Memory,
             GridLayout, GPTConfig):
    ALLOWED.add(_cls)
ALLOWED.add(Trace, _trace_fields, _trace)
for _cls in (Span, Routing):
    ALLOWED.add(_cls, *_named_tuple(_cls))

__all__ = ["ALLOWED"]
