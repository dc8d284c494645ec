"""Models and data the sharding tests share (ZeRO in test_dp, FSDP in test_fsdp, memory in
test_footprint): small, seeded, sizes that do not split evenly over 2 ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class Stack(nn.Module):
    """Three Linear units and nothing else: the counts are exactly one call per unit."""

    def __init__(self, d: int = 5):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, d + 1), nn.Linear(d + 1, d + 2),
                                     nn.Linear(d + 2, d)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def my_rows(t: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous block of t's rows."""
    r, n = dist.get_rank(), dist.get_world_size()
    return t[r * len(t) // n:(r + 1) * len(t) // n]


def seeded(cls, seed):
    """cls() with its parameters drawn from seed."""
    torch.manual_seed(seed)
    return cls()
