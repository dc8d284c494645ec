"""dl.bench: the fit recovers a known network, sweeps and timings have the promised shape, the
profile finds the communication and tells overlap from its absence, the picture draws.

No assertion here is about how fast anything is: times are measured on a shared machine.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab.profiling import Interval, Profile, _op_key

# -- the alpha-beta fit -------------------------------------------------------------------------


def synthetic(alpha: float, beta: float, sizes, worlds, noise=None):
    """Rows measured on a perfect ring network, optionally off by a relative `noise`."""
    rows = []
    for i, (w, n) in enumerate((w, n) for w in worlds for n in sizes):
        t = 2 * (w - 1) * alpha + 2 * (w - 1) / w * n / beta
        rows.append(("all_reduce", w, n, t * (1 + (noise[i] if noise else 0))))
    return rows


def test_fit_recovers_a_known_network_exactly():
    rows = synthetic(25e-6, 3e9, [2**12, 2**16, 2**20, 2**24], [2, 4, 8])
    fit = dl.bench.fit_alpha_beta(rows)
    assert fit.alpha == pytest.approx(25e-6, rel=1e-9)
    assert fit.beta == pytest.approx(3e9, rel=1e-9)
    assert max(abs(r) for r in fit.residuals) < 1e-9
    # the ring: 2 (N - 1) messages of n / N bytes
    assert fit.predict("all_reduce", 2**22, 4) == pytest.approx(6 * 25e-6 + 1.5 * 2**22 / 3e9)
    assert fit.predict("all_gather", 2**22, 4) == pytest.approx(3 * 25e-6 + 0.75 * 2**22 / 3e9)
    assert fit.predict("message", 1000, 4) == pytest.approx(25e-6 + 1000 / 3e9)


def test_fit_minimises_relative_residuals_and_reports_them():
    noise = [0.1, -0.1, 0.05, -0.05, 0.0, 0.02]
    rows = synthetic(50e-6, 1e9, [2**10, 2**18, 2**22], [2, 4], noise)
    fit = dl.bench.fit_alpha_beta(rows)
    design = torch.tensor([[2 * (w - 1), 2 * (w - 1) / w * n] for _, w, n, _ in rows],
                          dtype=torch.float64)
    t = torch.tensor([r[3] for r in rows], dtype=torch.float64)
    want = torch.linalg.lstsq(design / t[:, None], torch.ones(len(rows), 1,
                                                              dtype=torch.float64)).solution
    assert fit.alpha == pytest.approx(want[0, 0].item(), rel=1e-6)
    assert 1 / fit.beta == pytest.approx(want[1, 0].item(), rel=1e-6)
    predicted = (design @ want)[:, 0]
    assert list(fit.residuals) == pytest.approx(((t - predicted) / t).tolist(), abs=1e-9)
    # every residual is small against the big, well-measured sizes too: relative weighting
    assert max(abs(r) for r in fit.residuals) < 0.15


def test_fit_refuses_what_cannot_be_fitted():
    with pytest.raises(ValueError, match="two sizes"):
        dl.bench.fit_alpha_beta([("all_reduce", 2, 1024, 1e-4)])
    with pytest.raises(ValueError, match="two sizes"):
        dl.bench.fit_alpha_beta([("all_reduce", 2, 1024, 1e-4), ("all_reduce", 2, 1024, 2e-4)])
    with pytest.raises(ValueError, match="> 0"):
        dl.bench.fit_alpha_beta([("all_reduce", 2, 1024, 0.0), ("all_reduce", 2, 4096, 1e-4)])
    with pytest.raises(ValueError, match="does not grow"):
        dl.bench.fit_alpha_beta([("all_reduce", 2, 1024, 2e-4), ("all_reduce", 2, 2**20, 1e-4)])
    with pytest.raises(ValueError, match="ring_steps knows"):
        dl.bench.ring_steps("broadcastt", 4)
    assert [dl.bench.ring_steps("all_reduce", n) for n in (1, 2, 8)] == [0, 2, 14]


def test_tree_all_reduce_and_the_unweighted_fit():
    # a binomial tree: ceil(log2 N) rounds up, as many down, each of the whole buffer
    assert [dl.bench.tree_steps(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 2, 4, 4, 6, 6, 8]
    fit = dl.bench.AlphaBeta(5e-6, 1e10)
    assert fit.predict("tree_all_reduce", 2**20, 6) == pytest.approx(6 * (5e-6 + 2**20 / 1e10))
    # tree rows fit with ring rows, and the unweighted fit differs on noisy data
    rows = synthetic(50e-6, 1e9, [2**10, 2**18, 2**22], [2, 4], [0.1, -0.1, 0.05, -0.05, 0, 0.02])
    rows.append(("tree_all_reduce", 4, 2**16, fit.predict("tree_all_reduce", 2**16, 4)))
    relative, absolute = (dl.bench.fit_alpha_beta(rows, relative=r) for r in (True, False))
    assert abs(relative.alpha - absolute.alpha) > 1e-3 * relative.alpha
    exact = [("tree_all_reduce", w, n, fit.predict("tree_all_reduce", n, w))
             for w in (3, 8) for n in (2**10, 2**20)]
    assert dl.bench.fit_alpha_beta(exact).beta == pytest.approx(1e10, rel=1e-9)


def test_flops():
    assert dl.bench.train_flops(1e9, 2048) == 6 * 1e9 * 2048
    assert dl.bench.train_flops(1e9, 2048, n_layers=4, d_model=256, seq_len=512) == \
        6 * 1e9 * 2048 + 12 * 4 * 256 * 512 * 2048
    assert dl.bench.matmul_flops(128, repeats=2) > 0


def test_train_flops_matches_torchs_flop_counter_on_tinygpt():
    """torch.utils.flop_counter counts the matrix products of a real step: the weights that
    multiply activations (not the embedding lookups) and attention's score products."""
    from torch.utils.flop_counter import FlopCounterMode

    config = dl.models.GPTConfig(vocab_size=64, seq_len=32, d_model=64, n_heads=4, n_layers=2,
                                 d_ff=256)
    model = dl.models.TinyGPT(config)
    idx, targets = dl.models.token_batch(4, config.seq_len, config.vocab_size, seed=0)
    with FlopCounterMode(display=False) as counter:
        dl.models.lm_loss(model(idx), targets).backward()
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    want = dl.bench.train_flops(weights, idx.numel(), n_layers=config.n_layers,
                                d_model=config.d_model, seq_len=config.seq_len)
    assert counter.get_total_flops() == want


