"""What the machine's NVIDIA driver lists against what this torch can use.

A GPU server with the CPU build of torch (an install that did not look for the GPU), or with a
CUDA build newer than its driver, runs the whole course on gloo and the CPU without a word:
`torch.cuda.device_count()` is simply 0. `nvidia-smi` still lists the GPUs, so the two
disagree, and `dpmp-lab doctor` says so with the fix.

    listed, driver = nvidia_smi()           # (8, "535.104.05"), or (0, None) without a driver
    problem = gpu_problem(torch.version.cuda, visible_gpus(), listed, driver)
"""

from __future__ import annotations

import shutil
import subprocess

from dpmp_lab.i18n.messages import N_, _

__all__ = ["MIN_DRIVER", "gpu_problem", "nvidia_smi"]

# The oldest driver each CUDA major release runs on (minor version compatibility): NVIDIA,
# "CUDA Compatibility", Minor Version Compatibility, Table 1 (11.x: 450.80.02 on Linux).
MIN_DRIVER = {11: "450.80.02", 12: "525", 13: "580"}


def nvidia_smi() -> tuple[int, str | None]:
    """(GPUs `nvidia-smi -L` lists, the driver's version): (0, None) where there is no
    nvidia-smi or it fails (no driver loaded)."""
    if not shutil.which("nvidia-smi"):
        return 0, None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30)
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0, None
    if listed.returncode != 0:
        return 0, None
    gpus = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    versions = driver.stdout.split() if driver.returncode == 0 else []
    return gpus, (versions[0] if versions else None)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def gpu_problem(torch_cuda: str | None, torch_gpus: int, listed: int,
                driver: str | None, hidden: bool = False) -> str | None:
    """Why torch sees none of the `listed` GPUs, with the fix; None when there is nothing to
    say (no GPU listed, torch sees some, or CUDA_VISIBLE_DEVICES hides them: `hidden`)."""
    if listed == 0 or torch_gpus > 0 or hidden:
        return None
    if torch_cuda is None:
        return _("nvidia-smi lists {listed} GPU(s), but this torch is the CPU build, so every "
                 "launch runs on gloo and the CPU. Fix: install the CUDA build of the same "
                 "version (on Linux, PyPI's torch wheel: `pip install --force-reinstall "
                 "torch==<version>` without the +cpu, or remove .venv and run `python3 "
                 "bootstrap.py course`, which looks for the GPU)").format(listed=listed)
    major = _version(torch_cuda)[:1]
    need = MIN_DRIVER.get(major[0]) if major else None
    if need and driver and _version(driver) < _version(need):
        return _("nvidia-smi lists {listed} GPU(s), but this torch was built for CUDA {cuda}, "
                 "which needs an NVIDIA driver >= {need}, and the driver is {driver}. Fix: "
                 "update the driver, or install a torch built for an older CUDA "
                 "(https://pytorch.org/get-started/previous-versions/)").format(
            listed=listed, cuda=torch_cuda, need=need, driver=driver)
    unseen = (N_("nvidia-smi lists {listed} GPU(s) (driver {driver}), but this torch, built for "
                 "CUDA {cuda} (driver >= {need}), sees none: check that this process may open "
                 "/dev/nvidia* (a container started without the GPUs, a cgroup) and what "
                 "`python -c \"import torch; torch.cuda.init()\"` says") if need else
              N_("nvidia-smi lists {listed} GPU(s) (driver {driver}), but this torch, built for "
                 "CUDA {cuda}, sees none: check that this process may open /dev/nvidia* (a "
                 "container started without the GPUs, a cgroup) and what `python -c \"import "
                 "torch; torch.cuda.init()\"` says"))
    return _(unseen).format(listed=listed, driver=driver or _("unknown"), cuda=torch_cuda,
                            need=need)
