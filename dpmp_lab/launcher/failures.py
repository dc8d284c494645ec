"""Why a launch failed, told the way a learner can act on it.

Everything here is a pure function of what the launcher collected (messages, exit codes,
output, faulthandler dumps), so it is tested without starting a process. Three readings
matter most:
  * a crash takes its connections down, so its peers fail with "connection closed": those
    are consequences, the crash is the cause (`launch_error`);
  * a collective or a send that never completes ends in a timeout on every rank that waits:
    it is a hang, and the hint says which kind (`hang_hint`, `p2p_wait`);
  * a rank killed by a signal or stopped on a hang leaves a faulthandler dump, which is
    turned into an ordinary traceback with the cell's source (stacks.py).
Besides those, what the notebook could not read (a result it cannot unpickle, a message over
the launch's limit) and a process group that the function destroyed itself.

Why it stays whole: each reading of the evidence makes the RankFailure whose sentence the
learner reads, and `launch_error` decides between exactly those readings (a cause or a
consequence, a hang of which kind); apart, the sentences and the rules that choose among them
would have to be kept in step across two modules.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from dpmp_lab._helpers import indent, ranks_text, tail
from dpmp_lab.i18n.messages import N_, _
from dpmp_lab.launcher import flight
from dpmp_lab.launcher.hints import (
    DESTROYED_GROUP_HINT,
    HANDLE_HANG_HINT,
    HANG_HINT,
    MEMORY_HINT,
    P2P_HANG_HINT,
    SHAPES_HINT,
    SIGNAL_HINTS,
    UNPICKLABLE_HINT,
)
from dpmp_lab.launcher.protocol import Vocabulary, exception_name
from dpmp_lab.launcher.stacks import p2p_wait, stack_from_dump, waits_on_handle
from dpmp_lab.render import human_bytes


class Reason(Vocabulary):
    """Why one rank did not return."""

    EXCEPTION = "exception"
    SIGNAL = "signal"
    EXIT = "exit"        # the process ended without a result (os._exit, or at start-up)
    TIMEOUT = "timeout"  # still running at the launch timeout, or a process-group timeout
    UNGUARDED = "unguarded launch"  # it re-imported a script that launches at its top level
    UNPICKLABLE = "unpicklable result"  # the notebook could not unpickle what it returned
    UNREADABLE = "unreadable message"  # the launcher could not (or would not) read a message
    DESTROYED_GROUP = "destroyed its group"  # it returned, but fn destroyed the process group


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

    def raised(self, kind: type[BaseException]) -> bool:
        """Whether the rank raised `kind`: by its class, whatever language its message is in."""
        return self.reason == Reason.EXCEPTION and self.exc_type == exception_name(kind)

    def describe(self, alike: Sequence[int] = ()) -> str:
        """What went wrong in this rank, or in the ranks `alike` that failed the same way."""
        who = ranks_text(alike if len(alike) > 1 else [self.rank])
        if self.reason == Reason.EXCEPTION:
            head = _("{who} raised {error}: {message}").format(who=who, error=self.exc_type,
                                                               message=self.message)
            return head + "\n" + indent(self.traceback.rstrip())
        if self.reason == Reason.SIGNAL:
            why = _(SIGNAL_HINTS.get(self.signal.name, N_("the process died")))
            killed = (N_("{who} were killed by signal {signal} ({why})") if len(alike) > 1
                      else N_("{who} was killed by signal {signal} ({why})"))
            head = _(killed).format(who=who, signal=self.signal.name, why=why)
            if self.traceback:
                head += "\n" + indent(self.traceback.rstrip())
        elif self.reason == Reason.EXIT:
            head = _("{who} exited with code {code} before returning").format(
                who=who, code=self.exitcode)
        elif self.reason == Reason.UNGUARDED:
            head = _("{who} stopped while importing the main script, which calls "
                     "dl.launch at its top level").format(who=who)
        elif self.reason in (Reason.UNPICKLABLE, Reason.UNREADABLE):
            head = self.message  # a sentence of its own, naming the rank (see `unpicklable`)
        elif self.reason == Reason.DESTROYED_GROUP:
            head = _("{who} returned after destroying its process group itself "
                     "(dist.destroy_process_group())").format(who=who)
        else:
            head = _("{who} did not finish: {message}").format(who=who, message=self.message)
            if self.traceback:
                head += "\n" + indent(self.traceback.rstrip())
        if self.output_tail.strip():
            head += ("\n  " + _("last output of {who}:").format(who=who) + "\n"
                     + indent(self.output_tail.rstrip(), 4))
        return head


def alike(failures: dict[int, RankFailure]) -> list[list[RankFailure]]:
    """The failures grouped by what they say but the rank, in the order of each group's first
    rank: four ranks that raised the same error from the same line are told once."""
    groups: dict[str, list[RankFailure]] = {}
    for failure in failures.values():
        groups.setdefault(dataclasses.replace(failure, rank=-1).describe(), []).append(failure)
    return list(groups.values())


class LaunchError(RuntimeError):
    """One or more ranks failed. `.failures` maps rank -> RankFailure; the first is the cause."""

    def __init__(self, failures: dict[int, RankFailure], *, output: list[str],
                 finished: list[int], stopped: list[int], world_size: int,
                 summary: str | None = None, hint: str | None = None,
                 flight_records: dict[int, dict] | None = None):
        self.failures = failures
        self.output = output
        self.finished = finished
        self.stopped = stopped
        self.world_size = world_size
        self.hint = hint
        # torch's flight recorder, per rank, when the launch hung (flight.py): rank -> record
        self.flight_records = dict(flight_records or {})
        self.summary = summary or self._default_summary()
        super().__init__(self.report())

    def _default_summary(self) -> str:
        return _("{ranks} of {world} failed").format(
            ranks=ranks_text(self.failures), world=self.world_size)

    def report(self) -> str:
        lines = [self.summary]
        for group in alike(self.failures):
            lines.append(group[0].describe(sorted(f.rank for f in group)))
        if self.finished:
            lines.append(_("{ranks} had returned.").format(ranks=ranks_text(self.finished)))
        if self.stopped:
            lines.append(_("{ranks}: stopped by the launcher (they were waiting on the ranks "
                           "above, or lost their connection to them).").format(
                ranks=ranks_text(self.stopped)))
        recorded = flight.summary(self.flight_records, self.world_size)
        if recorded and isinstance(self, LaunchTimeout):
            lines.append(recorded)
        if self.hint:
            lines.append(_("Hint: {hint}").format(hint=_(self.hint)))
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own frames, which never help a learner.
        return [f"{type(self).__name__}: " + self.report()]


class LaunchTimeout(LaunchError):
    """Some ranks did not finish in time: a hang, most often a collective not every rank called.
    Where torch records collectives, `.flight_records` holds each rank's record and the report
    says which collective the ranks disagree on."""

    def _default_summary(self) -> str:
        return _("{ranks} of {world} did not finish").format(
            ranks=ranks_text(self.failures), world=self.world_size)

    def save_flight_records(self, folder: str) -> list[str]:
        """Write the ranks' records where torch's analyser reads them:
        `python -m torch.distributed.flight_recorder.fr_trace <folder>`."""
        return flight.save(self.flight_records, folder)


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
    before, dump = _fatal_error_dump(output)
    failure.traceback = stack_from_dump(dump, main_thread)
    failure.output_tail = tail(before if failure.traceback else output)
    return failure


def _fatal_error_dump(output: str) -> tuple[str, str]:
    """(what came before, the dump) of a rank's output: faulthandler prints the threads' stacks
    of a fatal signal into stderr after a "Fatal Python error:" line; (output, "") without one."""
    before, _, dump = output.partition("Fatal Python error:")
    return before, dump


def still_running(rank: int, *, stack: str, output: str, timeout: float) -> RankFailure:
    """A rank that had not finished when the launch's own timeout passed."""
    return RankFailure(rank, Reason.TIMEOUT, traceback=stack, output_tail=tail(output),
                       message=_("still running after {timeout:g} s (launch timeout)").format(
                           timeout=timeout))


