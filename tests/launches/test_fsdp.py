"""dl.fsdp: FullyShardedDataParallel against single-process training (fp64, every rank), against
torch's FSDP2 fully_shard on the same model, and by its exact communication per unit and phase."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

import dpmp_lab as dl
from dpmp_lab.fsdp import FullyShardedDataParallel
from tests.support.sharding_models import Stack, my_rows, seeded

pytestmark = pytest.mark.usefixtures("no_leaks")

BATCH, SEQ, VOCAB = 6, 5, 11


class Tied(nn.Module):
    """Embedding tied to the head, a frozen bias, a norm (replicated), sizes that do not split
    evenly over 2 or 3 ranks."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.fc1 = nn.Linear(6, 7)
        self.norm = nn.LayerNorm(7)
        self.fc2 = nn.Linear(7, 6)
        self.head = nn.Linear(6, VOCAB)
        self.head.weight = self.emb.weight
        self.fc1.bias.requires_grad_(False)

    def forward(self, ids):
        h = F.relu(self.norm(self.fc1(self.emb(ids))))
        return self.head(self.fc2(h))


def token_data():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    tgt = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return ids, tgt


def lm(model, ids, tgt):
    return F.cross_entropy(model(ids).flatten(0, 1), tgt.flatten())


def train_tied(prefetch: bool, reshard: bool, steps: int = 3):
    """FSDP on this rank's rows and a single-process model on all of them, fp64."""
    ref = seeded(Tied, 0).double()
    # other ranks start elsewhere: FSDP broadcasts the first rank's values
    model = FullyShardedDataParallel(seeded(Tied, dist.get_rank()).double(),
                                     prefetch=prefetch, reshard_after_forward=reshard)
    # SGD: AdamW divides by sqrt(v), which turns a gradient that is 0 up to rounding into a
    # full-size step, so only a linear update keeps fp64 runs equal to 1e-12
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    ids, tgt = token_data()
    for _ in range(steps):
        lm(model, my_rows(ids), my_rows(tgt)).backward()
        model.finish_gradient_sync()
        opt.step()
        opt.zero_grad()
        lm(ref, ids, tgt).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return model.full_parameters(), {k: v.detach() for k, v in ref.named_parameters()}, \
        model.units


@pytest.mark.parametrize("world", [2, 3])
def test_matches_single_process_training_in_fp64_on_every_rank(warm, world):
    res = dl.launch(lambda: [train_tied(p, r) for p in (False, True) for r in (True, False)],
                    world_size=world, stream=False)
    for rank_runs in res.values:
        for full, ref, units in rank_runs:
            assert units == ["emb", "fc1", "fc2", "head"]     # the norm stays replicated
            assert list(full) == list(ref)
            for name in ref:
                torch.testing.assert_close(full[name], ref[name], rtol=0, atol=1e-12)


