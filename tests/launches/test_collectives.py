"""Ring collectives from send/recv (dl.collectives) against torch's own."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import collectives, cost

pytestmark = pytest.mark.usefixtures("no_leaks")


def rings(sizes: list[int]) -> list:
    r, n = dist.get_rank(), dist.get_world_size()
    out = []
    for size in sizes:
        x = torch.randn(size, generator=torch.Generator().manual_seed(r)).double()
        expected = x.clone()
        dist.all_reduce(expected)
        with dl.trace() as t_ar:
            total = collectives.ring_all_reduce(x.view(1, -1))
        chunk_sizes = [c.numel() for c in torch.tensor_split(torch.empty(size), n)]
        with dl.trace() as t_rs:
            mine = collectives.ring_reduce_scatter(x)
        with dl.trace() as t_ag:
            gathered = collectives.ring_all_gather(x[:chunk_sizes[r]], chunk_sizes)
        everyone = [torch.empty(chunk_sizes[0], dtype=x.dtype) for _ in range(n)]
        dist.all_gather(everyone, x[:chunk_sizes[0]])
        out.append({"size": size, "ok": torch.allclose(total.view(-1), expected, atol=1e-12),
                    "shape": tuple(total.shape),
                    "rs ok": torch.allclose(mine, torch.tensor_split(expected, n)[r]),
                    "ag ok": torch.equal(gathered, torch.cat([e[:s] for e, s in
                                                              zip(everyone, chunk_sizes,
                                                                  strict=True)]))
                    if len(set(chunk_sizes)) == 1 else True,
                    "traces": (t_ar, t_rs, t_ag)})
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_all_reduce_equals_dist_all_reduce_from_sends_only(warm, world):
    res = dl.launch(rings, [12, 10, 1, 0, 37], world_size=world, stream=False)
    for rank, cases in enumerate(res.values):
        for case in cases:
            size, (t_ar, t_rs, t_ag) = case["size"], case["traces"]
            assert case["ok"] and case["rs ok"] and case["ag ok"], (rank, size)
            assert case["shape"] == (1, size)
            # 2(N-1) messages each way, nothing else: no collective at all
            assert t_ar.count("send") == t_ar.count("recv") == 2 * (world - 1)
            assert t_ar.count() == 4 * (world - 1)
            assert all(e.peer == (rank + 1) % world for e in t_ar.select("send"))
            assert all(e.peer == (rank - 1) % world for e in t_ar.select("recv"))
            if size % world == 0:
                k = size * 8
                assert t_ar.bytes("send") == cost.ring_all_reduce_bytes(k, world)
                assert t_rs.bytes("send") == cost.reduce_scatter_bytes(k, world)
                assert t_ag.bytes("send") == cost.all_gather_bytes(k, world)


def halves() -> tuple:
    x = torch.arange(12.0) * (dist.get_rank() + 1)
    with dl.trace() as t:
        y = collectives.all_reduce_by_halves(x.view(3, 4))
    try:
        collectives.all_reduce_by_halves(torch.ones(5))
        bad = ""
    except ValueError as e:
        bad = str(e)
    return y, t, bad


def test_all_reduce_from_reduce_scatter_and_all_gather(warm):
    res = dl.launch(halves, world_size=3, stream=False)
    for y, t, bad in res.values:
        assert torch.equal(y, (torch.arange(12.0) * 6).view(3, 4))
        assert [e.op for e in t.events] == ["reduce_scatter", "all_gather"]
        assert "5 elements do not split evenly over 3 ranks" in bad
