"""Fully sharded data parallelism (ZeRO stage 3, FSDP): each rank stores 1/N of every weight.

    model = FullyShardedDataParallel(TinyGPT(cfg), compute_dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)   # this rank's fp32 shards
    loss_fn(model(x_shard), y_shard).backward()
    model.finish_gradient_sync()                            # replicated params' all-reduce
    opt.step()

A unit is a sub-module whose parameters are flattened into one vector, padded to a multiple of
the group size N and cut into N shards; rank r keeps shard r (the master copy, an
nn.Parameter of this wrapper, so any torch optimizer steps on shards and keeps state for 1/N).
Around each use of a unit:
- before its forward: all-gather the shards into the full flat parameter (in compute_dtype),
  and point the module's weights at views of it;
- after its forward: free the full parameter (its storage shrinks to nothing) unless
  reshard_after_forward=False;
- before its backward (a hook on its outputs' gradients): all-gather it again if it was freed;
- after its backward: reduce-scatter the full gradient (SUM, then / N) so each rank adds the
  averaged gradient of its shard only, and free the full parameter again.
The all-gather and the reduce-scatter are one autograd function, _GatherShards: the backward of
an all-gather is a reduce-scatter, the whole of ZeRO-3 in one line.

Mixed precision (compute_dtype=torch.bfloat16 or float16): the shards stay in the master dtype
(fp32) and so does the optimizer state; the all-gather sends the shard cast to compute_dtype,
so forward and backward compute in it. Gradients are reduced in reduce_dtype: by default the
master dtype (cast up first, then SUM and / N); reduce_dtype=compute_dtype halves the
traffic, and then each rank divides by N *before* the SUM, because a SUM of N fp16 gradients
can overflow where their mean does not (dividing first trades that for underflow of small
gradients; torch's FSDP1 splits the division into pre- and post-divide factors of about sqrt N,
and fp16 training needs loss scaling besides). These are FSDP2's
MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype).

Parameters outside every unit (by default those of modules without a weight matrix, such as
norms) stay whole on every rank in their own dtype; finish_gradient_sync() all-reduces their
gradients (SUM, then / N). Frozen parameters (requires_grad=False) stay whole too: they need no
gradient and no optimizer state; under compute_dtype they are cast to it once. A parameter tied
between modules (an embedding and an output head) lives in the first unit holding it; the
other module gathers that unit too, so a tied unit is gathered in forward and reduce-scattered
once per use (in backward it is gathered again only if a reduce-scatter freed it meanwhile).

prefetch=True issues the next unit's all-gather (async) as soon as the current one is done, in
forward order in forward and reversed in backward (the order of the first forward), so it
travels while the current unit computes. It changes when calls are issued, not how many.

Why it stays whole: a unit, its autograd function and the hooks that drive them share one small
state machine (gathered, in flight, backward uses pending); split over files, a reader would
chase one unit's life from module to module.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab._torch_helpers import tensors_in
from dpmp_lab.dp.replicas import check_same_everywhere, first_rank, resolve_group


@dataclass
class _Slot:
    """Where one parameter lives: a module attribute and a range of its unit's flat vector."""

    module: nn.Module
    name: str
    offset: int
    shape: torch.Size
    hook: nn.Module        # the module whose forward gathers it (the unit's, or a tied user)


