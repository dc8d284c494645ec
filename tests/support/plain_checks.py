"""How the references' tests compare numbers and count calls, written without dl.check.

dl.check is the grader, and its own tests hold it to the references (test_check); a reference
tested through it could hide a bug of its own behind one of the grader's. So the references'
tests read parameters, compare with a single-process run and count a trace's calls with
nothing but torch.testing and the trace's own questions (Trace.count, Trace.bytes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

import dpmp_lab as dl
from dpmp_lab.trace import Trace, matcher

FP32 = {"rtol": 1e-5, "atol": 1e-6}
FP64 = {"rtol": 1e-10, "atol": 1e-10}   # a parallel run sums in another order than one process


def params(module: nn.Module, prefix: str = "param ") -> dict[str, torch.Tensor]:
    """{'param <name>': a copy of its value}, as a rank returns it."""
    return {prefix + n: p.detach().cpu().clone() for n, p in module.named_parameters()}


def grads(module: nn.Module, prefix: str = "grad ") -> dict[str, torch.Tensor | None]:
    """{'grad <name>': a copy of its gradient, or None}, as a rank returns it."""
    return {prefix + n: None if p.grad is None else p.grad.detach().cpu().clone()
            for n, p in module.named_parameters()}


def assert_close_on_every_rank(values: Sequence[Mapping], expected: Mapping | Sequence[Mapping],
                               rtol: float = FP32["rtol"], atol: float = FP32["atol"]) -> None:
    """Every name `expected` has (one mapping for all ranks, or one per rank) is in each rank's
    result and close to it; a None is expected as None."""
    for rank, got in enumerate(values):
        want = expected if isinstance(expected, Mapping) else expected[rank]
        for name, value in want.items():
            assert name in got, f"rank {rank} returned no {name!r}"
            if value is None:
                assert got[name] is None, f"rank {rank}: {name!r} is not None"
                continue
            torch.testing.assert_close(got[name].cpu().to(value.dtype), value, rtol=rtol,
                                       atol=atol, msg=lambda m, r=rank, n=name: f"rank {r}, {n}: {m}")


def assert_same_on_every_rank(values: Sequence[Mapping]) -> None:
    """Every rank holds the very same tensors as rank 0 (replicas stay identical)."""
    for rank, got in enumerate(values[1:], start=1):
        assert got.keys() == values[0].keys()
        for name, value in values[0].items():
            assert torch.equal(got[name], value), f"rank {rank}'s {name!r} differs from rank 0's"


def _in_dtype(fn: Callable[..., Any], dtype: torch.dtype | None, *args: Any) -> Any:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype or before)
    try:
        return fn(*args)
    finally:
        torch.set_default_dtype(before)


def against_single_process(fn: Callable[..., Any], reference: Callable[..., Any], *args: Any,
                           world_size: int, dtype: torch.dtype | None = None,
                           expected_on_rank: Callable[[int, Any], Mapping] | None = None,
                           trace: bool = False) -> dl.LaunchResult:
    """fn(*args) on world_size ranks and reference(*args) here, both in `dtype` by default;
    every rank's result close to the reference's (or to expected_on_rank(rank, reference's))."""
    res = dl.launch(_in_dtype, fn, dtype, *args, world_size=world_size, trace=trace,
                    stream=False, timeout=60)
    with torch.random.fork_rng():
        ref = _in_dtype(reference, dtype, *args)
    expected = ref if expected_on_rank is None else [expected_on_rank(r, ref)
                                                     for r in range(world_size)]
    assert_close_on_every_rank(res.values, expected, **(FP64 if dtype == torch.float64 else FP32))
    return res


def _key(key: str | tuple) -> tuple:
    return (key, None, None) if isinstance(key, str) else tuple(key) + (None,) * (3 - len(key))


def assert_calls(traces: dl.LaunchResult | Sequence[Trace], expected: Mapping,
                 bytes: Mapping | None = None) -> None:
    """Each rank's trace has exactly `expected` calls per key ("op", (op, group) or (op, group,
    phase), None for any) and no call that no key matches; `bytes`: payload bytes per key."""
    for rank, t in enumerate(traces.traces if isinstance(traces, dl.LaunchResult) else traces):
        for key, n in expected.items():
            assert t.count(*_key(key)) == n, f"rank {rank}: {t.count(*_key(key))} {key}, not {n}"
        matches = [matcher(*_key(key)) for key in expected]
        extra = Counter((ev.op, ev.label or ev.group, ev.phase or "none") for ev in t.events
                        if not any(match(ev) for match in matches))
        assert not extra, f"rank {rank}: calls no key expects: {dict(extra)}"
        for key, n in (bytes or {}).items():
            assert t.bytes(*_key(key)) == n, f"rank {rank}: {t.bytes(*_key(key))} bytes of {key}"
