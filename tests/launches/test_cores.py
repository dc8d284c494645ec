"""dpmp_lab.launcher.cores: the cores a launch's ranks share, from the affinity, the cgroup CPU
quota and DPMP_LAB_CORES."""

from __future__ import annotations

import os

import pytest
import torch

import dpmp_lab as dl


def test_usable_cores_sees_a_cgroup_cpu_quota_and_the_override(tmp_path, monkeypatch):
    """A container's CPU quota (v2 cpu.max, v1 cfs quota / period, the smallest on the path)
    caps the affinity; DPMP_LAB_CORES overrides both."""
    from dpmp_lab.launcher import cores

    def write(path, **files):
        path.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (path / name.replace("_dot_", ".")).write_text(text)

    v2 = tmp_path / "v2"
    write(v2, cpu_dot_max="max 100000\n")
    write(v2 / "kube" / "pod", cpu_dot_max="150000 100000\n")
    assert cores.cgroup_cpu_limit("0::/kube/pod\n", v2) == 1.5
    write(v2 / "kube", cpu_dot_max="100000 100000\n")          # the parent's is smaller
    assert cores.cgroup_cpu_limit("0::/kube/pod\n", v2) == 1.0
    assert cores.cgroup_cpu_limit("0::/elsewhere\n", v2) is None
    v1 = tmp_path / "v1"
    write(v1 / "cpu,cpuacct" / "docker" / "c1", cpu_dot_cfs_quota_us="300000\n",
          cpu_dot_cfs_period_us="100000\n")
    assert cores.cgroup_cpu_limit("4:cpu,cpuacct:/docker/c1\n1:memory:/x\n", v1) == 3.0
    write(v1 / "cpu,cpuacct" / "docker" / "c2", cpu_dot_cfs_quota_us="-1\n",
          cpu_dot_cfs_period_us="100000\n")
    assert cores.cgroup_cpu_limit("4:cpu,cpuacct:/docker/c2\n", v1) is None
    monkeypatch.delenv(cores.CORES_ENV, raising=False)
    write(v2 / "one_and_a_half", cpu_dot_max="150000 100000\n")
    assert cores.usable_cores("0::/one_and_a_half\n", v2) == min(2, len(os.sched_getaffinity(0)))
    assert cores.usable_cores("0::/elsewhere\n", v2) == len(os.sched_getaffinity(0))
    monkeypatch.setenv(cores.CORES_ENV, "6")      # more than this machine: the ranks believe it
    assert cores.usable_cores() == 6 and dl.launch(_threads, world_size=2).values == [3, 3]
    monkeypatch.setenv(cores.CORES_ENV, "many")
    with pytest.raises(ValueError, match="DPMP_LAB_CORES='many': give a whole number"):
        cores.usable_cores()


def _threads() -> int:
    return torch.get_num_threads()
