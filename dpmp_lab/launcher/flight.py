"""torch's flight recorder, read for a hang: which collective each rank last issued, per group.

torch.distributed keeps a ring buffer of the collectives every process group issued (the
"flight recorder": op, sizes, dtypes, the group's sequence number, whether it completed). A
stack says where one rank waits; the record says what the ranks disagree on: rank 0 issued
the group's collective #3 and waits in it, rank 1 stopped at #2. On nccl, where a hang ends
in the watchdog's timeout (and an abort) rather than an exception, torch writes that record
itself when the timeout fires, to TORCH_FR_DUMP_TEMP_FILE + rank; a rank the launcher stops
on its own timeout writes the same record when asked (`dump`). Both land in the launch's own
folder under torch's names, so `python -m torch.distributed.flight_recorder.fr_trace <folder>`
reads what `LaunchTimeout.save_flight_records` writes. Older torch records nccl only, or not
at all: then there is nothing to add and the error says what it said before.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpmp_lab._helpers import ranks_text
from dpmp_lab.i18n.messages import N_, _

PREFIX = "flight_rank_"   # torch's file names: <prefix><rank>, what fr_trace reads
BUFFER_ENTRIES = "2000"   # entries kept per process, unless the caller set a size
MAX_DUMP_BYTES = 16 << 20  # the most the launcher reads of one rank's record


def _every_backend() -> bool:
    """torch's recorder for every backend (torch >= 2.7), on by default, with its own names for
    the variables; before, an nccl-only recorder that keeps nothing unless given a buffer."""
    from torch._C import _distributed_c10d as c10d

    return hasattr(c10d, "_dump_fr_trace")


def environ(folder: str) -> dict[str, str]:
    """Where torch writes a rank's record on a timeout: the launch's own folder, not /tmp,
    which every learner of a server shares."""
    name = "TORCH_FR_DUMP_TEMP_FILE" if _every_backend() else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
    return {name: os.path.join(folder, PREFIX)}


def buffer_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """A buffer for an older torch's nccl recorder, unless `environ` already chose one."""
    if _every_backend() or "TORCH_NCCL_TRACE_BUFFER_SIZE" in environ:
        return {}
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": BUFFER_ENTRIES}


def _recorded(backend: str) -> bytes | None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    from torch._C import _distributed_c10d as c10d

    # nccl keeps its own record (torch 2.11 measured: _dump_fr_trace holds no nccl entry);
    # torch >= 2.7 records the other backends too, in _dump_fr_trace
    names = (["_dump_nccl_trace"] if "nccl" in backend else []) + ["_dump_fr_trace"]
    empty = None  # a rank that issued nothing says so with an empty record
    for dump in filter(None, (getattr(c10d, name, None) for name in names)):
        try:
            data = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        except Exception:  # noqa: BLE001 - a record is a bonus; the launch reports without it
            continue
        if _has_entries(data):
            return data
        empty = empty or data
    return empty


def _has_entries(data: bytes) -> bool:
    try:
        return bool(_PlainData(io.BytesIO(data)).load().get("entries"))
    except Exception:  # noqa: BLE001 - not a record we can read
        return False


def dump(folder: str, rank: int, backend: str) -> bool:
    """In a rank: write its record where the launcher looks (whole, or not at all)."""
    data = _recorded(backend)
    if not data:
        return False
    path = os.path.join(folder, f"{PREFIX}{rank}")
    try:
        with open(path + ".part", "wb") as f:
            f.write(data)
        os.replace(path + ".part", path)
    except OSError:   # the launch's folder gone, a full disk: the report goes on without it
        return False
    return True


def written(folder: str, rank: int) -> bool:
    return os.path.exists(os.path.join(folder, f"{PREFIX}{rank}"))


class _PlainData(pickle.Unpickler):
    """Records are written by ranks that run a learner's code: read only plain data."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight record holds plain data, not {module}.{name}")


def read(folder: str, world_size: int) -> dict[int, dict]:
    """Each rank's record found in `folder` (rank -> torch's dict), unreadable ones left out."""
    records = {}
    for rank in range(world_size):
        try:
            with open(os.path.join(folder, f"{PREFIX}{rank}"), "rb") as f:
                data = f.read(MAX_DUMP_BYTES + 1)
            if len(data) > MAX_DUMP_BYTES:
                continue
            record = _PlainData(io.BytesIO(data)).load()
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError,
                AttributeError, IndexError):
            continue
        if isinstance(record, dict) and isinstance(record.get("entries"), list):
            records[rank] = record
    return records


def save(records: Mapping[int, dict], folder: str) -> list[str]:
    """Write records under torch's names, for torch's analyser (fr_trace)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for rank, record in sorted(records.items()):
        path = os.path.join(folder, f"{PREFIX}{rank}")
        with open(path, "wb") as f:
            pickle.dump(record, f)
        paths.append(path)
    return paths


# -- reading a record -------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One collective (or send/recv) a rank issued, as the learner reads it."""

    group: str | None  # the group's name in the record ("1"); None: the default group
    seq: int           # the group's collective number (the same on every rank of the group)
    op: str            # "all_reduce", "send 0->1"
    shapes: str        # "[4] float32"
    p2p: bool
    completed: bool

    def __str__(self) -> str:
        call = f"{self.op}({self.shapes})"
        if self.p2p:
            return call
        return _("collective #{seq}, {call}").format(seq=self.seq, call=call)


