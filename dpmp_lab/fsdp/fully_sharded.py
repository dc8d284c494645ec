"""FSDP's mechanism, the file to read first: a unit's flat sharded parameter (Unit), the
all-gather whose backward is a reduce-scatter (_GatherShards), and the hooks that gather a unit
around its forward and backward. The package's docstring tells a unit's life around them; what
serves the edge cases is in bookkeeping.py, so that this file holds the idea alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab._torch_helpers import resolve_group, tensors_in
from dpmp_lab.dp.flat import padded_flat, shard_size
from dpmp_lab.dp.replicas import check_same_everywhere, first_rank
from dpmp_lab.fsdp import bookkeeping
from dpmp_lab.i18n.messages import _


class Unit:
    """One FSDP unit: a flat, padded, sharded parameter and its full (gathered) buffer."""

    def __init__(self, name: str, home: nn.Module, params: list[tuple[str, nn.Parameter]],
                 group: dist.ProcessGroup, compute_dtype: torch.dtype | None,
                 reduce_dtype: torch.dtype | None):
        self.name, self.home, self.group = name, home, group   # home: its module (not a tied user)
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        first = bookkeeping.check_flattenable(name, params)
        self.master_dtype = first.dtype
        self.compute_dtype = compute_dtype or first.dtype
        self.reduce_dtype = reduce_dtype or first.dtype
        self.offsets: dict[int, int] = {}           # id(parameter) -> offset in the flat vector
        self.numel = 0
        for _name, p in params:
            self.offsets[id(p)] = self.numel
            self.numel += p.numel()
        self.layout = [(n, self.offsets[id(p)], p.shape) for n, p in params]
        self.shard_size = shard_size(self.numel, self.size)     # the last shard is padded
        self.padded = self.shard_size * self.size
        flat = padded_flat([p for _, p in params], self.size)
        with torch.no_grad():
            dist.broadcast(flat, src=first_rank(group), group=group)
        lo = self.rank * self.shard_size
        self.shard = nn.Parameter(flat[lo:lo + self.shard_size].clone())
        self.full = torch.empty(self.padded, dtype=self.compute_dtype, device=first.device)
        self.full.untyped_storage().resize_(0)      # nothing gathered yet
        self.slots: list[bookkeeping.Slot] = []     # where its parameters live
        self.gathered = False
        self.work: Any = None                       # an all-gather in flight
        self.pending_backward = 0                   # uses whose reduce-scatter is still due

    def start_gather(self) -> None:
        """Issue the all-gather into the full buffer (async); wait_gather() finishes it."""
        if self.work is not None or self.gathered:
            return
        storage = self.full.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.padded * self.full.element_size())
        src = self.shard.detach().to(self.compute_dtype)
        # views of `full` that autograd saved must not see the gather as an in-place change of
        # their data: it puts back the very values they were saved with. The version is
        # restored after the wait, because gloo writes the gathered chunks from its own thread.
        # A private torch API (torch's FSDP uses it for the same reason): no public one does it.
        self._keep = torch.autograd._unsafe_preserve_version_counter(self.full)
        self.work = dist.all_gather_single(self.full, src, group=self.group,
                                           async_op=True)
        self._src = src                             # keep the input alive until the wait

    def wait_gather(self) -> None:
        if self.work is not None:
            self.work.wait()
            self._keep.__exit__(None, None, None)
            self.work, self._src, self._keep = None, None, None
            self.gathered = True

    def gather(self) -> None:
        self.start_gather()
        self.wait_gather()

    def free(self) -> None:
        """Drop the full parameter's memory; views of it stay valid objects, without data."""
        self.wait_gather()
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    def reduce_scatter(self, grad: torch.Tensor) -> torch.Tensor:
        """The averaged gradient of this rank's shard, in the master dtype."""
        grad = grad.to(self.reduce_dtype).contiguous()
        low = self.reduce_dtype != self.master_dtype and self.reduce_dtype in (
            torch.float16, torch.bfloat16)
        if low:
            grad = grad / self.size                 # divide first: a SUM in fp16 can overflow
        out = torch.empty(self.shard_size, dtype=self.reduce_dtype, device=self.shard.device)
        dist.reduce_scatter_single(out, grad, op=dist.ReduceOp.SUM, group=self.group)
        if not low:
            out = out / self.size
        return out.to(self.master_dtype)


