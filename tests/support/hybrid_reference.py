"""What hybrid training must equal: every rank's parameters its shard of the single-process
model's, the losses the same (shared by test_hybrid and the device audit's test)."""

from __future__ import annotations

import pytest
import torch

import dpmp_lab as dl

STEPS = 3


def expected_shard(full: torch.Tensor, dim: int | None, tp_rank: int, tp: int) -> torch.Tensor:
    """The piece of a whole-model parameter that tp rank `tp_rank` holds (as tp.shard_tensor cuts)."""
    return full if dim is None else full.chunk(tp, dim=dim)[tp_rank]


def check_against_reference(results: list[dict], dp: int, tp: int, pp: int,
                            reference: dict) -> None:
    """Every rank's parameters are its shard of the reference's; the losses are the same."""
    layout = dl.GridLayout(dp=dp, tp=tp, pp=pp)
    owners: dict[str, set] = {}
    for res in results:
        coords = layout.coords(res["rank"])
        for name, value in res["params"].items():
            want = expected_shard(reference["params"][name], res["sharding"][name],
                                  coords.tp, tp)
            dl.check.close(value, want, name=name, rank=res["rank"], rtol=1e-8, atol=1e-10)
            owners.setdefault(name, set()).add((coords.dp, coords.tp))
    # every parameter lives on exactly one stage, on every (dp, tp) place of it
    assert set(owners) == set(reference["params"])
    assert all(len(places) == dp * tp for places in owners.values())
    last_stage = [r for r in results if layout.coords(r["rank"]).pp == pp - 1]
    for step in range(STEPS):
        mean = sum(r["losses"][step] for r in last_stage) / len(last_stage)
        assert mean == pytest.approx(reference["losses"][step], rel=1e-10)
    assert all(r["losses"] == [None] * STEPS for r in results if r not in last_stage)
