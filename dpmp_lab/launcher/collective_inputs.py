"""What a tensor handed to a collective must be, where the backends check it only by crashing.

Every rank launched by dl.launch runs with this check on every c10d call (through the tracer's
dispatcher hook, trace.watch_calls), so the mistake is a Python error in the learner's line
instead of a rank killed by SIGSEGV or SIGABRT with no word on why.

The one rule so far: a tensor whose elements share memory. `x.expand(...)` and the gradient
that `loss.sum().backward()` starts from are views with stride 0, every element one storage
slot. A collective writes its tensor in place; on such a view gloo crashes the process (seen on
torch 2.13: munmap_chunk(): invalid pointer, then SIGSEGV/SIGABRT), and nccl would write
through the shared slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from dpmp_lab.i18n.messages import _
from dpmp_lab.trace import watch_calls


def shares_elements(t: torch.Tensor) -> bool:
    """True for a view in which several elements are one memory slot (a stride of 0 along a
    dimension longer than 1)."""
    return any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True))


def refuse_shared_elements(op: str, tensors: list[torch.Tensor]) -> None:
    """A trace.watch_calls watcher: raise before the call reaches the backend."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and shares_elements(t):
            raise ValueError(_(
                "{op} was handed a tensor of shape {shape} whose elements share memory (strides "
                "{strides}: an expanded view, such as the gradient that loss.sum().backward() "
                "starts from, one number broadcast to the output's shape). A collective writes "
                "every element of its tensor in place, and the backends crash or corrupt memory "
                "on such a view: communicate on a tensor that owns its elements. "
                "[hint: comm.shared_elements]").format(
                    op=op, shape=tuple(t.shape), strides=t.stride()))


@contextlib.contextmanager
def checked() -> Iterator[None]:
    """Every collective issued inside is checked first (what a rank's function runs under)."""
    with watch_calls(refuse_shared_elements):
        yield
