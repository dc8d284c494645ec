"""footprint.py: a memory timeline of model state, sampled at each moment of a step, against the
formulas of dl.cost for plain training, ZeRO-1 and FSDP."""

from __future__ import annotations

import pytest
import torch

import dpmp_lab as dl
from dpmp_lab.fsdp import FullyShardedDataParallel
from tests.sharding_models import Stack, my_rows, seeded

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
