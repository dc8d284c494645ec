"""Made-up traces, one per built-in likely-mistake entry of dl.check's COMM_HINTS, and the failure
each prints: the check's tests and the class report's tests read the same cases."""

from __future__ import annotations

import pytest

import dpmp_lab as dl
from dpmp_lab.check.failed import CheckFailed

TP, WORLD = (0, 1), (0, 1, 2, 3)


def trace_of(*events: tuple) -> dl.Trace:
    """(op, ranks, phase, label) per call, as rank 0 issued them."""
    t = dl.Trace()
    t.rank = 0
    for op, group, phase, label in events:
        t.events.append(dl.CommEvent(op, group, 64, "float32", (16,), phase, False, label))
    return t


def comm_failure(t: dl.Trace, expected: dict, **kw) -> str:
    with pytest.raises(CheckFailed) as info:
        dl.check.comm(t, expected, **kw)
    return str(info.value)


def dp_calls(op: str, n: int) -> list[tuple]:
    return [(op, TP, None, "dp")] * n


# one case per built-in entry of COMM_HINTS, in the table's order: (trace, expected, kwargs, words)
COMM_CASES = [
    (dp_calls("all_reduce", 4), {"all_reduce": 1}, {"n_params": 4},
     "4 all-reduces = one per parameter tensor: flatten the gradients"),
    ([("all_reduce", WORLD, "backward", None)], {("all_reduce", "dp", "backward"): 1}, {},
     "the all_reduce went to group (0,1,2,3) instead of the dp group: pass group=... to the "
     "collective (without it, torch uses every rank)"),
    (dp_calls("all_reduce", 2), {("all_reduce", "dp", "backward"): 2}, {},
     "the all_reduce was issued outside forward and backward, not during backward: launch the "
     "gradient communication from gradient hooks"),
    (dp_calls("all_gather", 1), {"all_reduce": 1}, {},
     "an all_gather where an all_reduce belongs"),
    (dp_calls("all_reduce", 1), {"all_gather": 1}, {},
     "an all_reduce where an all_gather belongs"),
    (dp_calls("all_reduce", 1), {"reduce_scatter": 1}, {},
     "a full all_reduce where a reduce_scatter is enough"),
    (dp_calls("all_reduce", 1), {"send": 4, "recv": 4}, {},
     "torch's all_reduce was called, but this exercise builds the communication from "
     "point-to-point messages: post each send together with its receive"),
    (dp_calls("all_reduce", 4), {"broadcast": 1, "all_reduce": 4}, {},
     "no broadcast was issued: the step that should communicate is missing"),
    (dp_calls("all_reduce", 4), {("all_reduce", "dp"): 2}, {},
     "2x the expected number of all_reduce calls on the dp group"),
    (dp_calls("all_reduce", 4), {"all_reduce": 3}, {},
     "1 all_reduce call(s) more than needed"),
    (dp_calls("all_reduce", 5), {"all_reduce": 8}, {},
     "3 all_reduce call(s) missing"),
    (dp_calls("send", 1) + dp_calls("recv", 1) + dp_calls("broadcast", 1), {"send": 1, "recv": 1},
     {}, "this exercise builds its communication from send/recv only, but torch's broadcast "
         "was called"),
    (dp_calls("all_reduce", 4), {}, {},
     "4 unexpected all_reduce call(s) on group dp: communication the algorithm does not need"),
]
