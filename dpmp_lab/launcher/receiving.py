"""What the launcher makes of the next message on a rank's msg pipe.

A rank's message is read whole into the notebook and unpickled, so what can go wrong there
goes wrong in the kernel: a result whose class only the rank can import, a `__reduce__` that
raises on load, bytes that are no message, or a message big enough to exhaust the kernel's
memory. Each becomes a RankFailure that names the rank, instead of an exception in the
launcher's event loop. Nothing is read past the launch's limit (`max_result_bytes` and a
margin): multiprocessing reads the length first and refuses, before allocating anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from dpmp_lab.i18n.messages import _
from dpmp_lab.launcher import failures, serialize
from dpmp_lab.launcher.failures import RankFailure, Reason
from dpmp_lab.launcher.protocol import MESSAGE_MARGIN, Raised, Returned, Started

# What Connection.recv_bytes raises (an OSError) when a message is longer than maxlength.
TOO_LONG = "bad message length"


@dataclass(frozen=True)
class Result:
    """A Returned message with its value and trace unpickled."""

    value: Any
    trace: Any
    destroyed_group: bool


def receive(conn: Connection, rank: int, limit: int) -> Started | Result | RankFailure | None:
    """The next message from `rank` (a Returned as a Result, a Raised as a RankFailure); a
    RankFailure also when it cannot be read; None when the pipe closed or broke, in which case
    the rank's exit tells why. After a RankFailure or None, the pipe is of no further use."""
    try:
        data = conn.recv_bytes(limit + MESSAGE_MARGIN)
    except EOFError:
        return None
    except OSError as exc:
        if str(exc) == TOO_LONG:
            return failures.oversized(rank, limit, MESSAGE_MARGIN)
        return None  # the rank died while sending
    try:
        message = serialize.loads(data)
    except Exception as exc:
        return failures.unreadable(rank, exc)
    match message:
        case Started():
            return message
        case Returned(value=value, trace=trace, destroyed_group=destroyed):
            try:
                return Result(serialize.loads(value), serialize.loads(trace), destroyed)
            except Exception as exc:
                return failures.unpicklable(rank, exc)
        case Raised(exc_type=exc_type, message=text, traceback=tb, exitcode=exitcode):
            return RankFailure(rank, Reason.EXCEPTION, exc_type=exc_type, message=text,
                               traceback=tb, exitcode=exitcode)
    return failures.unreadable(rank, TypeError(_("a {kind} is no message").format(
        kind=type(message).__name__)))
