"""ZeRO stage 1 (ShardedOptimizer): each rank keeps optimizer state for 1/N of the parameters.

The gradients are reduce-scattered instead of all-reduced, so each rank gets the averaged
gradient of its own 1/N of the parameters, keeps optimizer state (AdamW's two moments: twice
the parameters) only for that shard, updates it, and all-gathers the updated shards. Same
traffic as an all-reduce (which is a reduce-scatter plus an all-gather; gloo emulates
reduce-scatter with an all-reduce, nccl does not), 1/N of the optimizer memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab.dp.replicas import _check_same_everywhere, _first_rank, _resolve_group


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

