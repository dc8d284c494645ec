"""Pipeline parallelism: schedule tables by hand, the bubble, and real pipelined steps that
match the unpipelined model in fp64, with exactly the point-to-point traffic they should send."""

from __future__ import annotations

import xml.dom.minidom

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import models, pp, viz

pytestmark = pytest.mark.usefixtures("no_leaks")

CFG = models.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, d_ff=32)
BATCH = 8


def rows(text: str) -> list[list[str]]:
    """A grid written by hand, one stage per line: 'F0 F1 . B0' -> ['F0', 'F1', '.', 'B0']."""
    return [line.split() for line in text.strip().splitlines()]


def actions(sched: pp.Schedule) -> list[str]:
    return [" ".join(map(str, stage)) for stage in sched.actions]


# -- schedule tables, written out by hand ----------------------------------------------------


def test_naive_one_microbatch_keeps_one_stage_busy():
    s = pp.naive(3, 1)
    assert actions(s) == ["F0 B0"] * 3
    assert s.grid == rows("""
        F0 .  .  .  .  B0
        .  F0 .  .  B0 .
        .  .  F0 B0 .  .""")
    assert s.bubble_fraction == pytest.approx(2 / 3)
    two = pp.naive(2, 2)
    assert actions(two) == ["F0 B0 F1 B1"] * 2
    assert two.grid == rows("""
        F0 .  .  B0 F1 .  .  B1
        .  F0 B0 .  .  F1 B1 .""")


def test_gpipe_tables():
    s = pp.gpipe(2, 2)
    assert actions(s) == ["F0 F1 B0 B1"] * 2
    assert s.grid == rows("""
        F0 F1 .  .  B0 B1
        .  F0 F1 B0 B1 .""")
    s = pp.gpipe(3, 4)
    assert actions(s) == ["F0 F1 F2 F3 B0 B1 B2 B3"] * 3
    assert s.grid == rows("""
        F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
        .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .
        .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .""")


def test_one_f_one_b_tables():
    s = pp.one_f_one_b(3, 4)
    assert actions(s) == ["F0 F1 F2 B0 F3 B1 B2 B3",
                          "F0 F1 B0 F2 B1 F3 B2 B3",
                          "F0 B0 F1 B1 F2 B2 F3 B3"]
    assert s.grid == rows("""
        F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
        .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
        .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .""")
    s = pp.one_f_one_b(4, 4)
    assert actions(s) == ["F0 F1 F2 F3 B0 B1 B2 B3",
                          "F0 F1 F2 B0 F3 B1 B2 B3",
                          "F0 F1 B0 F2 B1 F3 B2 B3",
                          "F0 B0 F1 B1 F2 B2 F3 B3"]
    assert s.grid == rows("""
        F0 F1 F2 F3 .  .  .  B0 .  B1 .  B2 .  B3
        .  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3 .
        .  .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .  .
        .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .  .""")


def test_backward_twice_as_long_as_forward():
    s = pp.one_f_one_b(2, 2, backward_cost=2)
    assert s.grid == rows("""
        F0 F1 .  .  B0 B0 .  B1 B1
        .  F0 B0 B0 F1 B1 B1 .  .""")
    assert s.spans[1][1] == pp.Span("B", 0, 2, 4)
    assert s.bubble_fraction == pytest.approx(1 / 3)


def test_printed_schedule():
    text = str(pp.gpipe(2, 2))
    assert text.splitlines()[1:] == ["time    0  1  2  3  4  5",
                                     "stage 0 F0 F1 .  .  B0 B1",
                                     "stage 1 .  F0 F1 B0 B1 ."]
    assert "bubble 33.3%" in text and "at most 2, 2 per stage" in text
    page = pp.one_f_one_b(2, 3)._repr_html_()
    assert page.count("<tr>") == 3 and page.count(">B2</td>") == 2


# -- the bubble and the memory held ------------------------------------------------------------


