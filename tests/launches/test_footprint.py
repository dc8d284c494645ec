"""footprint.py: a memory timeline of model state, sampled at each moment of a step, against the
formulas of dl.cost for plain training, ZeRO-1 and FSDP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dpmp_lab as dl
from dpmp_lab.fsdp import FullyShardedDataParallel
from tests.support.sharding_models import Stack, my_rows, seeded

pytestmark = pytest.mark.usefixtures("no_leaks")


def footprints():
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = {}
    for stage in (0, 1, 3):
        model = seeded(Stack, 0).double()
        if stage == 3:
            model = FullyShardedDataParallel(model)
        if stage == 1:
            opt = dl.dp.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        with dl.footprint.record(model, opt) as fp:
            model(my_rows(x)).pow(2).mean().backward()
            fp.mark("after backward")
            opt.step()
            fp.mark("after step")
        out[stage] = fp
    return out


def test_footprint_measures_what_the_formulas_say(warm):
    res = dl.launch(footprints, world_size=2, stream=False)
    for out in res.values:
        plain, fsdp = out[0], out[3]
        n = 36 + 49 + 40
        formula = dl.cost.memory(n, dp=1, precision="fp32")
        assert plain.peak("params") == 8 * n == 2 * formula.params   # fp64: twice fp32's bytes
        assert plain.samples[-1].grads == 8 * n
        assert plain.samples[-1].optimizer == 2 * 8 * n + 6 * 4     # two moments, 6 step counters
        # ZeRO-1 at its formula: parameters, gradients and the shard are views of two flat
        # buffers (125 numbers padded to 126), only the optimizer state is halved
        zero1 = out[1]
        assert zero1.peak("params") == zero1.samples[-1].params == 8 * 126
        assert zero1.peak("grads") == zero1.samples[-1].grads == 8 * 126
        assert zero1.samples[-1].optimizer == 2 * 8 * 63 + 4          # one step counter
        assert zero1.peak("total") < plain.peak("total")
        shards = 18 + 25 + 20
        assert fsdp.samples[0].params == 8 * shards and fsdp.samples[0].grads == 0
        # the shards plus the largest unit, gathered whole: Linear(6, 7) padded to 50 elements
        assert fsdp.peak("params") == 8 * shards + 8 * 50 == dl.cost.fsdp_peak_param_bytes(
            2 * shards, 2, 50, master=torch.float64)
        moments = [s.moment for s in fsdp.samples]
        assert moments[:3] == ["start", "layers.0 forward begins", "layers.0 forward ends"]
        assert fsdp.samples[1].params == 8 * shards + 8 * 36        # layers.0 gathered
        assert fsdp.samples[3].params == 8 * shards + 8 * 50        # freed, layers.1 gathered
        assert fsdp.samples[-1].optimizer == 2 * 8 * shards + 3 * 4
        assert "layers.1 forward begins" in str(fsdp.picture(formula))
        assert "<svg" in fsdp.picture(formula)._repr_svg_()


# -- held(): every tensor, wherever it is kept -------------------------------------------------

POOL: list = []


def _kept_in_every_way():
    """Bytes a window leaves held when what it makes is kept in a global list, an attribute, a
    closure, autograd's saved tensors, a view of a bigger storage, or nowhere; one storage seen
    through two tensors counts once."""
    class Holder:
        pass

    holder, out = Holder(), {}
    for how in ("nowhere", "global", "attribute", "closure", "saved", "view", "twice"):
        with dl.footprint.held() as mem:
            t = torch.zeros(100, dtype=torch.float64)          # 800 bytes
            if how == "global":
                POOL.append(t)
            elif how == "attribute":
                holder.kept = t
            elif how == "closure":
                holder.read = (lambda kept=t: kept)            # noqa: E731
            elif how == "saved":
                leaf = torch.ones(100, dtype=torch.float64, requires_grad=True)
                holder.out = (leaf * 2).sin()     # keeps leaf * 2 for backward, and itself
            elif how == "view":
                holder.view = t[:1]               # the whole storage stays
            elif how == "twice":
                holder.a, holder.b = t, t.view(10, 10)
            mem.mark("made")
            del t
        out[how] = (mem.at("made"), mem.end)
    POOL.clear()
    return out


def test_held_counts_each_storage_once_wherever_it_is_kept(warm):
    # in a rank, as the notebooks measure (a walk of this test process's objects takes seconds)
    out = dl.launch(_kept_in_every_way, world_size=1, stream=False).values[0]
    assert out["nowhere"] == (800, 0)
    for how in ("global", "attribute", "closure", "view", "twice"):
        assert out[how][1] == 800, (how, out[how])
    # the leaf (800), the sin's input saved for backward (800), the result (800), and the
    # multiplication's scalar
    assert 3 * 800 <= out["saved"][1] <= 3 * 800 + 8, out["saved"]


def _followed_through_a_handle():
    rank, peer = torch.distributed.get_rank(), 1 - torch.distributed.get_rank()
    followed, handles = dl.footprint.Followed(), []
    for _ in range(3):
        t = torch.full((4,), float(rank))
        followed(t)
        if rank == 0:
            handles.append(torch.distributed.isend(t.detach()[:2], peer))
        else:
            torch.distributed.recv(torch.empty(2), peer)
        del t
    alive_with_handles = followed.alive()
    while handles:
        handles.pop().wait()
    return alive_with_handles, followed.alive()


def test_followed_sees_a_storage_a_send_handle_keeps(warm):
    """A view sent with isend is kept by the handle in C++: the storage stays allocated until
    the handle is dropped, which a weak reference to the Python tensor would not see."""
    res = dl.launch(_followed_through_a_handle, world_size=2, stream=False)
    assert res.values[0][1] == 0 and res.values[1] == (0, 0)
    assert res.values[0][0] == 3


def test_held_on_the_device_audits_stand_in_counts_the_cpu():
    """Under the device audit dl.device() is "cpu:0": the CPU's tensors are its tensors."""
    with dl.footprint.held("cpu:0") as mem:
        kept = torch.zeros(10)
    assert mem.end == 40 and kept.numel() == 10


