"""ZeRO stages 1 and 2: each rank keeps optimizer state (ZeRO1Optimizer) and also gradients
(ZeRO2Optimizer) for 1/N of the parameters; ShardedOptimizer(stage=...) makes either.

The gradients are reduce-scattered instead of all-reduced, so each rank gets the averaged
gradient of its own 1/N of the parameters, keeps optimizer state (AdamW's two moments: twice
the parameters) only for that shard, updates it, and all-gathers the updated shards. Same
traffic as an all-reduce (which is a reduce-scatter plus an all-gather; gloo emulates
reduce-scatter with an all-reduce, nccl does not), 1/N of the optimizer memory.

Stage 2 also drops the gradients a rank does not own: a hook reduce-scatters each parameter's
gradient as soon as backward has produced it, adds this rank's 1/N to its gradient shard and
frees p.grad, so a full set of gradients never exists after backward. Each parameter is cut
into N chunks of its own (padded), so one parameter's reduce-scatter needs no other; rank r's
shard is chunk r of every parameter, a view of that parameter's own (padded) storage, so the
shard costs no copy. Stage 3 also shards the parameters: dpmp_lab.fsdp.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab._torch_helpers import resolve_group
from dpmp_lab.dp.flat import padded_flat, shard_size
from dpmp_lab.dp.replicas import check_same_everywhere, first_rank
from dpmp_lab.i18n.messages import _

__all__ = ["ShardedOptimizer", "ZeRO1Optimizer", "ZeRO2Optimizer"]


def ShardedOptimizer(params: Iterable[torch.Tensor],  # noqa: N802 - the name notebooks call
                     optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW,
                     group: dist.ProcessGroup | None = None, *, stage: int = 1,
                     **optimizer_kwargs: Any) -> ZeRO1Optimizer | ZeRO2Optimizer:
    """ZeRO over `group`'s ranks (None: every rank): stage 1 shards the optimizer state
    (ZeRO1Optimizer), stage 2 the gradients too (ZeRO2Optimizer). Stage 3 also shards the
    parameters: dpmp_lab.fsdp.

    params:          the trainable parameters of a plain (not DataParallel-wrapped) model; the
                     optimizer averages the gradients itself.
    optimizer_cls:   the optimizer run on this rank's shard, e.g. torch.optim.AdamW.
    optimizer_kwargs: passed on, e.g. lr=1e-3, weight_decay=0.01.
    """
    if stage not in (1, 2):
        raise ValueError(_("stage must be 1 (optimizer state sharded) or 2 (gradients too); "
                           "got {stage!r}. Stage 3 shards the parameters: "
                           "dpmp_lab.fsdp.FullyShardedDataParallel").format(stage=stage))
    cls = ZeRO1Optimizer if stage == 1 else ZeRO2Optimizer
    return cls(params, optimizer_cls, group, **optimizer_kwargs)


class _Sharded:
    """What both stages share: the arguments checked, the group, the trainable parameters made
    identical on every rank (broadcast from the group's first rank), and the inner optimizer's
    groups and state."""

    stage = 0

    def __init__(self, params: Iterable[torch.Tensor],
                 optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW,
                 group: dist.ProcessGroup | None = None, **optimizer_kwargs: Any):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls,
                                                               torch.optim.Optimizer)):
            raise TypeError(_("optimizer_cls must be a torch.optim.Optimizer class such as "
                              "torch.optim.AdamW, not {cls!r}").format(cls=optimizer_cls))
        if isinstance(params, torch.Tensor):
            raise TypeError(_("params must be an iterable of tensors, e.g. "
                              "model.parameters()"))
        params = list(params)
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(_("params must be tensors (e.g. model.parameters()); got a "
                                  "{kind} (parameter groups are not supported)").format(
                    kind=type(p).__name__))
        self.group = resolve_group(group, "ShardedOptimizer")
        self.group_size = dist.get_world_size(self.group)
        self.group_rank = dist.get_rank(self.group)
        unique = list({id(p): p for p in params}.values())      # a tied parameter once
        self.params = [p for p in unique if p.requires_grad]
        if not self.params:
            raise ValueError(_("ShardedOptimizer got no trainable parameters (none requires "
                               "grad): there is nothing to optimize"))
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise TypeError(_("all parameters must share one dtype and device to be flattened "
                              "into one buffer; got {kinds}").format(
                kinds=sorted(str(k) for k in kinds)))
        check_same_everywhere(self.params, self.group, _("parameters"))
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = shard_size(self.numel, self.group_size)
        flat = padded_flat(self.params, self.group_size)
        with torch.no_grad():
            dist.broadcast(flat, src=first_rank(self.group), group=self.group)
            self._unpack(flat)
        self._hooks: list[Any] = []
        self._shard_grad: torch.Tensor | None = None
        self.optimizer = optimizer_cls(self._layout(flat), **optimizer_kwargs)

    def _layout(self, flat: torch.Tensor) -> list[nn.Parameter]:
        """Where the parameters, gradients and this rank's shard live; the tensors the inner
        optimizer steps."""
        raise NotImplementedError

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's param groups (change the learning rate here)."""
        return self.optimizer.param_groups

    @property
    def state_numel(self) -> int:
        """Optimizer-state elements this rank holds (AdamW: 2 x shard_size and a step counter
        per tensor it steps: one in stage 1, one per parameter's chunk in stage 2); unsharded
        AdamW holds 2 x numel + one counter per tensor."""
        return sum(t.numel() for state in self.optimizer.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor))

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Average gradients (reduce-scatter), update this rank's shard, gather every shard."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            self._step()
        return loss

    def _step(self) -> None:
        raise NotImplementedError

    def _pack(self, flat: torch.Tensor, tensors: list[torch.Tensor | None]) -> None:
        start = 0
        for p, t in zip(self.params, tensors, strict=True):
            view = flat[start:start + p.numel()].view(p.shape)
            if t is None:
                view.zero_()
            else:
                view.copy_(t)
            start += p.numel()

    def _unpack(self, flat: torch.Tensor) -> None:
        start = 0
        for p in self.params:
            p.copy_(flat[start:start + p.numel()].view(p.shape))
            start += p.numel()


