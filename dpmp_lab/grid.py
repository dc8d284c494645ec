"""The process grid of hybrid parallelism: every rank has a place (pp, dp, cp, tp).

    grid = dl.ProcessGrid(dp=2, tp=2)          # inside a rank, world size 4
    grid.tp_group, grid.dp_group               # process groups, named in traces
    grid.describe()                            # who is with whom, as text

Ranks are numbered rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank: tensor
parallel varies fastest, so the ranks of one tp group are neighbours (on real machines: GPUs of
one node, joined by the fastest links, since tp communicates in every layer); context parallel
(cp, the sequence split over ranks, ring attention) comes next, since it talks in every
attention layer too; pipeline stages vary slowest. As the articles draw it for dp x tp: a row
of the grid is a DP group (same model shard, different data), a column an MP/TP group (one
model split across ranks). With cp = 1 (the default) the numbering is the dp x tp x pp one.

Expert parallel (ep) is not a dimension of its own: the experts of a MoE layer are split over
ep ranks carved out of the dp group (ep must divide dp), dp_rank = edp_rank * ep + ep_rank.
The ep ranks hold different experts and different data; they exchange tokens with all-to-all
in every MoE layer, and their non-expert weights stay data parallel over the whole dp group.
dp = 4, cp = 2, tp = 1, ep = 2 (8 ranks):

    cp_rank:          0    1          cp groups: (0,1) (2,3) (4,5) (6,7)   the sequence split
    dp_rank 0:        0    1          dp groups: (0,2,4,6) (1,3,5,7)       gradients
    dp_rank 1:        2    3          ep groups: (0,2) (4,6) (1,3) (5,7)   experts: all-to-all
    dp_rank 2:        4    5            (consecutive dp ranks with the same cp and tp rank)
    dp_rank 3:        6    7

dl.viz.grid(dp=4, cp=2, ep=2) draws it (one panel per cp rank) without launching anything.

GridLayout is the arithmetic alone and works anywhere, also in the notebook kernel;
ProcessGrid adds the process groups, built with torch's DeviceMesh so that torch-native
DTensor and FSDP code can use the very same mesh (`grid.mesh["tp"]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from dpmp_lab._helpers import whole_number
from dpmp_lab._torch_helpers import group_ready
from dpmp_lab.i18n.messages import _
from dpmp_lab.trace import name_group

__all__ = ["Coords", "GROUPS", "GridLayout", "KINDS", "ProcessGrid"]

KINDS = ("pp", "dp", "cp", "tp")       # the mesh's dimensions, slowest first
GROUPS = (*KINDS, "ep")                  # ep: a sub-group of dp


class Coords(NamedTuple):
    """A rank's place in the grid, in the grid's order: pp outermost, tp innermost (the ranks
    of a tp group are neighbours)."""

    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class GridLayout:
    """Which rank sits where, and which ranks share a group: pure arithmetic."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for kind in GROUPS:
            whole_number(kind, getattr(self, kind),
                         what=_("every grid dimension needs at least 1 rank"))
        if self.dp % self.ep:
            raise ValueError(_("ep={ep} must divide dp={dp}: the expert-parallel ranks are "
                               "carved out of the data-parallel group").format(
                ep=self.ep, dp=self.dp))

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def rank_of(self, pp: int = 0, dp: int = 0, tp: int = 0, cp: int = 0) -> int:
        """The global rank at grid place (pp, dp, cp, tp)."""
        for kind, value in (("pp", pp), ("dp", dp), ("tp", tp), ("cp", cp)):
            if not 0 <= value < getattr(self, kind):
                raise ValueError(_("{kind}={value} is outside this grid ({kind} has {n} ranks: "
                                   "0..{last})").format(kind=kind, value=value,
                                                        n=getattr(self, kind),
                                                        last=getattr(self, kind) - 1))
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def coords(self, rank: int) -> Coords:
        """(pp, dp, cp, tp) of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(_("rank {rank} is outside this grid of {n} ranks").format(
                rank=rank, n=self.world_size))
        return Coords(pp=rank // (self.dp * self.cp * self.tp),
                      dp=rank // (self.cp * self.tp) % self.dp, tp=rank % self.tp,
                      cp=rank // self.tp % self.cp)

    def ep_rank(self, rank: int) -> int:
        """`rank`'s index in its ep group: dp_rank % ep."""
        return self.coords(rank).dp % self.ep

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        """The ranks that share `rank`'s `kind` group ("dp", "tp", "pp", "cp" or "ep")."""
        _check_kind(kind)
        here = self.coords(rank)._asdict()
        if kind == "ep":   # consecutive dp ranks: the same dp_rank // ep
            first = here["dp"] - here["dp"] % self.ep
            places = range(first, first + self.ep)
        else:
            places = range(getattr(self, kind))
        members = []
        for i in places:
            here["dp" if kind == "ep" else kind] = i
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
        return None if c.pp == self.pp - 1 else self.rank_of(**c._replace(pp=c.pp + 1)._asdict())

    def prev_stage(self, rank: int) -> int | None:
        """The rank `rank` receives activations from (None on the first stage)."""
        c = self.coords(rank)
        return None if c.pp == 0 else self.rank_of(**c._replace(pp=c.pp - 1)._asdict())

    def describe_sizes(self) -> str:
        if self.cp == 1 and self.ep == 1:
            return (f"pp={self.pp} x dp={self.dp} x tp={self.tp} = {self.world_size} ranks, "
                    f"rank = (pp_rank * {self.dp} + dp_rank) * {self.tp} + tp_rank")
        return (f"pp={self.pp} x dp={self.dp} x cp={self.cp} x tp={self.tp} = "
                f"{self.world_size} ranks (ep={self.ep} inside dp), rank = ((pp_rank * "
                f"{self.dp} + dp_rank) * {self.cp} + cp_rank) * {self.tp} + tp_rank")

    def describe(self, rank: int | None = None) -> str:
        """The layout in words: every group of every kind, and `rank`'s place if given."""
        lines = [self.describe_sizes()]
        what = {"tp": "tensor parallel: split each layer, talk every layer",
                "cp": "context parallel: split the sequence, pass K/V round a ring",
                "dp": "data parallel: same shard, different data, sync gradients",
                "ep": "expert parallel: different experts, tokens sent by all-to-all",
                "pp": "pipeline: consecutive stages pass activations"}
        shown = [k for k in ("tp", "cp", "dp", "ep", "pp")
                 if k in ("tp", "dp", "pp") or getattr(self, k) > 1]
        for kind in shown:
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
            if self.cp > 1 or self.ep > 1:
                lines.append(f"  rank {rank}: cp_rank {c.cp}, ep_rank {self.ep_rank(rank)}; "
                             f"cp group {_tuple(self.group_of('cp', rank))}, "
                             f"ep group {_tuple(self.group_of('ep', rank))}")
        return "\n".join(lines)


