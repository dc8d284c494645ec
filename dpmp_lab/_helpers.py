"""Small idioms the modules share: argument checks, "is there a process group", the wording of
rank lists and values in messages, and where the package sits. Imports nothing from dpmp_lab."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# The package's folder, and the folder that holds it (a checkout's root in an editable install):
# the one place that reads a file's position, so that moving a module moves nothing else.
PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE_HOME = PACKAGE_DIR.parent


def freeze_startup() -> bool:
    """Move what the process has made so far (the imports: torch alone is about 160,000 objects,
    never garbage) out of the garbage collector's sight with `gc.freeze()`, so that collections
    and `gc.get_objects()` see only what comes after: dl.footprint's walks in a kernel go from
    about 0.3 s to a few ms. Not while a tensor exists: a frozen tensor is one those walks
    would no longer find. True if it froze."""
    global _FROZEN_AT_START
    gc.collect()
    if any(issubclass(type(o), torch.Tensor) for o in gc.get_objects()):
        return False
    gc.freeze()
    _FROZEN_AT_START = gc.get_freeze_count()
    return True


_FROZEN_AT_START = 0   # how many objects freeze_startup froze in this process (or its parent)


def collect_every_object() -> None:
    """gc.collect(), with every object made since the startup freeze in gc's sight again: a
    gc.freeze() of the learner's own would otherwise hide the tensors it made from
    dl.footprint's walks (they would then see everything again, only slower)."""
    if gc.get_freeze_count() > _FROZEN_AT_START:
        gc.unfreeze()
    gc.collect()


def whole_number(name: str, value: Any, *, at_least: int = 1, at_most: int | None = None,
                 what: str = "") -> int:
    """`value` as an int from at_least to at_most, or a TypeError/ValueError that names `name`.

    bool is refused although it is an int: `world_size=True` is a mistake, not 1. `what` ends
    the ValueError's sentence ("a pipeline needs at least 1 stage").
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    if value < at_least or (at_most is not None and value > at_most):
        limits = f"from {at_least} to {at_most}" if at_most is not None else f"at least {at_least}"
        raise ValueError(f"{name}={value}: {what or f'it must be {limits}'}")
    return value


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


def positive_seconds(name: str, value: Any) -> None:
    """None, or a number of seconds > 0."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or value <= 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def group_ready() -> bool:
    """Whether this process has a default process group (inside a rank, or under torchrun)."""
    return dist.is_available() and dist.is_initialized()


def tensor_arg(x: object, what: str) -> torch.Tensor:
    """x itself, or a TypeError naming the argument when it is not a tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(x).__name__}")
    return x


def member_group(group: object, axis: str, kind: str, example: str) -> dist.ProcessGroup:
    """group itself when it is a process group this rank belongs to; else an error saying
    which group of the grid (`axis`, e.g. "tp", a `kind` of parallelism) was expected."""
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be the {kind} torch.distributed ProcessGroup (e.g. "
                        f"{example}), not {type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the {axis} group "
                         f"{dist.get_process_group_ranks(group)} it was given")
    return group


def ranks_text(ranks: Iterable[int]) -> str:
    """'rank 2' or 'ranks 0, 1, 3': the start of a sentence about some ranks (in the library's
    language of the moment)."""
    from dpmp_lab.i18n.messages import _  # here: the catalogues' module imports this one

    ranks = list(ranks)
    if len(ranks) == 1:
        return _("rank {rank}").format(rank=ranks[0])
    return _("ranks {ranks}").format(ranks=", ".join(str(r) for r in ranks))


def short_repr(value: Any, limit: int = 40) -> str:
    """repr(value), cut to `limit` characters with '...'."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def indent(text: str, n: int = 2) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in text.splitlines())


def tail(text: str, lines: int = 15) -> str:
    """The last `lines` lines of text."""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def ipython_shell() -> str | None:
    """'kernel' in a Jupyter kernel, 'terminal' in terminal IPython, else None (a script, a
    rank). Never imports IPython: if nothing imported it, this is no IPython session."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython else None
    shell = get() if get else None
    if shell is None:
        return None
    return "kernel" if getattr(shell, "kernel", None) is not None else "terminal"