# nccl's watchdog thread, on a collective past the process-group timeout (torch 2.11):
# "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE,
# NumelIn=4, NumelOut=4, Timeout(ms)=3000) ran for 3096 milliseconds before timing out."
# The rank then lives on (measured: 8 s and more) with its main thread still waiting.
WATCHDOG_RE = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\((?P<work>[^)]*)\)")


def watchdog_timeout(rank: int, line: str, *, stack: str, output: str,
                     pg_timeout: float) -> RankFailure:
    """A rank whose collective nccl's watchdog timed out (see WATCHDOG_RE)."""
    found = WATCHDOG_RE.search(line)
    work = dict(kv.split("=", 1) for kv in found["work"].split(", ") if "=" in kv) if found else {}
    what = _("collective #{seq} ({op}, {numel} elements)").format(
        seq=work["SeqNum"], op=work.get("OpType", "?").lower(), numel=work.get("NumelIn", "?")
    ) if "SeqNum" in work else _("a collective")
    return RankFailure(rank, Reason.TIMEOUT, traceback=stack, output_tail=tail(output),
                       message=_("waited {pg_timeout:g} s in {what} that did not complete "
                                 "(nccl's watchdog: process-group timeout)").format(
                           pg_timeout=pg_timeout, what=what))


def stopped_by_watchdog(rank: int, *, stack: str, output: str) -> RankFailure:
    """A rank still running when another rank's collective timed out."""
    return RankFailure(rank, Reason.TIMEOUT, traceback=stack, output_tail=tail(output),
                       message=_("still running when another rank's collective timed out"))


