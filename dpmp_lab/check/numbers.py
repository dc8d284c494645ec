"""Numbers against a reference: what every rank returned, compared with what it should hold.

    res = dl.check.against_reference(my_dp_step, full_batch_step, world_size=4)
    dl.check.compare(res.values, expected)       # one mapping, one per rank, or rank -> mapping
    dl.check.same_on_all_ranks(res.values)       # data-parallel replicas stay identical

A difference is described for the learner: which tensor on which rank, how far off and where,
and, when the whole tensor is the reference times a constant, the likely mistake
(hints.SCALE_HINTS). Tolerances are torch.allclose's: |got - expected| <= atol + rtol * |expected|.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from dpmp_lab._helpers import ranks_text
from dpmp_lab.check import communication
from dpmp_lab.check.audited import launch
from dpmp_lab.check.failed import CheckFailed
from dpmp_lab.check.hints import (
    REPLICA_HINT,
    keyed_scale_hint,
    keyed_unfilled_hint,
    likely,
    tag,
)
from dpmp_lab.i18n.messages import _
from dpmp_lab.models import default_dtype

__all__ = ["FP32", "FP64", "against_reference", "close", "compare", "grads", "params",
           "same_on_all_ranks"]

FP32 = {"rtol": 1e-5, "atol": 1e-6}
FP64 = {"rtol": 1e-10, "atol": 1e-10}   # TP and PP sum in another order than one process


def close(actual: Any, expected: Any, *, name: str = "value", rank: int | None = None,
          rtol: float = FP32["rtol"], atol: float = FP32["atol"],
          world: int | None = None) -> None:
    """Assert `actual` equals `expected` within |a - e| <= atol + rtol * |e|, element-wise.
    `world`, the run's number of ranks when there is one, keeps a hint for a result scaled by
    another whole number from blaming the ranks."""
    problem = _difference(actual, expected, rtol, atol, world=world)
    if problem:
        where = (_("rank {rank}: {name!r}").format(rank=rank, name=name) if rank is not None
                 else repr(name))
        raise CheckFailed(_("{where} {problem}").format(where=where, problem=problem))


def compare(values: Sequence[Any], expected: Any, *, rtol: float | None = None,
            atol: float | None = None, dtype: torch.dtype | None = None) -> None:
    """Compare what every rank returned with what it should have returned.

    values:   per-rank results (res.values): each a mapping name -> tensor (or one tensor).
    expected: one mapping for every rank, a list of mappings (one per rank), or a function
              rank -> mapping (e.g. the rank's shard of a reference tensor).
    Every failing (rank, tensor) is listed; the first in detail, with the likely mistake.
    """
    rtol, atol = _tolerances(rtol, atol, dtype)
    failures = []
    for rank, got in enumerate(values):
        got_map = _as_mapping(got)
        for name, exp in _as_mapping(_expected_for(expected, rank, len(values))).items():
            if name not in got_map:
                failures.append((rank, name, _("is missing: rank {rank} returned {names}").format(
                    rank=rank, names=_names(got_map))))
                continue
            problem = _difference(got_map[name], exp, rtol, atol, world=len(values))
            if problem:
                failures.append((rank, name, problem))
    if failures:
        raise CheckFailed(_report(failures, len(values)))


def same_on_all_ranks(values: Sequence[Any], names: Iterable[str] | None = None, *,
                      rtol: float = 0.0, atol: float = 0.0, hint: str = REPLICA_HINT) -> None:
    """Assert every rank holds the same tensors (data-parallel replicas must stay identical).

    `hint`: the likely mistake to name when they differ (default: about weights and
    gradients of data-parallel replicas)."""
    maps = [_as_mapping(v) for v in values]
    for name in (list(names) if names is not None else list(maps[0])):
        first = torch.as_tensor(maps[0][name]).detach().cpu().double()
        for rank in range(1, len(maps)):
            if name not in maps[rank]:
                raise CheckFailed(_("rank {rank} returned no {name!r}").format(rank=rank,
                                                                               name=name))
            mine = torch.as_tensor(maps[rank][name]).detach().cpu().double()
            if mine.shape == first.shape and torch.allclose(mine, first, rtol=rtol, atol=atol):
                continue
            if mine.shape != first.shape:
                how = _("has shape {shape}, rank 0's {first}").format(
                    shape=tuple(mine.shape), first=tuple(first.shape))
            else:
                err, at = _largest_error(mine, first)
                how = _("differs from rank 0's by up to {err:.3g}{at} (rank {rank} has "
                        "{mine:.6g}, rank 0 has {first:.6g})").format(
                    err=err, at=_at(at), rank=rank, mine=mine[at].item(), first=first[at].item())
            raise CheckFailed(
                _("On rank {rank}, {name!r} {how}. Replicas must stay identical.").format(
                    rank=rank, name=name, how=how) + "\n"
                + likely(hint) + "\n"
                + tag(["replicas_differ" if hint == REPLICA_HINT else "exercise.replicas"]))


def grads(module: torch.nn.Module, prefix: str = "grad ") -> dict[str, torch.Tensor | None]:
    """{'grad <name>': gradient} of every parameter, ready to return from a rank."""
    return {prefix + n: _local(p.grad) for n, p in module.named_parameters()}


def params(module: torch.nn.Module, prefix: str = "param ") -> dict[str, torch.Tensor]:
    """{'param <name>': value} of every parameter, ready to return from a rank."""
    return {prefix + n: _local(p) for n, p in module.named_parameters()}


def against_reference(fn: Callable[..., Any], reference: Callable[..., Any], *args: Any,
                      world_size: int = 4, expected_on_rank: Callable[[int, Any], Any] | None
                      = None, dtype: torch.dtype | None = None, rtol: float | None = None,
                      atol: float | None = None, comm: Mapping | Callable | None = None,
                      comm_hints: Mapping | None = None, n_params: int | None = None,
                      trace: bool = False, timeout: float = 60.0, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` on `world_size` ranks and `reference(*args, **kwargs)` once in
    this process, and check that every rank's result matches.

    fn returns a mapping name -> tensor (see grads() and params()) or a tensor; reference
    returns the same names with single-process values. expected_on_rank(rank, ref) picks
    what rank `rank` should hold (default: all of ref, as in data parallel). dtype=float64
    runs both in double precision with tolerance 1e-10 (for TP/PP, where the order of a sum
    changes); the default fp32 tolerance is rtol=1e-5, atol=1e-6. comm: also assert the
    communication every rank issued, as in check.comm() (with comm_hints and n_params).
    Returns the LaunchResult.
    """
    res = launch(_run_in_dtype, fn, dtype, *args, world_size=world_size,
                 trace=trace or comm is not None, timeout=timeout, **kwargs)
    with torch.random.fork_rng(), default_dtype(dtype):
        ref = reference(*args, **kwargs)
    if expected_on_rank is None:
        expected: Any = ref
    else:
        expected = [expected_on_rank(r, ref) for r in range(world_size)]
    compare(res.values, expected, rtol=rtol, atol=atol, dtype=dtype)
    if comm is not None:
        communication.comm(res, comm, hints=comm_hints, n_params=n_params)
    return res


def _run_in_dtype(fn: Callable[..., Any], dtype: torch.dtype | None, *args: Any,
                  **kwargs: Any) -> Any:
    with default_dtype(dtype):
        return fn(*args, **kwargs)


# -- reading the values --------------------------------------------------------------------------


def _tolerances(rtol: float | None, atol: float | None,
                dtype: torch.dtype | None) -> tuple[float, float]:
    base = FP64 if dtype == torch.float64 else FP32
    return (base["rtol"] if rtol is None else rtol, base["atol"] if atol is None else atol)


def _expected_for(expected: Any, rank: int, world: int) -> Any:
    if callable(expected):
        return expected(rank)
    if isinstance(expected, (list, tuple)) and len(expected) == world:
        return expected[rank]
    return expected


def _as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {"output": value}


def _names(mapping: Mapping) -> str:
    names = list(mapping)
    if not names:
        return _("nothing")
    return ", ".join(repr(n) for n in names[:8]) + (" ..." if len(names) > 8 else "")


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if hasattr(t, "to_local"):   # a DTensor: this rank's shard
        t = t.to_local()
    return t.detach().clone()


# -- describing a difference -----------------------------------------------------------------------


def _difference(actual: Any, expected: Any, rtol: float, atol: float,
                world: int | None = None) -> str:
    """'' when close enough, else a sentence that says how far off and what it suggests."""
    if expected is None:
        return "" if actual is None else _("should be None")
    if actual is None:
        return _("is None: it was never computed (no gradient reached this parameter: was "
                 "backward run, and is the parameter used in forward?)")
    try:
        a = torch.as_tensor(actual).detach().cpu()
        e = torch.as_tensor(expected).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        return "" if actual == expected else _("is {actual!r}, expected {expected!r}").format(
            actual=actual, expected=expected)
    if a.shape != e.shape:
        return _shape_difference(a, e)
    if not (a.is_floating_point() or a.is_complex()):
        if torch.equal(a, e.to(a.dtype)):
            return ""
        if a.numel() == 1:
            return _("is {actual}, expected {expected}").format(actual=a.item(),
                                                                expected=e.item())
        first = tuple(int(i) for i in (a != e).nonzero()[0])
        return _("differs in {wrong} of {numel} elements (first at {at}: got {actual}, "
                 "expected {expected})").format(wrong=(a != e).sum().item(), numel=a.numel(),
                                                at=list(first), actual=a[first].item(),
                                                expected=e[first].item())
    a64, e64 = a.double(), e.double()
    if torch.allclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True):
        return ""
    worst, at = _largest_error(a64, e64)
    # relative to the elements that are not ~0: an expected 1e-30 makes any error "1e27x"
    scale = max(atol, 1e-6 * e64.abs().max().item())
    big = e64.abs() >= scale
    rel = (((a64 - e64).abs()[big] / e64.abs()[big]).nan_to_num(float("inf")).max().item()
           if big.any() else None)
    text = (_("differs from the reference: max abs error {worst:.3g}{at} (got {actual:.6g}, "
              "expected {expected:.6g})").format(worst=worst, at=_at(at), actual=a64[at].item(),
                                                 expected=e64[at].item())
            + (_(", max rel error {rel:.3g} (where |expected| >= {scale:.2g})").format(
                rel=rel, scale=scale) if rel is not None else "")
            + ALLOWED + _("allowed |got - expected| <= {atol:g} + {rtol:g} * |expected|").format(
                atol=atol, rtol=rtol))
    key, hint = keyed_scale_hint(a64, e64, rtol, atol, world)
    if not hint:
        key, hint = keyed_unfilled_hint(a64, e64)
    return text + ((".\n  " + likely(hint) + f" {tag([key])}")
                   if hint else "")


