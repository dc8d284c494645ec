"""Why a launch failed, told the way a learner can act on it.

Everything here is a pure function of what the launcher collected (messages, exit codes,
output, faulthandler dumps), so it is tested without starting a process. Three readings
matter most:
  * a crash takes its connections down, so its peers fail with "connection closed": those
    are consequences, the crash is the cause (`launch_error`);
  * a collective or a send that never completes ends in a timeout on every rank that waits:
    it is a hang, and the hint says which kind (`hang_hint`, `p2p_wait`);
  * a rank killed by a signal or stopped on a hang leaves a faulthandler dump, which is
    turned into an ordinary traceback with the cell's source (`stack_from_dump`).
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import signal
import sys
from dataclasses import dataclass

from dpmp_lab import worker
from dpmp_lab._helpers import indent, ranks_text, tail
from dpmp_lab.protocol import Vocabulary


class Reason(Vocabulary):
    """Why one rank did not return."""

    EXCEPTION = "exception"
    SIGNAL = "signal"
    EXIT = "exit"        # the process ended without a result (os._exit, or at start-up)
    TIMEOUT = "timeout"  # still running at the launch timeout, or a process-group timeout
    UNGUARDED = "unguarded launch"  # it re-imported a script that launches at its top level


@dataclass
class RankFailure:
    """Why one rank did not return: an exception, a signal, an early exit, or a hang."""

    rank: int
    reason: Reason
    exc_type: str | None = None
    message: str = ""
    traceback: str = ""
    exitcode: int | None = None
    signal: signal.Signals | None = None
    output_tail: str = ""

    def describe(self) -> str:
        if self.reason == Reason.EXCEPTION:
            head = f"rank {self.rank} raised {self.exc_type}: {self.message}"
            return head + "\n" + indent(self.traceback.rstrip())
        if self.reason == Reason.SIGNAL:
            head = (
                f"rank {self.rank} was killed by signal {self.signal.name} "
                f"({SIGNAL_HINTS.get(self.signal.name, 'the process died')})"
            )
            if self.traceback:
                head += "\n" + indent(self.traceback.rstrip())
        elif self.reason == Reason.EXIT:
            head = f"rank {self.rank} exited with code {self.exitcode} before returning"
        elif self.reason == Reason.UNGUARDED:
            head = (f"rank {self.rank} stopped while importing the main script, which calls "
                    "dl.launch at its top level")
        else:
            head = f"rank {self.rank} did not finish: {self.message}"
            if self.traceback:
                head += "\n" + indent(self.traceback.rstrip())
        if self.output_tail.strip():
            head += f"\n  last output of rank {self.rank}:\n" + indent(self.output_tail.rstrip(), 4)
        return head


SIGNAL_HINTS = {
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
        return f"{ranks_text(self.failures)} of {self.world_size} failed"

    def report(self) -> str:
        lines = [self.summary]
        for failure in self.failures.values():
            lines.append(failure.describe())
        if self.finished:
            lines.append(f"{ranks_text(self.finished)} had returned.")
        if self.stopped:
            lines.append(f"{ranks_text(self.stopped)}: stopped by the launcher (they were "
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
        return f"{ranks_text(self.failures)} of {self.world_size} did not finish"


class UnguardedLaunch(LaunchError):
    """A script called dl.launch while the ranks imported it: the launch never reached fn."""

    def report(self) -> str:
        return self.summary  # the same exit of every rank says nothing more


# -- reading the evidence ----------------------------------------------------------------------

# What a rank that calls dl.launch while multiprocessing imports the main script exits with
# (see launch.launch), before it could send a word.
UNGUARDED_EXIT = 86


def death(rank: int, exitcode: int | None, output: str, main_thread: int | None, *,
          started: bool) -> RankFailure:
    """A rank whose process ended before it returned or raised."""
    if exitcode == UNGUARDED_EXIT and not started:
        return RankFailure(rank, Reason.UNGUARDED, exitcode=exitcode, output_tail=tail(output))
    if exitcode is not None and exitcode < 0:
        sig = signal.Signals(-exitcode)
        failure = RankFailure(rank, Reason.SIGNAL, exitcode=exitcode, signal=sig)
    else:
        failure = RankFailure(rank, Reason.EXIT, exitcode=exitcode)
    # faulthandler printed the stack of a fatal signal into stderr: lift it out.
    before, _, dump = output.partition("Fatal Python error:")
    failure.traceback = stack_from_dump(dump, main_thread)
    failure.output_tail = tail(before if failure.traceback else output)
    return failure


def still_running(rank: int, *, stack: str, output: str, timeout: float) -> RankFailure:
    """A rank that had not finished when the launch's own timeout passed."""
    return RankFailure(rank, Reason.TIMEOUT,
                       message=f"still running after {timeout:g} s (launch timeout)",
                       traceback=stack, output_tail=tail(output))


_TIMEOUT_RE = re.compile(r"timed out|timeout", re.IGNORECASE)
_PEER_LOST_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|connectFullMesh failed|Broken pipe",
    re.IGNORECASE,
)


def lost_a_peer(failure: RankFailure) -> bool:
    """The rank raised only because another rank's process went away."""
    return failure.reason == Reason.EXCEPTION and bool(_PEER_LOST_RE.search(failure.message))


def is_collective_timeout(failure: RankFailure) -> bool:
    """The rank raised because its process-group timeout fired while it waited."""
    return (
        failure.reason == Reason.EXCEPTION
        and failure.exc_type is not None
        and ("DistBackendError" in failure.exc_type or "RuntimeError" in failure.exc_type
             or "DistError" in failure.exc_type)
        and bool(_TIMEOUT_RE.search(failure.message))
    )


