"""The device audit: GPU-correct code passes on the CPU, code that would misplace data fails.

Every planted mistake below works on a laptop (gloo, everything on the CPU) and breaks, or runs
on the wrong device, on a GPU server; under `device_audit=True` it fails with a message that
names the line and says to use dl.device(). The references of the library run under the audit
too, with the same numbers as without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import dpmp_lab as dl
from dpmp_lab import hybrid
from dpmp_lab.launcher import launch as launch_module
from dpmp_lab.launcher.audit import AUDIT_DEVICE
from tests.conftest import ROOT
from tests.support import readme_examples

pytestmark = pytest.mark.usefixtures("no_leaks")


def audited(fn, *args, world_size: int = 2, **kwargs):
    return dl.launch(fn, *args, world_size=world_size, device_audit=True, stream=False,
                     timeout=60, **kwargs)


def audit_failure(fn, *args, world_size: int = 2) -> str:
    """The message of rank 0's failure under the audit (every rank fails the same way)."""
    with pytest.raises(dl.LaunchError) as info:
        audited(fn, *args, world_size=world_size)
    failure = info.value.failures[min(info.value.failures)]
    assert failure.exc_type == "dpmp_lab.launcher.audit.DeviceAuditError", failure.describe()
    return failure.message


# -- code written for GPUs passes ------------------------------------------------------------


def gpu_style_step():
    dev = dl.device()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=gen).to(dev)           # seeded on the CPU, then moved
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(x).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        dist.all_reduce(torch.zeros(p.numel(), device=p.device))   # p.device is the device
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    parts = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    with torch.device(dev):
        buf = torch.ones(3)
    dist.all_reduce(buf)
    dist.all_reduce(flat.new_ones(2))
    opt.step()
    dist.barrier()                                                # torch's own tensor
    objects = [None] * dist.get_world_size()
    dist.all_gather_object(objects, {"rank": dist.get_rank()})   # torch's own CPU tensors
    scale = torch.tensor(2.0)                                     # a CPU scalar may mix
    return {"device": str(dev), "x.device": str(x.device), "sum": (buf * scale).sum().item(),
            "moved": model[0].weight.device == dev, "objects": objects,
            "weight": model[0].weight.detach().cpu()}


def test_code_written_for_gpus_passes_and_computes_the_same(warm):
    res = audited(gpu_style_step)
    plain = dl.launch(gpu_style_step, world_size=2, stream=False, device_audit=False)
    assert res.device_audit and not plain.device_audit
    for got, want in zip(res.values, plain.values, strict=True):
        assert got["device"] == got["x.device"] == str(AUDIT_DEVICE) and got["moved"]
        assert want["device"] == "cpu"
        assert got["sum"] == want["sum"] == 12.0
        assert got["objects"] == [{"rank": 0}, {"rank": 1}]
        assert torch.equal(got["weight"], want["weight"])
    assert "device audit" in res.describe() and "CPU tensors through gloo" in res.describe()


