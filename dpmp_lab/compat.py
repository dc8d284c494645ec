"""The torch.distributed names the course uses, also on older torch.

torch 2.13 renamed all_gather_into_tensor to all_gather_single and reduce_scatter_tensor to
reduce_scatter_single (the old names still work but warn on every call, on every rank). The
library and the notebooks use the new names; dpmp_lab supports torch >= 2.4, so on a torch
without them, loading the learner's API (dpmp_lab.load) adds them as the old functions under
their new names.
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["provide_new_collective_names"]


def provide_new_collective_names() -> None:
    if not dist.is_available():
        return
    if not hasattr(dist, "all_gather_single"):
        dist.all_gather_single = dist.all_gather_into_tensor
    if not hasattr(dist, "reduce_scatter_single"):
        dist.reduce_scatter_single = dist.reduce_scatter_tensor