def unpicklable(rank: int, error: BaseException) -> RankFailure:
    """A rank whose result the notebook could not unpickle: an instance of a class only the
    rank can import, or an object whose unpickling raises."""
    return RankFailure(rank, Reason.UNPICKLABLE, exc_type=type(error).__name__, message=_(
        "rank {rank}'s result could not be unpickled in the notebook: {kind}: {error}").format(
            rank=rank, kind=type(error).__name__, error=error))


def unreadable(rank: int, error: BaseException) -> RankFailure:
    """A rank that sent bytes the launcher could not read as a message."""
    return RankFailure(rank, Reason.UNREADABLE, exc_type=type(error).__name__, message=_(
        "rank {rank} sent a message the notebook could not read: {kind}: {error}").format(
            rank=rank, kind=type(error).__name__, error=error))


def oversized(rank: int, limit: int, margin: int) -> RankFailure:
    """A rank that sent more than the launcher reads in one message, its own check bypassed."""
    return RankFailure(rank, Reason.UNREADABLE, message=_(
        "rank {rank} sent a message over {most}, more than the launch reads "
        "(max_result_bytes={limit:,}, and {margin} for the message around a result), so the "
        "notebook did not read it. Return less, or raise the limit: "
        "dl.launch(..., max_result_bytes=...).").format(
            rank=rank, most=human_bytes(limit + margin), limit=limit, margin=human_bytes(margin)))


_TIMEOUT_RE = re.compile(r"timed out|timeout", re.IGNORECASE)
_PEER_LOST_RE = re.compile(r"Connection closed by peer|Connection reset by peer|"
                           r"connectFullMesh failed|Broken pipe", re.IGNORECASE)


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


# -- hints ------------------------------------------------------------------------------------


def hang_hint(failures: dict[int, RankFailure]) -> str:
    if any(p2p_wait(f.traceback) for f in failures.values()):
        return P2P_HANG_HINT
    if any(waits_on_handle(f.traceback) for f in failures.values()):
        return HANDLE_HANG_HINT
    return HANG_HINT


def hint_for(failures: dict[int, RankFailure]) -> str | None:
    """A hint for a launch that failed without hanging, read from its first cause."""
    first = next(iter(failures.values()))
    if first.reason == Reason.UNPICKLABLE:
        return UNPICKLABLE_HINT
    text = first.output_tail + first.message
    if "size doesn't match" in text or "Mismatch" in text:
        return SHAPES_HINT
    if first.reason == Reason.SIGNAL and first.signal and first.signal.name == "SIGKILL":
        return MEMORY_HINT
    return None


# -- the error a launch raises -----------------------------------------------------------------


def launch_error(failures: dict[int, RankFailure], *, output: list[str], finished: list[int],
                 pg_timeout: float, destroyed: Sequence[int] = (),
                 flight_records: dict[int, dict] | None = None) -> LaunchError:
    """The error for ranks that failed (in the order noticed): causes named, consequences
    counted as stopped, and a hang behind process-group timeouts reported as a hang.
    `destroyed`: the ranks that returned with their process group destroyed by fn."""
    world_size = len(output)
    if any(f.reason == Reason.UNGUARDED for f in failures.values()):
        return unguarded_launch(failures, output=output)
    destroyers = [r for r in destroyed if r not in failures]
    if destroyers and all(lost_a_peer(f) or is_collective_timeout(f) for f in failures.values()):
        return group_destroyed(destroyers, failures, output=output, finished=finished)
    # A rank that crashes takes its connections with it: its peers then fail with
    # "connection closed". Those are consequences; report the cause.
    causes = {k: f for k, f in failures.items() if not lost_a_peer(f)} or dict(failures)
    stopped = [r for r in range(world_size) if r not in causes and r not in finished]
    common = dict(output=output, finished=finished, stopped=stopped, world_size=world_size)
    if all(is_collective_timeout(f) for f in causes.values()):
        hung = {rank: _waited(f, pg_timeout) for rank, f in sorted(causes.items())}
        return LaunchTimeout(hung, hint=hang_hint(hung), flight_records=flight_records,
                             **common)
    return LaunchError(causes, hint=hint_for(causes), **common)


