"""Data parallelism: every rank holds the whole model, trains on its own slice of the batch, and
the ranks average their gradients so that every replica takes the same step.

    model = DataParallel(TinyMLP(), bucket_mb=1.0, overlap=True)
    loss_fn(model(x_shard), y_shard).backward()   # buckets are all-reduced while backward runs
    model.finish_gradient_sync()                  # wait, divide by the group size, write p.grad
    opt.step()

Why averaging is enough: the loss of the full batch is the mean of the per-rank mean losses
(when every rank has as many samples), so its gradient is the mean of the per-rank gradients.
The mean is an all-reduce with SUM followed by a division by the group size (gloo's
ReduceOp.AVG has a correctness bug, so we never use it).

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

ShardedOptimizer is ZeRO stage 1: the gradients are reduce-scattered instead of all-reduced, so
each rank gets the averaged gradient of its own 1/N of the parameters, keeps optimizer state
(AdamW's two moments: twice the parameters) only for that shard, updates it, and all-gathers
the updated shards. Same traffic as an all-reduce (which is a reduce-scatter plus an
all-gather; gloo emulates reduce-scatter with an all-reduce, nccl does not), 1/N of the
optimizer memory.
"""

from __future__ import annotations

import contextlib
import math
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MiB = 1024 * 1024


# -- process groups and replicas -----------------------------------------------------------------


def _resolve_group(group: Any, who: str) -> dist.ProcessGroup:
    """The process group to average over (None: every rank), checked for this rank."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{who} needs a process group: run it inside the ranks of "
                           "dl.launch(...) (or after dist.init_process_group)")
    if group is None:
        return dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the group given to {who}: "
                         "dist.new_group hands non-members a placeholder; give every rank the "
                         "group it belongs to (e.g. grid.dp_group)")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, "
                        f"not {type(group).__name__}")
    return group


def _first_rank(group: dist.ProcessGroup) -> int:
    """The GLOBAL rank of the group's rank 0: broadcast takes global ranks as src."""
    return dist.get_process_group_ranks(group)[0]


def _check_same_everywhere(tensors: list[torch.Tensor], group: dist.ProcessGroup,
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
        seen = "; ".join(f"rank {r} has {row[0]} tensors with {row[1]} elements"
                         + (" but other shapes, dtypes or requires_grad" if row[:2] == rows[0][:2]
                            else "") for r, row in odd)
        raise ValueError(
            f"the ranks hold different {what}: rank {ranks[0]} has {rows[0][0]} tensors with "
            f"{rows[0][1]} elements; {seen}. Data parallelism needs the same model on every "
            "rank of the group: build it with the same shapes, dtypes and requires_grad "
            "everywhere (only the values may differ).")


# -- DataParallel ---------------------------------------------------------------------------------


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
        if not isinstance(module, nn.Module):
            raise TypeError(f"DataParallel wraps an nn.Module, not {type(module).__name__}")
        if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)):
            raise TypeError(f"bucket_mb must be a number of MiB, not {bucket_mb!r}")
        if not bucket_mb >= 0 or math.isinf(bucket_mb):
            raise ValueError(f"bucket_mb={bucket_mb}: a bucket size must be a finite number "
                             "of MiB >= 0 (0 means one all-reduce per parameter tensor)")
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap must be True or False, not {overlap!r}")
        self.module = module
        self.group = _resolve_group(group, "DataParallel")
        self.group_size = dist.get_world_size(self.group)
        self.bucket_mb = float(bucket_mb)
        self.overlap = overlap

        # named_parameters() lists a tied (shared) Parameter once, under its first name.
        named = list(module.named_parameters())
        trainable = [(n, p) for n, p in named if p.requires_grad]
        if not trainable:
            raise ValueError("the module has no trainable parameters (none requires grad): "
                             "there are no gradients to average")
        states = [p for _, p in named] + list(module.buffers())
        _check_same_everywhere(states, self.group, "models")
        self._broadcast(states)

        self._params = [p for _, p in trainable]
        self._buckets = self._make_buckets(trainable)
        self._bucket_of = {i: b for b in self._buckets for i in b.params}
        self._sync_enabled = True      # False inside no_sync()
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
            raise RuntimeError("the gradients of the last backward were never averaged: call "
                               "model.finish_gradient_sync() after backward and before "
                               "optimizer.step(), or, to accumulate gradients over several "
                               "backwards, run all but the last inside `with model.no_sync():`")
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: a backward run inside sends nothing. The next backward
        outside it sends the accumulated sum (gradient accumulation over micro-batches)."""
        before = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = before

    def finish_gradient_sync(self) -> None:
        """Send the buckets backward did not send, wait for all, write the averages to p.grad.

        A no-op when no gradient arrived since the last call (calling it twice, or after a
        backward inside no_sync), so nothing is averaged twice. A second backward before this
        call would mix gradients that were already sent with ones that were not: it raises
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
            raise RuntimeError(
                "backward ran more than once since the last finish_gradient_sync(): the "
                "gradients of the first backward were already sent, so the average would be "
                "wrong and p.grad was left unaveraged. Call finish_gradient_sync() after every "
                "backward, or, to accumulate gradients, run all but the last backward inside "
                "`with model.no_sync():`")

    # -- inside: building buckets, broadcasting ------------------------------------------------

    @torch.no_grad()
    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        src = _first_rank(self.group)
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
        if not self._sync_enabled:
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
                raise TypeError(f"parameter {name!r} has a sparse gradient; DataParallel "
                                "averages dense gradients only")
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