class _GatherShards(torch.autograd.Function):
    """forward: all-gather every rank's shard into the unit's full flat parameter (in the
    compute dtype; a prefetched gather is only waited for). backward: reduce-scatter the full
    gradient (SUM, then / N), giving this rank the averaged gradient of its own shard."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, unit: Unit) -> torch.Tensor:
        ctx.unit = unit
        if unit.work is None:
            unit.gathered = False      # every use gathers afresh: the shards may have stepped
        unit.gather()
        return unit.full.detach()      # a new tensor object per use, sharing the storage

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        unit = ctx.unit
        shard_grad = unit.reduce_scatter(grad)
        unit.pending_backward -= 1
        if unit.pending_backward <= 0:
            unit.free()
        return shard_grad, None


class FullyShardedDataParallel(bookkeeping.UnitReports, nn.Module):
    """Shard `module`'s parameters over a process group, unit by unit (ZeRO-3, FSDP).

    group:        the data-parallel ranks (None: every rank).
    units:        names (or modules) of the sub-modules that become units; each owns the
                  parameters of its subtree not owned by a unit nested in it. Default: every
                  sub-module holding a weight matrix directly (each Linear, Embedding).
    compute_dtype: dtype of forward/backward and of the all-gathers (None: the master dtype).
    reduce_dtype: dtype of the gradient reduce-scatter (None: the master dtype).
    reshard_after_forward: free each unit's full parameter after its forward (True) or keep it
                  until its backward (False: one all-gather per use instead of two).
    prefetch:     issue the next unit's all-gather while the current unit computes.

    The wrapped module's original parameters are gone from it: weights of units are views of
    gathered buffers inside forward and backward only; read them with full_parameters().
    """

    def __init__(self, module: nn.Module, group: dist.ProcessGroup | None = None,
                 units: Iterable[str | nn.Module] | None = None,
                 compute_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                 reshard_after_forward: bool = True, prefetch: bool = False):
        super().__init__()
        bookkeeping.check_arguments(module, compute_dtype, reduce_dtype)
        self.module = module
        self.group = resolve_group(group, "FullyShardedDataParallel")
        self.group_size = dist.get_world_size(self.group)
        self.reshard_after_forward = bool(reshard_after_forward)
        self.prefetch = bool(prefetch)
        self.compute_dtype = compute_dtype
        self.names = bookkeeping.parameter_names(module)     # id -> first (qualified) name
        check_same_everywhere(list(bookkeeping.unique_params(module)), self.group,
                              _("parameters"))
        self.flat_units = [Unit(name, module.get_submodule(name), params, self.group,
                                compute_dtype, reduce_dtype)
                           for name, params in bookkeeping.unit_parameters(module, units,
                                                                           self.names)]
        self.shards = nn.ParameterList([u.shard for u in self.flat_units])
        # hooked: the modules whose forward gathers each unit; replicated: whole on every rank.
        # The units' weights in `module` become views of their `full` buffer (without data now)
        self.hooked, self.replicated = bookkeeping.place_weights(module, self.flat_units,
                                                                 self.group, compute_dtype)
        self.forward_order = bookkeeping.ForwardOrder()   # what prefetch follows
        self._handles = []
        for hook_mod in self.hooked:
            self._handles.append(hook_mod.register_forward_pre_hook(self._pre_forward))
            self._handles.append(hook_mod.register_forward_hook(self._post_forward))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self) -> None:
        """After backward: average the replicated parameters' gradients (one all-reduce) and
        free any unit a backward left gathered. Shards already hold their averaged gradient."""
        for unit in self.flat_units:
            if unit.gathered or unit.work is not None:
                unit.free()
            unit.pending_backward = 0
        self.forward_order.fix()
        bookkeeping.average_gradients(self.replicated, self.group, self.group_size)

    # -- the hooks ----------------------------------------------------------------------------

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        for unit in self.hooked[module]:
            self.forward_order.saw(unit)
            full = _GatherShards.apply(unit.shard, unit)
            if full.requires_grad:
                unit.pending_backward += 1
            for slot in unit.slots:
                if slot.hook is module:
                    setattr(slot.module, slot.name, slot.view(full))
            if self.prefetch and unit.home is module:
                self.forward_order.prefetch_next(unit, +1)

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        units = self.hooked[module]
        if self.reshard_after_forward:
            for unit in units:
                unit.free()
        grads = [t for t in tensors_in(output) if t.requires_grad]
        if grads:
            hook = _PreBackward(self, module, units)
            for t in grads:
                t.register_hook(hook)


class _PreBackward:
    """Gradient hook on a unit module's outputs: gather the module's units again (once per
    backward) before autograd runs its backward; prefetch the unit backward reaches next."""

    def __init__(self, fsdp: FullyShardedDataParallel, module: nn.Module, units: list[Unit]):
        self.fsdp, self.module, self.units, self.done = fsdp, module, units, False

    def __call__(self, grad: torch.Tensor) -> None:
        if self.done:
            return
        self.done = True
        for unit in self.units:
            if not unit.gathered:
                unit.gather()
            if self.fsdp.prefetch and unit.home is self.module:
                self.fsdp.forward_order.prefetch_next(unit, -1)


__all__ = ["FullyShardedDataParallel", "Unit"]