class ProcessGrid:
    """The grid with its process groups; create it on every rank, with the same sizes.

    Attributes: dp, tp, pp, cp, ep (sizes), rank, coords, dp_rank, tp_rank, pp_rank, cp_rank,
    ep_rank, dp_group, tp_group, pp_group, cp_group (ProcessGroups), ep_group (a ProcessGroup,
    or None when ep = 1: every expert is local, as dl.moe.MoE(ep_group=None) expects),
    dp_ranks, tp_ranks, pp_ranks, cp_ranks, ep_ranks (global ranks of this rank's groups),
    next_stage, prev_stage (global ranks or None), mesh (torch DeviceMesh with dims "pp", "dp",
    "cp", "tp"), layout (GridLayout).
    """

    def __init__(self, dp: int = 1, tp: int = 1, pp: int = 1, *, cp: int = 1, ep: int = 1,
                 device_type: str | None = None):
        self.layout = GridLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
        if not group_ready():
            extra = f", cp={cp}, ep={ep}" if cp > 1 or ep > 1 else ""
            raise RuntimeError(_(
                "ProcessGrid creates process groups, so it must run inside a rank (a function "
                "started by dl.launch or a %%distributed cell). To look at a layout in the "
                "notebook, use dl.viz.grid(dp={dp}, tp={tp}, pp={pp}{extra}).").format(
                    dp=dp, tp=tp, pp=pp, extra=extra))
        world = dist.get_world_size()
        if self.layout.world_size != world:
            axes = "dp * tp * pp" + (" * cp" if cp > 1 else "")
            sizes = f"{dp} * {tp} * {pp}" + (f" * {cp}" if cp > 1 else "")
            raise ValueError(_(
                "{axes} = {sizes} = {n}, but the world has {world} ranks: the grid must use "
                "every rank exactly once").format(axes=axes, sizes=sizes,
                                                  n=self.layout.world_size, world=world))
        if device_type is None:
            # "nccl" or torch's combined "cpu:gloo,cuda:nccl": the ranks compute on GPUs
            device_type = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
        self.mesh = init_device_mesh(device_type, (pp, dp, cp, tp), mesh_dim_names=KINDS)
        self.rank = dist.get_rank()
        self.coords = self.layout.coords(self.rank)
        self.pp_rank, self.dp_rank, self.cp_rank, self.tp_rank = self.coords
        self.ep_rank = self.layout.ep_rank(self.rank)
        for kind in KINDS:
            group = self.mesh.get_group(kind)
            planned = self.layout.group_of(kind, self.rank)
            built = tuple(dist.get_process_group_ranks(group))
            if built != planned:   # would mean DeviceMesh changed its rank order
                raise RuntimeError(f"DeviceMesh built {kind} group {built}, expected {planned}")
            name_group(group, kind)
            setattr(self, f"{kind}_group", group)
            setattr(self, f"{kind}_ranks", planned)
        self.ep_ranks = self.layout.group_of("ep", self.rank)
        self.ep_group = None
        if ep > 1:   # every rank creates every ep group, in one order (section 2 of 05)
            for ranks in self.layout.groups("ep"):
                group = dist.new_group(list(ranks))
                if self.rank in ranks:
                    name_group(group, "ep")
                    self.ep_group = group
        self.next_stage = self.layout.next_stage(self.rank)
        self.prev_stage = self.layout.prev_stage(self.rank)

    dp = property(lambda self: self.layout.dp)
    tp = property(lambda self: self.layout.tp)
    pp = property(lambda self: self.layout.pp)
    cp = property(lambda self: self.layout.cp)
    ep = property(lambda self: self.layout.ep)
    world_size = property(lambda self: self.layout.world_size)

    def describe(self) -> str:
        """The whole layout and this rank's place in it, as text."""
        return self.layout.describe(self.rank)

    def __repr__(self) -> str:
        extra = f" cp={self.cp_rank} ep={self.ep_rank}" if self.cp > 1 or self.ep > 1 else ""
        return (f"ProcessGrid(pp={self.pp}, dp={self.dp}, tp={self.tp}"
                + (f", cp={self.cp}, ep={self.ep}" if extra else "")
                + f"; rank {self.rank} at pp={self.pp_rank} dp={self.dp_rank} "
                f"tp={self.tp_rank}{extra})")


def _check_kind(kind: str) -> None:
    if kind not in GROUPS:
        raise ValueError(_("group kind must be one of {kinds}, not {kind!r}").format(
            kinds=", ".join(GROUPS), kind=kind))


def _tuple(ranks: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, ranks)) + ")"