def _group_name(group: str | None) -> str:
    """A group as the learner reads it, in the language of the moment (see Entry.group)."""
    if group is None:
        return _("the default group")
    return _("group {name}").format(name=group)


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Bool": "bool", "Byte": "uint8", "Char": "int8"}


def entries(record: Mapping[str, Any]) -> list[Entry]:
    """A record's entries in the order issued, in the learner's words."""
    out = []
    for e in record.get("entries", []):
        if not isinstance(e, Mapping):
            continue
        group = e.get("process_group") or ("?", "")
        name, desc = (list(group) + ["", ""])[:2]
        label = None if desc == "default_pg" or name == "0" else str(name)
        op = str(e.get("profiling_name", "?")).split(":", 1)[-1]
        dtypes = [_DTYPES.get(d, str(d).lower()) for d in e.get("input_dtypes") or []]
        sizes = e.get("input_sizes") or []
        shapes = ", ".join(f"{list(s)} {d}" for s, d in zip(sizes, dtypes, strict=False))
        p2p = bool(e.get("is_p2p", False))
        seq = e.get("p2p_seq_id" if p2p else "collective_seq_id", 0)
        completed = e.get("state") == "completed" or bool(e.get("retired"))
        out.append(Entry(label, int(seq or 0), op, shapes, p2p, completed))
    return out


def summary(records: Mapping[int, Mapping[str, Any]], world_size: int) -> str:
    """What the records say about a hang: per process group, the last collective each rank
    issued, which ranks never issued the one others wait in, or which issued different ones
    at the same place. Empty when there is no record."""
    if not records:
        return ""
    lasts: dict[str | None, dict[int, Entry]] = {}
    pending_p2p: dict[int, Entry] = {}
    for rank, record in sorted(records.items()):
        for entry in entries(record):
            if entry.p2p:
                pending_p2p.pop(rank, None)
                if not entry.completed:
                    pending_p2p[rank] = entry
            else:
                lasts.setdefault(entry.group, {})[rank] = entry
    lines = []
    for group, last in sorted(lasts.items(), key=lambda kv: kv[0] is not None):
        lines += _group_lines(_group_name(group), last,
                              sorted(records) if group is None else sorted(last))
    for rank, entry in sorted(pending_p2p.items()):
        lines.append(_("rank {rank} waits in {entry}").format(rank=rank, entry=entry))
    missing = [r for r in range(world_size) if r not in records]
    if missing:
        lines.append(_("{ranks}: no record (the process ended before it could write "
                       "one)").format(ranks=ranks_text(missing)))
    if not lines:
        return ""
    head = _("Flight recorder (what torch.distributed recorded each rank issuing):")
    return "\n".join([head] + ["  " + line for line in lines])


def _group_lines(group: str, last: dict[int, Entry], members: list[int]) -> list[str]:
    issued_none = [r for r in members if r not in last]
    top = max(e.seq for e in last.values())
    ahead = {r: e for r, e in last.items() if e.seq == top}
    behind = {r: e for r, e in last.items() if e.seq < top}
    kinds = {(e.op, e.shapes) for e in ahead.values()}
    if not behind and not issued_none:
        if len(kinds) > 1:
            told = "; ".join(_("rank {rank} {call}").format(rank=r, call=f"{e.op}({e.shapes})")
                             for r, e in sorted(ahead.items()))
            return [_("{group}, collective #{seq}: the ranks issued different collectives "
                      "({told})").format(group=group, seq=top, told=told)]
        if all(e.completed for e in ahead.values()):
            return []   # this group agrees and finished: not where the hang is
        waiting = sorted(r for r, e in ahead.items() if not e.completed)
        still = (N_("{group}: every rank issued {entry}; {ranks} still waits in it")
                 if len(waiting) == 1 else
                 N_("{group}: every rank issued {entry}; {ranks} still wait in it"))
        return [_(still).format(group=group, entry=next(iter(ahead.values())),
                                ranks=ranks_text(waiting))]
    waiting = sorted(r for r, e in ahead.items() if not e.completed)
    if waiting == sorted(ahead):
        issued = (N_("{group}: {ranks} issued {entry} and waits in it") if len(waiting) == 1
                  else N_("{group}: {ranks} issued {entry} and wait in it"))
    elif waiting:
        issued = (N_("{group}: {ranks} issued {entry}; {waiting} waits in it")
                  if len(waiting) == 1 else
                  N_("{group}: {ranks} issued {entry}; {waiting} wait in it"))
    else:
        issued = N_("{group}: {ranks} issued {entry}")
    lines = [_(issued).format(group=group, ranks=ranks_text(sorted(ahead)),
                              entry=ahead[min(ahead)], waiting=ranks_text(waiting))]
    for r, e in sorted(behind.items()):
        lines.append(_("{group}: rank {rank} never issued collective #{seq}; its last was "
                       "{entry}").format(group=group, rank=r, seq=top, entry=e))
    if issued_none:
        lines.append(_("{group}: {ranks} issued no collective at all").format(
            group=group, ranks=ranks_text(issued_none)))
    return lines