@pytest.mark.parametrize("backward_cost", [1, 2])
def test_bubble_of_the_grid_is_the_formula(backward_cost):
    for p in range(1, 5):
        for m in range(1, 9):
            formula = pp.bubble_fraction(p, m)
            assert formula == pytest.approx((p - 1) / (m + p - 1))
            for make in (pp.gpipe, pp.one_f_one_b):
                s = make(p, m, backward_cost=backward_cost)
                assert s.bubble_fraction == pytest.approx(formula), (make.__name__, p, m)
                assert s.makespan == (m + p - 1) * (1 + backward_cost)
                assert pp.measured_bubble(s.spans).per_stage == pytest.approx([formula] * p)
            naive = pp.naive(p, m, backward_cost=backward_cost)
            assert naive.bubble_fraction == pytest.approx((p - 1) / p)


def test_activations_held_gpipe_m_and_1f1b_p_minus_stage():
    for p in range(1, 5):
        for m in range(p, 9):
            g, f, n = pp.gpipe(p, m), pp.one_f_one_b(p, m), pp.naive(p, m)
            for stage in range(p):
                assert g.peak_in_flight(stage) == m
                assert f.peak_in_flight(stage) == p - stage
                assert n.peak_in_flight(stage) == 1
    assert pp.one_f_one_b(4, 2).peak_in_flight(0) == 2   # fewer micro-batches than the warm-up


def test_make_schedule_by_name():
    assert actions(pp.make_schedule("1F1B", 3, 4)) == actions(pp.one_f_one_b(3, 4))
    assert actions(pp.make_schedule("afab", 2, 3)) == actions(pp.gpipe(2, 3))
    assert actions(pp.make_schedule("ZB-H1", 2, 3)) == actions(pp.zb_h1(2, 3))
    with pytest.raises(ValueError, match="unknown schedule 'zb'"):
        pp.make_schedule("zb", 2, 2)


def test_hand_written_schedule_is_checked():
    mine = pp.Schedule("mine", [["F0", "F1", "B0", "B1"], ["F0", "B0", "F1", "B1"]])
    assert mine.grid == rows("""
        F0 F1 .  B0 .  B1
        .  F0 B0 F1 B1 .""")     # the same as 1F1B on two stages
    assert mine.grid == pp.one_f_one_b(2, 2).grid
    with pytest.raises(ValueError, match="stage 1 runs B0 before F0"):
        pp.Schedule("x", [["F0", "B0"], ["B0", "F0"]])
    with pytest.raises(ValueError, match="exactly once; it has F0 F1 B0"):
        pp.Schedule("x", [["F0", "F1", "B0", "B1"], ["F0", "F1", "B0"]])
    with pytest.raises(ValueError, match="can never finish"):   # a cycle: a deadlock on ranks
        pp.Schedule("x", [["F0", "B0", "F1", "B1"], ["F1", "F0", "B0", "B1"]])
    with pytest.raises(ValueError, match="cannot read 'X1'"):
        pp.Schedule("x", [["X1"]])


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="m=0: a pipeline needs at least 1 micro-batch"):
        pp.gpipe(2, 0)
    with pytest.raises(ValueError, match="p=0: a pipeline needs at least 1 stage"):
        pp.one_f_one_b(0, 4)
    with pytest.raises(ValueError, match="at least 1 stage"):
        pp.bubble_fraction(0, 4)
    with pytest.raises(TypeError, match="m must be an int"):
        pp.naive(2, 1.5)
    with pytest.raises(ValueError, match="backward_cost"):
        pp.gpipe(2, 2, backward_cost=0)


# -- splitting a model -------------------------------------------------------------------------


def test_split_pieces():
    model = models.TinyGPT(CFG)
    pieces = model.pieces()
    stages = pp.split_pieces(pieces, 3)
    assert [len(s) for s in stages] == [2, 1, 1]
    assert stages[0][0] is model.embed and stages[2][0] is model.head   # shared, not copied
    assert [len(s) for s in pp.split_pieces(pieces, 3, boundaries=[1, 3])] == [1, 2, 1]
    assert [len(s) for s in pp.split_pieces(pieces, 4)] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="4 pieces cannot fill 5 pipeline stages"):
        pp.split_pieces(pieces, 5)
    with pytest.raises(ValueError, match="need 2 boundaries"):
        pp.split_pieces(pieces, 3, boundaries=[2])
    with pytest.raises(ValueError, match="must rise strictly"):
        pp.split_pieces(pieces, 3, boundaries=[2, 2])
    with pytest.raises(ValueError, match="n_stages=0"):
        pp.split_pieces(pieces, 0)


