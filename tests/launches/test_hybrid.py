"""TinyGPT on dp x tp (x pp) grids equals single-process training; also under torchrun."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab import hybrid
from tests.conftest import ROOT
from tests.support.hybrid_reference import STEPS, check_against_reference

pytestmark = pytest.mark.usefixtures("no_leaks")


def traced_train(dp: int, tp: int, pp: int) -> tuple:
    with dl.trace() as t:
        res = hybrid.train(dp, tp, pp, steps=STEPS, dtype=torch.float64)
    grid = dl.GridLayout(dp=dp, tp=tp, pp=pp)
    return res, t, grid.group_of("dp", dist.get_rank()), grid.group_of("tp", dist.get_rank())


@pytest.mark.parametrize("dp, tp, pp", [(2, 2, 1), (2, 2, 2)])
def test_hybrid_training_equals_single_process(warm, dp, tp, pp):
    reference = hybrid.train_single_process(steps=STEPS, dtype=torch.float64)
    out = dl.launch(traced_train, dp, tp, pp, world_size=dp * tp * pp, stream=False,
                    timeout=300)
    check_against_reference([v[0] for v in out.values], dp, tp, pp, reference)
    for _, t, dp_ranks, tp_ranks in out.values:
        # the gradient all-reduce: once per step, on the dp group only, after backward
        assert t.count("all_reduce", group=dp_ranks) == STEPS
        assert t.count("all_reduce", group="dp", phase="backward") == 0
        # tensor-parallel collectives stay on the tp group; pipeline p2p on the pp group
        # the dp group also carries DataParallel's setup: a model check and the broadcasts
        assert t.count(group="dp") == STEPS + 1 + t.count("broadcast", group="dp")
        assert t.count("all_gather", group="dp") == 1
        assert {e.group for e in t.events if e.label == "tp"} == {tp_ranks}
        assert all(e.label == "pp" for e in t.select("send") + t.select("recv"))
        assert t.count("all_reduce", group="tp") > 0


def test_bad_batch_is_a_clear_error(warm):
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(hybrid.train, 2, 1, 1, batch_size=6, micro_batches=2, world_size=2,
                  stream=False)
    assert "batch_size=6 must split into dp=2 shards of micro_batches=2" in str(info.value)


# -- the same training under torchrun --------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nodes: int, per_node: int, grid: list[str], save: str) -> list[str]:
    """Start `nodes` torchrun processes on this machine, like a small cluster on localhost."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs = []
    for node in range(nodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
               f"--nproc-per-node={per_node}", f"--node-rank={node}",
               "--master-addr=127.0.0.1", f"--master-port={port}",
               "-m", "dpmp_lab.hybrid", *grid, f"--steps={STEPS}", "--fp64", f"--save={save}"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, cwd=ROOT, env=env))
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, out
        outputs.append(out)
    return outputs


# two "nodes" of two ranks: torchrun's rendezvous across nodes and the pipeline's p2p between
# them (dp x tp groups are built the same way under dl.launch, tested above)
@pytest.mark.parametrize("nodes, per_node, grid", [
    (2, 2, ["--dp=2", "--pp=2"]),
])
def test_the_same_training_runs_under_torchrun(tmp_path, nodes, per_node, grid):
    outputs = torchrun(nodes, per_node, grid, str(tmp_path))
    sizes = {k: int(v) for k, v in (g.lstrip("-").split("=") for g in grid)}
    dp, tp, pp = sizes.get("dp", 1), sizes.get("tp", 1), sizes.get("pp", 1)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
               for r in range(nodes * per_node)]
    check_against_reference(results, dp, tp, pp,
                            hybrid.train_single_process(steps=STEPS, dtype=torch.float64))
    assert "step 2 loss" in "".join(outputs)


def test_module_refuses_to_run_outside_torchrun():
    out = subprocess.run([sys.executable, "-m", "dpmp_lab.hybrid"], capture_output=True,
                         text=True, cwd=ROOT, env={k: v for k, v in os.environ.items()
                                                   if k != "RANK"}, timeout=120)
    assert out.returncode != 0 and "run me under torchrun" in out.stderr
