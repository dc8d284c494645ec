"""The rank processes of one launch, and the loop that watches them.

Each rank is a process running worker.rank_main, with five pipes to the launcher (what each
carries: protocol.Pipe). One selector waits on all of them and on every process's exit,
until every rank returned, one failed, or the launch's time ran out. Then the launch winds
down: on success the ranks are released and exit on their own; on a failure the others get
a moment to report their own; on a hang the stuck ranks are asked where they are. Whatever
still runs is killed with every process it started (processes.py), its last output
collected, and every pipe closed, whatever happened (Ctrl-C included).
"""

from __future__ import annotations

import linecache
import os
import selectors
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from dpmp_lab.launcher import failures, flight, processes, stacks, worker
from dpmp_lab.launcher.failures import LaunchError, RankFailure
from dpmp_lab.launcher.lines import labelled
from dpmp_lab.launcher.progress import Progress
from dpmp_lab.launcher.protocol import Outcome, Pipe, RankState, Started
from dpmp_lab.launcher.ranks import Rank, Request
from dpmp_lab.launcher.receiving import Result, receive
from dpmp_lab.launcher.starting import starting

STOP_GRACE_S = 0.2  # after a first failure: time for the other ranks to report their own
CAUSE_GRACE_S = 1.0  # the same when every failure so far is a lost peer: time for the cause
DRAIN_S = 2.0  # after stopping: time to collect the last output of killed ranks
EXIT_WAIT_S = 5.0  # after every rank returned: time for the ranks to tear down and exit
# on a hang: the most time for faulthandler to write the stuck ranks' stacks (the wait ends
# as soon as every stack is whole; on a loaded 2-core machine one took over 2 s)
DUMP_WAIT_S = 6.0


