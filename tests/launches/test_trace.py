"""dl.trace: every collective and p2p op counted once, with its group, phase and bytes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import dpmp_lab as dl

pytestmark = pytest.mark.usefixtures("no_leaks")


def _ours(t: dl.Trace) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ev in t.events:
        counts[ev.op] = counts.get(ev.op, 0) + 1
    return counts


# CommDebugMode's names (legacy funcol and c10d packets) -> ours
_CDM = {"all_reduce": "all_reduce", "allreduce_": "all_reduce", "all_gather_into_tensor":
        "all_gather", "allgather_": "all_gather", "_allgather_base_": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
        "reduce_scatter_": "reduce_scatter", "broadcast_": "broadcast", "broadcast":
        "broadcast", "alltoall_base_": "all_to_all", "alltoall_": "all_to_all",
        "all_to_all_single": "all_to_all"}


def _theirs(cdm) -> dict[str, int]:
    counts: dict[str, int] = {}
    for packet, n in cdm.get_comm_counts().items():
        name = _CDM[str(packet).split(".")[-1]]
        counts[name] = counts.get(name, 0) + n
    return counts


def collectives_both_ways():
    """Each snippet under dl.trace and CommDebugMode at once; return both counts."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor.debug import CommDebugMode

    ws, r = dist.get_world_size(), dist.get_rank()
    snippets = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(5)),
        "all_reduce async": lambda: dist.all_reduce(torch.ones(5), async_op=True).wait(),
        "all_gather list": lambda: dist.all_gather([torch.empty(3) for _ in range(ws)],
                                                   torch.ones(3)),
        "all_gather tensor": lambda: dist.all_gather_into_tensor(torch.empty(3 * ws),
                                                                 torch.ones(3)),
        "reduce_scatter tensor": lambda: dist.reduce_scatter_tensor(torch.empty(2),
                                                                    torch.ones(2 * ws)),
        "reduce_scatter list": lambda: dist.reduce_scatter(
            torch.empty(2), [torch.ones(2) for _ in range(ws)]),
        "broadcast": lambda: dist.broadcast(torch.ones(4), src=0),
        "all_to_all single": lambda: dist.all_to_all_single(torch.empty(ws), torch.ones(ws)),
        "all_to_all list": lambda: dist.all_to_all([torch.empty(1) for _ in range(ws)],
                                                   [torch.ones(1) * r for _ in range(ws)]),
        "functional all_reduce": lambda: funcol.all_reduce(torch.ones(3), "sum",
                                                           dist.group.WORLD).wait(),
        "functional all_gather": lambda: funcol.all_gather_tensor(torch.ones(3), 0,
                                                                  dist.group.WORLD).wait(),
        "a mix": lambda: [dist.all_reduce(torch.ones(2)) for _ in range(3)]
        + [dist.broadcast(torch.ones(2), 1), dist.all_gather_into_tensor(torch.empty(ws),
                                                                         torch.ones(1))],
    }
    out = {}
    for name, snippet in snippets.items():
        with dl.trace() as t, CommDebugMode() as cdm:
            snippet()
        out[name] = (_ours(t), _theirs(cdm))
    return out


def test_counts_equal_torch_comm_debug_mode(warm):
    res = dl.launch(collectives_both_ways, world_size=3, stream=False)
    for rank, per_snippet in enumerate(res.values):
        for name, (ours, theirs) in per_snippet.items():
            assert theirs, f"CommDebugMode saw nothing for {name}"
            assert ours == theirs, f"rank {rank}, {name}: ours {ours}, CommDebugMode {theirs}"


