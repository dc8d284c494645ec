"""The small models and data: deterministic, learnable, and sharded without gaps or overlap."""

from __future__ import annotations

import pytest
import torch

import dpmp_lab as dl
from dpmp_lab.models import (
    GPTConfig,
    TinyGPT,
    TinyMLP,
    lm_loss,
    shard_batch,
    shard_range,
    token_batch,
)


def test_models_are_deterministic_and_leave_the_global_rng_alone():
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    a, b = TinyGPT(seed=3), TinyGPT(seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(TinyMLP(seed=0).layers[0].weight, TinyMLP(seed=1).layers[0].weight)


def test_tiny_gpt_shapes_pieces_and_learning():
    cfg = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, d_ff=32)
    model = TinyGPT(cfg, seed=0)
    idx, targets = token_batch(batch_size=16, seq_len=8, vocab_size=32, seed=0)
    assert model(idx).shape == (16, 8, 32)
    x = idx
    for piece in model.pieces():
        x = piece(x)
    assert torch.equal(x, model(idx))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = lm_loss(model(idx), targets).item()
    for _ in range(60):
        opt.zero_grad()
        loss = lm_loss(model(idx), targets)
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_attention_is_causal():
    model = TinyGPT(seed=0)
    idx, _ = token_batch(batch_size=2, seq_len=16, seed=0)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    assert torch.allclose(model(idx)[:, :10], model(changed)[:, :10])


def test_heads_must_divide_the_width():
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        GPTConfig(d_model=30, n_heads=4)


@pytest.mark.parametrize("n, world", [(64, 4), (10, 4), (3, 4), (7, 1)])
def test_shards_are_disjoint_complete_and_balanced(n, world):
    ranges = [shard_range(n, r, world) for r in range(world)]
    covered = [i for r in ranges for i in r]
    assert covered == list(range(n))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_shard_matches_the_articles_and_refuses_uneven_batches():
    x = torch.arange(64)
    assert [shard_batch(x, r, 4).tolist()[0] for r in range(4)] == [0, 16, 32, 48]
    assert all(len(shard_batch(x, r, 4)) == 16 for r in range(4))
    with pytest.raises(ValueError, match="does not split evenly over 4 ranks"):
        shard_batch(torch.arange(10), 0, 4)
    assert len(shard_batch(torch.arange(10), 0, 4, even=False)) == 3
    assert dl.models.regression_batch(8)[0].shape == (8, 16)


def test_the_old_ambiguous_names_are_gone():
    """shard meant both a batch split and a weight slice, PipelineStage is torch's other class:
    never released under those names (0.1.0), so no alias keeps them."""
    for module, old in ((dl.models, "shard"), (dl.tp, "shard"), (dl.pp, "PipelineStage")):
        assert not hasattr(module, old)
