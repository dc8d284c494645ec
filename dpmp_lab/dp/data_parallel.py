"""DataParallel: replicate a module over a process group and average its gradients.

Three ways to do the all-reduce, from naive to what torch's DistributedDataParallel does:
- bucket_mb=0: one all-reduce per trainable tensor. Many small messages: each pays a latency.
- buckets: flat buffers of about bucket_mb MiB, one all-reduce each. Fewer, larger messages.
- overlap=True: a bucket is sent (async_op=True) from a gradient hook as soon as all of its
  gradients exist, while backward still computes the gradients of earlier layers. Buckets are
  filled in reverse registration order, roughly the order backward produces gradients.

Every rank must issue the same collectives in the same order, or gloo pairs the wrong buffers.
So buckets are launched strictly in bucket order (a ready bucket waits for the ones before it)
and finish_gradient_sync() launches whatever backward did not: buckets holding a parameter this
rank did not use this step (its gradient counts as zeros). Afterwards every trainable
parameter has a gradient on every rank, zeros where no rank used it.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab._torch_helpers import resolve_group
from dpmp_lab.dp.replicas import check_same_everywhere, first_rank
from dpmp_lab.i18n.messages import _

__all__ = ["DataParallel", "GradientsNotAveraged"]

MiB = 1024 * 1024


class GradientsNotAveraged(RuntimeError):
    """A forward began while the buckets of the last backward were out and never finished:
    its own class, so that a check can tell it in any language."""


@dataclass
class _Bucket:
    """Gradients that travel together: one flat buffer, one all-reduce per step."""

    params: list[int]                       # indices into DataParallel._params
    offsets: list[int]                      # where each one starts in buffer
    buffer: torch.Tensor
    pending: int = 0                        # gradients still to arrive this step
    work: Any = None                        # the async all-reduce, once launched
    names: list[str] = field(default_factory=list)


class DataParallel(nn.Module):
    """Replicate `module` over a process group and average its gradients.

    group:     the ranks that hold replicas (None: every rank). Parameters and buffers are
               broadcast from the group's first rank, so replicas start identical.
    bucket_mb: bucket size in MiB; 0 means one all-reduce per trainable tensor.
    overlap:   True: send each bucket from a gradient hook while backward still runs.
               False: nothing happens in backward; finish_gradient_sync() sends everything.
               Several backwards before it simply accumulate (a pipeline's micro-batches).

    Call finish_gradient_sync() after backward and before optimizer.step(). Buffers (e.g.
    BatchNorm running statistics) are broadcast once, here, and then evolve on each rank with
    its own data, as under torch DDP with broadcast_buffers=False.

    Construction communicates 1 all_gather (a fingerprint of the model, so that ranks holding
    different models get a ValueError instead of a crash in gloo) and 1 broadcast per unique
    parameter (frozen ones too) and buffer; a training step, num_buckets all-reduces.
    """

    def __init__(self, module: nn.Module, group: dist.ProcessGroup | None = None,
                 bucket_mb: float = 1.0, overlap: bool = True):
        super().__init__()
        _check_options(module, bucket_mb, overlap)
        self.module = module
        self.group = resolve_group(group, "DataParallel")
        self.group_size = dist.get_world_size(self.group)
        self.bucket_mb = float(bucket_mb)
        self.overlap = overlap

        # named_parameters() lists a tied (shared) Parameter once, under its first name.
        named = list(module.named_parameters())
        trainable = [(n, p) for n, p in named if p.requires_grad]
        if not trainable:
            raise ValueError(_("the module has no trainable parameters (none requires "
                               "grad): there are no gradients to average"))
        states = [p for name, p in named] + list(module.buffers())
        check_same_everywhere(states, self.group, _("models"))
        self._broadcast(states)

        self._params = [p for name, p in trainable]
        self._buckets = self._make_buckets(trainable)
        self._bucket_of = {i: b for b in self._buckets for i in b.params}
        self._sync_enabled = True      # False inside no_sync()
        self._backward_syncs = True    # whether the last forward ran outside no_sync()
        self._reset_round()
        for i, p in enumerate(self._params):
            p.register_post_accumulate_grad_hook(_hook(weakref.ref(self), i))

    @property
    def buckets(self) -> list[list[str]]:
        """The parameter names of each bucket, in the order they are sent."""
        return [list(b.names) for b in self._buckets]

    @property
    def num_buckets(self) -> int:
        """All-reduces per training step."""
        return len(self._buckets)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._round_open and self._sync_enabled and self.overlap and torch.is_grad_enabled():
            raise GradientsNotAveraged(_(
                "the gradients of the last backward were never averaged: its buckets went out, "
                "and nothing finished them (finish_gradient_sync) before this forward began "
                "another backward's worth (see DataParallel's docstring on no_sync)"))
        if torch.is_grad_enabled():    # as in torch's DDP, the forward decides for its backward
            self._backward_syncs = self._sync_enabled
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: the backward of a forward run inside sends nothing.
        The next backward of a forward outside it sends the accumulated sum (gradient
        accumulation over micro-batches). As in torch's DistributedDataParallel, the forward
        decides: a forward outside with its backward inside still sends."""
        before = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = before

    def finish_gradient_sync(self) -> None:
        """Send the buckets backward did not send, wait for all, write the averages to p.grad.

        A no-op when no gradient arrived since the last call (calling it twice, or after the
        backward of a forward inside no_sync), so nothing is averaged twice. A second backward
        before this call would mix gradients that were already sent with ones that were not: it raises
        RuntimeError here, after the collectives complete on every rank (no hang), and leaves
        p.grad holding the local, unaveraged sums.
        """
        if not self._round_open:
            return
        self._launch_in_order(only_ready=False)
        repeated = self._backward_again
        for bucket in self._buckets:        # unpack the first while later ones still travel
            bucket.work.wait()
            if not repeated:
                self._unpack(bucket)
        self._reset_round()
        if repeated:
            raise RuntimeError(_(
                "backward ran more than once since the last finish_gradient_sync(): the "
                "gradients of the first backward were already sent, so the average would be "
                "wrong and p.grad was left unaveraged. Call finish_gradient_sync() after every "
                "backward, or, to accumulate gradients, run the forward and backward of all "
                "but the last inside `with model.no_sync():`"))

    # -- inside: building buckets, broadcasting ------------------------------------------------

    @torch.no_grad()
    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        src = first_rank(self.group)
        for t in tensors:
            dist.broadcast(t.detach(), src=src, group=self.group)

    def _make_buckets(self, trainable: list[tuple[str, nn.Parameter]]) -> list[_Bucket]:
        """Reverse registration order (roughly the order backward produces gradients); a
        bucket is closed as soon as it holds bucket_mb or more, as torch DDP does, or when the
        next tensor has another dtype or device. bucket_mb=0: every tensor alone."""
        cap = self.bucket_mb * MiB
        groups: list[list[int]] = []
        size, full = 0, True
        for i in reversed(range(len(trainable))):
            p = trainable[i][1]
            if full or not _same_kind(trainable[groups[-1][0]][1], p):
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += p.numel() * p.element_size()
            full = size >= cap
        buckets = []
        for members in groups:
            first = trainable[members[0]][1]
            offsets = [0]
            for i in members:
                offsets.append(offsets[-1] + trainable[i][1].numel())
            buffer = torch.zeros(offsets[-1], dtype=first.dtype, device=first.device)
            buckets.append(_Bucket(members, offsets[:-1], buffer,
                                   names=[trainable[i][0] for i in members]))
        return buckets

    # -- inside: one sync round (first gradient after a sync ... finish_gradient_sync) ---------

    def _reset_round(self) -> None:
        self._ready = [False] * len(self._params)
        for bucket in self._buckets:
            bucket.pending = len(bucket.params)
            bucket.work = None
        self._next_bucket = 0          # buckets are launched in this order, on every rank
        self._round_open = False       # a gradient arrived since the last sync
        self._backward_again = False   # some gradient arrived twice

    def _grad_ready(self, index: int) -> None:
        """Runs inside backward, right after p.grad of parameter `index` was accumulated."""
        if not self._backward_syncs:
            return
        self._round_open = True
        if self._ready[index]:
            # without overlap nothing was sent yet: a second backward simply accumulates
            self._backward_again = self._backward_again or self.overlap
            return
        self._ready[index] = True
        self._bucket_of[index].pending -= 1
        if self.overlap:
            self._launch_in_order(only_ready=True)

    def _launch_in_order(self, only_ready: bool) -> None:
        """Launch buckets in bucket order: from the next unsent one, as long as it is ready
        (only_ready) or all of them (at finish: whatever did not arrive counts as zeros)."""
        while self._next_bucket < len(self._buckets):
            bucket = self._buckets[self._next_bucket]
            if only_ready and bucket.pending:
                return
            self._pack(bucket)
            bucket.work = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM,
                                          group=self.group, async_op=True)
            self._next_bucket += 1

    @torch.no_grad()
    def _pack(self, bucket: _Bucket) -> None:
        for i, start, name in zip(bucket.params, bucket.offsets, bucket.names, strict=True):
            p = self._params[i]
            view = bucket.buffer[start:start + p.numel()].view(p.shape)
            if p.grad is None:          # not used on this rank this step: contributes zeros
                view.zero_()
            elif p.grad.layout != torch.strided:
                raise TypeError(_("parameter {name!r} has a sparse gradient; DataParallel "
                                  "averages dense gradients only").format(name=name))
            else:
                view.copy_(p.grad)

    @torch.no_grad()
    def _unpack(self, bucket: _Bucket) -> None:
        """p.grad = the bucket's sum / group size (dividing while copying: one pass)."""
        for i, start in zip(bucket.params, bucket.offsets, strict=True):
            p = self._params[i]
            view = bucket.buffer[start:start + p.numel()].view(p.shape)
            if p.grad is None:
                p.grad = view / self.group_size
            else:
                torch.div(view, self.group_size, out=p.grad)


