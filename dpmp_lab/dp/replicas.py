"""What every data-parallel scheme starts from: replicas that are identical on every rank of its
group (the group itself: _torch_helpers.resolve_group).

Replicas are made identical by broadcasting from the group's first rank; before that, one
all_gather of a fingerprint refuses replicas of different shapes with a ValueError, where gloo
would abort the process with a native message.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from dpmp_lab.i18n.messages import _

__all__ = ["check_same_everywhere", "first_rank"]


def first_rank(group: dist.ProcessGroup) -> int:
    """The GLOBAL rank of the group's rank 0: broadcast takes global ranks as src."""
    return dist.get_process_group_ranks(group)[0]


def check_same_everywhere(tensors: list[torch.Tensor], group: dist.ProcessGroup,
                          what: str) -> None:
    """Refuse replicas whose tensors differ in number, shape, dtype or requires_grad.

    Without this, the first collective over buffers of different sizes makes gloo abort the
    process with a native message. One all_gather of a fixed-size fingerprint costs nothing.
    """
    layout = ";".join(f"{tuple(t.shape)}/{t.dtype}/{t.requires_grad}" for t in tensors)
    mine = torch.tensor([len(tensors), sum(t.numel() for t in tensors),
                         zlib.crc32(layout.encode())], dtype=torch.int64,
                        device=tensors[0].device)
    size = dist.get_world_size(group)
    everyone = torch.empty(size * mine.numel(), dtype=torch.int64, device=mine.device)
    dist.all_gather_single(everyone, mine, group=group)
    rows = everyone.view(size, -1).tolist()
    ranks = dist.get_process_group_ranks(group)
    odd = [(ranks[i], row) for i, row in enumerate(rows) if row != rows[0]]
    if odd:
        seen = "; ".join((_("rank {rank} has {n} tensors with {size} elements but other "
                            "shapes, dtypes or requires_grad") if row[:2] == rows[0][:2] else
                          _("rank {rank} has {n} tensors with {size} elements")).format(
            rank=r, n=row[0], size=row[1]) for r, row in odd)
        raise ValueError(_(
            "the ranks hold different {what}: rank {rank} has {n} tensors with {size} "
            "elements; {seen}. Data parallelism needs the same model on every rank of the "
            "group: build it with the same shapes, dtypes and requires_grad everywhere (only "
            "the values may differ).").format(
                what=what, rank=ranks[0], n=rows[0][0], size=rows[0][1], seen=seen))
