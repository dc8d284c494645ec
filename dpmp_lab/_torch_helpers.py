"""The idioms the modules share that need torch: the startup's objects frozen out of gc's sight,
the tensors in a nested value, "is there a process group", a tensor or a group argument checked
(every group a library piece takes goes through resolve_group or member_group).
(_helpers.py keeps those that do not, for the instructor's tools, which load no torch.) Imports
nothing from dpmp_lab but `_()`, which says its messages in the learner's language."""

from __future__ import annotations

import gc
import itertools
import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from dpmp_lab.i18n.messages import _


def freeze_startup() -> bool:
    """Move what the process has made so far (the imports: torch alone is about 160,000 objects,
    never garbage) out of the garbage collector's sight with `gc.freeze()`, so that collections
    and `gc.get_objects()` see only what comes after: dl.footprint's walks in a kernel go from
    about 0.3 s to a few ms. Not while a tensor exists: a frozen tensor is one those walks
    would no longer find. True if it froze."""
    global _SINCE_STARTUP
    gc.collect()
    if any(issubclass(type(o), torch.Tensor) for o in gc.get_objects()):
        return False
    gc.freeze()
    _SINCE_STARTUP = []   # made after the freeze: in gc's sight until the next gc.freeze()
    return True


# A tracked object made after the startup freeze (or at import, where none happened). Another
# gc.freeze() takes it out of gc's sight with everything else: seeing it gone costs a walk of
# the objects gc sees, where gc.get_freeze_count() walks every frozen one (15-30 ms a call).
_SINCE_STARTUP: list = []


def every_object() -> list[Any]:
    """gc.collect(), then every object gc tracks, those made since the startup freeze among
    them: a gc.freeze() of the learner's own would otherwise hide the tensors it made from
    dl.footprint's walks (they then see everything again, only slower)."""
    gc.collect()
    objects = gc.get_objects()
    if not any(map(operator.is_, objects, itertools.repeat(_SINCE_STARTUP))):
        gc.unfreeze()
        gc.collect()
        objects = gc.get_objects()
    return objects


def tensors_in(value: Any, *, levels: int | None = None,
               modules: bool = False) -> Iterator[torch.Tensor]:
    """The tensors in a nested structure of lists, tuples and dict values (a collective's
    arguments, a module's output), `levels` deep at most (None: no limit); with `modules`, an
    nn.Module found inside gives its parameters and buffers."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if levels is not None and levels < 0:
        return
    deeper = None if levels is None else levels - 1
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v, levels=deeper, modules=modules)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v, levels=deeper, modules=modules)
    elif modules and isinstance(value, torch.nn.Module):
        yield from value.parameters()
        yield from value.buffers()


def group_ready() -> bool:
    """Whether this process has a default process group (inside a rank, or under torchrun)."""
    return dist.is_available() and dist.is_initialized()


def tensor_arg(x: object, what: str) -> torch.Tensor:
    """x itself, or a TypeError naming the argument when it is not a tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(_("{what} must be a torch.Tensor, not {kind}").format(
            what=what, kind=type(x).__name__))
    return x


def resolve_group(group: Any, who: str) -> dist.ProcessGroup:
    """The process group to average over (None: every rank), checked for this rank."""
    if not group_ready():
        raise RuntimeError(_("{who} needs a process group: run it inside the ranks of "
                             "dl.launch(...) (or after dist.init_process_group)").format(who=who))
    if group is None:
        return dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(_("rank {rank} is not a member of the group given to {who}: "
                           "dist.new_group hands non-members a placeholder; give every rank the "
                           "group it belongs to (e.g. grid.dp_group)").format(
            rank=dist.get_rank(), who=who))
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(_("group must be a torch.distributed ProcessGroup or None, not "
                          "{kind}").format(kind=type(group).__name__))
    return group


def member_group(group: object, axis: str, kind: str, example: str) -> dist.ProcessGroup:
    """group itself when it is a process group this rank belongs to; else an error saying
    which group of the grid (`axis`, e.g. "tp", a `kind` of parallelism, marked with N_() and
    said in the learner's language) was expected."""
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(_("group must be the {kind} torch.distributed ProcessGroup (e.g. "
                          "{example}), not {name}").format(
            kind=_(kind), example=example, name=type(group).__name__))
    if dist.get_rank(group) < 0:
        raise ValueError(_("rank {rank} is not a member of the {axis} group {ranks} it was "
                           "given").format(rank=dist.get_rank(), axis=axis,
                                           ranks=dist.get_process_group_ranks(group)))
    return group
