"""The launcher's vocabulary: the states a rank goes through, how a launch ends, the pipes
between a rank and the launcher, the messages a rank sends on one of them, and their size.

Messages are frozen dataclasses built and read by field name (`match` with keyword patterns),
so a field added to one never shifts the others, as it did when they were tuples read by index.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

MAX_RESULT_BYTES = 256 << 20  # dl.launch's default max_result_bytes: a result, pickled
# What the launcher reads beyond max_result_bytes in one message: the message around a
# result, or a long traceback. Past that it reads nothing, whatever a rank sends.
MESSAGE_MARGIN = 1 << 20


class Vocabulary(str, Enum):
    """A fixed word: an enum member that compares, hashes and prints as its string value
    (what `enum.StrEnum` does from Python 3.11; this package still supports 3.10)."""

    def __str__(self) -> str:
        return self.value


class RankState(Vocabulary):
    """Where one rank is, as the launcher sees it (and the progress row shows it)."""

    STARTING = "starting"  # its process is starting
    RUNNING = "running"    # it said Started: loading fn, joining the group, running fn
    RETURNED = "returned"  # it sent fn's value; it waits for the launcher's release to exit
    FAILED = "failed"      # it raised, died, or its process-group timeout fired
    STOPPED = "stopped"    # the launcher killed it because another rank failed or hung


class Outcome(Vocabulary):
    """How the launcher's watch over the ranks ended."""

    ALL_RETURNED = "all returned"
    FAILED = "failed"          # at least one rank failed
    TIMED_OUT = "timed out"    # the launch's own timeout passed first
    WATCHDOG = "watchdog"      # nccl's watchdog timed a collective out (the rank lives on)


class Pipe(Vocabulary):
    """A rank's pipes to the launcher, and what the launcher's selector waits on."""

    OUT = "out"    # the rank's file descriptor 1: printed live as "[rank r] ..."
    ERR = "err"    # its file descriptor 2, so native messages (gloo, NCCL) are kept too
    MSG = "msg"    # its messages, below
    DUMP = "dump"  # where faulthandler writes every thread's stack when asked (SIGUSR1)
    RELEASE = "release"  # the launcher's "every rank returned": only then is a group torn down
    EXIT = "exit"  # not a pipe: the process's sentinel, readable once it ended


# -- what a rank tells the launcher, in the order it can happen --------------------------------


@dataclass(frozen=True, kw_only=True)
class Started:
    """The rank process is set up and about to load fn."""

    main_thread: int  # the thread to look for in a faulthandler dump of this rank


@dataclass(frozen=True, kw_only=True)
class Returned:
    """fn returned. Its value and its trace (the rank's dl.Trace when the launch traces, else
    None) travel pickled on their own (serialize.dumps), so the rank can weigh them before
    sending and the launcher can tell a value the notebook cannot unpickle from a message it
    cannot read."""

    value: bytes
    trace: bytes
    destroyed_group: bool = False  # fn called dist.destroy_process_group() itself


@dataclass(frozen=True, kw_only=True)
class Raised:
    """fn (or loading it, or joining the group) raised."""

    exc_type: str        # "ValueError", "torch.distributed.DistBackendError", ...
    message: str
    traceback: str       # without the launcher's frames
    exitcode: int | None  # SystemExit's code, else None


Message = Started | Returned | Raised


def exception_name(kind: type[BaseException]) -> str:
    """The name an exception crosses under (Raised.exc_type): a builtin's own, any other's
    with its module, so that two classes of one name stay apart."""
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