# -- running on ranks ------------------------------------------------------------------------


def pipelined_steps(kind: str, m: int, schedules: list[str]):
    """Every schedule once on this rank's stage, from zeroed gradients, under a trace."""
    p, rank = dist.get_world_size(), dist.get_rank()
    if kind == "gpt":
        model = models.TinyGPT(CFG, seed=0).double()
        x, y = models.token_batch(BATCH, CFG.seq_len, CFG.vocab_size, seed=1)
        shape, loss_fn = (BATCH // m, CFG.seq_len, CFG.d_model), models.lm_loss
    else:
        model = models.TinyMLP(d_in=6, d_hidden=5, d_out=3, n_hidden=3, seed=0).double()
        x, y = models.regression_batch(BATCH, 6, 3, seed=1)
        x, y = x.double(), y.double()
        shape, loss_fn = (BATCH // m, 5), torch.nn.functional.mse_loss
    pieces = model.pieces() if kind == "gpt" else list(model.layers)
    stage = pp.Stage(pp.split_pieces(pieces, p)[rank], activation_shape=shape)
    out = {}
    for name in schedules:
        model.zero_grad(set_to_none=True)
        with dl.trace() as t:
            result = pp.run_schedule(name, stage, x, y, n_microbatches=m, loss_fn=loss_fn)
        grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
        out[name] = (result, grads, t)
    return out


def reference(kind: str) -> tuple[float, dict[str, torch.Tensor]]:
    if kind == "gpt":
        model = models.TinyGPT(CFG, seed=0).double()
        x, y = models.token_batch(BATCH, CFG.seq_len, CFG.vocab_size, seed=1)
        loss = models.lm_loss(model(x), y)
    else:
        model = models.TinyMLP(d_in=6, d_hidden=5, d_out=3, n_hidden=3, seed=0).double()
        x, y = models.regression_batch(BATCH, 6, 3, seed=1)
        loss = torch.nn.functional.mse_loss(model(x.double()), y.double())
    loss.backward()
    return loss.item(), {n: q.grad for n, q in model.named_parameters()}


def check_step(per_rank, kind: str, name: str, p: int, m: int, act_numel: int) -> None:
    ref_loss, ref_grads = reference(kind)
    results = [v[name][0] for v in per_rank]
    traces = [v[name][2] for v in per_rank]
    # numbers: the loss on the last stage, every gradient on exactly one stage (fp64)
    assert results[-1].loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-10)
    assert len(results[-1].losses) == m and all(r.losses == [] for r in results[:-1])
    seen: dict[str, int] = {}
    for rank, v in enumerate(per_rank):
        for param, grad in v[name][1].items():
            assert param not in seen, f"{param} has a gradient on ranks {seen[param]} and {rank}"
            seen[param] = rank
            torch.testing.assert_close(grad, ref_grads[param], rtol=1e-10, atol=1e-10,
                                       msg=lambda m, what=f"rank {rank}, grad {param}": f"{what}: {m}")
    assert sorted(seen) == sorted(ref_grads), "some parameter got no gradient"
    # communication: activations forward, their gradients back, nothing else
    sched = pp.make_schedule(name, p, m)
    total_sends = sum(t.count("send") for t in traces)
    assert total_sends == 2 * m * (p - 1) == sum(t.count("recv") for t in traces)
    for rank, (t, r) in enumerate(zip(traces, results, strict=True)):
        forward_peer = [rank + 1] * m if rank < p - 1 else []
        backward_peer = [rank - 1] * m if rank > 0 else []
        assert sorted(e.peer for e in t.select("send")) == sorted(forward_peer + backward_peer)
        assert sorted(e.peer for e in t.select("recv")) == sorted(forward_peer + backward_peer)
        assert t.count() == t.count("send") + t.count("recv"), "a collective in a pipeline"
        assert all(e.group == tuple(range(p)) and e.nbytes == act_numel * 8 for e in t.events)
        assert all(e.async_op for e in t.select("send"))
        assert r.peak_in_flight == sched.peak_in_flight(rank)
        assert [(s.kind, s.microbatch) for s in r.spans] == \
            [(a.kind, a.microbatch) for a in sched.actions[rank]]
        assert all(s.end >= s.start for s in r.spans)


def test_two_stages_match_the_unpipelined_gpt(warm):
    m, schedules = 4, ["gpipe", "1f1b", "naive", "zbh1", "zbh2"]
    res = dl.launch(pipelined_steps, "gpt", m, schedules, world_size=2, stream=False)
    for name in schedules:
        check_step(res.values, "gpt", name, 2, m, BATCH // m * CFG.seq_len * CFG.d_model)
    results = [v["1f1b"][0] for v in res.values]
    bubble = pp.measured_bubble(results)
    assert len(bubble.per_stage) == 2 and all(0 <= b < 1 for b in bubble.per_stage)
    picture = viz.timeline(results)
    assert str(picture).splitlines()[1].startswith("stage 0 (rank 0) |F")
    xml.dom.minidom.parseString(picture._repr_svg_())


def test_three_stages_match_the_unpipelined_gpt(warm):
    m, schedules = 4, ["gpipe", "1f1b", "zbh1"]     # ZB: integer tokens into stage 0
    res = dl.launch(pipelined_steps, "gpt", m, schedules, world_size=3, stream=False)
    for name in schedules:
        check_step(res.values, "gpt", name, 3, m, BATCH // m * CFG.seq_len * CFG.d_model)


def test_four_stages_of_an_mlp_do_not_deadlock(warm):
    m, schedules = 8, ["1f1b", "gpipe", "zbh1", "zbh2"]
    res = dl.launch(pipelined_steps, "mlp", m, schedules, world_size=4, timeout=60,
                    stream=False)
    for name in schedules:
        check_step(res.values, "mlp", name, 4, m, BATCH // m * 5)


def dp_times_pp():
    """dp=2 x pp=2: each dp replica pipelines its half of the batch, then one all-reduce."""
    grid = dl.ProcessGrid(dp=2, pp=2)
    m, half = 2, BATCH // 2
    model = models.TinyGPT(CFG, seed=0).double()
    x, y = models.token_batch(BATCH, CFG.seq_len, CFG.vocab_size, seed=1)
    x, y = models.shard_batch(x, grid.dp_rank, 2), models.shard_batch(y, grid.dp_rank, 2)
    module = pp.split_pieces(model.pieces(), 2)[grid.pp_rank]
    stage = pp.Stage(module, grid.pp_group,
                     activation_shape=(half // m, CFG.seq_len, CFG.d_model))
    params = list(module.parameters())
    backward_marks: list[int] = []
    sync_mark: list[int] = []

    def sync_grads() -> None:     # plain data parallel: sum over replicas, divide by their count
        sync_mark.append(len(t.events))
        flat = torch.cat([q.grad.reshape(-1) for q in params])
        dist.all_reduce(flat, group=grid.dp_group)
        flat /= grid.dp
        offset = 0
        for q in params:
            q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
            offset += q.numel()

    params[0].register_hook(lambda g: backward_marks.append(len(t.events)))
    with dl.trace() as t:
        pp.run_schedule("1f1b", stage, x, y, n_microbatches=m, loss_fn=models.lm_loss,
                        after_last_backward=sync_grads)
    grads = {n: q.grad for n, q in model.named_parameters() if q.grad is not None}
    return grads, backward_marks, sync_mark, t


def test_dp_times_pp_syncs_gradients_once_after_the_last_microbatch(warm):
    res = dl.launch(dp_times_pp, world_size=4, stream=False)
    _, ref_grads = reference("gpt")
    for rank, (grads, marks, sync, t) in enumerate(res.values):
        for param, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[param], rtol=1e-10, atol=1e-10,
                                       msg=lambda m, what=f"rank {rank}, grad {param}": f"{what}: {m}")
        assert len(marks) == 2 and len(sync) == 1
        dp_events = [i for i, e in enumerate(t.events) if e.label == "dp"]
        assert [t.events[i].op for i in dp_events] == ["all_reduce"]
        assert dp_events[0] >= sync[0] >= marks[-1], "gradients synced before the last backward"
        assert t.count("all_reduce", group="dp", phase="none") == 1
        assert t.count("send", group="pp") == 2 and t.count("recv", group="pp") == 2
        assert t.count() == 5
    stage0 = {n for n in res.values[0][0]}
    assert stage0 == {n for n in res.values[1][0]}, "dp replicas hold different stages"


# -- bad input on ranks --------------------------------------------------------------------


def refused_runs():
    """Mistakes every rank makes alike: each must fail on its own rank, before any send."""
    model = torch.nn.Linear(4, 4).double()
    stage = pp.Stage(model, activation_shape=(2, 4))
    x = torch.randn(8, 4, dtype=torch.float64)
    messages = []
    attempts = [
        lambda: pp.run_schedule("1f1b", stage, x, x, n_microbatches=3,
                                loss_fn=torch.nn.functional.mse_loss),
        lambda: pp.run_schedule(pp.gpipe(3, 4), stage, x, x,
                                loss_fn=torch.nn.functional.mse_loss),
        lambda: pp.run_schedule("gpipe", stage, x, x, loss_fn=torch.nn.functional.mse_loss),
        lambda: pp.run_schedule(pp.gpipe(2, 4), stage, x, x, n_microbatches=2,
                                loss_fn=torch.nn.functional.mse_loss),
        lambda: pp.run_schedule("1f1b", model, x, x, n_microbatches=4),
        lambda: pp.Stage(model, activation_shape=(2, 0)),
    ]
    for attempt in attempts:
        try:
            attempt()
        except (ValueError, TypeError) as exc:
            messages.append(f"{type(exc).__name__}: {exc}")
        else:
            messages.append("accepted")
    return messages


def wrong_activation_shape():
    stage = pp.Stage(torch.nn.Linear(4, 3), activation_shape=(2, 4))
    x = torch.randn(8, 4)
    pp.run_schedule("gpipe", stage, x, torch.randn(8, 4), n_microbatches=4,
                    loss_fn=torch.nn.functional.mse_loss)


def missing_targets():
    stage = pp.Stage(torch.nn.Linear(4, 4), activation_shape=(2, 4))
    pp.run_schedule("gpipe", stage, torch.randn(8, 4), n_microbatches=4)


def test_bad_input_on_ranks_is_a_clear_error(warm):
    res = dl.launch(refused_runs, world_size=2, stream=False)
    assert res.values[0] == res.values[1]
    not_divisible, stages, no_m, m_differs, no_stage, shape = res.values[0]
    assert "inputs has 8 rows, which do not split into 3 equal micro-batches" in not_divisible
    assert "the schedule has 3 stages but the pipeline group has 2 ranks" in stages
    assert "needs n_microbatches" in no_m
    assert "n_microbatches=2, but the schedule has 4" in m_differs
    assert no_stage.startswith("TypeError: stage must be a Stage")
    assert "activation_shape must be positive ints" in shape
    with pytest.raises(dl.LaunchError, match=r"rank 0 raised ValueError: stage 0 produced an "
                       r"activation of shape \(2, 3\)"):
        dl.launch(wrong_activation_shape, world_size=2, timeout=60, stream=False)
    with pytest.raises(dl.LaunchError, match="rank 1 raised ValueError: the last stage computes "
                       "the loss: pass targets and loss_fn"):
        dl.launch(missing_targets, world_size=2, timeout=60, stream=False)


# -- the timeline picture --------------------------------------------------------------------


def test_timeline_of_a_schedule():
    picture = viz.timeline(pp.gpipe(2, 2))
    assert str(picture).splitlines()[1:] == [
        "stage 0 |F0>F1>......B0<B1<| idle 33%",
        "stage 1 |...F0>F1>B0<B1<...| idle 33%",
        "        0                  6 time steps"]
    svg = picture._repr_svg_()
    xml.dom.minidom.parseString(svg)
    assert svg.count('fill="#4e79a7" stroke') == 4 and svg.count('fill="#f28e2b" stroke') == 4
    assert svg.count('height="24" fill="url(#dpmp-idle)"') == 2   # a shaded lane per stage
    long = str(viz.timeline(pp.one_f_one_b(2, 2, backward_cost=2)))
    assert long.splitlines()[2] == "stage 1 |...F0>B0<<<<F1>B1<<<<......| idle 33%"
    with pytest.raises(TypeError, match="draws a pp.Schedule"):
        viz.timeline([1, 2])
