"""Pipeline parallelism: cut a model into stages, stream micro-batches through them.

    stages = pp.split_pieces(model.pieces(), n_stages=4)      # [embed, blocks..., head] cut in 4
    print(pp.one_f_one_b(4, 8))                               # who does what when, and the bubble
    print(pp.zb_h1(4, 8), pp.interleaved_1f1b(4, 8, 2))       # W passes; virtual stages
    stage = pp.Stage(stages[grid.pp_rank], grid.pp_group, activation_shape=(2, 16, 32))
    result = pp.run_schedule("1f1b", stage, idx, targets, n_microbatches=4, loss_fn=lm_loss)

Each pipeline stage (a rank) holds a run of consecutive layers and talks only to its two
neighbours: it receives activations from the previous stage and sends its own to the next
(forward), and the activation gradients go the other way (backward). A batch that went
through the stages in one piece would keep all but one stage idle, so the batch is cut into
m micro-batches: while stage 1 works on micro-batch 0, stage 0 already works on micro-batch 1.

A *schedule* says, for every stage, in which order it runs the forward (F) and backward (B)
of each micro-batch:
- naive: one micro-batch at a time through the whole pipeline; one stage busy at any moment.
- GPipe (all forward, then all backward, "AFAB"): the pipeline fills, drains, fills again.
- 1F1B: after a warm-up of p - stage - 1 forwards each stage alternates one forward and one
  backward, so it frees a micro-batch's activations as soon as it can: a stage holds at most
  p - stage micro-batches of activations instead of GPipe's m, for the same bubble.
The *bubble* is the time stages sit idle while the pipeline fills and drains. With equal
stages it is (p - 1) / (m + p - 1) of the step for GPipe and 1F1B alike: more micro-batches,
smaller bubble. Two ways to shrink it further:
- interleaved 1F1B (Megatron-LM's virtual stages): each rank holds v chunks of layers, rank
  r the model stages r, r + p, ...; the fill and drain are made of chunks v times shorter, so
  the bubble is (p - 1) / (v m + p - 1), for v times the point-to-point messages.
- zero bubble (Qi et al. 2024): the backward split into B (the input gradient, which the
  previous stage waits for) and W (the weight gradients, which nobody waits for), so that Ws
  fill the idle slots. ZB-H1 keeps 1F1B's peak memory for a third of its bubble (F = B = W);
  ZB-H2 holds 2p - 1 micro-batches and leaves no pause inside any stage.

Four modules: pp.schedules, what a schedule is (plain data, simulated on a time grid, no
process group needed); pp.tables, the schedules above; pp.runner, which cuts a model into
stages and runs a schedule on real ranks; pp.on_torch, the same on torch's own runner.
"""

from dpmp_lab.pp.on_torch import torch_schedule
from dpmp_lab.pp.runner import PipelineResult, Stage, run_schedule, split_pieces
from dpmp_lab.pp.schedules import Action, Bubble, Schedule, Span, measured_bubble
from dpmp_lab.pp.tables import (
    SCHEDULES,
    bubble_fraction,
    gpipe,
    interleaved_1f1b,
    make_schedule,
    naive,
    one_f_one_b,
    zb_h1,
    zb_h2,
)

__all__ = ["Action", "Bubble", "PipelineResult", "Stage", "SCHEDULES", "Schedule",
           "Span", "bubble_fraction", "gpipe", "interleaved_1f1b", "make_schedule",
           "measured_bubble", "naive", "one_f_one_b", "run_schedule", "split_pieces",
           "torch_schedule", "zb_h1", "zb_h2"]