# -- timing and sweeps in ranks ------------------------------------------------------------------


def timed_in_rank():
    calls = []
    t = dl.bench.time_in_ranks(lambda: calls.append(1), warmup=3, repeats=4)
    return t, len(calls)


def test_time_in_ranks_gathers_every_rank_and_repeat(warm):
    res = dl.launch(timed_in_rank, world_size=2, stream=False)
    (t0, calls0), (t1, calls1) = res.values
    assert calls0 == calls1 == 7                      # 3 warm-up + 4 timed
    assert t0.per_rank == t1.per_rank                 # every rank gets every rank's times
    assert len(t0.per_rank) == 2 and all(len(r) == 4 for r in t0.per_rank)
    assert t0.per_repeat == [max(a, b) for a, b in zip(*t0.per_rank, strict=True)]
    assert t0.min <= t0.median
    with pytest.raises(ValueError, match="repeats"):
        dl.bench.time_in_ranks(print, repeats=0)


def test_sweep_has_one_row_per_op_size_and_world_size(warm):
    table = dl.bench.sweep(["all_reduce", "all_gather"], [64, 4096], [2, 4], warmup=1,
                           repeats=2)
    assert [(r.op, r.world_size, r.nbytes) for r in table.rows] == [
        (op, w, n) for w in (2, 4) for op in ("all_reduce", "all_gather") for n in (64, 4096)]
    assert all(0 < r.min_seconds <= r.seconds for r in table.rows)
    assert len(table.select("all_gather", 4)) == 2
    assert "collective sweep" in str(table.table())
    assert "algbw GB/s" in str(table.table()) and "busbw GB/s" in str(table.table())
    with pytest.raises(ValueError, match="whole fp32"):
        dl.bench.sweep(["all_reduce"], [20], [4])
    with pytest.raises(ValueError, match="2 ranks or more"):
        dl.bench.sweep(["all_reduce"], [64], [1])


def test_sweep_bandwidths_are_nccl_tests_algbw_and_busbw():
    """doc/PERFORMANCE.md of nccl-tests: algbw = S / t; busbw = algbw x 2(n-1)/n for
    all-reduce, x (n-1)/n for all-gather and reduce-scatter (S the full tensor)."""
    rows = [dl.bench.SweepRow(op, 4, 8_000_000, 2e-3, 1e-3)
            for op in ("all_reduce", "all_gather", "reduce_scatter")]
    assert [r.algbw for r in rows] == [pytest.approx(4e9)] * 3
    assert [r.busbw for r in rows] == [pytest.approx(6e9), pytest.approx(3e9),
                                       pytest.approx(3e9)]
    assert dl.bench.SweepRow("all_reduce", 2, 8_000_000, 2e-3, 1e-3).busbw == pytest.approx(4e9)
    lines = str(dl.bench.Sweep(rows).table()).splitlines()
    assert lines[1].split()[-4:] == ["algbw", "GB/s", "busbw", "GB/s"]
    assert [line.split()[-2:] for line in lines[-3:]] == [["4.00", "6.00"], ["4.00", "3.00"],
                                                          ["4.00", "3.00"]]


# -- profiles ------------------------------------------------------------------------------------


def profiled_dp_step(overlap: bool, bucket_mb: float):
    model = dl.dp.DataParallel(dl.models.TinyMLP(seed=0).to(dl.device()), bucket_mb=bucket_mb,
                               overlap=overlap)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)).to(dl.device())

    def step():
        model(x).sum().backward()
        model.finish_gradient_sync()
    step()
    return dl.bench.profile(step)[1], len(list(model.parameters()))