# -- ZeRO-1 ---------------------------------------------------------------------------------------


class ShardedOptimizer:
    """ZeRO stage 1: each rank keeps optimizer state for 1/N of the parameters only.

    params:          the trainable parameters of a plain (not DataParallel-wrapped) model; this
                     class averages the gradients itself.
    optimizer_cls:   the optimizer run on this rank's shard, e.g. torch.optim.AdamW.
    group:           the data-parallel ranks (None: every rank).
    optimizer_kwargs: passed on, e.g. lr=1e-3, weight_decay=0.01.

    The parameters are flattened into one vector, padded to a multiple of the group size N and
    cut into N contiguous shards; rank r owns shard r. At construction the vector is broadcast
    from the group's first rank, so replicas start identical. step() = reduce-scatter the flat
    gradients (SUM, then / N), optimizer step on the shard, all-gather the updated shards into
    the parameters. A parameter without a gradient counts as a zero gradient (so AdamW still
    decays it), because every rank must send the same vector. p.grad keeps this rank's local
    gradient: only the shard's average is ever formed.
    """

    def __init__(self, params: Iterable[torch.Tensor],
                 optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW,
                 group: dist.ProcessGroup | None = None, **optimizer_kwargs: Any):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls,
                                                                torch.optim.Optimizer)):
            raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer class such as "
                            f"torch.optim.AdamW, not {optimizer_cls!r}")
        if isinstance(params, torch.Tensor):
            raise TypeError("params must be an iterable of tensors, e.g. model.parameters()")
        params = list(params)
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"params must be tensors (e.g. model.parameters()); got a "
                                f"{type(p).__name__} (parameter groups are not supported)")
        self.group = _resolve_group(group, "ShardedOptimizer")
        self.group_size = dist.get_world_size(self.group)
        self.group_rank = dist.get_rank(self.group)
        unique = list({id(p): p for p in params}.values())      # a tied parameter once
        self.params = [p for p in unique if p.requires_grad]
        if not self.params:
            raise ValueError("ShardedOptimizer got no trainable parameters (none requires "
                             "grad): there is nothing to optimize")
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise TypeError(f"all parameters must share one dtype and device to be flattened "
                            f"into one buffer; got {sorted(str(k) for k in kinds)}")
        _check_same_everywhere(self.params, self.group, "parameters")

        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-self.numel // self.group_size)          # ceil
        padded = self.shard_size * self.group_size
        like = self.params[0]
        self._flat_params = torch.zeros(padded, dtype=like.dtype, device=like.device)
        self._flat_grads = torch.zeros_like(self._flat_params)
        with torch.no_grad():
            self._pack(self._flat_params, [p.detach() for p in self.params])
            dist.broadcast(self._flat_params, src=_first_rank(self.group), group=self.group)
            self._unpack_params()
        lo = self.group_rank * self.shard_size
        self.shard = nn.Parameter(self._flat_params[lo:lo + self.shard_size].clone())
        self.optimizer = optimizer_cls([self.shard], **optimizer_kwargs)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's param groups (change the learning rate here)."""
        return self.optimizer.param_groups

    @property
    def state_numel(self) -> int:
        """Optimizer-state elements this rank holds (AdamW: 2 x shard_size + 1 step counter,
        after the first step); unsharded AdamW holds 2 x numel + one counter per tensor."""
        return sum(t.numel() for state in self.optimizer.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Average gradients (reduce-scatter), update this rank's shard, gather every shard."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            self._pack(self._flat_grads, [p.grad for p in self.params])
            shard_grad = torch.empty_like(self.shard)
            dist.reduce_scatter_single(shard_grad, self._flat_grads, op=dist.ReduceOp.SUM,
                                       group=self.group)
            self.shard.grad = shard_grad.div_(self.group_size)
            self.optimizer.step()
            dist.all_gather_single(self._flat_params, self.shard.detach(),
                                        group=self.group)
            self._unpack_params()
        return loss

    def _pack(self, flat: torch.Tensor, tensors: list[torch.Tensor | None]) -> None:
        start = 0
        for p, t in zip(self.params, tensors, strict=True):
            view = flat[start:start + p.numel()].view(p.shape)
            if t is None:
                view.zero_()
            else:
                view.copy_(t)
            start += p.numel()

    def _unpack_params(self) -> None:
        start = 0
        for p in self.params:
            p.copy_(self._flat_params[start:start + p.numel()].view(p.shape))
            start += p.numel()


__all__ = ["DataParallel", "ShardedOptimizer"]