class _Unit:
    """One FSDP unit: a flat, padded, sharded parameter and its full (gathered) buffer."""

    def __init__(self, name: str, params: list[tuple[str, nn.Parameter]],
                 group: dist.ProcessGroup, compute_dtype: torch.dtype | None,
                 reduce_dtype: torch.dtype | None):
        self.name = name
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        first = params[0][1]
        kinds = {(p.dtype, p.device) for _, p in params}
        if len(kinds) > 1:
            raise TypeError(f"unit {name!r}: its parameters must share one dtype and device to "
                            f"be flattened; got {sorted(str(k) for k in kinds)}")
        self.master_dtype = first.dtype
        self.compute_dtype = compute_dtype or first.dtype
        self.reduce_dtype = reduce_dtype or first.dtype
        self.offsets: dict[int, int] = {}           # id(parameter) -> offset in the flat vector
        self.numel = 0
        for _, p in params:
            self.offsets[id(p)] = self.numel
            self.numel += p.numel()
        self.layout = [(n, self.offsets[id(p)], p.shape) for n, p in params]
        self.shard_size = -(-self.numel // self.size)          # ceil: the last shard is padded
        self.padded = self.shard_size * self.size
        flat = torch.zeros(self.padded, dtype=first.dtype, device=first.device)
        with torch.no_grad():
            for _, p in params:
                o = self.offsets[id(p)]
                flat[o:o + p.numel()].copy_(p.detach().reshape(-1))
            dist.broadcast(flat, src=first_rank(group), group=group)
        lo = self.rank * self.shard_size
        self.shard = nn.Parameter(flat[lo:lo + self.shard_size].clone())
        self.full = torch.empty(self.padded, dtype=self.compute_dtype, device=first.device)
        self.full.untyped_storage().resize_(0)      # nothing gathered yet
        self.slots: list[_Slot] = []
        self.home: nn.Module | None = None         # the unit's own module (not a tied user)
        self.gathered = False
        self.work: Any = None                       # a prefetched all-gather in flight
        self.pending_backward = 0                   # uses whose reduce-scatter is still due

    # -- the communication ------------------------------------------------------------------

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
    def forward(ctx, shard: torch.Tensor, unit: _Unit) -> torch.Tensor:
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


class FullyShardedDataParallel(nn.Module):
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
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, not {type(module).__name__}")
        for what, dt in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dt is not None and (not isinstance(dt, torch.dtype) or not dt.is_floating_point):
                raise TypeError(f"{what} must be a floating torch.dtype such as torch.bfloat16 "
                                f"or None, not {dt!r}")
        self.module = module
        self.group = resolve_group(group, "FullyShardedDataParallel")
        self.group_size = dist.get_world_size(self.group)
        self.reshard_after_forward = bool(reshard_after_forward)
        self.prefetch = bool(prefetch)
        self.compute_dtype = compute_dtype
        self.names = _parameter_names(module)                 # id -> first (qualified) name
        check_same_everywhere([p for p in _unique_params(module)], self.group, "parameters")

        unit_modules = _resolve_units(module, units)
        owner = _owners(module, unit_modules)                  # id(param) -> unit module name
        self._units: list[_Unit] = []
        by_name: dict[str, _Unit] = {}
        for unit_name in unit_modules:
            params = [(self.names[id(p)], p) for p in _unique_params(module)
                      if owner.get(id(p)) == unit_name]
            if params:
                unit = _Unit(unit_name, params, self.group, compute_dtype, reduce_dtype)
                unit.home = module.get_submodule(unit_name)
                self._units.append(unit)
                by_name[unit_name] = unit
        self.shards = nn.ParameterList([u.shard for u in self._units])

        # every (module, attribute) holding a sharded parameter becomes a slot of its unit;
        # a hook module (the unit's module, or a module outside it holding a tied weight)
        # gathers the units its slots belong to
        self._hooked: dict[nn.Module, list[_Unit]] = {}
        sharded: dict[int, _Unit] = {id(p): by_name[owner[id(p)]]
                                     for p in _unique_params(module) if owner.get(id(p)) in by_name}
        whole: list[nn.Parameter] = []            # replicated and frozen: not sharded
        for mod_name, mod in module.named_modules():
            for attr, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) in sharded:
                    unit = sharded[id(p)]
                    hook_mod = _hook_module(module, unit.name, mod_name, mod)
                    unit.slots.append(_Slot(mod, attr, unit.offsets[id(p)], p.shape, hook_mod))
                    self._hooked.setdefault(hook_mod, [])
                    if unit not in self._hooked[hook_mod]:
                        self._hooked[hook_mod].append(unit)
                elif all(p is not q for q in whole):
                    whole.append(p)
        self._replicated = [p for p in whole if p.requires_grad]
        with torch.no_grad():     # replicas start identical, as the units' shards do
            for t in [*whole, *module.buffers()]:
                dist.broadcast(t.data, src=first_rank(self.group), group=self.group)
        if compute_dtype is not None:
            for p in whole:
                if not p.requires_grad:
                    p.data = p.data.to(compute_dtype)
        for unit in self._units:
            unit.full.untyped_storage().resize_(unit.padded * unit.full.element_size())
            for slot in unit.slots:      # outside forward: views without data (storage freed)
                del slot.module._parameters[slot.name]
                setattr(slot.module, slot.name, _view(unit.full, slot))
            unit.full.untyped_storage().resize_(0)
        self._order: list[_Unit] = []          # units in the order of the first forward
        self._order_fixed = False
        self._handles = []
        for hook_mod in self._hooked:
            self._handles.append(hook_mod.register_forward_pre_hook(self._pre_forward))
            self._handles.append(hook_mod.register_forward_hook(self._post_forward))

    # -- what callers use ---------------------------------------------------------------------

    @property
    def units(self) -> list[str]:
        """The unit names, in construction order ("" is the wrapped module itself)."""
        return [u.name for u in self._units]

    def unit_params(self, name: str) -> list[str]:
        """The (qualified) names of the parameters the unit `name` owns."""
        for u in self._units:
            if u.name == name:
                return [n for n, _, _ in u.layout]
        raise KeyError(f"no unit named {name!r}; units are {self.units}")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self) -> None:
        """After backward: average the replicated parameters' gradients (one all-reduce) and
        free any unit a backward left gathered. Shards already hold their averaged gradient."""
        for unit in self._units:
            if unit.gathered or unit.work is not None:
                unit.free()
            unit.pending_backward = 0
        self._order_fixed = bool(self._order)
        trainable = [p for p in self._replicated if p.requires_grad]
        if not trainable:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in trainable])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat /= self.group_size
        start = 0
        for p in trainable:
            p.grad = flat[start:start + p.numel()].view_as(p).clone()
            start += p.numel()

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} of every parameter, in the master dtype (one all-gather per
        unit): what a single-process model trained the same way would hold."""
        out: dict[str, torch.Tensor] = {}
        for unit in self._units:
            flat = torch.empty(unit.padded, dtype=unit.master_dtype, device=unit.shard.device)
            dist.all_gather_single(flat, unit.shard.detach(), group=self.group)
            for name, offset, shape in unit.layout:
                out[name] = flat[offset:offset + shape.numel()].view(shape).clone()
        for name, p in self.module.named_parameters():
            out[name] = p.detach().clone()
        return {name: out[name] for name in self.names.values() if name in out}

    def held_tensors(self) -> dict[str, list[torch.Tensor | None]]:
        """What this rank holds beyond `parameters()` and their .grad, by kind: the gathered
        full parameters of each unit (None while freed). A memory timeline adds these."""
        return {"params": [u.full for u in self._units], "grads": []}

    @property
    def gathering_modules(self) -> list[nn.Module]:
        """The modules whose forward gathers a unit (FSDP's hooks sit on them)."""
        return list(self._hooked)

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds now: sharded parameters (master), gathered full parameters,
        replicated parameters, and gradients of both (what a memory timeline samples)."""
        def nbytes(t: torch.Tensor | None) -> int:
            return 0 if t is None else t.untyped_storage().nbytes()
        return {
            "params": sum(nbytes(u.shard) for u in self._units)
            + sum(p.numel() * p.element_size() for p in self._replicated),
            "gathered": sum(nbytes(u.full) for u in self._units),
            "grads": sum(nbytes(u.shard.grad) for u in self._units)
            + sum(nbytes(p.grad) for p in self._replicated),
        }

    # -- the hooks ----------------------------------------------------------------------------

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        for unit in self._hooked[module]:
            if not self._order_fixed and unit not in self._order:
                self._order.append(unit)
            full = _GatherShards.apply(unit.shard, unit)
            if full.requires_grad:
                unit.pending_backward += 1
            for slot in unit.slots:
                if slot.hook is module:
                    setattr(slot.module, slot.name, _view(full, slot))
            if self.prefetch and unit.home is module:
                self._prefetch(unit, +1)

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        units = self._hooked[module]
        if self.reshard_after_forward:
            for unit in units:
                unit.free()
        grads = [t for t in tensors_in(output) if t.requires_grad]
        if grads:
            hook = _PreBackward(self, module, units)
            for t in grads:
                t.register_hook(hook)

    def _prefetch(self, unit: _Unit, step: int) -> None:
        if unit not in self._order:
            return
        i = self._order.index(unit) + step
        if 0 <= i < len(self._order) and self._order[i] is not unit:
            self._order[i].start_gather()


class _PreBackward:
    """Gradient hook on a unit module's outputs: gather the module's units again (once per
    backward) before autograd runs its backward; prefetch the unit backward reaches next."""

    def __init__(self, fsdp: FullyShardedDataParallel, module: nn.Module, units: list[_Unit]):
        self.fsdp, self.module, self.units, self.done = fsdp, module, units, False

    def __call__(self, grad: torch.Tensor) -> None:
        if self.done:
            return
        self.done = True
        for unit in self.units:
            if not unit.gathered:
                unit.gather()
            if self.fsdp.prefetch and unit.home is self.module:
                self.fsdp._prefetch(unit, -1)


# -- building units -------------------------------------------------------------------------------


def _unique_params(module: nn.Module) -> Iterator[nn.Parameter]:
    seen: set[int] = set()
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def _parameter_names(module: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in module.named_parameters()}


def _resolve_units(module: nn.Module, units: Iterable[str | nn.Module] | None) -> list[str]:
    """The names of the unit modules, in module order."""
    names = {mod: name for name, mod in module.named_modules()}
    if units is None:
        chosen = [name for name, mod in module.named_modules()
                  if any(p.dim() >= 2 and p.requires_grad
                         for p in mod.parameters(recurse=False))]
    else:
        if isinstance(units, (str, nn.Module)):
            units = [units]
        chosen = []
        for u in units:
            if isinstance(u, nn.Module):
                if u not in names:
                    raise ValueError(f"unit {type(u).__name__} is not a sub-module of the "
                                     "wrapped module")
                chosen.append(names[u])
            elif isinstance(u, str):
                if u not in names.values():
                    known = ", ".join(repr(n) for n in names.values() if n) or "none"
                    raise ValueError(f"no sub-module named {u!r}; sub-modules are: {known}")
                chosen.append(u)
            else:
                raise TypeError(f"units must be sub-module names or modules, not "
                                f"{type(u).__name__}")
    return list(dict.fromkeys(chosen))


def _owners(module: nn.Module, unit_names: list[str]) -> dict[int, str]:
    """id(trainable parameter) -> the unit owning it: the innermost unit holding it; for a
    parameter tied between units that do not nest, the first of them in module order."""
    mods = dict(module.named_modules())
    order = {name: i for i, name in enumerate(mods)}
    owner: dict[int, str] = {}
    for p in _unique_params(module):
        if not p.requires_grad:
            continue
        holders = [u for u in unit_names if any(p is q for q in mods[u].parameters())]
        inner = [u for u in holders
                 if not any(v != u and _inside(mods[u], mods[v]) for v in holders)]
        if inner:
            owner[id(p)] = min(inner, key=order.__getitem__)
    return owner


def _inside(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _hook_module(root: nn.Module, unit_name: str, mod_name: str, mod: nn.Module) -> nn.Module:
    """The unit's module when `mod` lies inside it, else `mod` itself (a tied weight's user)."""
    unit_mod = root.get_submodule(unit_name)
    return unit_mod if _inside(unit_mod, mod) else mod


def _view(full: torch.Tensor, slot: _Slot) -> torch.Tensor:
    return full[slot.offset:slot.offset + slot.shape.numel()].view(slot.shape)


__all__ = ["FullyShardedDataParallel"]