def counted_steps(reshard: bool, prefetch: bool):
    torch.manual_seed(0)
    model = FullyShardedDataParallel(Stack().double(), reshard_after_forward=reshard,
                                     prefetch=prefetch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    first_done = []
    model.module.layers[0].register_forward_hook(lambda *a: first_done.append(time.perf_counter()))
    out = []
    for _ in range(2):
        with dl.trace() as t:
            model(my_rows(x)).pow(2).mean().backward()
            model.finish_gradient_sync()
        opt.step()
        opt.zero_grad()
        out.append(t)
    shards = [p.numel() for p in model.shards]                # one shard per unit
    # was the second layer's gather issued before the first layer's forward was over?
    early = t.select("all_gather", phase="forward")[1].time < first_done[-1]
    return out, shards, model.memory(), early


@pytest.mark.parametrize("reshard,prefetch", [(True, False), (True, True), (False, False)])
def test_exact_collectives_per_unit_and_phase(warm, reshard, prefetch):
    res = dl.launch(counted_steps, reshard, prefetch, world_size=2, stream=False)
    for traces, shards, memory, early in res.values:
        assert early == prefetch          # prefetch issues the next unit's gather ahead
        # Linear(5,6): 36 elements -> shards of 18; Linear(6,7): 49 -> 25 (padded); 7->5: 40
        assert shards == [18, 25, 20]
        for t in traces:
            assert t.count("all_gather", phase="forward") == 3
            assert t.count("all_gather", phase="backward") == (3 if reshard else 0)
            assert t.count("reduce_scatter", phase="backward") == 3
            assert t.count() == 3 + 3 + (3 if reshard else 0)       # nothing else, no all-reduce
            assert t.bytes("all_gather", phase="forward") == 8 * sum(shards)
            assert t.bytes("reduce_scatter") == 8 * 2 * sum(shards)
            forward = [e.shape for e in t.select("all_gather", phase="forward")]
            assert forward == [(18,), (25,), (20,)]                  # in forward order
        assert memory["gathered"] == 0 and memory["params"] == 8 * sum(shards)


# -- mixed precision ------------------------------------------------------------------------------


def mixed(reduce_dtype):
    """bf16 compute, fp32 master weights, against one process applying the same casts: each
    rank's rows through a bf16 copy of the weights, gradients cast up and averaged."""
    ref = seeded(Stack, 0)
    model = FullyShardedDataParallel(seeded(Stack, 0), compute_dtype=torch.bfloat16,
                                     reduce_dtype=reduce_dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(2))
    n = dist.get_world_size()
    for _ in range(2):
        with dl.trace() as t:
            model(my_rows(x).bfloat16()).float().pow(2).mean().backward()
            model.finish_gradient_sync()
        opt.step()
        opt.zero_grad()
        low = seeded(Stack, 0).bfloat16()
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(n):
            with torch.no_grad():
                for p, q in zip(low.parameters(), ref.parameters(), strict=True):
                    p.copy_(q)
            low.zero_grad()
            low(x[r * 8 // n:(r + 1) * 8 // n].bfloat16()).float().pow(2).mean().backward()
            for g, p in zip(grads, low.parameters(), strict=True):
                g += p.grad.to(reduce_dtype or torch.float32).float() / n
        for p, g in zip(ref.parameters(), grads, strict=True):
            p.grad = g
        ref_opt.step()
    dtypes = {e.dtype for e in t.select("all_gather")}, {e.dtype for e in t.select("reduce_scatter")}
    master = {str(p.dtype) for p in model.parameters()}
    return model.full_parameters(), dict(ref.named_parameters()), dtypes, master


@pytest.mark.parametrize("reduce_dtype", [None, torch.bfloat16])
def test_mixed_precision_keeps_fp32_masters_and_matches_the_same_casts(warm, reduce_dtype):
    res = dl.launch(mixed, reduce_dtype, world_size=2, stream=False)
    for full, ref, (gather_dtypes, reduce_dtypes), master in res.values:
        assert gather_dtypes == {"bfloat16"}
        assert reduce_dtypes == {"bfloat16" if reduce_dtype else "float32"}
        assert master == {"torch.float32"}
        for name in ref:
            assert full[name].dtype == torch.float32
            torch.testing.assert_close(full[name], ref[name].detach(), rtol=1e-5, atol=1e-5)


# -- torch's FSDP2 ------------------------------------------------------------------------------


def against_fully_shard():
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = FullyShardedDataParallel(seeded(Stack, 0).double())
    theirs = seeded(Stack, 0).double()
    for layer in theirs.layers:
        fully_shard(layer)
    fully_shard(theirs)
    out = {}
    for name, model in (("ours", ours), ("torch", theirs)):
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        for _ in range(2):
            with dl.trace() as t:
                model(my_rows(x)).pow(2).mean().backward()
                if model is ours:
                    ours.finish_gradient_sync()
            opt.step()
            opt.zero_grad()
        counts = {(e.op, e.phase) for e in t.events}
        out[name] = ({k: t.count(k[0], phase=k[1] or "none") for k in counts},
                     t.bytes("all_gather"))
    full = ours.full_parameters()
    torch_full = {k: v.full_tensor() for k, v in theirs.named_parameters()}
    return out, full, torch_full


def test_same_numbers_and_collectives_as_torch_fully_shard(warm):
    res = dl.launch(against_fully_shard, world_size=2, stream=False)
    for out, full, torch_full in res.values:
        assert out["ours"][0] == {("all_gather", "forward"): 3, ("all_gather", "backward"): 3,
                                  ("reduce_scatter", "backward"): 3}
        assert out["torch"][0] == out["ours"][0]    # the trace sees FSDP2's gathers as forward
        for name, value in torch_full.items():
            torch.testing.assert_close(full[name], value, rtol=0, atol=1e-12)


# -- bad input ------------------------------------------------------------------------------------


def bad_input():
    errors = []
    for kwargs in ({"units": ["nope"]}, {"compute_dtype": torch.int32}, {"units": [3]}):
        try:
            FullyShardedDataParallel(Stack(), **kwargs)
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
    try:
        dl.dp.ShardedOptimizer(Stack().parameters(), stage=3)
    except ValueError as exc:
        errors.append(str(exc))
    return errors


def test_bad_input_says_what_is_wrong(warm):
    errors = dl.launch(bad_input, world_size=2, stream=False)[0]
    assert "no sub-module named 'nope'" in errors[0] and "layers.0" in errors[0]
    assert "compute_dtype must be a floating torch.dtype" in errors[1]
    assert "units must be sub-module names or modules" in errors[2]
    assert "Stage 3 shards the parameters" in errors[3] and "FullyShardedDataParallel" in errors[3]