def ddp_and_dtensor():
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = dl.device()
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(4, 4).to(dev))
    ddp(torch.ones(2, 4, device=dev)).sum().backward()
    grid = dl.ProcessGrid(dp=1, tp=2)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).to(dev)
    parallelize_module(mlp, grid.mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    mlp(torch.randn(4, 8).to(dev)).sum().backward()
    return ddp.module.weight.grad.sum().item()


def test_torch_ddp_and_dtensor_on_the_device_pass(warm):
    res = audited(ddp_and_dtensor)
    assert res.values[0] == res.values[1]


# -- planted mistakes fail, naming the line --------------------------------------------------


def tensor_without_device_to_a_collective():
    t = torch.ones(3)
    dist.all_reduce(t)


def tensor_without_device_mixed_with_the_device():
    x = torch.ones(4, device=dl.device())
    bias = torch.zeros(4)
    return (x + bias).sum().item()


def model_never_moved():
    model = nn.Linear(4, 2)
    x = torch.randn(3, 4).to(dl.device())
    return model(x)


def model_and_data_never_moved():
    model = nn.Linear(4, 2)
    model(torch.randn(3, 4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)


def scaffold_allocates_on_the_cpu():
    mine = torch.ones(2, device=dl.device())
    parts = [torch.empty(2) for _ in range(dist.get_world_size())]   # the scaffold's buffers
    dist.all_gather(parts, mine)


def argument_from_the_notebook_used_as_is(weights):
    dist.broadcast(weights, src=0)


def cpu_generator_draws_on_the_device():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(3, generator=gen, device=dl.device())


def moved_back_to_the_cpu_and_sent():
    x = torch.ones(3, device=dl.device())
    dist.all_reduce(x.cpu())


def error_caught_by_the_code():
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError:
        pass
    return 1


def gradient_assigned_from_the_cpu():
    p = nn.Parameter(torch.ones(2, device=dl.device()))
    p.grad = torch.zeros(2)


def recv_into_a_cpu_buffer():
    if dist.get_rank() == 0:
        dist.send(torch.ones(2, device=dl.device()), dst=1)
    else:
        buf = torch.empty(2)
        dist.recv(buf, src=0)


def gradient_hook_sends_a_cpu_buffer():
    model = nn.Linear(4, 2).to(dl.device())

    def hook(p):                      # overlapped data parallel: send as gradients arrive
        bucket = torch.zeros(p.numel())
        bucket.copy_(p.grad.flatten())
        dist.all_reduce(bucket)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    model(torch.ones(3, 4, device=dl.device())).sum().backward()


class _SendsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        total = torch.zeros(grad.shape)
        dist.all_reduce(total)
        return grad


def custom_backward_sends_a_cpu_buffer():
    x = torch.ones(3, device=dl.device(), requires_grad=True)
    _SendsInBackward.apply(x).sum().backward()


def deprecated_collective_into_a_cpu_buffer():
    mine = torch.ones(2, device=dl.device())
    out = torch.empty(2 * dist.get_world_size())
    with warnings.catch_warnings():   # all_gather_into_tensor is deprecated in torch 2.13
        warnings.simplefilter("ignore")
        dist.all_gather_into_tensor(out, mine)


def numpy_of_a_device_tensor():
    return torch.ones(2, device=dl.device()).numpy()


PLANTED = [
    (tensor_without_device_to_a_collective, (), ["an all_reduce", "`t = torch.ones(3)`"]),
    (tensor_without_device_mixed_with_the_device, (), ["mixes", "`bias = torch.zeros(4)`"]),
    (model_never_moved, (), ["linear() mixes", "`model = nn.Linear(4, 2)`"]),
    (model_and_data_never_moved, (), ["an all_reduce", "`model = nn.Linear(4, 2)`"]),
    (scaffold_allocates_on_the_cpu, (), ["an all_gather", "torch.empty(2) for _ in"]),
    (argument_from_the_notebook_used_as_is, (torch.ones(3),), ["a broadcast",
                                                               "sent from the notebook"]),
    (cpu_generator_draws_on_the_device, (), ["CPU generator", "draw on the CPU"]),
    (moved_back_to_the_cpu_and_sent, (), ["an all_reduce", "`dist.all_reduce(x.cpu())`"]),
    (error_caught_by_the_code, (), ["caught", "`dist.all_reduce(torch.ones(1))`"]),
    (gradient_assigned_from_the_cpu, (), ["gradient on the CPU", "`p.grad = torch.zeros(2)`"]),
    (recv_into_a_cpu_buffer, (), ["dist.recv", "`buf = torch.empty(2)`"]),
    (numpy_of_a_device_tensor, (), ["numpy() of a tensor on this rank's device", ".cpu()"]),
    # a name torch deprecated is a wrapper of typing_extensions': the learner's line is named
    (deprecated_collective_into_a_cpu_buffer, (), ["`out = torch.empty(2 * dist.get_world_size())`",
                                                   "`dist.all_gather_into_tensor(out, mine)`"]),
    (gradient_hook_sends_a_cpu_buffer, (), ["an all_reduce", "`bucket = torch.zeros(p.numel())`"]),
    (custom_backward_sends_a_cpu_buffer, (), ["an all_reduce",
                                              "`total = torch.zeros(grad.shape)`"]),
]


@pytest.mark.parametrize("fn, args, words", PLANTED, ids=[p[0].__name__ for p in PLANTED])
def test_planted_mistake_fails_with_the_line_and_the_fix(warm, fn, args, words):
    message = audit_failure(fn, *args)
    assert "device audit" in message and "dl.device()" in message
    assert "test_audit.py, line" in message
    for word in words:
        assert word in message, message
    dl.launch(fn, *args, world_size=2, stream=False, device_audit=False)   # fine on CPUs


def test_the_environment_turns_the_audit_on_for_every_launch(warm, monkeypatch):
    monkeypatch.setenv("DPMP_LAB_DEVICE_AUDIT", "1")
    with pytest.raises(dl.LaunchError, match="device audit"):
        dl.launch(tensor_without_device_to_a_collective, world_size=2, stream=False)
    assert dl.launch(lambda: str(dl.device()), world_size=1, stream=False).values == ["cpu:0"]
    monkeypatch.setenv("DPMP_LAB_DEVICE_AUDIT", "0")
    assert dl.launch(lambda: str(dl.device()), world_size=1, stream=False).values == ["cpu"]


def test_a_checks_launch_audits_where_the_ranks_have_no_gpu_each(warm, monkeypatch):
    # what a visible check launches fails on a laptop where the grader's audit will fail it;
    # the learner's own dl.launch there stays plain
    monkeypatch.delenv("DPMP_LAB_DEVICE_AUDIT", raising=False)
    monkeypatch.setattr(launch_module, "visible_gpus", lambda: 0)
    with pytest.raises(dl.check.CheckFailed, match="device audit"):   # the audit's words alone
        dl.check.launch(tensor_without_device_to_a_collective, world_size=2, stream=False)
    dl.launch(tensor_without_device_to_a_collective, world_size=2, stream=False)
    assert dl.check.launch(lambda: str(dl.device()), world_size=1, device_audit=False,
                           stream=False).values == ["cpu"]
    monkeypatch.setenv("DPMP_LAB_DEVICE_AUDIT", "0")   # none at all, a check's neither
    assert dl.check.launch(lambda: str(dl.device()), world_size=1,
                           stream=False).values == ["cpu"]
    monkeypatch.delenv("DPMP_LAB_DEVICE_AUDIT")
    # with GPUs enough, gloo asked for still puts the ranks on the CPU (one GPU per rank, on
    # nccl, is tools/gpu_course.py's to show)
    monkeypatch.setattr(launch_module, "visible_gpus", lambda: 4)
    assert not launch_module.ranks_have_gpus("gloo", 2)
    assert launch_module.ranks_have_gpus("auto", 2) == dist.is_nccl_available()


def test_the_audit_runs_on_gloo_and_refuses_nccl():
    with pytest.raises(ValueError, match="device audit runs on the CPU"):
        dl.launch(lambda: None, world_size=1, backend="nccl", device_audit=True)


# -- the library's references run on dl.device() ---------------------------------------------


def references_on_the_device():
    from dpmp_lab import collectives, dp, models, pp, tp

    dev = dl.device()
    world, rank = dist.get_world_size(), dist.get_rank()
    x = torch.randn(12, generator=torch.Generator().manual_seed(rank)).double().to(dev)
    ring = collectives.ring_all_reduce(x)
    halves = collectives.all_reduce_by_halves(x)

    mlp = models.TinyMLP(seed=0).to(dev)
    model = dp.DataParallel(mlp, bucket_mb=0.0001, overlap=True)
    opt = dp.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    batch = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    model(models.shard_batch(batch, rank, world).to(dev)).pow(2).mean().backward()
    model.finish_gradient_sync()
    opt.step()

    grid = dl.ProcessGrid(dp=1, tp=world)
    gpt = models.TinyGPT(hybrid.SMALL, seed=0)
    tp.parallelize_gpt(gpt, grid.tp_group)
    gpt.to(dev)
    idx, targets = models.token_batch(4, hybrid.SMALL.seq_len, hybrid.SMALL.vocab_size, seed=2)
    tp.vocab_parallel_cross_entropy(gpt(idx.to(dev)), targets.to(dev), group=grid.tp_group).backward()

    stage_module = pp.split_pieces(models.TinyGPT(hybrid.SMALL, seed=0).pieces(), world)[rank]
    stage = pp.Stage(stage_module.to(dev),
                     activation_shape=(2, hybrid.SMALL.seq_len, hybrid.SMALL.d_model))
    result = pp.run_schedule("1f1b", stage, idx.to(dev), targets.to(dev), n_microbatches=2,
                             loss_fn=models.lm_loss)
    return {"ring": ring.cpu(), "halves": halves.cpu(), "loss": result.loss}


def test_references_run_under_the_audit(warm):
    res = audited(references_on_the_device)
    total = sum(torch.randn(12, generator=torch.Generator().manual_seed(r)).double()
                for r in range(2))
    for value in res.values:
        torch.testing.assert_close(value["ring"], total)
        torch.testing.assert_close(value["halves"], total)
    assert res.values[1]["loss"] is not None


@pytest.mark.parametrize("dp, tp, pp", [(2, 2, 1), (1, 2, 2)])
def test_hybrid_training_under_the_audit_equals_single_process(warm, dp, tp, pp):
    from tests.support.hybrid_reference import STEPS, check_against_reference

    res = dl.launch(hybrid.train, dp, tp, pp, steps=STEPS, dtype=torch.float64,
                    world_size=dp * tp * pp, device_audit=True, stream=False, timeout=120)
    reference = hybrid.train_single_process(steps=STEPS, dtype=torch.float64)
    check_against_reference(res.values, dp, tp, pp, reference)


def test_readme_examples_pass_the_audit():
    """The launch and trace examples of the README and docs/, in a script, with
    DPMP_LAB_DEVICE_AUDIT=1."""
    code = Path(readme_examples.__file__)
    env = dict(os.environ, DPMP_LAB_DEVICE_AUDIT="1")
    out = subprocess.run([sys.executable, str(code)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Documentation examples: ok under the device audit" in out.stdout
