"""Schedules beyond 1F1B: interleaved 1F1B (virtual stages) and the zero-bubble schedules (B and W
apart). Their tables against torch.distributed.pipelining's order, their bubble and memory
against the formulas and the papers' claims, and real steps that match the unpipelined model
with the point-to-point traffic the formula counts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import cost, models, pp, viz

pytestmark = pytest.mark.usefixtures("no_leaks")


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def actions(sched: pp.Schedule) -> list[list[str]]:
    return [[str(a) for a in row] for row in sched.actions]


# -- actions and hand-written tables -------------------------------------------------------


def test_action_text_round_trips():
    assert pp.Action.parse("F3") == pp.Action("F", 3) == pp.Action.parse("F3.0")
    assert pp.Action.parse("B3.1") == pp.Action("B", 3, chunk=1)
    assert pp.Action.parse(" W12 ") == pp.Action("W", 12)
    for text in ("F0", "B7", "W2", "F3.1", "W0.2", "B10.3"):
        assert str(pp.Action.parse(text)) == text
    assert str(pp.Span("W", 2, 0, 1, chunk=1)) == "W2.1" and str(pp.Span("F", 0, 0, 1)) == "F0"
    with pytest.raises(ValueError, match="cannot read 'X1'"):
        pp.Action.parse("X1")
    with pytest.raises(ValueError, match="cannot read 'F1.'"):
        pp.Action.parse("F1.")
    with pytest.raises(ValueError, match="chunk index must be an int >= 0"):
        pp.Action("F", 1, -1)


def test_split_backward_is_checked_with_messages_a_learner_can_act_on():
    ok = pp.Schedule("mine", [["F0", "F1", "B0", "W0", "B1", "W1"], ["F0", "B0", "F1", "B1"]])
    assert ok.splits_backward == (True, False)
    assert ok.grid == rows("""
        F0 F1 .  B0 W0 B1 W1
        .  F0 B0 F1 B1 .  .""")
    with pytest.raises(ValueError, match="W0 before B0 on stage 0: the weight gradient needs "
                                         "the output gradient that B0 receives"):
        pp.Schedule("x", [["F0", "W0", "B0"], ["F0", "B0"]])
    with pytest.raises(ValueError, match=r"stage 0 must run F and B and W of every micro-batch "
                                         r"0..1 exactly once; it has F0 F1 B0 W0 B1 \(a rank "
                                         r"that runs any W runs one W after each B\)"):
        pp.Schedule("x", [["F0", "F1", "B0", "W0", "B1"], ["F0", "B0", "F1", "B1"]])
    with pytest.raises(ValueError, match="stage 1 runs B1 before F1"):
        pp.Schedule("x", [["F0", "F1", "B0", "W0", "B1", "W1"], ["F0", "B0", "B1", "F1"]])


def test_virtual_stages_wrap_from_the_last_rank_to_the_first():
    # p = 2 ranks, v = 2 chunks: model stages 0 (rank 0), 1 (rank 1), 2 (rank 0), 3 (rank 1)
    s = pp.Schedule("mine", [["F0", "F0.1", "B0.1", "B0"], ["F0", "F0.1", "B0.1", "B0"]])
    assert (s.n_ranks, s.n_chunks, s.n_model_stages) == (2, 2, 4)
    assert s.needs(0, pp.Action("F", 0, 1)) == (1, pp.Action("F", 0, 0))   # wraps around
    assert s.needs(1, pp.Action("B", 0, 0)) == (0, pp.Action("B", 0, 1))   # and back
    assert s.needs(1, pp.Action("B", 0, 1)) == (1, pp.Action("F", 0, 1))   # the loss
    assert s.needs(0, pp.Action("F", 0)) is None
    assert s.grid == rows("""
        F0 .  F0.1 .    .    B0.1 .  B0
        .  F0 .    F0.1 B0.1 .    B0 .""")
    with pytest.raises(ValueError, match="rank 1 must run F and B of every micro-batch 0..0 on "
                                         "each of its 2 chunks exactly once"):
        pp.Schedule("x", [["F0", "F0.1", "B0.1", "B0"], ["F0", "B0"]])
    with pytest.raises(ValueError, match="can never finish.*rank 0 at F0.1"):
        pp.Schedule("x", [["F0", "F0.1", "B0.1", "B0"], ["F0.1", "F0", "B0.1", "B0"]])


def test_interleaved_table():
    s = pp.interleaved_1f1b(2, 2, 2)
    assert actions(s) == [["F0", "F1", "F0.1", "F1.1", "B0.1", "B1.1", "B0", "B1"],
                          ["F0", "F1", "F0.1", "B0.1", "F1.1", "B1.1", "B0", "B1"]]
    assert s.grid == rows("""
        F0 F1 F0.1 F1.1 .    B0.1 .    B1.1 B0 B1
        .  F0 F1   F0.1 B0.1 F1.1 B1.1 B0   B1 .""")
    with pytest.raises(ValueError, match="m must be a multiple of p.*m=6 is not: use m=8"):
        pp.interleaved_1f1b(4, 6, 2)
    with pytest.raises(ValueError, match="n_chunks=1: interleaving needs at least 2 chunks"):
        pp.interleaved_1f1b(4, 8, 1)


def test_zero_bubble_tables():
    h1 = pp.zb_h1(3, 4)
    assert actions(h1) == [["F0", "F1", "F2", "B0", "W0", "F3", "B1", "W1", "B2", "W2", "B3",
                            "W3"],
                           ["F0", "F1", "B0", "F2", "B1", "W0", "F3", "B2", "W1", "B3", "W2",
                            "W3"],
                           ["F0", "B0", "F1", "B1", "F2", "B2", "W0", "F3", "B3", "W1", "W2",
                            "W3"]]
    assert h1.grid == rows("""
        F0 F1 F2 .  .  B0 W0 F3 B1 W1 B2 W2 B3 W3
        .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
        .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3""")
    h2 = pp.zb_h2(2, 3)
    assert h2.grid == rows("""
        F0 F1 F2 B0 W0 B1 W1 B2 W2 .
        .  F0 B0 F1 B1 F2 B2 W0 W1 W2""")    # a parallelogram: no pause inside a row
    assert [h2.peak_in_flight(s) for s in range(2)] == [3, 3]


# -- against torch.distributed.pipelining's order ----------------------------------------------

# torch builds its tables in the schedule's constructor, which wants PipelineStages and so a
# process group: a "fake" one (torch's own testing backend) in a fresh interpreter, so that
# this test process never holds a default group
_TORCH_ORDERS = r"""
import json, sys
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.pipelining import PipelineStage, schedules
out = {}
for name, p, m, v in json.loads(sys.argv[1]):
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=p)
    stages = [PipelineStage(torch.nn.Linear(2, 2), c * p, v * p, torch.device("cpu"))
              for c in range(v)]
    order = getattr(schedules, name)(stages, m).pipeline_order
    out[f"{name} {p} {m} {v}"] = {r: [str(a) for a in acts if a is not None]
                                  for r, acts in order.items()}
    dist.destroy_process_group()
