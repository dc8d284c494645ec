"""The flat-shard layout that ZeRO's stages and FSDP share: tensors flattened one after the other
into one vector, zero-padded to n equal chunks, chunk r on rank r of the group. One parameter or
many, the arithmetic is the same: each chunk holds ceil(numel / n) numbers, and the padding is
what the last one lacks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["padded_flat", "shard_size"]


def shard_size(numel: int, n: int) -> int:
    """Numbers in each of n equal chunks of numel numbers, the last one padded: ceil(numel / n)."""
    return -(-numel // n)


def padded_flat(tensors: Sequence[torch.Tensor], n: int, *, dtype: torch.dtype | None = None
                ) -> torch.Tensor:
    """The tensors' numbers one after the other in a new vector of n equal chunks, zeros after
    the last (in `dtype`, else the first tensor's; on the first tensor's device)."""
    first = tensors[0]
    flat = torch.zeros(n * shard_size(sum(t.numel() for t in tensors), n),
                       dtype=dtype or first.dtype, device=first.device)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            flat[offset:offset + t.numel()].copy_(t.detach().reshape(-1))
            offset += t.numel()
    return flat