class Supervisor:
    """One launch: start the ranks, watch them, wind down, close everything."""

    def __init__(self, request: Request, payload: bytes, *, trace: bool, stream: bool,
                 progress: bool = False):
        self.req = request
        self.payload = payload
        self.trace = trace
        self.stream = stream
        self.progress = Progress(request.world_size, progress) if progress else None
        self.ranks: list[Rank] = []
        self.failures: dict[int, RankFailure] = {}  # in the order they were noticed
        self.stuck: list[Rank] = []
        self.watchdog: dict[int, str] = {}  # rank -> nccl's line saying a collective timed out
        self.asked_records: list[Rank] = []  # ranks asked for their flight record (a hang)
        self.flight_records: dict[int, dict] = {}
        self.folder = ""  # this launch's own: the store, and the ranks' flight records
        self.stopping = False
        self.sel = selectors.DefaultSelector()

    def run(self) -> list[Rank]:
        """Every rank, each with its value; raises LaunchError or LaunchTimeout instead when
        one did not return."""
        # Why not a TCPStore on port 0: its client and server look up each peer's address
        # (::ffff:127.0.0.1) by reverse DNS, and where DNS is slow or unreachable that stalls
        # a launch by 5 s or more. A file store needs no network and no name lookups.
        self.folder = tempfile.mkdtemp(prefix="dpmp_lab-")
        outcome = None
        try:
            self._start(os.path.join(self.folder, "store"))
            # the ranks' time counts from here: the first launch may have waited for the
            # forkserver to import torch, which is no time of theirs (seconds on a busy machine)
            outcome = self._watch(time.monotonic() + self.req.timeout)
            self._wind_down(outcome)
        except BaseException:
            self._kill_all()
            raise
        finally:
            self._close()
            if outcome not in (None, Outcome.ALL_RETURNED):
                self.flight_records = flight.read(self.folder, self.req.world_size)
            shutil.rmtree(self.folder, ignore_errors=True)
            if self.progress is not None:  # whatever did not finish was stopped by us
                self.progress.close([r.state if r.finished else RankState.STOPPED
                                     for r in self.ranks])
        if outcome != Outcome.ALL_RETURNED:
            raise self._error(outcome)
        return self.ranks

    # starting
    def _start(self, store_path: str) -> None:
        environ = {**flight.buffer_defaults({**os.environ, **self.req.env}), **os.environ,
                   **self._launch_environ(), **self.req.env, **flight.environ(self.folder)}
        common = dict(
            world_size=self.req.world_size,
            backend=self.req.backend,
            store_path=store_path,
            flight_dir=self.folder,
            pg_timeout=self.req.pg_timeout,
            threads=self.req.threads,
            payload=self.payload,
            sys_path=list(sys.path),
            cwd=os.getcwd(),
            source_lines=notebook_sources(),
            trace=self.trace,
            device_audit=self.req.device_audit,
            max_result_bytes=self.req.max_result_bytes,
            start_method=self.req.start_method,
        )
        with starting(self.req.start_method) as ctx:
            for r in range(self.req.world_size):
                env_r = dict(environ, RANK=str(r), LOCAL_RANK=str(r))
                self._start_rank(ctx, worker.RankSpec(rank=r, environ=env_r, **common))

    def _start_rank(self, ctx: BaseContext, spec: worker.RankSpec) -> None:
        out_r, out_w = ctx.Pipe(duplex=False)
        err_r, err_w = ctx.Pipe(duplex=False)
        msg_r, msg_w = ctx.Pipe(duplex=False)
        dump_r, dump_w = ctx.Pipe(duplex=False)
        rel_r, rel_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=worker.rank_main,
                           args=(spec, out_w, err_w, msg_w, dump_w, rel_r),
                           name=f"dpmp_lab-rank{spec.rank}")
        rank = Rank(spec.rank, proc, out_r, err_r, msg_r, dump_r, rel_w)
        self.ranks.append(rank)
        try:
            proc.start()
        finally:  # the rank's ends: only the rank may hold them, or no pipe would ever close
            for conn in (out_w, err_w, msg_w, dump_w, rel_r):
                conn.close()
        for conn, pipe in ((out_r, Pipe.OUT), (err_r, Pipe.ERR), (msg_r, Pipe.MSG),
                           (dump_r, Pipe.DUMP), (proc.sentinel, Pipe.EXIT)):
            self.sel.register(conn, selectors.EVENT_READ, (rank, pipe))

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

    # watching: until every rank returned, one failed, or time ran out
    def _watch(self, deadline: float) -> Outcome:
        while True:
            if self.failures:
                return Outcome.FAILED
            if all(r.state == RankState.RETURNED for r in self.ranks):
                return Outcome.ALL_RETURNED
            if self.watchdog:
                return Outcome.WATCHDOG
            now = time.monotonic()
            if now >= deadline:
                return Outcome.TIMED_OUT
            self._pump(min(deadline - now, 1.0))
            if self.progress is not None:
                self.progress.update([r.state for r in self.ranks])

    def _wind_down(self, outcome: Outcome) -> None:
        match outcome:
            case Outcome.ALL_RETURNED:
                for r in self.ranks:
                    self._release(r)
                self._pump_until(lambda: all(r.exited for r in self.ranks), EXIT_WAIT_S)
            case Outcome.FAILED:
                # A rank that lost its peers reports a consequence: wait a little longer for
                # the cause (a crash, a group destroyed by fn) to report itself.
                lost = all(failures.lost_a_peer(f) for f in self.failures.values())
                self._pump_until(lambda: all(r.finished for r in self.ranks),
                                 CAUSE_GRACE_S if lost else STOP_GRACE_S)
                if any(failures.is_collective_timeout(f) for f in self.failures.values()):
                    self._ask_records()  # a hang behind process-group timeouts
                    self._pump_until(self._records_written, DUMP_WAIT_S)
            case Outcome.TIMED_OUT | Outcome.WATCHDOG:
                self.stuck = [r for r in self.ranks if not r.finished]
                for r in self.stuck:
                    signal_rank(r.proc, signal.SIGUSR1)
                # faulthandler walks every thread's frames from a signal handler: a thread
                # running Python meanwhile (the one writing the flight record) can crash the
                # rank, so the record is asked for once the stacks are written
                self._pump_until(lambda: all(self._knows_where(r) for r in self.stuck),
                                 DUMP_WAIT_S)
                self._ask_records()
                self._pump_until(self._records_written, DUMP_WAIT_S)
        self._kill_all()
        self._pump_until(lambda: not self._open_streams(), DRAIN_S)
        self._flush_partial_lines()

    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout=max(timeout, 0.0)):
            rank, pipe = key.data
            match pipe:
                case Pipe.OUT | Pipe.ERR:
                    self._read_output(rank, pipe, key.fileobj)
                case Pipe.DUMP:
                    data = _read(key.fileobj)
                    if data:
                        rank.dumps.append(data.decode("utf-8", "replace"))
                    else:
                        self._unregister(key.fileobj)
                case Pipe.MSG:
                    self._read_message(rank, key.fileobj)
                case Pipe.EXIT:
                    self._unregister(key.fileobj)
                    self._on_exit(rank)

    def _pump_until(self, done: Callable[[], bool], seconds: float) -> None:
        end = time.monotonic() + seconds
        while not done():
            left = end - time.monotonic()
            if left <= 0 or not self.sel.get_map():
                return
            self._pump(min(left, 0.1))

    # what the ranks say
    def _read_output(self, rank: Rank, pipe: Pipe, conn: Connection) -> None:
        data = _read(conn)
        if not data:
            self._unregister(conn)
        text, lines = rank.lines[pipe].feed(data)
        if text:
            rank.chunks.append(text)
        for line in lines:
            self._show(rank.rank, pipe, line)
            if pipe == Pipe.ERR and not rank.finished and failures.WATCHDOG_RE.search(line):
                self.watchdog.setdefault(rank.rank, line)

    def _show(self, rank: int, pipe: Pipe, line: str) -> None:
        if self.stream:
            (sys.stdout if pipe == Pipe.OUT else sys.stderr).write(labelled(rank, line))

    def _flush_partial_lines(self) -> None:
        for r in self.ranks:
            for pipe, splitter in r.lines.items():
                line = splitter.rest()
                if line is not None:
                    self._show(r.rank, pipe, line)
        if self.stream:
            sys.stdout.flush()
            sys.stderr.flush()

    def _read_message(self, rank: Rank, conn: Connection) -> None:
        match receive(conn, rank.rank, self.req.max_result_bytes):
            case None:
                self._unregister(conn)
            case Started(main_thread=thread):
                rank.state = RankState.RUNNING
                rank.main_thread = thread
            case Result(value=value, trace=trace, destroyed_group=destroyed):
                rank.state = RankState.RETURNED
                rank.value, rank.trace, rank.destroyed_group = value, trace, destroyed
            case RankFailure() as failure:
                self._unregister(conn)
                rank.state = RankState.FAILED
                self.failures.setdefault(rank.rank, failure)

    def _on_exit(self, rank: Rank) -> None:
        rank.exited = True
        # A result may still sit in the pipe: read it before deciding the rank died.
        while not rank.msg.closed and rank.msg in self.sel.get_map() and rank.msg.poll(0):
            self._read_message(rank, rank.msg)
        if rank.finished:
            return
        if self.stopping:
            rank.state = RankState.STOPPED
            return
        started = rank.state != RankState.STARTING
        rank.state = RankState.FAILED
        self.failures.setdefault(rank.rank, failures.death(
            rank.rank, _exitcode(rank.proc), rank.output, rank.main_thread, started=started))

    def _release(self, rank: Rank) -> None:
        try:
            rank.release.send_bytes(worker.RELEASE)
        except OSError:
            pass

    def _ask_records(self) -> None:
        """Ask every rank still alive for its flight record (worker._listen answers)."""
        for r in self.ranks:
            if not r.exited and not flight.written(self.folder, r.rank):
                try:
                    r.release.send_bytes(worker.WRITE_RECORD)
                    self.asked_records.append(r)
                except OSError:
                    pass

    def _records_written(self) -> bool:
        return all(r.exited or flight.written(self.folder, r.rank) for r in self.asked_records)

    # stopping and cleaning up
    def _kill_all(self) -> None:
        self.stopping = True
        for r in self.ranks:
            if r.proc.pid is not None and r.proc.exitcode is None:
                processes.kill_tree(r.proc.pid)  # and all it started: it is their subreaper

    def _open_streams(self) -> bool:
        return any(key.data[1] in (Pipe.OUT, Pipe.ERR) for key in self.sel.get_map().values())

    def _unregister(self, fileobj: Any) -> None:
        # by fd: a Connection that refused a message over its limit has closed itself
        for key in [k for k in self.sel.get_map().values() if k.fileobj is fileobj]:
            self.sel.unregister(key.fd)

    def _close(self) -> None:
        for r in self.ranks:
            if r.proc.pid is not None:
                r.proc.join(timeout=5.0)
                if r.proc.exitcode is None:  # never seen: SIGKILL cannot be ignored
                    processes.kill_tree(r.proc.pid)
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

    # the error, from what was collected
    def _error(self, outcome: Outcome) -> LaunchError:
        finished = [r.rank for r in self.ranks if r.state == RankState.RETURNED]
        output = [r.output for r in self.ranks]
        if outcome in (Outcome.TIMED_OUT, Outcome.WATCHDOG):
            stuck = {r.rank: self._stuck(r, outcome) for r in self.stuck}
            return failures.launch_timeout(stuck, output=output, finished=finished,
                                           flight_records=self.flight_records)
        return failures.launch_error(
            self.failures, output=output, finished=finished, pg_timeout=self.req.pg_timeout,
            destroyed=[r.rank for r in self.ranks if r.destroyed_group],
            flight_records=self.flight_records)

    def _stuck(self, r: Rank, outcome: Outcome) -> RankFailure:
        stack = self._where_stuck(r)
        if outcome == Outcome.TIMED_OUT:
            return failures.still_running(r.rank, stack=stack, output=r.output,
                                          timeout=self.req.timeout)
        if r.rank in self.watchdog:
            return failures.watchdog_timeout(r.rank, self.watchdog[r.rank], stack=stack,
                                             output=r.output, pg_timeout=self.req.pg_timeout)
        return failures.stopped_by_watchdog(r.rank, stack=stack, output=r.output)

    def _knows_where(self, rank: Rank) -> bool:
        # A rank caught inside the launcher's own code was just reporting an error (its
        # process-group timeout fired at the same moment): wait for that report instead.
        return rank.rank in self.failures or stacks.dump_complete("".join(rank.dumps),
                                                                  rank.main_thread)

    def _where_stuck(self, rank: Rank) -> str:
        return failures.where_stuck("".join(rank.dumps), rank.main_thread,
                                    self.failures.get(rank.rank), rank.output)


def notebook_sources() -> dict[str, tuple]:
    """linecache entries of code that exists only in memory (notebook cells), for tracebacks."""
    return {
        name: entry
        for name, entry in list(linecache.cache.items())
        if len(entry) == 4 and entry[1] is None
    }


def signal_rank(proc: BaseProcess, sig: int) -> None:
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


def _exitcode(proc: BaseProcess, seconds: float = 1.0) -> int | None:
    """The exit code of a process whose sentinel just became readable. Under fork and spawn
    the sentinel closes while the process is still exiting, a moment before it can be reaped."""
    end = time.monotonic() + seconds
    while proc.exitcode is None and time.monotonic() < end:
        time.sleep(0.005)
    return proc.exitcode


def _read(conn: Any) -> bytes:
    try:
        return os.read(conn.fileno(), 65536)
    except OSError:
        return b""
