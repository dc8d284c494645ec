"""`dpmp-lab doctor`'s words without a launch: the backend plan, gpu_problem,
LaunchResult.describe() and why the sandbox cannot run, in the language DPMP_LAB_LANG names,
English unchanged without it; and the words of dl.hybrid's torchrun script."""

from __future__ import annotations

import pytest

from dpmp_lab.launcher.doctor import backend_plan
from dpmp_lab.launcher.launch import LaunchResult
from dpmp_lab.launcher.nvidia import gpu_problem


def _result(n: int, backend: str, audit: bool = False) -> LaunchResult:
    return LaunchResult(values=[0] * n, output=[""] * n, backend=backend, wall_time=1.234,
                        device_audit=audit)


def test_the_doctors_words_stay_english_without_a_language(monkeypatch):
    monkeypatch.delenv("DPMP_LAB_LANG", raising=False)
    assert backend_plan(2, True) == [
        "world size 1: nccl on cuda:0..0 (cpu:gloo,cuda:nccl: CPU tensors through gloo)",
        "world size 2: nccl on cuda:0..1 (cpu:gloo,cuda:nccl: CPU tensors through gloo)",
        "world size 4: gloo on the CPU (2 GPU(s) < 4 ranks)",
        "world size 8: gloo on the CPU (2 GPU(s) < 8 ranks)",
    ]
    assert backend_plan(1, False, (2,)) == ["world size 2: gloo on the CPU (no NCCL in this torch)"]
    assert gpu_problem("12.8", 0, 8, "520.61.05") == (
        "nvidia-smi lists 8 GPU(s), but this torch was built for CUDA 12.8, which needs an NVIDIA "
        "driver >= 525, and the driver is 520.61.05. Fix: update the driver, or install a torch "
        "built for an older CUDA (https://pytorch.org/get-started/previous-versions/)")
    assert gpu_problem("10.2", 0, 2, None).startswith(
        "nvidia-smi lists 2 GPU(s) (driver unknown), but this torch, built for CUDA 10.2, sees none")
    assert _result(1, "gloo").describe() == "1 rank on the CPU; CPU tensors through gloo; 1.23 s"
    assert _result(4, "cpu:gloo,cuda:nccl").describe() == (
        "4 ranks on cuda:0..cuda:3; CUDA tensors through nccl, CPU tensors through gloo; 1.23 s")
    assert _result(2, "gloo", audit=True).describe() == (
        "2 ranks on the CPU under the device audit (dl.device() is cpu:0, its stand-in for a "
        "GPU); CPU tensors through gloo; 1.23 s")
    assert _result(1, "gloo", audit=True).describe().startswith(
        "1 rank on the CPU under the device audit")


@pytest.mark.parametrize("language", ["ja"])
def test_the_doctors_words_in_the_learners_language(monkeypatch, language):
    monkeypatch.setenv("DPMP_LAB_LANG", language)
    plan = backend_plan(2, True)
    assert plan[1] == "ワールドサイズ 2：cuda:0..1上でnccl（cpu:gloo,cuda:nccl：CPUテンソルはgloo経由）"
    assert plan[3] == "ワールドサイズ 8：CPU上でgloo（GPU 2個 < 8ランク）"
    assert backend_plan(1, False, (2,)) == ["ワールドサイズ 2：CPU上でgloo（このtorchにはNCCLがありません）"]

    too_old = gpu_problem("12.8", 0, 8, "520.61.05")
    assert "ドライバーを更新する" in too_old and "8個のGPU" in too_old
    assert "CUDA 12.8" in too_old and ">= 525" in too_old and "520.61.05" in too_old
    assert "{" not in too_old and "nvidia-smi lists" not in too_old
    unseen = gpu_problem("10.2", 0, 2, None)
    assert "ドライバー：不明" in unseen and "CUDA 10.2" in unseen and "{" not in unseen
    assert "`python -c \"import torch; torch.cuda.init()\"`" in unseen   # the code stays as it is
    cpu_build = gpu_problem(None, 0, 4, "535.104.05")
    assert "CPUビルド" in cpu_build and "`python3 bootstrap.py course`" in cpu_build

    assert _result(1, "gloo").describe() == "CPU上で1ランク；CPUテンソルはgloo経由；1.23秒"
    assert _result(4, "cpu:gloo,cuda:nccl").describe() == (
        "cuda:0..cuda:3上で4ランク；CUDAテンソルはnccl経由, CPUテンソルはgloo経由；1.23秒")
    audited = _result(2, "gloo", audit=True).describe()
    assert audited.startswith("デバイス監査のもと、CPU上で2ランク") and "{" not in audited


@pytest.mark.parametrize("language", ["en", "ja"])
def test_why_the_sandbox_cannot_run_speaks_the_language_of_the_moment(monkeypatch, language):
    """The doctor's sandbox line: each reason in the language asked for, even after the probe's
    result was cached in another (the probe keeps what went wrong, not the words)."""
    import sys

    from dpmp_lab.instructor import sandbox

    monkeypatch.setenv("DPMP_LAB_LANG", language)
    english = language == "en"
    monkeypatch.setattr(sys, "platform", "darwin")
    why = sandbox.problem()
    assert "darwin" in why and "--no-sandbox" in why
    assert ("Linux-only" in why) == english and ("Linux専用" in why) != english
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    why = sandbox.problem()
    assert "apt-get install bubblewrap" in why
    assert ("is not installed" in why) == english
    monkeypatch.setattr(sandbox, "bwrap", lambda: "/usr/bin/bwrap")
    monkeypatch.setattr(sandbox, "_probe", lambda: (True, "setting up uid map: Permission denied"))
    why = sandbox.problem()
    assert "setting up uid map: Permission denied" in why and "unprivileged_userns_clone" in why
    assert ("refused to start" in why) == english
    monkeypatch.setattr(sandbox, "_probe", lambda: (False, "[Errno 2] No such file"))
    assert ("could not start" in sandbox.problem()) == english
    monkeypatch.setattr(sandbox, "_probe", lambda: None)
    assert sandbox.problem() is None


@pytest.mark.parametrize("language", ["en", "ja"])
def test_the_hybrid_scripts_help_speaks_the_language_of_the_moment(monkeypatch, capsys, language):
    """`python -m dpmp_lab.hybrid --help` (05's torchrun script): its own words in the learner's
    language (argparse's frame, "usage:" and "options:", is argparse's)."""
    from dpmp_lab import hybrid

    monkeypatch.setenv("DPMP_LAB_LANG", language)
    with pytest.raises(SystemExit):
        hybrid.main(["--help"])
    shown = capsys.readouterr().out
    assert ("Train TinyGPT on a dp x tp x pp grid." in shown) == (language == "en")
    assert ("TinyGPTを学習する" in shown) == (language == "ja")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit):
        hybrid.main([])
    said = capsys.readouterr().err
    assert "dl.launch(hybrid.train, ...)" in said
    assert ("run me under torchrun" in said) == (language == "en")
