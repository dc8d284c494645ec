"""moe: routing arithmetic by hand, and expert parallel equal to the one-process MoE in fp64.

Every rank builds the same one-process MoE (same seed) and every rank's tokens; it checks its
own output and loss against the one-process MoE on its tokens, its experts' gradients against
the one-process gradients summed over every rank's tokens, and its communication.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import moe

pytestmark = pytest.mark.usefixtures("no_leaks")

D, FF, E, TOKENS = 4, 6, 4, 12


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def _loss(layer: moe.MoE, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out, aux = layer(x)
    return (out * w).sum() + 0.5 * aux


def _expert_parallel(top_k: int, capacity_factor: float) -> dict:
    n, me = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    dense = moe.MoE(D, FF, E, top_k, capacity_factor, dtype=torch.float64)
    xs = [_randn(2, TOKENS // 2, D, seed=10 + r) for r in range(n)]
    ws = [_randn(2, TOKENS // 2, D, seed=20 + r) for r in range(n)]
    ep = moe.MoE.from_dense(dense, dist.group.WORLD)
    x = xs[me].clone().requires_grad_()   # as in a model: earlier layers want dx
    with dl.trace() as t:
        out, aux = ep(x)
        ((out * ws[me]).sum() + 0.5 * aux).backward()
    want_out, want_aux = dense(xs[me])
    dropped = dense.last_dropped
    x_ref = xs[me].clone().requires_grad_()
    router_grad, x_grad = torch.autograd.grad(_loss(dense, x_ref, ws[me]),
                                              (dense.router.weight, x_ref))
    sum(_loss(dense, x, w) for x, w in zip(xs, ws, strict=True)).backward()
    mine = slice(ep.first_expert, ep.first_expert + ep.n_local)
    errs = {"out": (out - want_out).abs().max().item(), "aux": abs(aux.item() - want_aux.item()),
            "router grad": (ep.router.weight.grad - router_grad).abs().max().item(),
            "x grad": (x.grad - x_grad).abs().max().item(),
            "w1 grad": (ep.w1.grad - dense.w1.grad[mine]).abs().max().item(),
            "w2 grad": (ep.w2.grad - dense.w2.grad[mine]).abs().max().item()}
    comm = {}
    for e in t.events:
        calls, nbytes = comm.get((e.op, e.phase), (0, 0))
        comm[(e.op, e.phase)] = (calls + 1, nbytes + e.nbytes)
    return {"errs": errs, "comm": comm, "dropped": (ep.last_dropped, dropped),
            "buffer": dl.cost.ep_dispatch_bytes(TOKENS, D, E, top_k, capacity_factor,
                                                torch.float64)}


@pytest.mark.parametrize("world, top_k, factor", [(2, 2, 1.0), (4, 1, 1.0), (2, 1, 4.0)])
def test_expert_parallel_equals_one_process(world, top_k, factor):
    res = dl.launch(_expert_parallel, top_k, factor, world_size=world, timeout=60, stream=False)
    dropped = 0
    for r in res.values:
        assert max(r["errs"].values()) < 1e-12, r["errs"]
        assert r["dropped"][0] == r["dropped"][1]
        dropped += r["dropped"][0]
        assert r["comm"] == {("all_to_all", "forward"): (2, 2 * r["buffer"]),
                             ("all_to_all", "backward"): (2, 2 * r["buffer"])}, r["comm"]
    if factor >= E / top_k:
        assert dropped == 0
    else:
        assert dropped > 0      # the case really exercises dropping


def test_routing_by_hand():
    # 4 tokens, 2 experts, top-1, capacity ceil(1.0 * 4 * 1 / 2) = 2: tokens 0, 1, 3 choose
    # expert 0, so token 3 (third in the queue) is dropped
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    r = moe.route(probs, top_k=1, capacity_factor=1.0)
    assert r.capacity == 2
    assert r.expert.tolist() == [0, 0, 1, 0] and r.kept.tolist() == [True, True, True, False]
    assert r.slot[r.kept].tolist() == [0, 1, 2]
    x = torch.arange(8.0).view(4, 2)
    buf = moe.dispatch(x, r, 2)
    assert buf.tolist() == [[[0, 1], [2, 3]], [[4, 5], [0, 0]]]
    out = moe.combine(buf, r, 4)
    assert torch.allclose(out, torch.tensor([[0, 0.9], [1.6, 2.4], [2.8, 3.5], [0, 0]]))
    # top-2: first choices queue first, so token 0's second choice (expert 1) comes after
    # token 2's first choice
    r2 = moe.route(probs, top_k=2, capacity_factor=1.0)
    assert r2.capacity == 4 and r2.kept.all()
    assert r2.expert.tolist() == [0, 0, 1, 0, 1, 1, 0, 1]
    assert r2.slot.tolist() == [0, 1, 4, 2, 5, 6, 3, 7]


def test_cost_of_the_dispatch():
    # capacity ceil(1.25 * 100 * 2 / 8) = 32 slots x 8 experts x 64 numbers x 4 bytes
    assert dl.cost.ep_dispatch_bytes(100, 64, 8, top_k=2) == 8 * 32 * 64 * 4
    assert dl.cost.all_to_all_bytes(1000, 4) == 750


def test_load_balancing_loss():
    uniform = torch.full((4, 2), 0.5)
    assert moe.load_balancing_loss(uniform, torch.tensor([0, 1, 0, 1])).item() == 1.0
    crowded = torch.tensor([[1.0, 0.0]] * 4)
    assert moe.load_balancing_loss(crowded, torch.tensor([0, 0, 0, 0])).item() == 2.0


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="top_k=3 is more than the 2 experts"):
        moe.MoE(4, 4, 2, top_k=3)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        moe.MoE(4, 4, 2, capacity_factor=0)
    with pytest.raises(TypeError, match="expert-parallel torch.distributed ProcessGroup"):
        moe.MoE(4, 4, 2, ep_group="ep")
    with pytest.raises(ValueError, match="last dim must be d_model = 4"):
        moe.MoE(4, 4, 2)(torch.zeros(3, 5))