def point_to_point():
    from torch.distributed.tensor.debug import CommDebugMode

    r, ws = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % ws, (r - 1) % ws
    with dl.trace() as t, CommDebugMode() as cdm:
        if r == 0:
            dist.send(torch.ones(4), dst=1)
        elif r == 1:
            dist.recv(torch.empty(4), src=0)
        ops = [dist.P2POp(dist.isend, torch.ones(2, dtype=torch.float64), right),
               dist.P2POp(dist.irecv, torch.empty(2, dtype=torch.float64), left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if r == 0:
            dist.isend(torch.ones(3), dst=ws - 1).wait()
        elif r == ws - 1:
            dist.irecv(torch.empty(3), src=0).wait()
    return t, sum(cdm.get_comm_counts().values())


def test_send_and_recv_are_counted_where_comm_debug_mode_counts_none(warm):
    res = dl.launch(point_to_point, world_size=3, stream=False)
    for rank, (t, cdm_total) in enumerate(res.values):
        assert cdm_total == 0
        sends, recvs = t.select("send"), t.select("recv")
        right, left = (rank + 1) % 3, (rank - 1) % 3
        batch_send = [e for e in sends if e.dtype == "float64"]
        batch_recv = [e for e in recvs if e.dtype == "float64"]
        assert [(e.peer, e.nbytes, e.async_op) for e in batch_send] == [(right, 16, True)]
        assert [(e.peer, e.nbytes, e.async_op) for e in batch_recv] == [(left, 16, True)]
    t0, t1, t2 = (v[0] for v in res.values)
    assert [(e.peer, e.nbytes, e.async_op) for e in t0.select("send")
            if e.dtype == "float32"] == [(1, 16, False), (2, 12, True)]
    assert [(e.peer, e.async_op) for e in t1.select("recv") if e.dtype == "float32"] == [
        (0, False)]
    assert [(e.peer, e.nbytes, e.async_op) for e in t2.select("recv")
            if e.dtype == "float32"] == [(0, 12, True)]
    assert t0.count() == 4 and t1.count() == 3 and t2.count() == 3
    assert all(e.group == (0, 1, 2) and e.phase is None for e in t0.events)


def ddp_steps(bucket_cap_mb: float):
    torch.manual_seed(dist.get_rank())
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model[2].bias.requires_grad_(False)   # frozen: never all-reduced
    with dl.trace() as build:
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    steps = []
    for _ in range(4):
        with dl.trace() as t:
            ddp(torch.randn(3, 4)).sum().backward()
        steps.append(t)
    trainable = sum(p.requires_grad for p in model.parameters())
    return build, steps, trainable


def test_torch_ddp_all_reduces_are_seen_in_backward(warm):
    res = dl.launch(ddp_steps, 0, world_size=2, stream=False)
    for build, steps, trainable in res.values:
        assert build.count("broadcast") >= 1   # DDP broadcasts rank 0's weights
        # the first step has one bucket; after DDP rebuilds them, bucket_cap_mb=0 gives one
        # all-reduce per trainable tensor, every one issued from autograd's backward
        assert steps[0].count("all_reduce") == 1
        assert steps[0].count("all_reduce", phase="backward") == 1
        for t in steps[2:]:
            assert t.count("all_reduce") == trainable == 5
            assert t.count("all_reduce", phase="backward") == trainable
            assert all(e.async_op for e in t.select("all_reduce"))


def dtensor_mlp():
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    grid = dl.ProcessGrid(dp=dist.get_world_size() // 2, tp=2)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    parallelize_module(mlp, grid.mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 8, requires_grad=True)
    with dl.trace() as t:
        mlp(x).sum().backward()
    return t, grid.tp_ranks


@pytest.mark.parametrize("world", [2, 4])
def test_dtensor_colwise_rowwise_mlp_is_one_all_reduce_each_way_on_tp(warm, world):
    res = dl.launch(dtensor_mlp, world_size=world, stream=False)
    for t, tp_ranks in res.values:
        assert t.count() == 2, t.events
        assert t.count("all_reduce", group="tp", phase="forward") == 1
        assert t.count("all_reduce", group="tp", phase="backward") == 1
        assert t.count("all_reduce", group=tp_ranks) == 2
        fwd = t.select(phase="forward")[0]
        assert fwd.nbytes == 4 * 8 * 4 and fwd.shape == (4, 8) and fwd.label == "tp"


def payloads():
    ws = dist.get_world_size()
    with dl.trace() as t:
        dist.all_reduce(torch.ones(6, 5))                               # 30 * 4
        dist.all_reduce(torch.ones(7, dtype=torch.float64))             # 7 * 8
        dist.all_reduce(torch.ones(3, dtype=torch.int64))               # 3 * 8
        dist.all_gather_into_tensor(torch.empty(2 * ws), torch.ones(2))  # shard: 2 * 4
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * ws))  # whole input: 3ws * 4
        dist.broadcast(torch.ones(5, dtype=torch.bfloat16), src=0)     # 5 * 2
        dist.barrier()                                                  # 0
    return t


def test_bytes_are_numel_times_element_size_of_each_payload(warm):
    res = dl.launch(payloads, world_size=2, stream=False)
    for t in res.values:
        assert [e.nbytes for e in t.events] == [120, 56, 24, 8, 24, 10, 0]
        assert [e.dtype for e in t.events][:3] == ["float32", "float64", "int64"]
        assert t.bytes("all_reduce") == 200 and t.bytes() == 242
        assert t.events[-1].op == "barrier"


def waited_and_not():
    """A blocking all-reduce, an async one waited for, two async ones never waited for."""
    x = torch.ones(4, device=dl.device())
    with dl.trace() as t:
        dist.all_reduce(x)
        dist.all_reduce(x, async_op=True).wait()
        handles = [dist.all_reduce(x, async_op=True) for _ in range(2)]
    for h in handles:
        h.wait()                 # outside the trace: not counted as waited
    return t.unwaited()


def test_unwaited_counts_async_calls_no_wait_followed(warm):
    assert dl.launch(waited_and_not, world_size=2, stream=False).values == [2, 2]


def written_while_on_the_wire():
    """Four async all-reduces: one divided before its wait, one after, one handed over as a view
    of a buffer written elsewhere, one whose irecv buffer was filled by hand before the wait;
    and a reduce-scatter whose output was divided before its wait (not what it sends)."""
    x, y = (torch.ones(4, device=dl.device()) for _ in range(2))
    buffer = torch.zeros(8, device=dl.device())
    with dl.trace() as t:
        handle = dist.all_reduce(x, async_op=True)
        x /= 2                                    # written while on the wire
        handle.wait()
        handle = dist.all_reduce(y, async_op=True)
        handle.wait()
        y /= 2                                    # after its wait: fine
        handle = dist.all_reduce(buffer[:4], async_op=True)
        buffer[4:] += 1                           # another part of the storage: not followed
        handle.wait()
        peer = 1 - dist.get_rank()
        handle = (dist.isend(x, dst=peer) if dist.get_rank() == 0 else dist.irecv(y, src=peer))
        if dist.get_rank() == 1:
            y.fill_(7)                            # the receive's buffer, before its wait
        handle.wait()
        out = torch.empty(2, device=dl.device())
        handle = dist.reduce_scatter_tensor(out, torch.ones(4, device=dl.device()),
                                            async_op=True)
        out /= 2                                  # the output, divided before it is filled
        handle.wait()
    return [(e.op, e.async_op) for e in t.written_in_flight()]


def test_a_tensor_changed_in_place_before_its_wait_is_noted_and_nothing_else(warm):
    values = dl.launch(written_while_on_the_wire, world_size=2, stream=False).values
    assert values == [[("all_reduce", True), ("reduce_scatter", True)],
                      [("all_reduce", True), ("recv", True), ("reduce_scatter", True)]]


class _Identity(torch.autograd.Function):
    """all-reduce in forward, nothing in backward: Megatron's g, to see the forward phase."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()   # .sum()'s gradient is one number expanded: not a buffer to write
        dist.all_reduce(grad)
        return grad


def phases():
    w = torch.randn(3, requires_grad=True)
    with dl.trace() as t:
        y = _Identity.apply(w * 2)                         # forward (inside a Function)
        outs = [torch.empty(3) for _ in range(dist.get_world_size())]
        dist.all_gather(outs, w * 3)                        # forward (input requires grad)
        y.sum().backward()                                  # backward (from the Function)
        dist.all_reduce(w.grad)                             # none: after backward returned
        with torch.no_grad():
            _Identity.apply(w * 2)                          # none: nothing is recorded
        h = w.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))
        (w * 5).sum().backward()                            # backward (from a gradient hook)
        h.remove()
    return [(e.op, e.phase) for e in t.events]


def test_phase_is_forward_backward_or_none(warm):
    res = dl.launch(phases, world_size=2, stream=False)
    assert res[0] == [("all_reduce", "forward"), ("all_gather", "forward"),
                      ("all_reduce", "backward"), ("all_reduce", None), ("all_reduce", None),
                      ("all_reduce", "backward")]


def gather_in_pre_forward_hook(module, args):
    """What a learner's FSDP unit does: all-gather under no_grad before the module runs."""
    with torch.no_grad():
        out = torch.empty(2 * dist.get_world_size())
        dist.all_gather_single(out, torch.ones(2))


def module_phases():
    layer = torch.nn.Linear(3, 3)
    layer.register_forward_pre_hook(gather_in_pre_forward_hook)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    for sub in model:
        fully_shard(sub)
    fully_shard(model)
    x = torch.randn(2, 4)
    with dl.trace() as t:
        with torch.no_grad():
            layer(torch.randn(1, 3))                       # forward: inside a module
            dist.all_gather_single(torch.empty(2 * dist.get_world_size()), torch.ones(2))
        model(x).sum().backward()                          # FSDP2: gathers under no_grad
    try:
        with dl.trace(), torch.no_grad():
            torch.nn.Sequential(torch.nn.Linear(1, 1), _Raises())(torch.ones(1))
    except RuntimeError:
        pass
    with dl.trace() as after:                              # a forward that raised left
        dist.all_reduce(torch.ones(1))                     # no phase behind
    return [(e.op, e.phase) for e in t.events], [e.phase for e in after.events]


class _Raises(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


def test_communication_inside_a_module_forward_is_forward_whatever_the_grad_mode(warm):
    res = dl.launch(module_phases, world_size=2, stream=False)
    for events, after in res.values:
        assert events[:2] == [("all_gather", "forward"), ("all_gather", None)]
        fsdp = events[2:]
        assert fsdp.count(("all_gather", "forward")) == 2       # one per fully_shard'ed layer
        assert fsdp.count(("all_gather", "backward")) == 2
        assert fsdp.count(("reduce_scatter", "backward")) == 2
        assert len(fsdp) == 6
        assert after == [None]


def traced_work(extra: int):
    for _ in range(extra):
        dist.all_reduce(torch.ones(2))
    with dl.trace() as inner:
        dist.broadcast(torch.ones(1), src=0)
    return inner


def test_launch_trace_true_returns_one_trace_per_rank(warm):
    res = dl.launch(traced_work, 2, world_size=3, trace=True, stream=False)
    assert len(res.traces) == 3
    for rank, (t, inner) in enumerate(zip(res.traces, res.values, strict=True)):
        assert t.rank == rank and inner.rank == rank
        assert [e.op for e in t.events] == ["all_reduce", "all_reduce", "broadcast"]
        assert [e.op for e in inner.events] == ["broadcast"]   # nested traces both record
        assert "rank" in repr(t) and "2 all_reduce" in repr(t)
    assert dl.launch(traced_work, 0, world_size=2, stream=False).traces is None


def test_summary_and_per_group_read_well(warm):
    res = dl.launch(traced_work, 2, world_size=2, trace=True, stream=False)
    t = res.traces[1]
    text = str(t.summary())
    assert "communication issued by rank 1" in text
    assert "all_reduce" in text and "(0,1)" in text and "16 B" in text
    assert "<table" in t.summary()._repr_html_() and "<td>all_reduce</td>" in t._repr_html_()
    assert t.per_group() == {(0, 1): {"all_reduce": 2, "broadcast": 1}}
    table = str(dl.viz.comm(res))
    assert "rank 0" in table and "rank 1" in table and "broadcast" in table


def test_filters_explain_bad_names():
    t = dl.Trace()
    t.events.append(dl.CommEvent("all_reduce", (0, 1), 8, "float32", (2,), None, False, "dp"))
    with pytest.raises(ValueError, match="did you mean 'all_reduce'"):
        t.count("allreduce")
    with pytest.raises(ValueError, match="phase must be"):
        t.count(phase="fwd")
    assert t.count(group="dp") == 1 and t.count(group=[1, 0]) == 1 and t.count(group="tp") == 0
    assert t.count(phase="none") == 1 and t.count(phase="forward") == 0


def test_tracing_leaves_the_dispatcher_as_it_was():
    def python_kernels() -> str:
        return torch._C._dispatch_dump_table("c10d::allreduce_")

    before = python_kernels()
    with dl.trace() as outer:
        with dl.trace():
            assert "BackendSelect: registered" in python_kernels()
        assert "BackendSelect: registered" in python_kernels()   # outer still active
    assert python_kernels() == before and outer.events == []


def test_comm_chart_shows_bytes_per_rank_and_group(warm):
    res = dl.launch(traced_work, 2, world_size=2, trace=True, stream=False)
    chart = dl.viz.comm_chart(res)
    text = str(chart)
    assert "rank 1  (0,1)" in text and "20 B" in text   # 2 all-reduces of 8 B + 4 B broadcast
    svg = chart._repr_svg_()
    assert svg.startswith("<svg") and "rank 0, (0,1)" in svg
    assert str(dl.viz.comm_chart(dl.Trace())) == "no communication"
