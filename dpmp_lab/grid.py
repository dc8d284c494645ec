"""The process grid of hybrid parallelism: every rank has a place (pp, dp, tp).

    grid = dl.ProcessGrid(dp=2, tp=2)          # inside a rank, world size 4
    grid.tp_group, grid.dp_group               # process groups, named in traces
    grid.describe()                            # who is with whom, as text

Ranks are numbered rank = (pp_rank * dp + dp_rank) * tp + tp_rank: tensor parallel varies
fastest, so the ranks of one tp group are neighbours (on real machines: GPUs of one node,
joined by the fastest links, since tp communicates in every layer); pipeline stages vary
slowest. As the articles draw it for dp x tp: a row of the grid is a DP group (same model
shard, different data), a column an MP/TP group (one model split across ranks).

GridLayout is the arithmetic alone and works anywhere, also in the notebook kernel;
ProcessGrid adds the process groups, built with torch's DeviceMesh so that torch-native
DTensor and FSDP code can use the very same mesh (`grid.mesh["tp"]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from dpmp_lab._helpers import group_ready, whole_number
from dpmp_lab.trace import name_group

KINDS = ("pp", "dp", "tp")


class Coords(NamedTuple):
    """A rank's place in the grid."""

    pp: int
    dp: int
    tp: int


@dataclass(frozen=True)
class GridLayout:
    """Which rank sits where, and which ranks share a group: pure arithmetic."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for kind in KINDS:
            whole_number(kind, getattr(self, kind),
                         what="every grid dimension needs at least 1 rank")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def rank_of(self, pp: int = 0, dp: int = 0, tp: int = 0) -> int:
        """The global rank at grid place (pp, dp, tp)."""
        for kind, value in zip(KINDS, (pp, dp, tp), strict=True):
            if not 0 <= value < getattr(self, kind):
                raise ValueError(f"{kind}={value} is outside this grid ({kind} has "
                                 f"{getattr(self, kind)} ranks: 0..{getattr(self, kind) - 1})")
        return (pp * self.dp + dp) * self.tp + tp

    def coords(self, rank: int) -> Coords:
        """(pp, dp, tp) of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside this grid of {self.world_size} ranks")
        return Coords(pp=rank // (self.dp * self.tp), dp=rank // self.tp % self.dp,
                      tp=rank % self.tp)

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        """The ranks that share `rank`'s `kind` group ("dp", "tp" or "pp")."""
        _check_kind(kind)
        here = self.coords(rank)._asdict()
        members = []
        for i in range(getattr(self, kind)):
            here[kind] = i
            members.append(self.rank_of(**here))
        return tuple(members)

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """Every `kind` group of the grid, in rank order: groups("tp") -> [(0, 1), (2, 3)]."""
        _check_kind(kind)
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world_size):
            seen.setdefault(self.group_of(kind, r), None)
        return list(seen)

    def next_stage(self, rank: int) -> int | None:
        """The rank that receives `rank`'s activations in the pipeline (None on the last)."""
        c = self.coords(rank)
        return None if c.pp == self.pp - 1 else self.rank_of(c.pp + 1, c.dp, c.tp)

    def prev_stage(self, rank: int) -> int | None:
        """The rank `rank` receives activations from (None on the first stage)."""
        c = self.coords(rank)
        return None if c.pp == 0 else self.rank_of(c.pp - 1, c.dp, c.tp)

    def describe_sizes(self) -> str:
        return (f"pp={self.pp} x dp={self.dp} x tp={self.tp} = {self.world_size} ranks, "
                f"rank = (pp_rank * {self.dp} + dp_rank) * {self.tp} + tp_rank")

    def describe(self, rank: int | None = None) -> str:
        """The layout in words: every group of every kind, and `rank`'s place if given."""
        lines = [self.describe_sizes()]
        what = {"tp": "tensor parallel: split each layer, talk every layer",
                "dp": "data parallel: same shard, different data, sync gradients",
                "pp": "pipeline: consecutive stages pass activations"}
        for kind in ("tp", "dp", "pp"):
            groups = " ".join(_tuple(g) for g in self.groups(kind))
            lines.append(f"  {kind} groups ({what[kind]}): {groups}")
        if rank is not None:
            c = self.coords(rank)
            nxt, prv = self.next_stage(rank), self.prev_stage(rank)
            lines.append(f"  rank {rank}: pp_rank {c.pp}, dp_rank {c.dp}, tp_rank {c.tp}; "
                         f"tp group {_tuple(self.group_of('tp', rank))}, "
                         f"dp group {_tuple(self.group_of('dp', rank))}, "
                         f"pp group {_tuple(self.group_of('pp', rank))}; "
                         f"previous stage {'-' if prv is None else prv}, "
                         f"next stage {'-' if nxt is None else nxt}")
        return "\n".join(lines)


