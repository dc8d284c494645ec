"""The same schedules on torch's own runner, torch.distributed.pipelining.

    step = pp.torch_schedule(chunks, "ScheduleInterleaved1F1B", n_microbatches=8,
                             loss_fn=F.mse_loss, example=torch.zeros(1, 4))
    losses = step(x, target)     # every rank calls it; losses on the rank of the last stage

torch wants what dl.pp's runner also wants, said its own way: one `PipelineStage` per model
stage this rank holds (in the interleaved layout rank r holds stages r, r + p, r + 2p, ...),
the schedule class given this rank's stages, and a `step` to which only the rank of the first
stage hands the batch and only the rank of the last one the target and a list for the losses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

__all__ = ["torch_schedule"]


def torch_schedule(chunks: Sequence[torch.nn.Module], schedule_name: str, n_microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   example: torch.Tensor | None = None,
                   group: dist.ProcessGroup | None = None
                   ) -> Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor] | None]:
    """This rank's chunks (chunk k is model stage k * p + rank) as a step of torch's schedule
    class `schedule_name`. `example`, one micro-batch's input, where every stage takes inputs of
    that shape and dtype, spares torch asking the previous stage for them. The step returns the
    micro-batch losses on the rank of the last stage, None elsewhere."""
    from torch.distributed.pipelining import PipelineStage, schedules

    rank, p = dist.get_rank(group), dist.get_world_size(group)
    v = len(chunks)
    device = next(iter(chunks[0].parameters())).device
    index = [k * p + rank for k in range(v)]
    stages = [PipelineStage(c, i, v * p, device, group=group,
                            input_args=None if example is None else example.to(device))
              for c, i in zip(chunks, index, strict=True)]
    schedule_class = getattr(schedules, schedule_name)
    several = issubclass(schedule_class, schedules.PipelineScheduleMulti)
    schedule = schedule_class(stages if several else stages[0], n_microbatches, loss_fn=loss_fn)
    first, last = 0 in index, v * p - 1 in index

    def step(x: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor] | None:
        losses: list[torch.Tensor] | None = [] if last else None
        kwargs = {"target": target, "losses": losses} if last else {}
        schedule.step(*((x,) if first else ()), **kwargs)
        return losses

    return step