def _check_options(module: Any, bucket_mb: Any, overlap: Any) -> None:
    """DataParallel's arguments refused with what they should be, before any communication."""
    if not isinstance(module, nn.Module):
        raise TypeError(_("DataParallel wraps an nn.Module, not {kind}").format(
            kind=type(module).__name__))
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)):
        raise TypeError(_("bucket_mb must be a number of MiB, not {value!r}").format(
            value=bucket_mb))
    if not bucket_mb >= 0 or math.isinf(bucket_mb):
        raise ValueError(_("bucket_mb={value}: a bucket size must be a finite number of MiB "
                           ">= 0 (0 means one all-reduce per parameter tensor)").format(
            value=bucket_mb))
    if not isinstance(overlap, bool):
        raise TypeError(_("overlap must be True or False, not {value!r}").format(value=overlap))


def _hook(wrapper: weakref.ref, index: int) -> Callable[[torch.Tensor], None]:
    """The gradient hook of parameter `index`. It holds its DataParallel weakly: wrap the same
    module again (a notebook cell run twice) and the old wrapper, once dropped, stays silent."""
    def grad_ready(_param: torch.Tensor) -> None:
        dp = wrapper()
        if dp is not None:
            dp._grad_ready(index)
    return grad_ready


def _same_kind(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Tensors that can share one flat buffer."""
    return a.dtype == b.dtype and a.device == b.device
