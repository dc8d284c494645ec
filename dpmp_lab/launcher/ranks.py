"""What the launcher keeps about a launch and its ranks: the request that passed launch's
checks, and per rank its process, the launcher's ends of its pipes and what it said so far.
Plain data, read and written by supervisor.py's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from dpmp_lab.launcher.lines import LineSplitter
from dpmp_lab.launcher.protocol import Pipe, RankState


@dataclass(frozen=True)
class Request:
    """A launch request that passed launch's checks: what starting the ranks needs."""

    world_size: int
    backend: str
    timeout: float
    pg_timeout: float
    start_method: str
    env: dict[str, str]
    threads: int
    max_result_bytes: int  # the most a rank may send back, pickled (it checks; so does receive)
    device_audit: bool = False


@dataclass
class Rank:
    """One rank's process, the launcher's ends of its pipes, and what it said so far."""

    rank: int
    proc: BaseProcess
    out: Connection
    err: Connection
    msg: Connection
    dump: Connection
    release: Connection
    state: RankState = RankState.STARTING
    value: Any = None
    trace: Any = None
    main_thread: int | None = None
    destroyed_group: bool = False  # it returned, with its process group destroyed by fn
    exited: bool = False
    chunks: list[str] = field(default_factory=list)  # stdout and stderr, as they arrived
    dumps: list[str] = field(default_factory=list)
    lines: dict[Pipe, LineSplitter] = field(
        default_factory=lambda: {Pipe.OUT: LineSplitter(), Pipe.ERR: LineSplitter()})

    @property
    def output(self) -> str:
        return "".join(self.chunks)

    @property
    def finished(self) -> bool:
        return self.state in (RankState.RETURNED, RankState.FAILED)