class ProcessGrid:
    """The grid with its process groups; create it on every rank, with the same sizes.

    Attributes: dp, tp, pp (sizes), rank, coords, dp_rank, tp_rank, pp_rank, dp_group,
    tp_group, pp_group (ProcessGroups), dp_ranks, tp_ranks, pp_ranks (global ranks of this
    rank's groups), next_stage, prev_stage (global ranks or None), mesh (torch DeviceMesh with
    dims "pp", "dp", "tp"), layout (GridLayout).
    """

    def __init__(self, dp: int = 1, tp: int = 1, pp: int = 1, *,
                 device_type: str | None = None):
        self.layout = GridLayout(dp=dp, tp=tp, pp=pp)
        if not group_ready():
            raise RuntimeError(
                "ProcessGrid creates process groups, so it must run inside a rank (a function "
                "started by dl.launch or a %%distributed cell). To look at a layout in the "
                f"notebook, use dl.viz.grid(dp={dp}, tp={tp}, pp={pp}).")
        world = dist.get_world_size()
        if self.layout.world_size != world:
            raise ValueError(
                f"dp * tp * pp = {dp} * {tp} * {pp} = {self.layout.world_size}, but the world "
                f"has {world} ranks: the grid must use every rank exactly once")
        if device_type is None:
            # "nccl" or torch's combined "cpu:gloo,cuda:nccl": the ranks compute on GPUs
            device_type = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
        self.mesh = init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=KINDS)
        self.rank = dist.get_rank()
        self.coords = self.layout.coords(self.rank)
        self.pp_rank, self.dp_rank, self.tp_rank = self.coords
        self.pp_ranks, self.dp_ranks, self.tp_ranks = (
            self.layout.group_of(kind, self.rank) for kind in KINDS)
        self.pp_group, self.dp_group, self.tp_group = (
            self.mesh.get_group(kind) for kind in KINDS)
        for kind in KINDS:
            group = getattr(self, f"{kind}_group")
            name_group(group, kind)
            built, planned = tuple(dist.get_process_group_ranks(group)), \
                getattr(self, f"{kind}_ranks")
            if built != planned:   # would mean DeviceMesh changed its rank order
                raise RuntimeError(f"DeviceMesh built {kind} group {built}, expected {planned}")
        self.next_stage = self.layout.next_stage(self.rank)
        self.prev_stage = self.layout.prev_stage(self.rank)

    dp = property(lambda self: self.layout.dp)
    tp = property(lambda self: self.layout.tp)
    pp = property(lambda self: self.layout.pp)
    world_size = property(lambda self: self.layout.world_size)

    def describe(self) -> str:
        """The whole layout and this rank's place in it, as text."""
        return self.layout.describe(self.rank)

    def __repr__(self) -> str:
        return (f"ProcessGrid(pp={self.pp}, dp={self.dp}, tp={self.tp}; rank {self.rank} at "
                f"pp={self.pp_rank} dp={self.dp_rank} tp={self.tp_rank})")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"group kind must be one of {', '.join(KINDS)}, not {kind!r}")


def _tuple(ranks: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, ranks)) + ")"
