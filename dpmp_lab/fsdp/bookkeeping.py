"""What FSDP's mechanism (fully_sharded.py) needs around it, kept apart so that the mechanism
reads on its own: which parameters make which unit (tied, frozen and replicated ones) and which
module gathers each, prefetch's order, what the wrapper reports of its units and memory, and the
checks of its arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from dpmp_lab.dp.replicas import first_rank
from dpmp_lab.i18n.messages import _

if TYPE_CHECKING:
    from dpmp_lab.fsdp.fully_sharded import Unit


@dataclass
class Slot:
    """Where one parameter lives: a module attribute and a range of its unit's flat vector."""

    module: nn.Module
    name: str
    offset: int
    shape: torch.Size
    hook: nn.Module        # the module whose forward gathers it (the unit's, or a tied user)

    def view(self, full: torch.Tensor) -> torch.Tensor:
        """The parameter, as a view of its unit's full flat parameter."""
        return full[self.offset:self.offset + self.shape.numel()].view(self.shape)


# -- the arguments ---------------------------------------------------------------------------------


def check_arguments(module: nn.Module, compute_dtype: torch.dtype | None,
                    reduce_dtype: torch.dtype | None) -> None:
    """Refuse a module that is not one and a dtype that is not floating, before any collective."""
    if not isinstance(module, nn.Module):
        raise TypeError(_("module must be an nn.Module, not {kind}").format(
            kind=type(module).__name__))
    for what, dt in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
        if dt is not None and (not isinstance(dt, torch.dtype) or not dt.is_floating_point):
            raise TypeError(_("{what} must be a floating torch.dtype such as torch.bfloat16 "
                              "or None, not {dtype!r}").format(what=what, dtype=dt))


def check_flattenable(name: str, params: list[tuple[str, nn.Parameter]]) -> nn.Parameter:
    """The unit's first parameter, once all of them share the dtype and device one vector has."""
    kinds = {(p.dtype, p.device) for _, p in params}
    if len(kinds) > 1:
        raise TypeError(_("unit {name!r}: its parameters must share one dtype and device to "
                          "be flattened; got {kinds}").format(
            name=name, kinds=sorted(str(k) for k in kinds)))
    return params[0][1]


# -- which parameters make which unit --------------------------------------------------------------


def unique_params(module: nn.Module) -> Iterator[nn.Parameter]:
    """Every parameter of `module` once, a tied one included."""
    seen: set[int] = set()
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def parameter_names(module: nn.Module) -> dict[int, str]:
    """id(parameter) -> its first qualified name."""
    return {id(p): name for name, p in module.named_parameters()}


def unit_parameters(module: nn.Module, units: Iterable[str | nn.Module] | None,
                    names: dict[int, str]) -> list[tuple[str, list[tuple[str, nn.Parameter]]]]:
    """(unit name, [(qualified name, parameter), ...]) for every unit that owns a parameter, in
    module order."""
    unit_names = _resolve_units(module, units)
    owner = _owners(module, unit_names)                    # id(param) -> unit module name
    found = []
    for unit_name in unit_names:
        params = [(names[id(p)], p) for p in unique_params(module)
                  if owner.get(id(p)) == unit_name]
        if params:
            found.append((unit_name, params))
    return found


def place_weights(module: nn.Module, units: list[Unit], group: dist.ProcessGroup,
                  compute_dtype: torch.dtype | None
                  ) -> tuple[dict[nn.Module, list[Unit]], list[nn.Parameter]]:
    """Give each unit a slot for every (module, attribute) holding one of its parameters, and
    there a view of its full buffer instead of the parameter (a view without data until a
    gather). Return the modules whose forward gathers each unit (the unit's own module, or a
    module outside it holding a tied weight) and the replicated parameters. The parameters left
    whole (replicated and frozen) are broadcast with the buffers; frozen ones are cast to
    compute_dtype."""
    hooked: dict[nn.Module, list[Unit]] = {}
    sharded = {pid: unit for unit in units for pid in unit.offsets}
    whole: list[nn.Parameter] = []
    for mod_name, mod in module.named_modules():
        # _parameters (private to torch): the module's own attributes as it stores them, which
        # the views replace; a module may override named_parameters()
        for attr, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) in sharded:
                unit = sharded[id(p)]
                hook_mod = _hook_module(module, unit.name, mod_name, mod)
                unit.slots.append(Slot(mod, attr, unit.offsets[id(p)], p.shape, hook_mod))
                hooked.setdefault(hook_mod, [])
                if unit not in hooked[hook_mod]:
                    hooked[hook_mod].append(unit)
            elif all(p is not q for q in whole):
                whole.append(p)
    replicated = [p for p in whole if p.requires_grad]
    with torch.no_grad():     # replicas start identical, as the units' shards do
        for t in [*whole, *module.buffers()]:
            dist.broadcast(t.data, src=first_rank(group), group=group)
    if compute_dtype is not None:
        for p in whole:
            if not p.requires_grad:
                p.data = p.data.to(compute_dtype)
    for unit in units:      # a view needs storage to point at; it is freed again at once
        unit.full.untyped_storage().resize_(unit.padded * unit.full.element_size())
        for slot in unit.slots:
            delattr(slot.module, slot.name)      # a Parameter no more: a plain tensor takes it
            setattr(slot.module, slot.name, slot.view(unit.full))
        unit.full.untyped_storage().resize_(0)
    return hooked, replicated


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
                    raise ValueError(_("unit {kind} is not a sub-module of the wrapped "
                                       "module").format(kind=type(u).__name__))
                chosen.append(names[u])
            elif isinstance(u, str):
                if u not in names.values():
                    known = ", ".join(repr(n) for n in names.values() if n) or _("none")
                    raise ValueError(_("no sub-module named {name!r}; sub-modules are: "
                                       "{known}").format(name=u, known=known))
                chosen.append(u)
            else:
                raise TypeError(_("units must be sub-module names or modules, not "
                                  "{kind}").format(kind=type(u).__name__))
    return list(dict.fromkeys(chosen))