class ZeRO1Optimizer(_Sharded):
    """ZeRO stage 1: each rank keeps optimizer state for 1/N of the parameters only.

    The parameters are flattened into one vector, padded to a multiple of the group size N and
    cut into N contiguous shards; rank r owns shard r. step() = reduce-scatter the flat
    gradients (SUM, then / N), optimizer step on the shard, all-gather the updated shards into
    the parameters. A parameter without a gradient counts as a zero gradient (so AdamW still
    decays it), because every rank must send the same vector. p.grad keeps this rank's local
    gradient: only the shard's average is ever formed.

    It holds the memory its formula counts: every parameter is a view of the flat parameter
    vector and every p.grad a view of the flat gradient vector (autograd accumulates into it in
    place, as DDP's gradient_as_bucket_view does), the shard is a view of the flat parameters
    (stepping it steps the model), and the shard's averaged gradient lives only during step().
    So params + grads are Ψ each, as in plain data parallelism, and only the optimizer state
    shrinks. zero_grad() zeroes the flat gradients in place and keeps the views, whatever
    set_to_none says (as DDP's gradient_as_bucket_view): the gradients stay one buffer.
    """

    stage = 1

    def _layout(self, flat: torch.Tensor) -> list[nn.Parameter]:
        """Parameters, gradients and the shard as views of the two flat buffers: no copies."""
        self._flat_params, self._flat_grads = flat, torch.zeros_like(flat)
        self._grad_views: list[torch.Tensor] = []
        start = 0
        for p in self.params:
            p.data = self._flat_params[start:start + p.numel()].view(p.shape)
            view = self._flat_grads[start:start + p.numel()].view(p.shape)
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
            self._grad_views.append(view)
            start += p.numel()
        lo = self.group_rank * self.shard_size
        self.shard = nn.Parameter(self._flat_params[lo:lo + self.shard_size])
        return [self.shard]

    def held_tensors(self) -> dict[str, list[torch.Tensor | None]]:
        """What this rank holds beyond the model's parameters and their .grad, by kind: the
        shard and the flat buffers. A memory timeline adds these; a tensor held twice counts
        once there."""
        return {"params": [self.shard, self._flat_params],
                "grads": [self.shard.grad, self._flat_grads, self._shard_grad]}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradients in place; the views stay (set_to_none changes nothing)."""
        with torch.no_grad():
            self._flat_grads.zero_()
            for p, view in zip(self.params, self._grad_views, strict=True):
                p.grad = view

    def _step(self) -> None:
        for p, view in zip(self.params, self._grad_views, strict=True):
            if p.grad is not view:      # set to None or replaced since: back into the view
                view.copy_(p.grad) if p.grad is not None else view.zero_()
                p.grad = view
        shard_grad = torch.empty(self.shard_size, dtype=self.shard.dtype,
                                 device=self.shard.device)
        dist.reduce_scatter_single(shard_grad, self._flat_grads, op=dist.ReduceOp.SUM,
                                   group=self.group)
        self.shard.grad = shard_grad.div_(self.group_size)
        self.optimizer.step()           # steps the shard, a view of the flat parameters
        self.shard.grad = None          # the averaged shard gradient lives in step() only
        # the shard is the flat vector's own slice: gather from a copy, never in place
        dist.all_gather_single(self._flat_params, self.shard.detach().clone(),
                               group=self.group)


class ZeRO2Optimizer(_Sharded):
    """ZeRO stage 2: the gradients are sharded too. A hook reduce-scatters each parameter's
    gradient as soon as backward has produced it, adds this rank's averaged chunk to its
    gradient shard and frees p.grad, so a full set of gradients never exists after backward
    (every trainable parameter must then get a gradient in every backward).

    Each parameter lives in a buffer of its own padded to N chunks, and chunk r of every one is
    rank r's shard: views, stepped in place, so the shard costs no copy.
    """

    stage = 2

    def _layout(self, flat: torch.Tensor) -> list[nn.Parameter]:
        """Each parameter in a padded buffer of its own, chunk r of each this rank's shard; the
        flat vector that made the replicas identical is not kept."""
        n, r = self.group_size, self.group_rank
        self.chunks = [shard_size(p.numel(), n) for p in self.params]
        self.chunk_offsets = [sum(self.chunks[:i]) for i in range(len(self.params))]
        self.shard_size = sum(self.chunks)
        self._padded: list[torch.Tensor] = []
        for p in self.params:
            padded = padded_flat([p], n)
            p.data = padded[:p.numel()].view(p.shape)
            self._padded.append(padded)
        self.shard_chunks = [nn.Parameter(padded[r * c:(r + 1) * c])
                             for padded, c in zip(self._padded, self.chunks, strict=True)]
        self._reduced: set[int] = set()
        self._hooks = [p.register_post_accumulate_grad_hook(self._reduce_one(i))
                       for i, p in enumerate(self.params)]
        return self.shard_chunks

    def _reduce_one(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            """Backward produced p.grad: keep this rank's averaged chunk of it, drop the rest."""
            c, n = self.chunks[i], self.group_size
            with torch.no_grad():
                full = nn.functional.pad(p.grad.reshape(-1), (0, c * n - p.numel()))
                mine = torch.empty(c, dtype=full.dtype, device=full.device)
                dist.reduce_scatter_single(mine, full, op=dist.ReduceOp.SUM, group=self.group)
                if self._shard_grad is None:
                    self._shard_grad = torch.zeros(self.shard_size, dtype=full.dtype,
                                                   device=full.device)
                o = self.chunk_offsets[i]
                self._shard_grad[o:o + c] += mine.div_(n)
            p.grad = None
            self._reduced.add(i)
        return hook

    def held_tensors(self) -> dict[str, list[torch.Tensor | None]]:
        """What this rank holds beyond the model's parameters and their .grad, by kind: the
        padded parameter buffers and the shard's gradient."""
        return {"params": list(self._padded), "grads": [self._shard_grad]}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The last step's shard gradient goes, and every p.grad (None, or zeroed in place)."""
        self._shard_grad, self._reduced = None, set()
        for chunk in self.shard_chunks:
            chunk.grad = None
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _step(self) -> None:
        missing = [i for i in range(len(self.params)) if i not in self._reduced]
        if missing and len(missing) < len(self.params):
            raise RuntimeError(_("stage 2: {n} trainable parameters got no gradient in "
                                 "backward, so their reduce-scatter never ran; use every "
                                 "parameter in the loss (or freeze it), or stage=1").format(
                n=len(missing)))
        grads = self._shard_grad
        for chunk, o, c in zip(self.shard_chunks, self.chunk_offsets, self.chunks, strict=True):
            chunk.grad = None if grads is None else grads[o:o + c]
        self.optimizer.step()           # steps the chunks, views of the parameters' storage
        n = self.group_size
        mine = torch.cat([chunk.detach() for chunk in self.shard_chunks])   # a copy to send
        everyone = torch.empty(n * self.shard_size, dtype=mine.dtype, device=mine.device)
        dist.all_gather_single(everyone, mine, group=self.group)
        rows = everyone.view(n, self.shard_size)
        for padded, o, c in zip(self._padded, self.chunk_offsets, self.chunks, strict=True):
            padded.view(n, c).copy_(rows[:, o:o + c])
        self._reduced = set()
