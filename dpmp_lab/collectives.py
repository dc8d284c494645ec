"""Collectives built by hand from point-to-point messages: what all_reduce does inside.

    total = ring_all_reduce(grad)            # = dist.all_reduce(grad), from send/recv only

The ring: the N ranks sit in a circle; each sends only to its right neighbour and receives
only from its left. The tensor is cut into N chunks.
- reduce-scatter (N-1 steps): in step s, rank r sends its running sum of chunk (r - s) mod N
  to the right and adds what arrives from the left to chunk (r - s - 1) mod N. After N-1
  steps rank r holds the complete sum of one chunk.
- all-gather (N-1 steps): each rank passes complete chunks around the circle until every
  rank has all of them.
Every rank sends 2(N-1) messages of K/N elements: 2(N-1)/N * K in all, almost independent
of N. That is why ring all-reduce scales, and what dl.cost.ring_all_reduce_bytes says.

Chunks may differ in size by one element (torch.tensor_split), so any length works.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dpmp_lab.i18n.messages import _


def ring_neighbours(group: dist.ProcessGroup | None) -> tuple[int, int, int, int]:
    """(my index in the group, group size, global rank on my right, global rank on my left)."""
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    right = dist.get_global_rank(group, (me + 1) % n) if group is not None else (me + 1) % n
    left = dist.get_global_rank(group, (me - 1) % n) if group is not None else (me - 1) % n
    return me, n, right, left


def start_ring_exchange(send: torch.Tensor, recv: torch.Tensor,
                        group: dist.ProcessGroup | None = None) -> list[dist.Work]:
    """Post the send to the right neighbour and the receive from the left one, both at once;
    wait on what it returns (ring attention computes meanwhile: dpmp_lab.cp).

    Posting both before waiting matters: if every rank did a blocking send first, each would
    wait for a neighbour that is itself stuck sending.
    """
    _, _, right, left = ring_neighbours(group)
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right, group),
                                   dist.P2POp(dist.irecv, recv, left, group)])


def _exchange(send: torch.Tensor, recv: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    for work in start_ring_exchange(send, recv, group):
        work.wait()


def ring_reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum x over the ranks and return this rank's chunk of the sum (chunk `group rank`).

    x is flattened and cut into N chunks with torch.tensor_split.
    """
    me, n, _, _ = ring_neighbours(group)
    chunks = [c.clone() for c in torch.tensor_split(x.detach().flatten(), n)]
    for step in range(n - 1):
        # shifted by one so that the chunk finished last is chunk `me`
        send_i, recv_i = (me - step - 1) % n, (me - step - 2) % n
        incoming = torch.empty_like(chunks[recv_i])
        _exchange(chunks[send_i], incoming, group)
        chunks[recv_i] += incoming
    return chunks[me]


def ring_all_gather(chunk: torch.Tensor, sizes: list[int],
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's 1-D chunk (rank order); sizes[i] = numel of rank i's chunk."""
    me, n, _right, _left = ring_neighbours(group)   # not `_, _`: `_` says the message below
    if len(sizes) != n or sizes[me] != chunk.numel():
        raise ValueError(_("sizes {sizes} do not fit {n} ranks with this rank's chunk of "
                           "{numel} elements").format(sizes=sizes, n=n, numel=chunk.numel()))
    chunks: list[torch.Tensor | None] = [None] * n
    chunks[me] = chunk.detach().flatten().clone()
    for step in range(n - 1):
        send_i, recv_i = (me - step) % n, (me - step - 1) % n
        incoming = chunk.new_empty(sizes[recv_i])
        _exchange(chunks[send_i], incoming, group)
        chunks[recv_i] = incoming
    return torch.cat(chunks)


def ring_all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The sum of x over the ranks, with x's shape: a ring reduce-scatter, then a ring
    all-gather. Equals dist.all_reduce(x) (up to the order of the floating-point sums)."""
    n = dist.get_world_size(group)
    sizes = [c.numel() for c in torch.tensor_split(torch.empty(x.numel(), device="meta"), n)]
    mine = ring_reduce_scatter(x, group)
    return ring_all_gather(mine, sizes, group).view(x.shape)


def all_reduce_by_halves(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """all_reduce = reduce_scatter + all_gather, with torch's collectives.

    Needs x.numel() divisible by the group size (pad otherwise). Returns the sum, x's shape.
    """
    n = dist.get_world_size(group)
    flat = x.detach().flatten().contiguous()
    if flat.numel() % n:
        raise ValueError(_("{numel} elements do not split evenly over {n} ranks: pad x").format(
            numel=flat.numel(), n=n))
    part = flat.new_empty(flat.numel() // n)
    dist.reduce_scatter_single(part, flat, group=group)
    out = flat.new_empty(flat.numel())
    dist.all_gather_single(out, part, group=group)
    return out.view(x.shape)


__all__ = ["all_reduce_by_halves", "ring_all_gather", "ring_all_reduce", "ring_neighbours",
           "ring_reduce_scatter", "start_ring_exchange"]
