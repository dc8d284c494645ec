"""dl.cost: the byte and memory formulas, against the articles, the ZeRO paper and what the
reference implementations send and hold (traced)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import collectives, cost

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_the_articles_numbers():
    assert cost.tensor_bytes((1024, 1024)) == 4 * 2**20        # fp32 gradient: 4 MiB
    assert cost.tensor_bytes((8, 128, 4096)) == 16 * 2**20     # fp32 activation: 16 MiB
    assert cost.tensor_bytes(10, torch.bfloat16) == 20
    assert cost.ring_all_reduce_bytes(4 * 2**20, 4) == 6 * 2**20
    assert cost.ring_all_reduce_bytes(100, 1) == 0


def test_memory_matches_the_zero_paper():
    # ZeRO paper, Figure 1: 7.5B parameters, 64-way DP, mixed-precision Adam (16 bytes each)
    gb = 1e9
    assert round(cost.memory(7.5e9, dp=64, precision="mixed").total / gb) == 120
    assert round(cost.memory(7.5e9, dp=64, zero=1, precision="mixed").total / gb, 1) == 31.4
    assert round(cost.memory(7.5e9, dp=64, zero=2, precision="mixed").total / gb, 1) == 16.6
    assert round(cost.memory(7.5e9, dp=64, zero=3, precision="mixed").total / gb, 2) == 1.88
    split = cost.memory(8e9, tp=4, pp=2)
    assert split.params == 4e9 and split.total == 16e9
    assert "optimizer state" in str(split) and "<table" in split._repr_html_()


@pytest.mark.parametrize("kwargs, words", [
    ({"zero": 4}, "ZeRO stages are 0"),
    ({"precision": "fp8"}, "precision must be one of"),
    ({"dp": 0}, "dp must be a whole number of ranks"),
])
def test_memory_bad_input(kwargs, words):
    with pytest.raises(ValueError, match=words):
        cost.memory(1e6, **kwargs)


# -- the formulas against the bytes the reference implementations send ---------------------------


def reference_traffic() -> dict:
    from dpmp_lab import dp, hybrid, models, pp, tp

    replica = dp.DataParallel(models.TinyMLP(), bucket_mb=0.001)
    x, y = models.regression_batch(4)
    with dl.trace() as t_dp:
        torch.nn.functional.mse_loss(replica(x), y).backward()
        replica.finish_gradient_sync()
    n_params = sum(p.numel() for p in replica.parameters())
    plain = models.TinyMLP()
    zero = dp.ShardedOptimizer(plain.parameters())
    torch.nn.functional.mse_loss(plain(x), y).backward()
    zero.step()   # Adam creates its state at the first step

    grid = dl.ProcessGrid(tp=2)
    cfg = hybrid.SMALL
    b, s, d = 4, cfg.seq_len, cfg.d_model
    mlp = tp.ParallelMLP.from_dense(models.MLP(d, cfg.d_ff), grid.tp_group)
    x = torch.randn(b, s, d, requires_grad=True)
    with dl.trace() as t_tp:
        mlp(x).sum().backward()
    line = dl.ProcessGrid(pp=2)
    model = models.TinyGPT(cfg)
    stage = pp.Stage(pp.split_pieces(model.pieces(), 2)[line.pp_rank], line.pp_group,
                     activation_shape=(b // 2, s, d))
    idx, targets = models.token_batch(b, s, cfg.vocab_size)
    with dl.trace() as t_pp:
        pp.run_schedule("1f1b", stage, idx, targets, n_microbatches=2, loss_fn=models.lm_loss)
    return {"dp": (t_dp.bytes("all_reduce"), n_params, t_dp.count("all_reduce")),
            "zero": (zero.state_numel, zero.numel),
            "tp": (t_tp.bytes("all_reduce", phase="forward"),
                   t_tp.bytes("all_reduce", phase="backward")),
            "pp": t_pp.bytes("send"), "shape": (b, s, d)}


def test_dp_tp_pp_and_zero_formulas_equal_what_the_references_send_and_hold(warm):
    res = dl.launch(reference_traffic, world_size=2, stream=False)
    b, s, d = res[0]["shape"]
    for r in res.values:
        traced, n_params, calls = r["dp"]
        assert traced == cost.dp_gradient_bytes(n_params) and calls > 1   # in several buckets
        # ZeRO-1 over 2 ranks: Adam's two fp32 states for half the (padded) parameters, each
        state, numel = r["zero"]
        expected = cost.memory(numel, dp=2, zero=1).optimizer
        assert abs(4 * state - expected) <= 4 * 2   # + Adam's step counter
        assert r["tp"] == (cost.tp_activation_bytes(b, s, d),) * 2
    # 2 micro-batches of b/2: stage 0 sends 2 activations, stage 1 sends 2 gradients back
    assert res[0]["pp"] == res[1]["pp"] == 2 * cost.pp_activation_bytes(b // 2, s, d)


# -- pipeline schedules (the grids and real steps check these in test_pp_schedules) --------------


def test_pipeline_bubbles_are_the_papers():
    p, m = 8, 24
    # Narayanan et al. 2021, Section 2.2: (p-1)/m of the ideal time, v times less interleaved
    assert cost.pp_bubble("1f1b", p, m, relative_to="ideal") == pytest.approx((p - 1) / m)
    assert cost.pp_bubble("interleaved", p, m, 4, relative_to="ideal") == \
        pytest.approx((p - 1) / (4 * m))
    assert cost.pp_bubble("GPipe", p, m) == pytest.approx((p - 1) / (m + p - 1))
    # Qi et al. 2024, equal F, B and W: ZB-H1 idles a third of 1F1B's (p-1)/m, ZB-H2 nothing
    # once steps run back to back
    assert cost.pp_bubble("zb-h1", p, m, relative_to="ideal") == pytest.approx((p - 1) / (3 * m))
    assert cost.pp_bubble("zbh2", p, m, relative_to="ideal") == pytest.approx((p - 1) / (3 * m))
    assert cost.pp_bubble("zbh2", p, m, steps=10**6) < 1e-6
    assert cost.pp_messages(p, m) == 2 * m * (p - 1)
    with pytest.raises(ValueError, match="pp_bubble knows naive, gpipe"):
        cost.pp_bubble("zb-v", p, m)
    with pytest.raises(ValueError, match="relative_to is 'step' or 'ideal'"):
        cost.pp_bubble("1f1b", p, m, relative_to="wall")


def ring_traffic() -> dict[str, tuple[float, float]]:
    """Per op: (sent_bytes of torch's collective as the tracer records it, the bytes this rank
    really sends when dl.collectives runs the same collective as a ring of sends)."""
    n = dist.get_world_size()
    x = torch.randn(4 * n, dtype=torch.float64)
    shard = torch.randn(4, dtype=torch.float64)
    out = {}
    for op, torch_call, ring_call in (
            ("all_reduce", lambda: dist.all_reduce(x.clone()),
             lambda: collectives.ring_all_reduce(x)),
            ("reduce_scatter", lambda: dist.reduce_scatter_single(shard.clone(), x.clone()),
             lambda: collectives.ring_reduce_scatter(x)),
            ("all_gather", lambda: dist.all_gather_single(x.clone(), shard),
             lambda: collectives.ring_all_gather(shard, [4] * n))):
        with dl.trace() as t_torch:
            torch_call()
        with dl.trace() as t_ring:
            ring_call()
        (event,) = t_torch.events
        out[op] = (cost.sent_bytes(event.op, event.nbytes, len(event.group)),
                   t_ring.bytes("send"))
    return out


def test_sent_bytes_of_a_traced_call_is_what_its_ring_sends(warm):
    res = dl.launch(ring_traffic, world_size=3, stream=False)
    for per_op in res.values:
        for op, (formula, sent) in per_op.items():
            assert formula == sent, (op, formula, sent)
    assert cost.sent_bytes("recv", 800, 4) == 0 and cost.sent_bytes("send", 800, 4) == 800
    assert cost.sent_bytes("all_to_all", 800, 4) == cost.all_to_all_bytes(800, 4) == 600
    # one broadcast from each of n ranks sends, per rank, what one all-gather of them does
    assert 4 * cost.sent_bytes("broadcast", 800, 4) == cost.sent_bytes("all_gather", 800, 4)
