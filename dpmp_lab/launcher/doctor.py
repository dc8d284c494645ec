"""`dpmp-lab doctor`: what this machine offers for the course (torch's build, the GPUs nvidia-smi
lists against those torch can use, the backend each world size gets, the sandbox), proven by
test launches: n ranks with backend="auto", and on a GPU machine nccl itself."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import dpmp_lab
from dpmp_lab.context import device
from dpmp_lab.i18n.messages import N_, _
from dpmp_lab.instructor import sandbox
from dpmp_lab.launcher.launch import launch, usable_cores, visible_gpus
from dpmp_lab.launcher.nvidia import gpu_problem, nvidia_smi


def _all_reduce_check(expected: float) -> dict:
    """Inside each rank: an all_reduce on the rank's device and, where the device is a GPU, one
    of a CPU tensor too (nccl serves the first, gloo the second)."""
    dev = device()
    t = torch.ones(4, device=dev) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    if not torch.allclose(t, torch.full((4,), expected, device=dev)):
        raise AssertionError(_("all_reduce on {device} gave {values}, expected {expected}").format(
            device=dev, values=t.tolist(), expected=expected))
    out = {"device": str(dev), "sum": float(t[0])}
    if dev.type == "cuda":
        c = torch.ones(2) * (dist.get_rank() + 1)
        dist.all_reduce(c)
        if float(c[0]) != expected:
            raise AssertionError(_("all_reduce of a CPU tensor gave {values}").format(
                values=c.tolist()))
        props = torch.cuda.get_device_properties(dev)
        out["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    return out


def backend_plan(gpus: int, nccl: bool, sizes: tuple[int, ...] = (1, 2, 4, 8)) -> list[str]:
    """What backend="auto" gives each world size on a machine with `gpus` GPUs."""
    lines = []
    for n in sizes:
        if nccl and gpus >= n:
            line = N_("world size {n}: nccl on cuda:0..{last} (cpu:gloo,cuda:nccl: CPU tensors "
                      "through gloo)")
        elif not nccl and gpus:
            line = N_("world size {n}: gloo on the CPU (no NCCL in this torch)")
        else:
            line = N_("world size {n}: gloo on the CPU ({gpus} GPU(s) < {n} ranks)")
        lines.append(_(line).format(n=n, last=n - 1, gpus=gpus))
    return lines


def _launch_check(label: str, n: int, backend: str, timeout: float) -> bool:
    doing = _("{label}: {n} rank(s), backend={backend!r}, one all_reduce ...")
    print("launching   " + doing.format(label=label, n=n, backend=backend), flush=True)
    try:
        res = launch(_all_reduce_check, float(n * (n + 1) / 2), world_size=n,
                     backend=backend, timeout=timeout, stream=False, device_audit=False)
    except Exception as exc:  # the doctor's job is to say what went wrong, whatever it was
        print("            " + _("FAILED: {why}").format(why=f"{type(exc).__name__}: {exc}"),
              file=sys.stderr)
        return False
    gpus = sorted({v["gpu"] for v in res.values if "gpu" in v})
    print("            " + (_("ok: {result}; {gpus}") if gpus else _("ok: {result}")).format(
        result=res.describe(), gpus=", ".join(gpus)))
    return True


def check_machine(world_size: int = 2, backend: str = "auto", timeout: float = 60.0) -> int:
    """Print what this machine offers for the course and prove that launches work: n ranks
    with backend="auto", and on a GPU machine nccl itself (2 ranks, or 1 with one GPU)."""
    print(f"dpmp_lab    {dpmp_lab.__version__} ({Path(dpmp_lab.__file__).parent})")
    print(f"python      {platform.python_version()} ({sys.executable})")
    build = (_("{version} (CUDA build: {cuda})") if torch.version.cuda
             else _("{version} (CUDA build: no)"))
    print("torch       " + build.format(version=torch.__version__, cuda=torch.version.cuda))
    backends = [b for b, ok in (("gloo", dist.is_gloo_available()),
                                ("nccl", dist.is_nccl_available()),
                                ("mpi", dist.is_mpi_available())) if ok]
    print(f"backends    {', '.join(backends) or _('none')}")
    gpus = visible_gpus()
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed, driver = nvidia_smi()
    seen = (_("{n} visible (CUDA_VISIBLE_DEVICES={shown})") if shown else
            _("{n} visible")).format(n=gpus, shown=shown)
    if listed:
        seen += "; " + _("nvidia-smi lists {listed}, driver {driver}").format(
            listed=listed, driver=driver or _("unknown"))
    print(f"GPUs        {seen}")
    problem = gpu_problem(torch.version.cuda, gpus, listed, driver, hidden=shown is not None)
    if problem:
        print("            " + _("FAILED: {why}").format(why=problem), file=sys.stderr)
    print(f"CPU cores   {usable_cores()}")
    for line in backend_plan(gpus, dist.is_nccl_available()):
        print(f"auto        {line}")
    ok = _launch_check("auto", world_size, backend, timeout) and not problem
    if gpus and dist.is_nccl_available():
        n = 2 if gpus >= 2 else 1
        ok = _launch_check("nccl", n, "nccl", timeout) and ok
    elif gpus:
        print("nccl        " + _("skipped: this torch build has no NCCL"))
    else:
        print("nccl        " + _("skipped: no GPU visible (the course runs on gloo and the CPU)"))
    why = sandbox.problem()
    works = _("works (bubblewrap): `dpmp-lab grade` runs each submission in a sandbox of its own")
    print("sandbox     " + (_("NOT available: {why}").format(why=why) if why else works))
    print(_("all checks passed") if ok else _("some checks FAILED"))
    return 0 if ok else 1


__all__ = ["backend_plan", "check_machine"]