# what separates how far off a value is from the tolerance it was allowed (the list of every
# wrong value leaves the tolerance out)
ALLOWED = "; "


def _at(at: tuple[int, ...]) -> str:
    return _(" at {index}").format(index=list(at)) if at else ""


def _shape_difference(a: torch.Tensor, e: torch.Tensor) -> str:
    msg = _("has shape {shape}, expected {expected}").format(
        shape=tuple(a.shape), expected=tuple(e.shape))
    if not a.numel():
        return msg + _(": it is empty (nothing was filled in, gathered or concatenated)")
    if e.numel() % a.numel() == 0 and e.numel() != a.numel():
        return msg + _(": 1/{n} of the elements, a shard rather than the whole tensor (gather "
                       "missing, or the wrong dimension split?)").format(n=e.numel() // a.numel())
    if e.numel() and a.numel() % e.numel() == 0 and e.numel() != a.numel():
        return msg + _(": {n}x the elements (gathered along the wrong dim?)").format(
            n=a.numel() // e.numel())
    return msg


def _largest_error(a: torch.Tensor, e: torch.Tensor) -> tuple[float, tuple[int, ...]]:
    """The largest |a - e| (NaN counts as infinite) and where it is."""
    err = (a - e).abs().nan_to_num(float("inf"))
    if not err.dim():
        return err.item(), ()
    return err.max().item(), tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))


def _report(failures: list[tuple[int, str, str]], world: int) -> str:
    """The first failure in full, then every wrong tensor with the ranks it is wrong on."""
    rank, name, problem = failures[0]
    lines = [_("On rank {rank}, {name!r} {problem}").format(
        rank=rank, name=name, problem=problem)]
    if len(failures) > 1:
        by_name: dict[str, list[tuple[int, str]]] = {}
        for r, n, p in failures:
            by_name.setdefault(n, []).append((r, p))
        lines += ["", _("All {n} wrong values (tensor, ranks, first problem):").format(
            n=len(failures))]
        for n, cases in by_name.items():
            ranks = (_("all ranks") if len(cases) == world
                     else ranks_text(r for r, _problem in cases))
            short = cases[0][1].split(ALLOWED)[0].splitlines()[0]
            lines.append("  " + _("{name!r} on {ranks}: {problem}").format(
                name=n, ranks=ranks, problem=short))
    return "\n".join(lines)
