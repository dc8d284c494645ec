"""faulthandler's dump of a rank's threads, read as the traceback a learner reads.

A rank dumps every thread's stack when the launcher asks where it is stuck (SIGUSR1) and when
a fatal signal kills it. faulthandler writes the most recent call first, without source lines
and with the launcher's own frames; `stack_from_dump` turns that into an ordinary traceback of
the main thread, with the cell's source; `p2p_wait` and `waits_on_handle` read what its innermost
frames say the rank waited in. Pure: tested in tests/unit/test_failures.py.
"""

from __future__ import annotations

import linecache
import os
import re

import dpmp_lab
from dpmp_lab.launcher import worker

_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_DUMP_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")


def stack_from_dump(dump: str, main_thread: int | None) -> str:
    """Turn faulthandler's dump of a stuck rank into a traceback of its main thread.

    faulthandler writes "most recent call first" without source lines; a learner reads
    tracebacks the other way round, with the code shown, so reverse it and add the source
    (notebook cells included: the kernel's linecache has them).
    """
    parsed = list(reversed(_main_frames(dump, main_thread)))
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
    """Whether a hung rank's dump has arrived whole: its main thread's stack reaches down to
    the launcher's frames, and shows where the rank waited.

    The dump comes through a pipe while faulthandler still writes it, a few bytes at a time,
    and another thread of the rank (the one listening to the launcher) has the launcher's
    frames too: only the main thread's own block says it is all there.
    """
    blocks = _thread_blocks(dump)
    frames = blocks.get(main_thread, []) if main_thread is not None else _main_frames(dump, None)
    return (any(m.group("file") == worker.__file__ for m in frames)
            and bool(stack_from_dump(dump, main_thread)))


def _main_frames(dump: str, main_thread: int | None) -> list[re.Match]:
    """The main thread's frames, most recent call first; the first thread's when the main
    thread is not known. A dump cut short before the main thread's block (a rank that died
    while faulthandler wrote it) gives none: another thread's stack is not where the rank
    stood."""
    blocks = _thread_blocks(dump)
    if main_thread is not None:
        return blocks.get(main_thread, [])
    return next(iter(blocks.values()), [])


def _thread_blocks(dump: str) -> dict[int | None, list[re.Match]]:
    """Each thread's frames, from the dump's whole lines (a dump read midway ends inside one)."""
    blocks: dict[int | None, list[re.Match]] = {}
    current: int | None = None
    for line in dump[:dump.rfind("\n") + 1].splitlines():
        head = _DUMP_THREAD.match(line)
        frame = _DUMP_FRAME.match(line)
        if head:
            current = int(head.group(1), 16)
            blocks[current] = []
        elif frame:
            blocks.setdefault(current, []).append(frame)
    return blocks


# -- what the innermost frames say a hung rank waited in ------------------------------------


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


_SOURCE_LINE_RE = re.compile(r"^\s+(?!File )(?P<code>\S.*)$")
_HANDLE_WAIT_RE = re.compile(r"\.wait\(\s*(timeout\s*=[^)]*)?\)")


def waits_on_handle(stack: str) -> bool:
    """The innermost line of a stack waits on a request handle (the Work an isend, an irecv or
    an async collective returned): `work.wait()` runs in C++, so no torch frame shows it. The
    library's own frames inside it (dl.trace's record of each wait) are looked through, to the
    first frame of the code that waited."""
    frames: list[tuple[str, str]] = []      # (file, its source line), outermost first
    for line in stack.rstrip().splitlines():
        found = _FRAME_RE.search(line)
        if found:
            frames.append((found.group("file"), ""))
        elif frames and not frames[-1][1] and (code := _SOURCE_LINE_RE.match(line)):
            frames[-1] = (frames[-1][0], code.group("code"))
    if not frames or "distributed_c10d" in frames[-1][0]:
        return False
    package = os.path.dirname(os.path.abspath(dpmp_lab.__file__)) + os.sep
    for file, code in reversed(frames):
        if _HANDLE_WAIT_RE.search(code):
            return True
        if not os.path.abspath(file).startswith(package):
            return False
    return False