@pytest.mark.parametrize(("overlap", "bucket_mb", "buckets", "overlapped"), [
    (True, 0.0, None, True),       # per-tensor all-reduces from the hooks, during backward
    (False, 0.0, None, False),     # the same ones, all sent after backward
    (True, 100.0, 1, False),       # one huge bucket: ready only at the last gradient
])
def test_profile_finds_each_collective_and_tells_overlap(warm, overlap, bucket_mb, buckets,
                                                         overlapped):
    res = dl.launch(profiled_dp_step, overlap, bucket_mb, world_size=2, stream=False)
    for prof, tensors in res.values:
        assert [c.name for c in prof.comm] == ["allreduce"] * (buckets or tensors)
        assert all(c.start <= c.end <= prof.wall for c in prof.comm)
        assert {k.kind for k in prof.compute} >= {"forward", "backward"}
        assert prof.overlapped() is overlapped
        assert 0.0 <= prof.comm_share() <= 1.0
    assert "overlapped" not in res.output[0] and "USDT" not in res.output[0]


def profiled_collectives():
    t = torch.ones(8, device=dl.device())
    out = torch.empty(8 * dist.get_world_size(), device=dl.device())

    def step():
        dist.all_reduce(t)
        dist.all_gather_single(out, t)
        dist.reduce_scatter_single(t, out)
        dist.broadcast(t, src=0)
    step()
    return dl.bench.profile(step)[1]


def test_profile_matches_each_issue_with_its_execution(warm):
    res = dl.launch(profiled_collectives, world_size=2, stream=False)
    for prof in res.values:
        assert [c.name for c in prof.comm] == ["allreduce", "_allgather_base",
                                               "_reduce_scatter_base", "broadcast"]
        assert all(c.start <= c.end for c in prof.comm)
        assert not prof.overlapped()                   # no backward at all
    assert [_op_key(n) for n in (
        "c10d::allreduce_", "gloo:all_reduce", "c10d::_allgather_base_",
        "gloo:all_gather_into_tensor", "c10d::_reduce_scatter_base_", "nccl:reduce_scatter",
        "c10d::broadcast_", "gloo:broadcast")] == [
        "allreduce", "allreduce", "allgather", "allgather", "reducescatter", "reducescatter",
        "broadcast", "broadcast"]


def traced_collectives(folder: str):
    t = torch.ones(8, device=dl.device())

    def step():
        dist.all_reduce(t)
    step()
    return dl.bench.profile(step, trace_dir=folder)[1]


def test_profile_writes_one_chrome_trace_per_rank(warm, tmp_path):
    """What Perfetto and chrome://tracing open: a JSON object with traceEvents, the profiled
    call's record and the collective in it, one file per rank."""
    import json

    folder = tmp_path / "traces"
    res = dl.launch(traced_collectives, str(folder), world_size=2, stream=False)
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json", "rank1.json"]
    for rank, prof in enumerate(res.values):
        assert prof.trace_file == str(folder / f"rank{rank}.json")
        names = {e.get("name") for e in json.loads(Path(prof.trace_file).read_text())[
            "traceEvents"]}
        assert "dpmp_lab.bench.profile" in names
        assert any("allreduce" in _op_key(n) for n in names if isinstance(n, str)
                   and n.startswith(("c10d::", "gloo:", "nccl:"))), sorted(names)[:20]
    assert dl.launch(profiled_collectives, world_size=2, stream=False).values[0].trace_file \
        is None


def test_overlap_and_exposed_share_are_interval_logic():
    fwd, bwd = Interval("forward", "f", 0, 2), Interval("backward", "b1", 2, 4)
    late = Interval("backward", "b2", 5, 7)
    early_comm = Interval("comm", "allreduce", 4.5, 8)
    assert Profile(0, [fwd, bwd, late], [early_comm], 10).overlapped()
    after = Interval("comm", "allreduce", 7.5, 9)
    assert not Profile(0, [fwd, bwd, late, Interval("other", "div", 9, 9.5)], [after],
                       10).overlapped()
    # exposed: 4.5-5 and 7-8 of early_comm are not under compute
    assert Profile(0, [fwd, bwd, late], [early_comm], 10).comm_share() == pytest.approx(0.15)


def test_profile_picture_draws_text_and_svg():
    prof = Profile(1, [Interval("forward", "aten::addmm", 0, 1),
                       Interval("backward", "AddmmBackward0", 1, 2.5),
                       Interval("backward", "TBackward0", 3, 3.5)],
                   [Interval("comm", "allreduce", 2, 4)], 4.0, [2.0])
    pic = dl.viz.profile([prof], width=40)
    text = str(pic)
    assert "rank 1 compute |" + "F" * 10 + "B" * 15 + "." * 5 + "B" * 5 + "." * 5 + "|" in text
    assert "rank 1 comm    |" + "." * 20 + "|" + "=" * 19 + "|" in text
    assert "overlapped, exposed comm 25%" in text      # 2.5-3 and 3.5-4 of 4 ms
    root = ET.fromstring(pic._repr_svg_())
    assert len(root.findall(".//{http://www.w3.org/2000/svg}rect")) >= 4
    with pytest.raises(TypeError, match="Profile"):
        dl.viz.profile([1, 2])
