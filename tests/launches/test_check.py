"""dl.check: passes right answers, and fails every wrong one with the promised message."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dpmp_lab as dl
from dpmp_lab.check import CheckFailed

pytestmark = pytest.mark.usefixtures("no_leaks")


# -- a data-parallel step, right and wrong, against full-batch training in one process -----------


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def sgd(model: torch.nn.Module, lr: float = 0.1) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def dp_step(mistake: str | None = None) -> dict:
    r, ws = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=r).to(dl.device())   # each rank differs until rank 0's broadcast
    if mistake != "no broadcast":
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    x, y = (t.to(dl.device()) for t in batch())
    F.mse_loss(model(x.chunk(ws)[r]), y.chunk(ws)[r]).backward()
    grads = [p.grad for p in model.parameters()]
    if mistake == "flat":
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        flat /= ws
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    else:
        for g in grads:
            dist.all_reduce(g)
            if mistake != "sum":
                g /= ws
    sgd(model)
    return {**dl.check.grads(model), **dl.check.params(model)}


def full_batch_step(_mistake: str | None = None) -> dict:
    """The reference gets the same arguments as the parallel function; it ignores this one."""
    model = make_model(seed=0)
    x, y = batch()
    F.mse_loss(model(x), y).backward()
    sgd(model)
    return {**dl.check.grads(model), **dl.check.params(model)}


def test_right_dp_step_passes_numbers_and_communication(warm):
    res = dl.check.against_reference(dp_step, full_batch_step, world_size=4,
                                     comm={"broadcast": 4, "all_reduce": 4})
    assert res.traces is not None and len(res.values) == 4
    dl.check.same_on_all_ranks(res.values)


def test_sum_instead_of_average_names_tensor_rank_errors_and_the_mistake(warm):
    with pytest.raises(CheckFailed) as info:
        dl.check.against_reference(dp_step, full_batch_step, "sum", world_size=4)
    msg = str(info.value)
    assert msg.startswith("On rank 0, 'grad 0.weight' differs from the reference")
    assert "max abs error" in msg and "max rel error" in msg
    assert "every element is 4x the reference" in msg and "not divided by 4" in msg
    assert "'param 2.bias' on all ranks: differs" in msg   # every wrong tensor is listed


def test_missing_broadcast_is_caught_by_reference_and_by_replica_check(warm):
    res = dl.launch(dp_step, "no broadcast", world_size=2, stream=False)
    with pytest.raises(CheckFailed, match="broadcast from rank 0 missing"):
        dl.check.same_on_all_ranks(res.values)
    with pytest.raises(CheckFailed, match="On rank 0, 'grad 0.weight' differs"):
        dl.check.compare(res.values, full_batch_step())


def test_per_parameter_all_reduce_gets_the_bucketing_hint(warm):
    flat_ok = {"broadcast": 4, "all_reduce": 1}
    dl.check.against_reference(dp_step, full_batch_step, "flat", world_size=2, comm=flat_ok)
    with pytest.raises(CheckFailed) as info:
        res = dl.launch(dp_step, world_size=2, trace=True, stream=False)
        dl.check.comm(res, flat_ok, n_params=4)
    msg = str(info.value)
    assert "The communication of ranks 0, 1 is not what this exercise expects." in msg
    assert "all_reduce  any    any           1     4   <-" in msg
    assert "4 all-reduces = one per parameter tensor" in msg


# -- fp64 and shards -----------------------------------------------------------------------------


def partial_sums(n: int = 1000) -> dict:
    r, ws = dist.get_rank(), dist.get_world_size()
    v = torch.linspace(0, 1, n, device=dl.device()) ** 3   # default dtype: float64 when asked
    total = v[r::ws].sum()                    # a different summation order than the reference
    dist.all_reduce(total)
    return {"total": total, "dtype": str(total.dtype), "shard": v.chunk(ws)[r]}


def whole_sum(n: int = 1000) -> dict:
    v = torch.linspace(0, 1, n) ** 3
    return {"total": v.sum(), "dtype": str(v.dtype), "v": v}


def test_fp64_option_runs_both_sides_in_double_and_shards_are_compared(warm):
    res = dl.check.against_reference(
        partial_sums, whole_sum, world_size=3, dtype=torch.float64,
        expected_on_rank=lambda r, ref: {"total": ref["total"], "dtype": ref["dtype"],
                                         "shard": ref["v"].chunk(3)[r]})
    assert res.values[0]["dtype"] == "torch.float64"
    with pytest.raises(CheckFailed, match="On rank 1, 'shard' differs from the reference"):
        dl.check.against_reference(
            partial_sums, whole_sum, world_size=3, dtype=torch.float64,
            expected_on_rank=lambda r, ref: {"shard": ref["v"].chunk(3)[0]})


# -- numbers, without launching ------------------------------------------------------------------


@pytest.mark.parametrize("actual, expected, words", [
    (torch.ones(3) * 4, torch.ones(3), "every element is 4x the reference"),
    (torch.ones(3) / 2, torch.ones(3), "every element is 1/2 of the reference"),
    (torch.zeros(3), torch.ones(3), "every element is zero"),
    (torch.ones(2, 4), torch.ones(2, 8), "1/2 of the elements, a shard rather than the whole"),
    (torch.ones(2, 8), torch.ones(2, 4), "2x the elements"),
    (None, torch.ones(2), "is None: it was never computed"),
    (torch.tensor([1.0, float("nan")]), torch.ones(2), "max abs error inf at [1]"),
    (torch.tensor([1, 2]), torch.tensor([1, 3]), "differs in 1 of 2 elements"),
    (3, 4, "is 3, expected 4"),
])
def test_close_fails_with_a_reason(actual, expected, words):
    with pytest.raises(CheckFailed) as info:
        dl.check.close(actual, expected, name="grad w", rank=2)
    assert str(info.value).startswith("rank 2: 'grad w'") and words in str(info.value)


def test_values_no_computation_makes_are_named_as_memory_never_written():
    expected = torch.tensor([0.5, -1.0, 2.0])
    for got in (torch.tensor([0.5, 1.9e214, 2.0]), torch.tensor([float("nan"), -1.0, 2.0])):
        with pytest.raises(CheckFailed, match=r"before its handle's wait\(\)(.|\n)*"
                                              r"\[hint: value.unfilled\]"):
            dl.check.close(got, expected)
    with pytest.raises(CheckFailed) as info:   # merely wrong numbers: not this hint
        dl.check.close(torch.tensor([0.5, -1.5, 2.0]), expected)
    assert "value.unfilled" not in str(info.value)


def test_close_passes_within_tolerance_and_uses_fp32_defaults():
    dl.check.close(torch.ones(3) * (1 + 1e-6), torch.ones(3))
    with pytest.raises(CheckFailed, match=r"allowed \|got - expected\| <= 1e-06 \+ 1e-05"):
        dl.check.close(torch.ones(3) * (1 + 1e-4), torch.ones(3))


def test_compare_lists_missing_names_and_takes_per_rank_expectations():
    with pytest.raises(CheckFailed, match="On rank 1, 'b' is missing: rank 1 returned 'a'"):
        dl.check.compare([{"a": 1, "b": 2}, {"a": 1}], {"a": 1, "b": 2})
    dl.check.compare([torch.ones(1), torch.ones(1) * 2], lambda r: torch.ones(1) * (r + 1))
    dl.check.compare([torch.ones(1), torch.ones(1) * 2], [torch.ones(1), torch.ones(1) * 2])


def test_failure_shows_only_the_message_in_a_notebook():
    err = CheckFailed("On rank 0, 'x' differs")
    assert err._render_traceback_() == ["CheckFailed: On rank 0, 'x' differs"]
    assert isinstance(err, AssertionError)   # nbgrader and pytest treat it as a failed test


# -- communication, on hand-made traces ---------------------------------------------------------


def trace_of(*events: tuple, rank: int = 0) -> dl.Trace:
    t = dl.Trace()
    t.rank = rank
    for op, group, phase, label, *nbytes in events:
        t.events.append(dl.CommEvent(op, group, nbytes[0] if nbytes else 64, "float32", (16,),
                                     phase, False, label))
    return t


TP = (0, 1)


def comm_failure(traces, expected, **kw) -> str:
    with pytest.raises(CheckFailed) as info:
        dl.check.comm(traces, expected, **kw)
    return str(info.value)


def test_a_result_of_infinities_or_nans_is_no_multiple_of_the_reference():
    """A buffer read before its collective filled it can hold inf or nan: the scale hint must
    say nothing of it, not fail on it (an OverflowError reached a learner once)."""
    from dpmp_lab.check.hints import Scale

    for factor in (float("inf"), float("-inf"), float("nan"), 1e-320, 5e-324):
        assert Scale(factor).whole is None
    assert Scale(4.0).whole == 4 and Scale(0.25).whole == 4 and Scale(1.0).whole is None
    with pytest.raises(CheckFailed):
        dl.check.close(torch.full((3,), float("inf")), torch.ones(3), name="chunk")


def test_comm_counts_calls_per_phase_whatever_the_collective():
    """An exercise that leaves the collective to the learner counts calls by phase (op None),
    so that its visible test names none."""
    t = trace_of(("all_gather", TP, "forward", "tp"), ("all_gather", TP, "backward", "tp"),
                 ("reduce_scatter", TP, "backward", "tp"))
    dl.check.comm(t, {(None, None, "forward"): 1, (None, None, "backward"): 2})
    report = comm_failure(t, {(None, None, "forward"): 1, (None, None, "backward"): 3},
                          hints={(None, None, "backward"): "two calls per unit"})
    assert "  any  " in report and "Likely mistake: two calls per unit" in report
    assert "1 collective call(s) missing in backward" in report and "None" not in report


def test_comm_passes_exact_counts_per_op_group_and_phase():
    t = trace_of(("all_reduce", TP, "forward", "tp"), ("all_reduce", TP, "backward", "tp"))
    dl.check.comm(t, {("all_reduce", "tp", "forward"): 1, ("all_reduce", "tp", "backward"): 1})
    dl.check.comm([t], {("all_reduce", TP): 2})
    dl.check.comm(t, {"all_gather": 0}, only=False)


def test_wrong_group_is_named():
    t = trace_of(("all_reduce", (0, 1, 2, 3), "backward", None))
    msg = comm_failure(t, {("all_reduce", "dp", "backward"): 1})
    assert "all_reduce  dp         backward         1     0   <-" in msg
    assert "all_reduce  (0,1,2,3)  backward         0     1   <-" in msg
    assert "went to group (0,1,2,3) instead of the dp group: pass group=" in msg


def test_gather_where_a_sum_belongs():
    t = trace_of(("all_gather", TP, "forward", "tp"), ("all_reduce", TP, "backward", "tp"))
    msg = comm_failure(t, {("all_reduce", "tp", "forward"): 1,
                           ("all_reduce", "tp", "backward"): 1})
    assert "an all_gather where an all_reduce belongs" in msg
    t = trace_of(("all_reduce", TP, "forward", "tp"))
    assert "an all_reduce where an all_gather belongs" in comm_failure(t, {"all_gather": 1})


def reads_before_waiting(wait: bool) -> float:
    x = torch.ones(3, device=dl.device())
    handle = dist.all_reduce(x, async_op=True)
    if wait:
        handle.wait()
    return float(x[0])


def test_an_async_call_never_waited_on_is_named_as_such(warm):
    res = dl.launch(reads_before_waiting, False, world_size=2, trace=True, stream=False)
    with pytest.raises(CheckFailed) as info:
        dl.check.all_waited(res, "my_step")
    assert "rank 0: my_step issued 1 asynchronous call(s)" in str(info.value)
    assert "[hint: check.unwaited]" in str(info.value)
    dl.check.all_waited(dl.launch(reads_before_waiting, True, world_size=2, trace=True,
                                  stream=False), "my_step")


def divides_before_waiting(wait_first: bool) -> float:
    x = torch.ones(3, device=dl.device())
    handle = dist.all_reduce(x, async_op=True)
    if wait_first:
        handle.wait()
    x /= dist.get_world_size()
    handle.wait()
    return float(x[0])


def test_a_tensor_changed_before_its_wait_is_named_as_such_whatever_the_numbers(warm):
    res = dl.launch(divides_before_waiting, False, world_size=2, trace=True, stream=False)
    with pytest.raises(CheckFailed) as info:
        dl.check.all_waited(res, "my_step")
    assert "rank 0: my_step changed the tensor of an asynchronous all_reduce in place" in str(
        info.value)
    assert "[hint: check.written_in_flight]" in str(info.value)
    dl.check.untouched_in_flight(dl.launch(divides_before_waiting, True, world_size=2,
                                           trace=True, stream=False), "my_step")


def test_a_reduction_by_hand_is_named_by_its_collectives_and_none_is_asked_for():
    ranks = (0, 1, 2)
    one_rank = [trace_of(("reduce", ranks, None, None), ("broadcast", ranks, None, None),
                         rank=r) for r in ranks]
    with pytest.raises(CheckFailed) as info:
        dl.check.reduced_in_one_collective(one_rank, "my_step")
    msg = str(info.value)
    assert msg.startswith("my_step issued broadcast and reduce calls, on 3 ranks.")
    assert "reduced onto one rank and sent back" in msg and "[hint: dp.reduce_then_broadcast]" in msg
    gathered = [trace_of(("all_gather", ranks, None, None), rank=r) for r in ranks]
    with pytest.raises(CheckFailed, match=r"all N gradients(.|\n)*dp.gather_then_sum"):
        dl.check.reduced_in_one_collective(gathered, "my_step")
    dl.check.reduced_in_one_collective([trace_of(("all_reduce", ranks, None, None), rank=r)
                                        for r in ranks], "my_step")
    dl.check.reduced_in_one_collective(dl.Trace(), "my_step")   # no call: another check's


def test_collective_in_a_send_recv_exercise():
    t = trace_of(("all_reduce", (0, 1, 2), None, None))
    msg = comm_failure(t, {"send": 4, "recv": 4})
    assert "torch's all_reduce was called, but this exercise builds the communication from " \
           "point-to-point messages" in msg
    assert msg.count("Likely mistake") == 1 and "Also" not in msg


def test_sync_after_backward_instead_of_during_it():
    t = trace_of(("all_reduce", TP, None, "dp"), ("all_reduce", TP, None, "dp"))
    msg = comm_failure(t, {("all_reduce", "dp", "backward"): 2})
    assert "issued outside forward and backward, not during backward" in msg
    assert "gradient hooks" in msg


def test_multiples_missing_and_extra_calls():
    t = trace_of(*[("all_reduce", TP, None, "dp")] * 4)
    assert "2x the expected number of all_reduce calls on the dp group" in comm_failure(
        t, {("all_reduce", "dp"): 2})
    assert "1 all_reduce call(s) more than needed" in comm_failure(t, {"all_reduce": 3})
    assert "no broadcast was issued" in comm_failure(t, {"broadcast": 1, "all_reduce": 4})
    assert "4 unexpected all_reduce call(s) on group dp" in comm_failure(t, {})
    assert "3 all_reduce call(s) missing" in comm_failure(trace_of(*[("all_reduce", TP, None,
                                                                      "dp")] * 5),
                                                          {"all_reduce": 8})


def test_custom_hints_come_first_also_for_unexpected_calls():
    t = trace_of(("all_reduce", TP, "backward", "dp"))
    msg = comm_failure(t, {}, hints={"all_reduce": "an accumulation step must not communicate: "
                                     "wrap it in no_sync()"})
    assert "Likely mistake: an accumulation step must not communicate" in msg
    msg = comm_failure(t, {"all_reduce": 2}, hints={"all_reduce": "one per bucket"})
    assert "Likely mistake: one per bucket" in msg


def test_bytes_checked_exactly_or_within_a_tolerance():
    t = trace_of(("send", TP, None, None, 1000), ("send", TP, None, None, 1000))
    dl.check.comm(t, {"send": 2}, bytes={"send": 2000})
    msg = comm_failure(t, {"send": 2}, bytes={"send": 1500})
    assert "bytes of send on any (any): expected 1500 (1.5 KiB), seen 2000 (2.0 KiB)" in msg
    dl.check.comm(t, {"send": 2}, bytes={"send": 1900}, bytes_rtol=0.1)


def test_ranks_with_the_same_problem_are_reported_once_and_per_rank_expectations_work():
    traces = [trace_of(("send", TP, None, None), rank=0), trace_of(("recv", TP, None, None),
                                                                   rank=1)]
    dl.check.comm(traces, lambda r: {"send": 1} if r == 0 else {"recv": 1})
    msg = comm_failure(traces + [trace_of(("recv", TP, None, None), rank=2)],
                       lambda r: {"send": 1} if r == 0 else {"recv": 0})
    assert "The communication of ranks 1, 2 is not what" in msg and "rank 0" not in msg


def test_bad_keys_and_missing_traces_are_clear_errors():
    t = trace_of()
    with pytest.raises(ValueError, match="did you mean 'all_gather'"):
        dl.check.comm(t, {"allgather": 1})
    with pytest.raises(ValueError, match="op, \\(op, group\\) or \\(op, group, phase\\)"):
        dl.check.comm(t, {("all_reduce", "tp", "forward", 1): 1})
    with pytest.raises(ValueError, match="launch with trace=True"):
        dl.check.comm(dl.LaunchResult(values=[1], output=[""]), {"all_reduce": 1})


# -- overlap of communication with backward ---------------------------------------------------


def bucketed_step(kind: str):
    """One DP step of a 4-hidden-layer MLP whose gradients are all-reduced as `kind` says."""
    dev = dl.device()
    model = dl.models.TinyMLP(n_hidden=4).to(dev)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank())).to(dev)
    if kind in ("dp", "dp_no_overlap"):
        model = dl.dp.DataParallel(model, bucket_mb=0.002, overlap=kind == "dp")
    params = [p for p in model.parameters() if p.requires_grad]
    arrived = []

    def all_at_the_end(p):            # the classic fake: hooks, but every send in the last one
        arrived.append(p)
        if len(arrived) == len(params):
            for q in arrived:
                dist.all_reduce(q.grad)
    if kind == "last_hook":
        for p in params:
            p.register_post_accumulate_grad_hook(all_at_the_end)
    if kind == "blocking_hooks":      # issued at the right time, but backward waits for each
        for p in params:
            p.register_post_accumulate_grad_hook(lambda q: dist.all_reduce(q.grad))

    def waited_at_once(q):            # asynchronous, and waited for in the same hook
        dist.all_reduce(q.grad, async_op=True).wait()
    if kind == "waited_at_once":
        for p in params:
            p.register_post_accumulate_grad_hook(waited_at_once)
    with dl.trace(gradients_of=model) as t:
        model(x).sum().backward()
        if kind.startswith("dp"):
            model.finish_gradient_sync()
    return t


def test_overlap_is_graded_by_when_gradients_were_computed(warm):
    real = dl.launch(bucketed_step, "dp", world_size=2, stream=False).values
    dl.check.overlaps_backward(real)
    for t in real:
        [p] = t.overlap("all_reduce")
        assert p.grads == 10 and 0 < p.before_last_grad < p.calls
    for kind, words in (("dp_no_overlap", "no all_reduce was issued during backward"),
                        ("last_hook", "were issued after the last of its 10 gradients")):
        traces = dl.launch(bucketed_step, kind, world_size=2, stream=False).values
        with pytest.raises(dl.check.CheckFailed, match=words) as info:
            dl.check.overlaps_backward(traces)
        assert "Likely mistake: the gradient communication starts only once" in str(info.value)
    traces = dl.launch(bucketed_step, "blocking_hooks", world_size=2, stream=False).values
    assert all(p.before_last_grad > 0 and not p.overlapped for t in traces
               for p in t.overlap("all_reduce"))
    with pytest.raises(dl.check.CheckFailed, match="as blocking calls") as info:
        dl.check.overlaps_backward(traces)
    assert "[hint: overlap.blocking]" in str(info.value)
    traces = dl.launch(bucketed_step, "waited_at_once", world_size=2, stream=False).values
    assert all(p.async_before_last_grad > 0 and p.in_flight == 0 for t in traces
               for p in t.overlap("all_reduce"))
    assert all(len(t.waits) == 10 for t in traces)   # Work.wait, as the hooks called it
    with pytest.raises(dl.check.CheckFailed, match="each was waited for before backward "
                                                   "computed another gradient") as info:
        dl.check.overlaps_backward(traces)
    assert "[hint: overlap.blocking]" in str(info.value)
    assert dist.Work.wait.__module__ != "dpmp_lab.trace"   # torch's own again after the trace
    with pytest.raises(ValueError, match="gradients_of=model"):
        dl.check.overlaps_backward(dl.Trace())


def accumulation_traces():
    """Two steps of 3 micro-batches each way a learner accumulates, traced per way."""
    dev = dl.device()
    model = dl.dp.DataParallel(dl.models.TinyMLP(n_hidden=2).to(dev), bucket_mb=0.002)
    xs = torch.randn(6, 16, generator=torch.Generator().manual_seed(dist.get_rank())).to(dev)
    out = {}
    for kind in ("right", "one_backward", "every_backward", "never_sent", "first_sends"):
        with dl.trace(gradients_of=model.module) as t:
            for _step in range(2):
                model.zero_grad()
                if kind == "one_backward":
                    with model.no_sync():
                        loss = sum(model(x).sum() for x in xs.chunk(2))
                    model(xs[-1:]).sum().add(loss).backward()
                    model.finish_gradient_sync()
                    continue
                for k, x in enumerate(xs.chunk(3)):
                    sends = {"right": k == 2, "every_backward": True, "never_sent": False,
                             "first_sends": k == 0}[kind]
                    with contextlib.nullcontext() if sends else model.no_sync():
                        model(x).sum().backward()
                    if kind == "every_backward":
                        model.finish_gradient_sync()
                model.finish_gradient_sync()
        out[kind] = t
    return out, model.num_buckets


def test_accumulation_sends_names_what_the_backwards_sent(warm):
    res = dl.launch(accumulation_traces, world_size=2, stream=False).values
    n_buckets = res[0][1]
    assert n_buckets > 1
    traces = {kind: [r[0][kind] for r in res] for kind in res[0][0]}
    dl.check.accumulation_sends(traces["right"], 2, 3, n_buckets)
    for kind, words in (("one_backward", "a step ran 1 backward, not 3"),
                        ("every_backward", f"every micro-batch's backward sent all {n_buckets}"),
                        ("never_sent", "nothing was sent in any backward"),
                        ("first_sends", "went out in a backward before a step's last one")):
        with pytest.raises(dl.check.CheckFailed, match=words) as info:
            dl.check.accumulation_sends(traces[kind], 2, 3, n_buckets)
        assert "On rank 0, the all_reduce calls of each backward (2 step(s) of 3" in str(
            info.value)
        assert "expected" not in str(info.value)   # the failure states no pattern to copy
    with pytest.raises(dl.check.CheckFailed, match="dp.accumulation_sends"):
        dl.check.accumulation_sends(traces["right"], 2, 3, n_buckets + 1)
    with pytest.raises(dl.check.CheckFailed, match="a step ran 3 backwards where it has 2 "):
        dl.check.accumulation_sends(traces["right"], 2, 2, n_buckets)   # pieces of 2 rows


# -- references switched off while the learner's own code is graded ---------------------------


def uses_the_library_reference():
    x = torch.ones(2, device=dl.device())
    return dl.tp.copy_to_tp_region(x, dist.group.WORLD).sum().item()


def test_references_off_in_the_notebook_and_in_the_ranks(warm):
    with dl.check.references_off("tp", "GridLayout.groups", "dp.DataParallel"):
        with pytest.raises(dl.check.ReferenceSwitchedOff, match=r"dl.tp.ColumnParallelLinear is"):
            dl.tp.ColumnParallelLinear(4, 4)
        with pytest.raises(dl.check.ReferenceSwitchedOff, match=r"dl.GridLayout.groups"):
            dl.GridLayout(dp=2, tp=2).groups("dp")
        with pytest.raises(dl.check.ReferenceSwitchedOff, match="graded on your own code"):
            dl.dp.DataParallel(torch.nn.Linear(2, 2))
    assert dl.GridLayout(dp=2, tp=2).groups("dp") == [(0, 2), (1, 3)]   # restored
    assert dl.launch(uses_the_library_reference, world_size=1, stream=False).values == [2.0]
    graded = dl.check.with_references_off(uses_the_library_reference, "tp")
    with pytest.raises(dl.LaunchError, match="dl.tp.copy_to_tp_region is switched off"):
        dl.launch(graded, world_size=1, stream=False)
    with pytest.raises(ValueError, match="no 'tp.nothing_like_this'"):
        with dl.check.references_off("tp.nothing_like_this"):
            pass


def test_messages_for_empty_results_wrong_constants_and_switched_off_classes():
    with pytest.raises(CheckFailed, match="it is empty"):
        dl.check.compare([{"Y": torch.zeros(0)}], {"Y": torch.ones(4)})
    e = torch.linspace(1, 2, 6, dtype=torch.float64)
    with pytest.raises(CheckFailed, match="not over the ranks: this run has 2.*wrong constant factor") as info:
        dl.check.compare([{"m": 10 * e}, {"m": 10 * e}], {"m": e}, dtype=torch.float64)
    assert "ranks or micro-batches" not in str(info.value)
    with pytest.raises(CheckFailed, match="1/10 of the reference: divided by 10 once too often "
                                          r"\(not the ranks: this run has 2\)"):
        dl.check.compare([{"m": e / 10}, {"m": e / 10}], {"m": e}, dtype=torch.float64)
    with pytest.raises(CheckFailed, match="2x the reference: a sum over 2 ranks"):
        dl.check.compare([{"m": 2 * e}, {"m": 2 * e}], {"m": e}, dtype=torch.float64)
    with dl.check.references_off("ProcessGrid"):      # a top-level, guarded name too
        with pytest.raises(dl.check.ReferenceSwitchedOff, match="dl.ProcessGrid is switched"):
            dl.ProcessGrid(dp=1)
        dl.integrity.verify()                          # the sanctioned swap is no tampering
    assert dl.ProcessGrid.__name__ == "ProcessGrid"
    with dl.check.references_off("tp.ColumnParallelLinear"):
        with pytest.raises(dl.check.ReferenceSwitchedOff, match="ColumnParallelLinear is switc"):
            dl.tp.ColumnParallelLinear.from_dense(torch.nn.Linear(2, 2), None)


def test_the_relative_error_ignores_expected_values_near_zero():
    """An expected 1e-30 next to values of order 1 made the report say 'max rel error 3e+27'."""
    expected = torch.tensor([1.0, 2.0, 1e-30], dtype=torch.float64)
    got = torch.tensor([1.0, 2.5, 1e-3], dtype=torch.float64)
    with pytest.raises(dl.check.CheckFailed) as info:
        dl.check.close(got, expected, name="t")
    msg = str(info.value)
    assert "max rel error 0.25 (where |expected| >=" in msg and "e+2" not in msg


def test_row_parts_names_the_learners_action_never_the_gold_one():
    said = dl.check.row_parts("F0 F1 B0 B1".split(), "F0 B0 F1 B1".split())
    assert "at action 1 (F1)" in said and "the right actions, in another order" in said
    assert "B0 F1" not in said.split(":", 1)[1]       # the gold row's order is not shown
    short = dl.check.row_parts(["F0"], "F0 B0".split())
    assert "stops after 1 actions" in short and "1 actions, the schedule 2" in short
    assert "got nothing" in dl.check.row_parts([], ["F0"])
    wrong = dl.check.row_parts("F0 B1".split(), "F0 B0".split())
    assert "at action 1 (B1)" in wrong and "does not hold the same actions" in wrong
    messages = dl.check.row_parts(["send 1", "recv 1"], ["recv 1", "send 1"], "message", "the row")
    assert messages.startswith("got send 1, recv 1: it parts from the row at message 0")


def test_seen_keeps_what_a_check_saw_and_drops_its_guess_at_the_cause():
    """A test that knows the cause better words its own: e.seen() is the message without the
    check's "Likely mistake" lines and hint keys, every wrong value still listed."""
    with pytest.raises(CheckFailed) as caught:
        dl.check.compare([{"a": torch.ones(3) * 3, "b": torch.zeros(2)}] * 2,
                         {"a": torch.ones(3), "b": torch.ones(2)})
    full, seen = str(caught.value), caught.value.seen()
    assert "Likely mistake" in full and "[hint: scale." in full
    assert "Likely mistake" not in seen and "[hint:" not in seen
    assert "max abs error 2" in seen and "'b' on all ranks" in seen
    with pytest.raises(CheckFailed) as caught:
        dl.check.same_on_all_ranks([{"w": torch.ones(2)}, {"w": torch.zeros(2)}])
    assert caught.value.seen() == ("On rank 1, 'w' differs from rank 0's by up to 1 at [0] "
                                   "(rank 1 has 0, rank 0 has 1). Replicas must stay identical.")