def test_reads_names_the_storages_an_operation_touched_and_held_names_what_a_mark_holds():
    """What a later step reads of what is held, by storage: a view counts as its base, a
    tensor nothing reads is not among them, and autograd's own operations count (a backward
    run inside reads what the forward saved)."""
    with dl.footprint.held("cpu") as mem:
        used, unused = torch.zeros(10), torch.zeros(20)
        leaf = torch.ones(3, requires_grad=True)
        doubled = leaf * 2                 # sin saves it for backward
        out = doubled.sin().sum()
        mem.mark("kept")
    kept = mem.storages["kept"]
    assert kept[used.untyped_storage().data_ptr()] == 40
    assert kept[unused.untyped_storage().data_ptr()] == 80
    assert mem.marks["kept"] == sum(kept.values())
    with dl.footprint.reads() as r:
        (used[2:5] + 1).sum()
        out.backward()
    assert used.untyped_storage().data_ptr() in r.storages
    assert unused.untyped_storage().data_ptr() not in r.storages
    assert doubled.untyped_storage().data_ptr() in r.storages
    assert leaf.grad is not None


def test_made_follows_what_its_window_made_wherever_it_is_kept_and_nothing_else():
    before = torch.zeros(1000, dtype=torch.float64)
    kept = []
    with dl.footprint.made() as made:
        a = torch.randn(100, dtype=torch.float64)        # 800 bytes
        b = a * 2                                        # 800
        before.add_(1.0)                                 # in place into what it did not make
        a.mul_(3)                                        # in place: nothing new
        view = b[:10]                                    # b's storage, once
        kept.append(torch.ones(50, dtype=torch.float64))  # 400, in a list
        assert made.alive() == 2000
        del a, b
        assert made.alive() == 1200                      # the view keeps b's storage
        del view
        assert made.alive() == 400
        x = torch.randn(4, 3, requires_grad=True)
        y = torch.tanh(x)                                # its graph saves y
        del y                                            # y and its graph go; x stays
    assert made.alive() == 400 + 4 * 3 * 4


def test_made_with_written_counts_a_buffer_made_before_that_the_window_fills():
    workspace = torch.empty(100, dtype=torch.float64)      # 800 bytes, made before
    untouched = torch.zeros(10, dtype=torch.float64)
    with dl.footprint.made(written=True) as made:
        workspace[:10].copy_(untouched + 1)                  # fills the workspace
        assert made.alive() == 800                           # the sum (80 B) is gone
    with dl.footprint.made() as plain:
        workspace[:10].copy_(untouched + 1)
    assert plain.alive() == 0


def test_made_without_scalars_leaves_out_the_losses_a_loop_keeps_for_its_log():
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 8, dtype=torch.float64)
    for scalars in (True, False):
        with dl.footprint.made(scalars=scalars) as made:
            losses, outs = [], []
            for _ in range(3):
                out = x * 2                               # 256 bytes, kept
                losses.append(F.mse_loss(out, y).detach())
                outs.append(out)
        kept = sum(t.untyped_storage().nbytes() for t in losses)
        assert kept > 0
        assert made.alive() == 3 * 256 + (kept if scalars else 0)


def _kept_and_frozen() -> int:
    import gc

    with dl.footprint.held() as mem:
        kept = torch.zeros(10_000, dtype=torch.float64)   # 80,000 bytes, kept
        gc.freeze()                                        # out of gc's sight, on purpose
        mem.mark("after")
    del kept
    return mem.at("after")


def test_a_tensor_frozen_out_of_gcs_sight_is_still_held():
    """The startup freeze hides the imports from held()'s walks; a gc.freeze() of the rank's
    own code does not hide what it made (the walk puts it back in sight first)."""
    assert dl.launch(_kept_and_frozen, world_size=1, stream=False).values[0] == 80_000
