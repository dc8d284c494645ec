"""cp: ring attention equals full attention in fp64, forward and backward, and talks as a ring.

Every rank builds the whole q, k, v (same seed), takes its part, runs ring attention and
compares its part of the output and of the gradients with full attention on one process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import cp

pytestmark = pytest.mark.usefixtures("no_leaks")

B, H, D = 2, 2, 4
F64 = 8


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def _compare(seq: int, zigzag: bool, causal: bool, overlap: bool, how: str) -> dict:
    group = dist.group.WORLD
    n = dist.get_world_size()
    full = [_randn(B, H, seq, D, seed=s).requires_grad_() for s in (1, 2, 3)]
    w = _randn(B, H, seq, D, seed=4)
    want = cp.attention(*full, causal=causal)
    (want * w).sum().backward()
    mine = [cp.split_sequence(t.detach(), group, zigzag).requires_grad_() for t in full]
    with dl.trace() as t:
        if how == "ring":
            out = cp.ring_attention(*mine, group, zigzag=zigzag, causal=causal, overlap=overlap)
        else:
            out = cp.all_gather_attention(*mine, group, zigzag=zigzag, causal=causal)
        (out * cp.split_sequence(w, group, zigzag)).sum().backward()
    errs = {"out": (out - cp.split_sequence(want, group, zigzag)).abs().max().item(),
            "gathered": (cp.gather_sequence(out.detach(), group, zigzag) - want).abs().max().item()}
    for name, a, b in zip("qkv", mine, full, strict=True):
        errs[f"d{name}"] = (a.grad - cp.split_sequence(b.grad, group, zigzag)).abs().max().item()
    comm = {}
    for e in t.events:
        key = (e.op, e.phase)
        calls, nbytes = comm.get(key, (0, 0))
        comm[key] = (calls + 1, nbytes + e.nbytes)
    part = B * H * seq // n * D * F64
    return {"errs": errs, "comm": comm, "part": part, "n": n}


@pytest.mark.parametrize("world, zigzag", [(2, False), (4, False), (2, True), (4, True)])
def test_ring_attention_equals_full_attention_fp64(world, zigzag):
    res = dl.launch(_compare, 16, zigzag, True, True, "ring", world_size=world, timeout=60,
                    stream=False)
    for r in res.values:
        assert max(r["errs"].values()) < 1e-12, r["errs"]
        n, kv = r["n"], 2 * r["part"]          # K and V stacked: one message per step
        assert r["comm"] == {("send", "forward"): (n - 1, (n - 1) * kv),
                             ("recv", "forward"): (n - 1, (n - 1) * kv),
                             ("send", "backward"): (2 * n - 1, (2 * n - 1) * kv),
                             ("recv", "backward"): (2 * n - 1, (2 * n - 1) * kv)}, r["comm"]
        k = dl.cost.cp_kv_bytes(B, 16, H * D, torch.float64)
        assert r["comm"][("send", "forward")][1] == dl.cost.cp_ring_bytes(k, n)
        assert r["comm"][("send", "backward")][1] == dl.cost.cp_ring_bytes(k, n, backward=True)
        assert dl.cost.cp_ring_bytes(k, n) == dl.cost.all_gather_bytes(k, n)


def test_without_overlap_non_causal_and_all_gather_agree():
    for args in ((8, False, True, False, "ring"), (8, True, False, True, "ring"),
                 (8, False, True, True, "all_gather"), (8, True, True, True, "all_gather")):
        res = dl.launch(_compare, *args, world_size=2, timeout=60, stream=False)
        for r in res.values:
            assert max(r["errs"].values()) < 1e-12, (args, r["errs"])
            if args[-1] == "all_gather":
                kv = 2 * r["part"]
                assert r["comm"] == {("all_gather", "forward"): (1, kv),
                                     ("reduce_scatter", "backward"): (1, 2 * kv)}, r["comm"]


def test_layout_arithmetic():
    assert cp.chunk_ids(4, 1) == [1] and cp.chunk_ids(4, 1, zigzag=True) == [1, 6]
    assert cp.positions(8, 2, 1, zigzag=True).tolist() == [2, 3, 4, 5]
    assert cp.positions(8, 2, 0, zigzag=True).tolist() == [0, 1, 6, 7]
    assert cp.attention_work(4) == [0.5, 1.5, 2.5, 3.5]
    assert cp.attention_work(4, zigzag=True) == [2.0] * 4     # same total, shared evenly
    assert cp.attention_work(2, causal=False) == [2.0, 2.0]
    assert cp.attention_work(2, zigzag=True, causal=False) == [2.0, 2.0]


def test_online_softmax_equals_softmax_over_blocks():
    s, v = _randn(3, 10, seed=5), _randn(10, 2, seed=6)
    acc = torch.zeros(3, 2, dtype=torch.float64)
    run_max = torch.full((3,), float("-inf"), dtype=torch.float64)
    run_sum = torch.zeros(3, dtype=torch.float64)
    for cols in (slice(0, 4), slice(4, 7), slice(7, 10)):   # * 10: the max moves a lot
        cp.online_softmax_update(acc, run_max, run_sum, s[:, cols] * 10, v[cols])
    want = torch.softmax(s * 10, dim=-1) @ v
    assert (acc / run_sum.unsqueeze(-1) - want).abs().max() < 1e-12


def _bad_inputs() -> list[str]:
    q = torch.zeros(1, 1, 3, 2, dtype=torch.float64)
    errors = []
    for call in (lambda: cp.ring_attention(q, q, q, dist.group.WORLD, zigzag=True),
                 lambda: cp.ring_attention(q[0], q[0], q[0], dist.group.WORLD),
                 lambda: cp.ring_attention(q, q, q, "cp"),
                 lambda: cp.split_sequence(q, dist.group.WORLD)):
        try:
            call()
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    return errors


def test_bad_input_is_a_clear_error():
    errors = dl.launch(_bad_inputs, world_size=2, timeout=30, stream=False).values[0]
    assert len(errors) == 4, errors
    assert "length must be even" in errors[0]
    assert "(batch, heads, sequence, head_dim)" in errors[1]
    assert "context-parallel" in errors[2]
    assert "does not split into 2 equal chunks" in errors[3]
    with pytest.raises(ValueError, match="divisible by 4"):
        cp.positions(6, 2, 0, zigzag=True)
