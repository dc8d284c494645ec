"""Hybrid parallel training: TinyGPT on a dp x tp x pp grid, built from the reference pieces.

    res = dl.launch(hybrid.train, dp=2, tp=2, pp=2, world_size=8)    # from a notebook
    torchrun --nproc-per-node 8 -m dpmp_lab.hybrid --dp 2 --tp 2 --pp 2     # from a shell

Every rank does the same four things, each with its own process group from the ProcessGrid:
1. tensor parallel (tp group): its shard of every layer (tp.parallelize_gpt);
2. pipeline parallel (pp group): only the pieces of its stage, activations to the neighbours
   (pp.split_pieces, pp.run_schedule);
3. data parallel (dp group): its share of the batch, and after the last micro-batch's
   backward one gradient all-reduce over the ranks holding the same shard of the same stage
   (dp.DataParallel, overlap=False, synced from run_schedule's after_last_backward);
4. AdamW on the parameters it holds.
The result equals single-process training of the whole model on the whole batch
(train_single_process), up to the order of floating-point sums.

The same function runs under dl.launch and under torchrun (one node or several), because it
only needs an initialised default process group.
"""

from __future__ import annotations

import argparse
import functools
import os
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

import dpmp_lab.models as models
from dpmp_lab.context import device as rank_device
from dpmp_lab.context import nccl_backend
from dpmp_lab.dp import DataParallel
from dpmp_lab.grid import ProcessGrid
from dpmp_lab.i18n.messages import _
from dpmp_lab.models import GPTConfig, TinyGPT
from dpmp_lab.pp import Stage, run_schedule, split_pieces
from dpmp_lab.tp import parallelize_gpt, sharding, vocab_parallel_cross_entropy

__all__ = ["SMALL", "main", "train", "train_single_process"]

SMALL = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=4, n_layers=2, d_ff=32)


def _batch(config: GPTConfig, batch_size: int, step: int, seed: int):
    return models.token_batch(batch_size, config.seq_len, config.vocab_size, seed=seed + 1 + step)


def train(dp: int = 1, tp: int = 1, pp: int = 1, *, config: GPTConfig = SMALL,
          steps: int = 3, batch_size: int = 8, micro_batches: int = 2, lr: float = 1e-2,
          seed: int = 0, schedule: str = "1f1b",
          dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Train TinyGPT for `steps` steps on this rank's place of a dp x tp x pp grid.

    Call it on every rank (world size = dp * tp * pp); dtype=torch.float64 trains in double.
    Returns this rank's grid place, the loss of every step (on the last pipeline stage; the
    mean over this rank's data shard) and its parameters, named as in the whole model, with
    `sharding` saying along which dim each is split over the tp group.
    """
    with models.default_dtype(dtype):
        return _train(dp, tp, pp, config, steps, batch_size, micro_batches, lr, seed, schedule)


def _train(dp: int, tp: int, pp: int, config: GPTConfig, steps: int, batch_size: int,
           micro_batches: int, lr: float, seed: int, schedule: str) -> dict[str, Any]:
    grid = ProcessGrid(dp=dp, tp=tp, pp=pp)
    device = rank_device()
    if batch_size % (dp * micro_batches):
        raise ValueError(_("batch_size={batch_size} must split into dp={dp} shards of "
                           "micro_batches={micro_batches} equal micro-batches").format(
            batch_size=batch_size, dp=dp, micro_batches=micro_batches))

    model = TinyGPT(config, seed=seed)
    if tp > 1:
        parallelize_gpt(model, grid.tp_group)
    model.to(device)
    stage_module = split_pieces(model.pieces(), pp)[grid.pp_rank]
    mine = {id(p) for p in stage_module.parameters()}
    named = {n: p for n, p in model.named_parameters() if id(p) in mine}

    sync = DataParallel(stage_module, group=grid.dp_group, overlap=False) if dp > 1 else None
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=lr)
    micro = batch_size // dp // micro_batches
    stage = Stage(stage_module, grid.pp_group,
                  activation_shape=(micro, config.seq_len, config.d_model))
    loss_fn = functools.partial(vocab_parallel_cross_entropy, group=grid.tp_group) if tp > 1 \
        else models.lm_loss

    losses = []
    for step in range(steps):
        idx, targets = _batch(config, batch_size, step, seed)
        idx = models.shard_batch(idx, grid.dp_rank, dp).to(device)
        targets = models.shard_batch(targets, grid.dp_rank, dp).to(device)
        optimizer.zero_grad()
        result = run_schedule(schedule, stage, idx, targets, n_microbatches=micro_batches,
                              loss_fn=loss_fn,
                              after_last_backward=sync.finish_gradient_sync if sync else None)
        optimizer.step()
        losses.append(result.loss)
    split = sharding(model)
    return {"coords": grid.coords._asdict(), "rank": grid.rank, "losses": losses,
            "params": {n: p.detach().cpu().clone() for n, p in named.items()},
            "sharding": {n: split.get(n) for n in named}}


def train_single_process(*, config: GPTConfig = SMALL, steps: int = 3, batch_size: int = 8,
                         lr: float = 1e-2, seed: int = 0,
                         dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The reference: the whole model, the whole batch, one process."""
    with models.default_dtype(dtype):
        return _train_single(config, steps, batch_size, lr, seed)


def _train_single(config: GPTConfig, steps: int, batch_size: int, lr: float,
                  seed: int) -> dict[str, Any]:
    model = TinyGPT(config, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        idx, targets = _batch(config, batch_size, step, seed)
        optimizer.zero_grad()
        loss = models.lm_loss(model(idx), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: one process per rank, environment from torchrun."""
    parser = argparse.ArgumentParser(description=_("Train TinyGPT on a dp x tp x pp grid."))
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--fp64", action="store_true", help=_("train in double precision"))
    parser.add_argument("--save", default=None, help=_("folder for each rank's result (.pt)"))
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error(_("run me under torchrun (or use dl.launch(hybrid.train, ...) in a notebook)"))
    local_gpus = torch.cuda.device_count()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend = "gloo"
    if local_gpus >= local_world and dist.is_nccl_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        backend = nccl_backend()   # CUDA tensors through nccl, CPU tensors through gloo
    dist.init_process_group(backend)
    try:
        result = train(args.dp, args.tp, args.pp, steps=args.steps, batch_size=args.batch_size,
                       micro_batches=args.micro_batches, schedule=args.schedule,
                       dtype=torch.float64 if args.fp64 else None)
        place = result["coords"]
        if result["losses"][0] is not None and place["dp"] == place["tp"] == 0:
            for step, loss in enumerate(result["losses"]):
                print(f"rank {result['rank']} (dp_rank 0, last stage) step {step} loss "
                      f"{loss:.6f}", flush=True)
        if args.save:
            os.makedirs(args.save, exist_ok=True)
            result["args"] = vars(args)
            result["config"] = asdict(SMALL)
            torch.save(result, os.path.join(args.save, f"rank{result['rank']}.pt"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