def _waited(failure: RankFailure, pg_timeout: float) -> RankFailure:
    p2p = p2p_wait(failure.traceback)
    if p2p:   # the op names stay as they are: "send", "recv"
        message = _("waited {pg_timeout:g} s in a {op} whose partner's matching {other} never "
                    "came (process-group timeout)").format(
            pg_timeout=pg_timeout, op=p2p, other="recv" if p2p == "send" else "send")
    elif waits_on_handle(failure.traceback):
        message = _("waited {pg_timeout:g} s on a request handle that never completed "
                    "(process-group timeout)").format(pg_timeout=pg_timeout)
    else:
        message = _("waited {pg_timeout:g} s in a collective that not every rank joined "
                    "(process-group timeout)").format(pg_timeout=pg_timeout)
    return dataclasses.replace(failure, reason=Reason.TIMEOUT, message=message)


def group_destroyed(destroyers: Sequence[int], waiting: dict[int, RankFailure], *,
                    output: list[str], finished: list[int]) -> LaunchError:
    """The error for ranks that lost their peers (or timed out) because fn destroyed the
    process group in other ranks: those ranks are the cause, and say what they did."""
    waiting = dict(sorted(waiting.items()))
    causes = {r: RankFailure(r, Reason.DESTROYED_GROUP) for r in sorted(destroyers)} | waiting
    returned = [r for r in finished if r not in causes]
    destroyed = (N_("{ranks} destroyed its process group (dist.destroy_process_group() in your "
                    "function) while {waiting} still waited in {where}: leave the group to the "
                    "launcher") if len(destroyers) == 1
                 else N_("{ranks} destroyed their process groups (dist.destroy_process_group() "
                         "in your function) while {waiting} still waited in {where}: leave the "
                         "group to the launcher"))
    where = (_("a send or recv") if all(p2p_wait(f.traceback) for f in waiting.values())
             else _("a collective"))
    summary = _(destroyed).format(ranks=ranks_text(sorted(destroyers)),
                                  waiting=ranks_text(waiting), where=where)
    return LaunchError(causes, output=output, finished=returned,
                       stopped=[r for r in range(len(output)) if r not in causes
                                and r not in returned],
                       world_size=len(output), summary=summary, hint=DESTROYED_GROUP_HINT)


def launch_timeout(stuck: dict[int, RankFailure], *, output: list[str],
                   finished: list[int],
                   flight_records: dict[int, dict] | None = None) -> LaunchTimeout:
    """The error for ranks still running at the launch timeout (see `still_running`)."""
    stuck = dict(sorted(stuck.items()))
    return LaunchTimeout(stuck, output=output, finished=finished, stopped=[],
                         world_size=len(output), hint=hang_hint(stuck),
                         flight_records=flight_records)


def unguarded_launch(failures: dict[int, RankFailure], *, output: list[str]) -> UnguardedLaunch:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    script = os.path.basename(main) if main else _("the main module")
    summary = _(
        "{script} calls dl.launch when it is imported, and every rank imports it again: "
        "under the 'forkserver' and 'spawn' start methods a rank is a fresh process that "
        "imports the main script (as __mp_main__) to find fn, so the launch at its top level "
        "ran again in each rank instead of fn. Put the code that launches under\n\n"
        '    if __name__ == "__main__":\n'
        "        dl.launch(...)\n\n"
        "and keep the functions the ranks run at the top level, outside it.").format(
            script=script)
    return UnguardedLaunch(failures, output=output, finished=[], stopped=[],
                           world_size=len(output), summary=summary)


# -- where a rank stood ------------------------------------------------------------------------


def where_stuck(dump: str, main_thread: int | None, failure: RankFailure | None,
                output: str = "") -> str:
    """The stack of a rank stopped on a hang: from its dump; when a fatal signal ended the rank
    while it wrote the dump, from the one faulthandler printed into its output; when its
    process-group timeout fired while the launcher asked, from the traceback it reported."""
    stack = stack_from_dump(dump, main_thread)
    if not stack:
        stack = stack_from_dump(_fatal_error_dump(output)[1], main_thread)
    if not stack and failure is not None:
        stack = failure.traceback
    return stack