def _owners(module: nn.Module, unit_names: list[str]) -> dict[int, str]:
    """id(trainable parameter) -> the unit owning it: the innermost unit holding it; for a
    parameter tied between units that do not nest, the first of them in module order."""
    mods = dict(module.named_modules())
    order = {name: i for i, name in enumerate(mods)}
    owner: dict[int, str] = {}
    for p in unique_params(module):
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


# -- prefetch and the replicated parameters ---------------------------------------------------------


class ForwardOrder:
    """The units in the order of the first forward, which prefetch follows: onward in forward,
    backward in backward. Fixed at the first finish_gradient_sync() that saw a forward."""

    def __init__(self) -> None:
        self.units: list[Unit] = []
        self.fixed = False

    def saw(self, unit: Unit) -> None:
        if not self.fixed and unit not in self.units:
            self.units.append(unit)

    def fix(self) -> None:
        self.fixed = bool(self.units)

    def prefetch_next(self, unit: Unit, step: int) -> None:
        """Start the all-gather of the unit `step` places after `unit` (+1 in forward, -1 in
        backward)."""
        if unit not in self.units:
            return
        i = self.units.index(unit) + step
        if 0 <= i < len(self.units) and self.units[i] is not unit:
            self.units[i].start_gather()


def average_gradients(params: list[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Average the gradients of the trainable `params` over the group: one flat all-reduce (SUM,
    then / size); a parameter without a gradient counts as zeros."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in trainable])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat /= size
    start = 0
    for p in trainable:
        p.grad = flat[start:start + p.numel()].view_as(p).clone()
        start += p.numel()


# -- what the wrapper reports ----------------------------------------------------------------------


class UnitReports:
    """What FullyShardedDataParallel tells its callers of its units and memory: a base class of
    it, reading the attributes its __init__ sets."""

    flat_units: list[Unit]
    hooked: dict[nn.Module, list[Unit]]
    replicated: list[nn.Parameter]
    module: nn.Module
    names: dict[int, str]
    group: dist.ProcessGroup

    @property
    def units(self) -> list[str]:
        """The unit names, in construction order ("" is the wrapped module itself)."""
        return [u.name for u in self.flat_units]

    def unit_params(self, name: str) -> list[str]:
        """The (qualified) names of the parameters the unit `name` owns."""
        for u in self.flat_units:
            if u.name == name:
                return [n for n, _, _ in u.layout]
        raise KeyError(_("no unit named {name!r}; units are {units}").format(
            name=name, units=self.units))

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} of every parameter, in the master dtype (one all-gather per
        unit): what a single-process model trained the same way would hold."""
        out: dict[str, torch.Tensor] = {}
        for unit in self.flat_units:
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
        return {"params": [u.full for u in self.flat_units], "grads": []}

    @property
    def gathering_modules(self) -> list[nn.Module]:
        """The modules whose forward gathers a unit (FSDP's hooks sit on them)."""
        return list(self.hooked)

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds now: sharded parameters (master), gathered full parameters,
        replicated parameters, and gradients of both (what a memory timeline samples)."""
        def nbytes(t: torch.Tensor | None) -> int:
            return 0 if t is None else t.untyped_storage().nbytes()
        return {
            "params": sum(nbytes(u.shard) for u in self.flat_units)
            + sum(p.numel() * p.element_size() for p in self.replicated),
            "gathered": sum(nbytes(u.full) for u in self.flat_units),
            "grads": sum(nbytes(u.shard.grad) for u in self.flat_units)
            + sum(nbytes(p.grad) for p in self.replicated),
        }


__all__ = ["ForwardOrder", "Slot", "UnitReports", "average_gradients", "check_arguments",
           "check_flattenable", "parameter_names", "place_weights", "unique_params",
           "unit_parameters"]
