"""Where the running code is: inside a rank or not, which rank, on which device.

The learner's `dl.rank()`, `dl.world_size()` and `dl.device()`, and what the references call
to put their tensors on the right device. The launcher's worker sets the rank's context as the
rank starts (`enter`); under torchrun, or any process that initialised the default group
itself, the answers come from torch.distributed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dpmp_lab._torch_helpers import group_ready
from dpmp_lab.i18n.messages import _

__all__ = ["RankContext", "device", "enter", "nccl_backend", "rank", "synchronize", "uses_nccl",
           "world_size"]


@dataclass(frozen=True)
class RankContext:
    """Where this rank runs: what rank(), world_size() and device() answer inside it."""

    rank: int
    world_size: int
    device: torch.device


_current: RankContext | None = None


def enter(context: RankContext) -> None:
    """The launcher's worker, as a rank starts: from now on this process is that rank."""
    global _current
    _current = context


def _outside_a_rank(name: str) -> RuntimeError:
    return RuntimeError(_(
        "dl.{name}() only has a meaning inside a rank: call it from a function started by "
        "dl.launch(...) or a %%distributed cell (or after init_process_group under torchrun)."
    ).format(name=name))


def rank() -> int:
    """This process's rank in the default process group."""
    if _current is not None:
        return _current.rank
    if group_ready():
        return dist.get_rank()
    raise _outside_a_rank("rank")


def world_size() -> int:
    """How many ranks the default process group has."""
    if _current is not None:
        return _current.world_size
    if group_ready():
        return dist.get_world_size()
    raise _outside_a_rank("world_size")


def device() -> torch.device:
    """The device this rank computes on: cuda:<local rank> when its group has nccl, else cpu.

    Make every tensor, model and buffer of a rank there (`torch.zeros(n, device=dl.device())`,
    `model.to(dl.device())`): nccl moves GPU memory only. In a device audit
    (launcher/audit.py) this is `cpu:0`, the audit's stand-in for the GPU."""
    if _current is not None:
        return _current.device
    if group_ready():
        if uses_nccl():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
        return torch.device("cpu")
    raise _outside_a_rank("device")


def synchronize() -> None:
    """Wait for this rank's device to finish what was queued (a no-op on the CPU): what a timer
    must do before it reads the clock, since CUDA kernels run after the call returns."""
    if device().type == "cuda":
        torch.cuda.synchronize(device())


def uses_nccl(group: dist.ProcessGroup | None = None) -> bool:
    """Whether `group` (default: the default group) moves CUDA tensors through nccl, whether
    it was made with "nccl" or with torch's combined "cpu:gloo,cuda:nccl"."""
    return "nccl" in str(dist.get_backend(group))


def nccl_backend() -> str:
    """What a launch under nccl initialises: CUDA tensors through nccl, CPU tensors through
    gloo (torch's own default form), so a CPU tensor in a collective is slow, not an error."""
    return "cpu:gloo,cuda:nccl"