_P2P_FUNCTIONS = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                  "recv_object_list")
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<name>\w+)')


def p2p_wait(stack: str) -> str | None:
    """"send" or "recv" when the innermost torch.distributed call of a stack is point-to-point."""
    calls = [m.group("name") for m in _FRAME_RE.finditer(stack)
             if "distributed_c10d" in m.group("file")]
    if not calls or calls[-1] not in _P2P_FUNCTIONS:
        return None
    return "recv" if "recv" in calls[-1] else "send"


# -- hints ------------------------------------------------------------------------------------

HANG_HINT = (
    "a rank that never finishes is usually waiting in a collective that another rank did not "
    "call: a collective inside `if rank == ...`, a different number of loop iterations per rank, "
    "or collectives issued in a different order. The stack above shows where each rank waited."
)
P2P_HANG_HINT = (
    "a send or recv that never completes: its partner never posted the matching recv or send "
    "(or posted it with another peer or tag), or every rank sent first and waits for a receiver "
    "that is itself sending (gloo's blocking send returns only once the receiver took the data). "
    "Post both directions at once with isend/irecv (or dist.batch_isend_irecv) and wait on "
    "them, or order them (even ranks send first, odd ranks receive first). The stack above "
    "shows where each rank waited."
)


def hang_hint(failures: dict[int, RankFailure]) -> str:
    if any(p2p_wait(f.traceback) for f in failures.values()):
        return P2P_HANG_HINT
    return HANG_HINT


def hint_for(failures: dict[int, RankFailure]) -> str | None:
    """A hint for a launch that failed without hanging, read from its first cause."""
    first = next(iter(failures.values()))
    text = first.output_tail + first.message
    if "size doesn't match" in text or "Mismatch" in text:
        return "the ranks passed tensors of different shapes or dtypes to the same collective."
    if first.reason == Reason.SIGNAL and first.signal and first.signal.name == "SIGKILL":
        return "the machine may have run out of memory: try smaller tensors or fewer ranks."
    return None


# -- the error a launch raises -----------------------------------------------------------------


def launch_error(failures: dict[int, RankFailure], *, output: list[str], finished: list[int],
                 pg_timeout: float) -> LaunchError:
    """The error for ranks that failed (in the order noticed): causes named, consequences
    counted as stopped, and a hang behind process-group timeouts reported as a hang."""
    world_size = len(output)
    if any(f.reason == Reason.UNGUARDED for f in failures.values()):
        return unguarded_launch(failures, output=output)
    # A rank that crashes takes its connections with it: its peers then fail with
    # "connection closed". Those are consequences; report the cause.
    causes = {k: f for k, f in failures.items() if not lost_a_peer(f)} or dict(failures)
    stopped = [r for r in range(world_size) if r not in causes and r not in finished]
    common = dict(output=output, finished=finished, stopped=stopped, world_size=world_size)
    if all(is_collective_timeout(f) for f in causes.values()):
        hung = {rank: _waited(f, pg_timeout) for rank, f in sorted(causes.items())}
        return LaunchTimeout(hung, hint=hang_hint(hung), **common)
    return LaunchError(causes, hint=hint_for(causes), **common)


def _waited(failure: RankFailure, pg_timeout: float) -> RankFailure:
    p2p = p2p_wait(failure.traceback)
    if p2p:
        message = (f"waited {pg_timeout:g} s in a {p2p} whose partner never posted the matching "
                   f"{'recv' if p2p == 'send' else 'send'} (process-group timeout)")
    else:
        message = (f"waited {pg_timeout:g} s in a collective that not every rank joined "
                   "(process-group timeout)")
    return dataclasses.replace(failure, reason=Reason.TIMEOUT, message=message)


def launch_timeout(stuck: dict[int, RankFailure], *, output: list[str],
                   finished: list[int]) -> LaunchTimeout:
    """The error for ranks still running at the launch timeout (see `still_running`)."""
    stuck = dict(sorted(stuck.items()))
    return LaunchTimeout(stuck, output=output, finished=finished, stopped=[],
                         world_size=len(output), hint=hang_hint(stuck))


def unguarded_launch(failures: dict[int, RankFailure], *, output: list[str]) -> UnguardedLaunch:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    script = os.path.basename(main) if main else "the main module"
    summary = (
        f"{script} calls dl.launch when it is imported, and every rank imports it again: "
        "under the 'forkserver' and 'spawn' start methods a rank is a fresh process that "
        "imports the main script (as __mp_main__) to find fn, so the launch at its top level "
        "ran again in each rank instead of fn. Put the code that launches under\n\n"
        '    if __name__ == "__main__":\n'
        "        dl.launch(...)\n\n"
        "and keep the functions the ranks run at the top level, outside it.")
    return UnguardedLaunch(failures, output=output, finished=[], stopped=[],
                           world_size=len(output), summary=summary)


# -- faulthandler dumps ------------------------------------------------------------------------

_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_DUMP_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")


def stack_from_dump(dump: str, main_thread: int | None) -> str:
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


def dump_complete(dump: str, main_thread: int | None) -> bool:
    """Whether a hung rank's dump has arrived whole: it ends with the launcher's frames, and
    shows where the rank waited."""
    return worker.__file__ in dump and bool(stack_from_dump(dump, main_thread))


def where_stuck(dump: str, main_thread: int | None, failure: RankFailure | None) -> str:
    """The stack of a rank stopped on a hang: from its dump, or, when its process-group timeout
    fired while the launcher asked, from the traceback it reported."""
    stack = stack_from_dump(dump, main_thread)
    if not stack and failure is not None:
        stack = failure.traceback
    return stack