print(json.dumps(out))
"""
INTERLEAVED_CASES = [(p, m, v) for p in (2, 3, 4) for v in (2, 3) for m in (p, 2 * p)]
ZB_CASES = [(p, m) for p in (2, 3, 4) for m in (p, p + 1, 2 * p)]


@pytest.fixture(scope="module")
def torch_orders() -> dict:
    cases = [("ScheduleInterleaved1F1B", p, m, v) for p, m, v in INTERLEAVED_CASES] + \
        [("ScheduleInterleavedZeroBubble", p, m, 1) for p, m in ZB_CASES]
    done = subprocess.run([sys.executable, "-c", _TORCH_ORDERS, json.dumps(cases)],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def from_torch(order: dict, p: int) -> list[list[str]]:
    """torch writes "5F2" (model stage 5, forward, micro-batch 2) and "I" for the input part of
    a split backward; ours is "F2.1" for rank 5 % p's chunk 5 // p."""
    out = []
    for r in range(p):
        row = []
        for text in order[str(r)]:
            stage, kind, mb = re.fullmatch(r"(\d+)([FIBW])(\d+)", text).groups()
            row.append(str(pp.Action({"I": "B"}.get(kind, kind), int(mb), int(stage) // p)))
        out.append(row)
    return out


@pytest.mark.parametrize("p, m, v", INTERLEAVED_CASES)
def test_interleaved_order_is_torchs(torch_orders, p, m, v):
    theirs = from_torch(torch_orders[f"ScheduleInterleaved1F1B {p} {m} {v}"], p)
    assert actions(pp.interleaved_1f1b(p, m, v)) == theirs
    # the comparison can fail: counting the backward's chunks up instead of down differs
    wrong = [[str(pp.Action(a.kind, a.microbatch, v - 1 - a.chunk)) if a.kind == "B" else str(a)
              for a in row] for row in pp.interleaved_1f1b(p, m, v).actions]
    assert wrong != theirs


def _with_w_after_b(a) -> list[str]:
    return [str(a), f"W{a.microbatch}"] if a.kind == "B" else [str(a)]


@pytest.mark.parametrize("p, m", ZB_CASES)
def test_zb_h1_order_is_torchs_interleaved_zero_bubble_with_one_chunk(torch_orders, p, m):
    theirs = from_torch(torch_orders[f"ScheduleInterleavedZeroBubble {p} {m} 1"], p)
    assert actions(pp.zb_h1(p, m)) == theirs
    # 1F1B with each W right after its B (no postponing) is not it, from p = 2 on
    eager = [[x for a in row for x in _with_w_after_b(a)] for row in pp.one_f_one_b(p, m).actions]
    assert eager != theirs


def message_orders(s: pp.Schedule) -> tuple[dict, dict]:
    """Per (sender, receiver): the messages in the order the sender sends them, and in the
    order the receiver receives them (the runner sends at the F or B that makes a message and
    receives at the one that needs it)."""
    p, last = s.n_ranks, s.n_model_stages - 1
    sent: dict = {}
    received: dict = {}
    for r, row in enumerate(s.actions):
        for a in row:
            k = a.chunk * p + r
            if a.kind == "F" and k > 0:
                received.setdefault(((k - 1) % p, r), []).append(("act", k, a.microbatch))
            if a.kind == "F" and k < last:
                sent.setdefault((r, (k + 1) % p), []).append(("act", k + 1, a.microbatch))
            if a.kind == "B" and k < last:
                received.setdefault(((k + 1) % p, r), []).append(("grad", k, a.microbatch))
            if a.kind == "B" and k > 0:
                sent.setdefault((r, (k - 1) % p), []).append(("grad", k - 1, a.microbatch))
    return sent, received


def test_every_table_sends_in_the_order_its_receiver_receives():
    """What lets the runner work on NCCL, which ignores tags and matches a pair's messages in
    order (on gloo the runner's tags would match them anyway)."""
    tables = [make(p, m) for make in (pp.gpipe, pp.one_f_one_b, pp.zb_h1, pp.zb_h2)
              for p in (2, 3, 4) for m in (1, 3, 8)]
    tables += [pp.interleaved_1f1b(p, m, v) for p in (2, 3, 4) for v in (2, 3)
               for m in (p, 2 * p)]
    for s in tables:
        sent, received = message_orders(s)
        assert sent == received, (s.name, s.n_ranks, s.n_microbatches, s.n_chunks)
    crossed = pp.Schedule("x", [["F0", "F1", "B0", "B1"], ["F0", "F1", "B1", "B0"]])
    sent, received = message_orders(crossed)
    assert sent != received     # runs (the grid finishes), but only because of tags


# -- the bubble, the memory, the messages: formulas against the simulated grids -------------------


@pytest.mark.parametrize("backward_cost", [1, 2, 3])
def test_interleaved_bubble_is_the_formula(backward_cost):
    for p in range(1, 5):
        for v in (2, 3, 4):
            for m in range(p, 4 * p + 1, p):
                s = pp.interleaved_1f1b(p, m, v, backward_cost=backward_cost)
                formula = cost.pp_bubble("interleaved", p, m, v)
                assert formula == pytest.approx((p - 1) / (v * m + p - 1))
                assert s.bubble_fraction == pytest.approx(formula), (p, v, m)
                # Narayanan et al.: (p-1)/(v m) of the ideal time; the idle time, v times less
                assert cost.pp_bubble("interleaved", p, m, v, relative_to="ideal") == \
                    pytest.approx((p - 1) / (v * m))
                # the idle time per rank is 1F1B's over v: (p-1)(F+B) in chunk steps, where
                # 1F1B's stage (v chunks) idles (p-1)(F+B) in its own, v times longer, steps
                idle = s.makespan - v * m * (1 + backward_cost)
                one = pp.one_f_one_b(p, m, backward_cost=backward_cost)
                assert idle == one.makespan - m * (1 + backward_cost) == \
                    (p - 1) * (1 + backward_cost)
    # and it can fail: plain 1F1B's bubble is not the interleaved formula
    assert pp.one_f_one_b(4, 8).bubble_fraction != pytest.approx(cost.pp_bubble("interleaved",
                                                                                4, 8, 2))


@pytest.mark.parametrize("backward_cost, weight_cost", [(1, 1), (2, 1), (1, 2), (3, 2)])
def test_zb_h1_bubble_is_the_formula_and_a_third_of_1f1b(backward_cost, weight_cost):
    for p in range(1, 6):
        for m in range(p, 3 * p + 2):
            s = pp.zb_h1(p, m, backward_cost=backward_cost, weight_cost=weight_cost)
            formula = cost.pp_bubble("zbh1", p, m, t_b=backward_cost, t_w=weight_cost)
            assert s.bubble_fraction == pytest.approx(formula), (p, m)
    # Qi et al., Section 2.1: with F = B = W the idle time is a third of 1F1B's on the same
    # model (1F1B's backward is B + W), at 1F1B's peak of p micro-batches on every stage
    p, m = 4, 8
    zb, one = pp.zb_h1(p, m), pp.one_f_one_b(p, m, backward_cost=2)
    assert (zb.makespan - 3 * m) * 3 == one.makespan - 3 * m == 3 * (p - 1)
    assert [zb.peak_in_flight(s) for s in range(p)] == [p] * p
    assert max(one.peak_in_flight(s) for s in range(p)) == p
    # where memory is freed matters: counted until B, ZB-H1 would seem to hold 1F1B's p - s
    until_b = [max(sum(1 if a.kind == "F" else -1 if a.kind == "B" else 0
                       for a in zb.actions[s][:i + 1]) for i in range(len(zb.actions[s])))
               for s in range(p)]
    assert until_b == [p - s for s in range(p)] != [zb.peak_in_flight(s) for s in range(p)]


def back_to_back(s: pp.Schedule, steps: int) -> pp.Schedule:
    """`steps` steps of s with nothing between them, step i on micro-batches i m .. i m + m-1."""
    m = s.n_microbatches
    table = [[pp.Action(a.kind, a.microbatch + i * m, a.chunk) for i in range(steps)
              for a in row] for row in s.actions]
    return pp.Schedule(s.name, table, backward_cost=s.backward_cost,
                       weight_cost=s.weight_cost)


def test_zb_h2_is_zero_bubble_between_steps_at_2p_minus_1_memory():
    for p in range(1, 6):
        for m in range(2 * p - 1, 4 * p):
            s = pp.zb_h2(p, m)
            assert s.bubble_fraction == pytest.approx(cost.pp_bubble("zbh2", p, m)), (p, m)
            assert s.bubble_fraction == pytest.approx((p - 1) / (3 * m + p - 1))
            assert max(s.peak_in_flight(r) for r in range(p)) == 2 * p - 1
            # no pause inside a row: the only idle time is each rank's start and end
            for row in s.spans:
                assert sum(x.end - x.start for x in row) == row[-1].end - row[0].start
            three = back_to_back(s, 3)
            assert three.bubble_fraction == pytest.approx(
                cost.pp_bubble("zbh2", p, m, steps=3)), (p, m)
    # against 1F1B and ZB-H1 on the same model: one step of ZB-H2 idles as long as ZB-H1's
    # (equal costs), but back to back only ZB-H2 closes the gap: ZB-H1 still pauses inside
    # its first stage every step
    p, m = 4, 8
    h1, h2 = pp.zb_h1(p, m), pp.zb_h2(p, m)
    assert h1.bubble_fraction == pytest.approx(h2.bubble_fraction)
    assert back_to_back(h1, 3).bubble_fraction == pytest.approx(h1.bubble_fraction)
    assert back_to_back(h2, 3).bubble_fraction < h2.bubble_fraction / 2
    assert cost.pp_bubble("zbh2", p, m, steps=1000) < 1e-3
    assert back_to_back(pp.one_f_one_b(p, m, backward_cost=2), 2).bubble_fraction == \
        pytest.approx(pp.bubble_fraction(p, m))


def test_describe_quotes_the_formula_where_it_holds():
    assert "formula (p-1)/(v*m+p-1) = 15.8%" in pp.interleaved_1f1b(4, 8, 2).describe()
    assert "p=4 ranks x v=2 chunks" in pp.interleaved_1f1b(4, 8, 2).describe()
    assert "F=1 B=1 W=1" in pp.zb_h1(4, 8).describe() and "= 11.1%" in pp.zb_h1(4, 8).describe()
    assert "formula" not in pp.zb_h2(4, 3).describe()     # m < 2p - 1: the formula is off
    assert "formula (p-1)/(3m+p-1) = 11.1%" in pp.zb_h2(4, 8).describe()


def test_make_schedule_knows_the_new_names():
    assert actions(pp.make_schedule("ZB-H1", 3, 4)) == actions(pp.zb_h1(3, 4))
    assert actions(pp.make_schedule("zb_h2", 3, 5, weight_cost=2)) == actions(pp.zb_h2(3, 5))
    assert pp.make_schedule("zb-h2", 3, 5, weight_cost=2).weight_cost == 2
    assert actions(pp.make_schedule("interleaved", 2, 4, n_chunks=3)) == \
        actions(pp.interleaved_1f1b(2, 4, 3))
    with pytest.raises(ValueError, match="n_chunks=2: only the interleaved schedule"):
        pp.make_schedule("1f1b", 2, 4, n_chunks=2)
    with pytest.raises(ValueError, match="weight_cost=2: only the zero-bubble schedules"):
        pp.make_schedule("1f1b", 2, 4, weight_cost=2)


def test_chunks_on_a_pipeline_of_one_rank_are_refused_with_the_way_out():
    def run():
        stages = [dl.pp.Stage(torch.nn.Linear(4, 4), activation_shape=(1, 4), chunk=c,
                              n_chunks=2) for c in range(2)]
        x = torch.randn(4, 4)
        dl.pp.run_schedule("interleaved", stages, x, x, n_microbatches=4,
                           loss_fn=torch.nn.functional.mse_loss)
    with pytest.raises(dl.LaunchError, match="2 chunks on a pipeline of one rank"):
        dl.launch(run, world_size=1, stream=False)


def test_message_counts():
    assert cost.pp_messages(4, 8) == 2 * 8 * 3
    assert cost.pp_messages(4, 8, 2) == 2 * 8 * 7      # 7 boundaries: about v times more
    assert cost.pp_messages(1, 8, 2) == 0   # one rank: every boundary is on it, nothing sent
    with pytest.raises(ValueError, match="v=0"):
        cost.pp_messages(4, 8, 0)
    with pytest.raises(ValueError, match="only the interleaved schedule runs virtual stages"):
        cost.pp_bubble("1f1b", 4, 8, 2)


def test_pictures_show_chunks_and_w():
    s = pp.interleaved_1f1b(2, 2, 2)
    text = str(viz.timeline(s))
    assert "F0.1" in text and "B1.1" in text
    svg = viz.timeline(pp.zb_h1(2, 2))._repr_svg_()
    assert svg.count('fill="#59a14f" stroke') == 4 and "weight gradient" in svg   # W: green
    assert "|F0>F1>...B0<W0=B1<W1=|" in str(viz.timeline(pp.zb_h1(2, 2))).replace(" ", "")
    chunked = viz.timeline(s)._repr_svg_()
    assert chunked.count('fill="#a0cbe8" stroke') == 4     # chunk 1's forwards, lighter
    page = s._repr_html_()
    assert page.count("<tr>") == 3 and ">F1.1</td>" in page and "darker = later chunk" in page


# -- on ranks ------------------------------------------------------------------------------------

D_IN, D_HIDDEN, D_OUT, BATCH = 6, 5, 3, 24


def blocks(n: int) -> list[torch.nn.Module]:
    """TinyMLP cut into n pieces whose boundaries all carry (rows, D_HIDDEN)."""
    layers = list(models.TinyMLP(D_IN, D_HIDDEN, D_OUT, n_hidden=n - 1, seed=0).double().layers)
    return [torch.nn.Sequential(*layers[i:i + 2]) for i in range(0, len(layers), 2)]


def reference(n: int) -> tuple[float, dict[str, torch.Tensor]]:
    model = torch.nn.Sequential(*blocks(n))
    x, y = models.regression_batch(BATCH, D_IN, D_OUT, seed=1)
    loss = torch.nn.functional.mse_loss(model(x.double()), y.double())
    loss.backward()
    return loss.item(), {n: q.grad for n, q in model.named_parameters()}


def chunked_steps(plans: list[tuple[str, int, int]]) -> dict:
    """Each (schedule, m, v) once on this rank's chunks (stage c p + r), under a trace; and
    interleaved once with the chunks laid out wrong (rank r holding stages r v .. r v + v - 1)."""
    p, rank = dist.get_world_size(), dist.get_rank()
    x, y = models.regression_batch(BATCH, D_IN, D_OUT, seed=1)
    x, y = x.double(), y.double()
    out = {}
    for name, m, v in plans:
        model = torch.nn.Sequential(*blocks(v * p))
        layouts = {"right": [c * p + rank for c in range(v)]}
        if v > 1:
            layouts["wrong"] = [rank * v + c for c in range(v)]
        for layout, held in layouts.items():
            model.zero_grad(set_to_none=True)
            stages = [pp.Stage(model[k], activation_shape=(BATCH // m, D_HIDDEN), chunk=c,
                               n_chunks=v) for c, k in enumerate(held)]
            with dl.trace() as t:
                result = pp.run_schedule(name, stages if v > 1 else stages[0], x, y,
                                         n_microbatches=m,
                                         loss_fn=torch.nn.functional.mse_loss)
            grads = {n: q.grad.clone() for n, q in model.named_parameters()
                     if q.grad is not None}
            out[(name, m, v, layout)] = (result, grads, t)
    return out


def check_chunked(per_rank, name: str, p: int, m: int, v: int) -> None:
    ref_loss, ref_grads = reference(v * p)
    last_rank = (v * p - 1) % p
    results = [r[(name, m, v, "right")][0] for r in per_rank]
    assert results[last_rank].loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-10)
    seen: dict[str, int] = {}
    for rank, r in enumerate(per_rank):
        for param, grad in r[(name, m, v, "right")][1].items():
            assert param not in seen, f"{param} has a gradient on ranks {seen[param]} and {rank}"
            seen[param] = rank
            torch.testing.assert_close(grad, ref_grads[param], rtol=1e-10, atol=1e-10,
                                       msg=lambda m, what=f"{name}, rank {rank}: grad {param}":
                                       f"{what}: {m}")
    assert sorted(seen) == sorted(ref_grads), "some parameter got no gradient"
    sched = pp.make_schedule(name, p, m, n_chunks=v)
    traces = [r[(name, m, v, "right")][2] for r in per_rank]
    assert sum(t.count("send") for t in traces) == cost.pp_messages(p, m, v) == \
        sum(t.count("recv") for t in traces)
    for rank, (t, res) in enumerate(zip(traces, results, strict=True)):
        stages = [c * p + rank for c in range(v)]
        forward = [(k + 1) % p for k in stages if k < v * p - 1] * m
        backward = [(k - 1) % p for k in stages if k > 0] * m
        assert sorted(e.peer for e in t.select("send")) == sorted(forward + backward)
        assert sorted(e.peer for e in t.select("recv")) == sorted(forward + backward)
        assert t.count() == t.count("send") + t.count("recv")
        assert [(e.op, e.peer) for e in t.events] == sched.messages(rank)   # and in that order
        assert res.peak_in_flight == sched.peak_in_flight(rank)
        assert [str(s) for s in res.spans] == [str(a) for a in sched.actions[rank]]
    if v > 1:   # the check can fail: stages laid out contiguously compute another model
        wrong = [r[(name, m, v, "wrong")][0] for r in per_rank][last_rank].loss
        assert wrong != pytest.approx(ref_loss, rel=1e-6)


def test_two_ranks_interleaved_and_zero_bubble_match_the_unpipelined_model(warm):
    plans = [("interleaved", 4, 2), ("interleaved", 2, 3), ("zbh1", 4, 1), ("zbh2", 4, 1)]
    res = dl.launch(chunked_steps, plans, world_size=2, timeout=60, stream=False)
    for name, m, v in plans:
        check_chunked(res.values, name, 2, m, v)


def test_three_and_four_ranks(warm):
    plans = [("interleaved", 3, 2), ("zbh1", 3, 1), ("zbh2", 6, 1)]
    res = dl.launch(chunked_steps, plans, world_size=3, timeout=60, stream=False)
    for name, m, v in plans:
        check_chunked(res.values, name, 3, m, v)
    plans = [("interleaved", 4, 2), ("zbh2", 8, 1)]
    res = dl.launch(chunked_steps, plans, world_size=4, timeout=60, stream=False)
    for name, m, v in plans:
        check_chunked(res.values, name, 4, m, v)


def refused_chunks():
    stages = [pp.Stage(torch.nn.Linear(4, 4), activation_shape=(2, 4), chunk=c, n_chunks=2)
              for c in range(2)]
    plain = pp.Stage(torch.nn.Linear(4, 4), activation_shape=(2, 4))
    x = torch.randn(8, 4)
    messages = []
    for attempt in (
            lambda: pp.run_schedule("interleaved", stages[::-1], x, x, n_microbatches=4,
                                    loss_fn=torch.nn.functional.mse_loss),
            lambda: pp.run_schedule(pp.interleaved_1f1b(2, 4, 2), stages[0], x, x,
                                    loss_fn=torch.nn.functional.mse_loss),
            lambda: pp.run_schedule(pp.interleaved_1f1b(2, 4, 2), plain, x, x,
                                    loss_fn=torch.nn.functional.mse_loss),
            lambda: pp.run_schedule("1f1b", stages, x, x, n_microbatches=4,
                                    loss_fn=torch.nn.functional.mse_loss),
            lambda: pp.Stage(torch.nn.Linear(4, 4), activation_shape=(2, 4), chunk=2,
                             n_chunks=2)):
        try:
            attempt()
        except (ValueError, TypeError) as exc:
            messages.append(str(exc))
        else:
            messages.append("accepted")
    return messages


def test_chunks_are_checked_on_ranks(warm):
    res = dl.launch(refused_chunks, world_size=2, timeout=60, stream=False)
    assert res.values[0] == res.values[1]
    order, one_of_two, one_stage, not_interleaved, chunk = res.values[0]
    assert "in chunk order, all on the same pipeline group: got chunk 1 of 2" in order
    assert "passed 1 stage(s) built with n_chunks=2: pass one Stage per chunk" in one_of_two
    assert "the schedule runs 2 chunks per rank, but this rank passed 1 stage(s)" in one_stage
    assert "n_chunks=2: only the interleaved schedule" in not_interleaved
    assert "chunk=2: the chunks of a rank holding 2 are 0..1" in chunk


def torch_schedule_steps(cases):
    """Per case (schedule class, m, v, layout): this rank's losses and gradients after one step
    of pp.torch_schedule, with the chunks laid out as torch wants them or contiguously."""
    import torch.nn.functional as F

    rank, p = dist.get_rank(), dist.get_world_size()
    out = []
    for name, m, v, layout in cases:
        model = dl.models.TinyMLP(d_in=4, d_hidden=8, d_out=2, n_hidden=4, seed=0).double()
        pieces = pp.split_pieces(list(model.layers), v * p)
        mine = ([pieces[k * p + rank] for k in range(v)] if layout == "interleaved"
                else pieces[rank * v:(rank + 1) * v])
        x, y = dl.models.regression_batch(2 * m, 4, 2, seed=1)
        losses = pp.torch_schedule(mine, name, m, F.mse_loss)(x.double(), y.double())
        out.append((None if losses is None else [float(t) for t in losses],
                    {n: q.grad.clone() for n, q in model.named_parameters()
                     if q.grad is not None}))
    return out


def test_torch_schedule_lays_chunks_out_as_torch_wants_them(warm):
    import torch.nn.functional as F

    cases = [("ScheduleInterleaved1F1B", 4, 2, "interleaved"),
             ("ScheduleInterleavedZeroBubble", 4, 1, "interleaved"),
             ("ScheduleGPipe", 2, 1, "interleaved"),
             ("ScheduleInterleaved1F1B", 4, 2, "contiguous")]
    res = dl.launch(torch_schedule_steps, cases, world_size=2, timeout=60, stream=False)
    for i, (name, m, _, layout) in enumerate(cases):
        model = dl.models.TinyMLP(d_in=4, d_hidden=8, d_out=2, n_hidden=4, seed=0).double()
        x, y = dl.models.regression_batch(2 * m, 4, 2, seed=1)
        pairs = zip(x.double().chunk(m), y.double().chunk(m), strict=True)
        want = [F.mse_loss(model(a), b) for a, b in pairs]
        torch.stack(want).mean().backward()
        assert res.values[0][i][0] is None
        got = res.values[1][i][0]
        if layout == "contiguous":   # the check can fail: another order of layers, another model
            assert got != pytest.approx([t.item() for t in want], rel=1e-6)
            continue
        assert got == pytest.approx([t.item() for t in want], rel=1e-10, abs=1e-12)
        grads = {**res.values[0][i][1], **res.values[1][i][1]}
        assert sorted(grads) == sorted(n for n, _ in model.named_parameters())
        for n, q in model.named_parameters():
            torch.testing.assert_close(grads[n], q.grad, rtol=1e-10, atol=1e-12,
                                       msg=lambda m, what=f"{name}: grad {n}": f"{what}: {m}")
