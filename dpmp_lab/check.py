"""Checks that graders and learners call: numbers against a reference, and communication.

    res = dl.check.against_reference(my_dp_step, full_batch_step, world_size=4,
                                     comm={("all_reduce", None, "backward"): 2})
    dl.check.comm(res, {("all_reduce", "tp", "forward"): 1, ("all_reduce", "tp", "backward"): 1})

A failed check raises CheckFailed (an AssertionError) whose message is for the learner: which
tensor on which rank, how far off, what communication was expected and what was seen, and the
mistake that most often produces that difference. In a notebook only the message is shown,
not our internals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpmp_lab import integrity, viz
from dpmp_lab.models import default_dtype
from dpmp_lab.trace import OPS, CommEvent, Trace, _matcher, traces_of

FP32 = {"rtol": 1e-5, "atol": 1e-6}
FP64 = {"rtol": 1e-10, "atol": 1e-10}


class CheckFailed(AssertionError):
    """A check did not pass. The message says what was expected, what was seen, and why."""

    def _render_traceback_(self) -> list[str]:
        return ["CheckFailed: " + str(self)]


# -- numbers ----------------------------------------------------------------------------------


def close(actual: Any, expected: Any, *, name: str = "value", rank: int | None = None,
          rtol: float = FP32["rtol"], atol: float = FP32["atol"]) -> None:
    """Assert `actual` equals `expected` within |a - e| <= atol + rtol * |e|, element-wise."""
    integrity.verify()
    problem = _difference(actual, expected, rtol, atol)
    if problem:
        raise CheckFailed(f"{_where(name, rank)} {problem}")


def compare(values: Sequence[Any], expected: Any, *, rtol: float | None = None,
            atol: float | None = None, dtype: torch.dtype | None = None) -> None:
    """Compare what every rank returned with what it should have returned.

    values:   per-rank results (res.values): each a mapping name -> tensor (or one tensor).
    expected: one mapping for every rank, a list of mappings (one per rank), or a function
              rank -> mapping (e.g. the rank's shard of a reference tensor).
    Every failing (rank, tensor) is listed; the first in detail, with the likely mistake.
    """
    integrity.verify()
    rtol, atol = _tolerances(rtol, atol, dtype)
    failures = []
    for rank, got in enumerate(values):
        want = _expected_for(expected, rank, len(values))
        got_map = _as_mapping(got)
        for name, exp in _as_mapping(want).items():
            if name not in got_map:
                failures.append((rank, name, f"is missing: rank {rank} returned "
                                 f"{_names(got_map)}"))
                continue
            problem = _difference(got_map[name], exp, rtol, atol, world=len(values))
            if problem:
                failures.append((rank, name, problem))
    if failures:
        raise CheckFailed(_numbers_report(failures, len(values)))


_REPLICA_HINT = ("the ranks started from different weights (broadcast from rank 0 missing) or "
                 "stepped with different gradients (gradients not averaged over the group).")


def same_on_all_ranks(values: Sequence[Any], names: Iterable[str] | None = None, *,
                      rtol: float = 0.0, atol: float = 0.0, hint: str = _REPLICA_HINT) -> None:
    """Assert every rank holds the same tensors (data-parallel replicas must stay identical).

    `hint`: the likely mistake to name when they differ (default: about weights and
    gradients of data-parallel replicas)."""
    integrity.verify()
    maps = [_as_mapping(v) for v in values]
    for name in (list(names) if names is not None else list(maps[0])):
        first = torch.as_tensor(maps[0][name]).detach().cpu().double()
        for rank in range(1, len(maps)):
            if name not in maps[rank]:
                raise CheckFailed(f"rank {rank} returned no {name!r}")
            mine = torch.as_tensor(maps[rank][name]).detach().cpu().double()
            if mine.shape == first.shape and torch.allclose(mine, first, rtol=rtol, atol=atol):
                continue
            if mine.shape != first.shape:
                how = f"has shape {tuple(mine.shape)}, rank 0's {tuple(first.shape)}"
            else:
                err, where = _largest_error(mine, first)
                how = (f"differs from rank 0's by up to {err:.3g}"
                       f"{' at ' + str(list(where)) if where else ''} (rank {rank} has "
                       f"{mine[where].item():.6g}, rank 0 has {first[where].item():.6g})")
            raise CheckFailed(
                f"On rank {rank}, {name!r} {how}. Replicas must stay identical.\n"
                f"Likely mistake: {hint}")


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
    integrity.verify()
    from dpmp_lab.launch import launch

    trace = trace or comm is not None
    res = launch(_run_in_dtype, fn, dtype, *args, world_size=world_size, trace=trace,
                 timeout=timeout, **kwargs)
    with torch.random.fork_rng(), default_dtype(dtype):
        ref = reference(*args, **kwargs)
    if expected_on_rank is None:
        expected: Any = ref
    else:
        expected = [expected_on_rank(r, ref) for r in range(world_size)]
    compare(res.values, expected, rtol=rtol, atol=atol, dtype=dtype)
    if comm is not None:
        _check_comm(res, comm, hints=comm_hints, n_params=n_params)
    return res


def _run_in_dtype(fn: Callable[..., Any], dtype: torch.dtype | None, *args: Any,
                  **kwargs: Any) -> Any:
    with default_dtype(dtype):
        return fn(*args, **kwargs)


def _tolerances(rtol: float | None, atol: float | None,
                dtype: torch.dtype | None) -> tuple[float, float]:
    base = FP64 if dtype == torch.float64 else FP32
    return (base["rtol"] if rtol is None else rtol, base["atol"] if atol is None else atol)


def _expected_for(expected: Any, rank: int, world: int) -> Any:
    if callable(expected):
        return expected(rank)
    if isinstance(expected, (list, tuple)) and len(expected) == world and not isinstance(
            expected, torch.Tensor):
        return expected[rank]
    return expected


def _as_mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    return {"output": value}


def _names(mapping: Mapping) -> str:
    names = list(mapping)
    return ", ".join(repr(n) for n in names[:8]) + (" ..." if len(names) > 8 else "") \
        if names else "nothing"


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if hasattr(t, "to_local"):   # a DTensor: this rank's shard
        t = t.to_local()
    return t.detach().clone()


def _where(name: str, rank: int | None) -> str:
    return f"rank {rank}: {name!r}" if rank is not None else repr(name)


def _difference(actual: Any, expected: Any, rtol: float, atol: float,
                world: int | None = None) -> str:
    """'' when close enough, else a sentence that says how far off and what it suggests."""
    if expected is None:
        return "" if actual is None else "should be None"
    if actual is None:
        return ("is None: it was never computed (no gradient reached this parameter: was "
                "backward run, and is the parameter used in forward?)")
    try:
        a = torch.as_tensor(actual).detach().cpu()
        e = torch.as_tensor(expected).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        return "" if actual == expected else f"is {actual!r}, expected {expected!r}"
    if a.shape != e.shape:
        msg = f"has shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        if not a.numel():
            msg += ": it is empty (nothing was filled in, gathered or concatenated)"
        elif e.numel() % a.numel() == 0 and e.numel() != a.numel():
            k = e.numel() // a.numel()
            msg += (f": 1/{k} of the elements, a shard rather than the whole tensor "
                    "(gather missing, or the wrong dimension split?)")
        elif e.numel() and a.numel() % e.numel() == 0 and e.numel() != a.numel():
            msg += f": {a.numel() // e.numel()}x the elements (gathered along the wrong dim?)"
        return msg
    if not (a.is_floating_point() or a.is_complex()):
        if torch.equal(a, e.to(a.dtype)):
            return ""
        if a.numel() == 1:
            return f"is {a.item()}, expected {e.item()}"
        first = tuple(int(i) for i in (a != e).nonzero()[0])
        return (f"differs in {(a != e).sum().item()} of {a.numel()} elements (first at "
                f"{list(first)}: got {a[first].item()}, expected {e[first].item()})")
    a64, e64 = a.double(), e.double()
    if torch.allclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True):
        return ""
    worst, where = _largest_error(a64, e64)
    rel = ((a64 - e64).abs() / e64.abs().clamp_min(1e-30)).nan_to_num(float("inf")).max().item()
    text = (f"differs from the reference: max abs error {worst:.3g}"
            f"{' at ' + str(list(where)) if where else ''} (got {a64[where].item():.6g}, "
            f"expected {e64[where].item():.6g}), max rel error {rel:.3g}; allowed "
            f"|got - expected| <= {atol:g} + {rtol:g} * |expected|")
    hint = _scale_hint(a64, e64, rtol, atol, world)
    return text + (f".\n  Likely mistake: {hint}" if hint else "")


def _largest_error(a: torch.Tensor, e: torch.Tensor) -> tuple[float, tuple[int, ...]]:
    """The largest |a - e| (NaN counts as infinite) and where it is."""
    err = (a - e).abs().nan_to_num(float("inf"))
    where = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape)) if err.dim() \
        else ()
    return err.max().item(), where


def _scale_hint(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float,
                world: int | None = None) -> str:
    """The likely mistake when `a` is `e` times a constant. A whole factor n is read as a sum
    over n ranks (or micro-batches) not divided by n; when n exceeds the ranks of the run, it
    cannot be the ranks: micro-batches, or a wrong constant."""
    if not torch.count_nonzero(a):
        return ("every element is zero: the value was never filled in, or was zeroed after it "
                "was computed (zero_grad in the wrong place?)")
    denom = (e * e).sum().item()
    if denom == 0:
        return ""
    scale = (a * e).sum().item() / denom
    if abs(scale - 1) < 1e-3 or not torch.allclose(a, scale * e, rtol=10 * rtol, atol=10 * atol):
        return ""
    whole = [n for n in (scale, 1 / scale) if abs(n - round(n)) < 1e-3 and round(n) > 1]
    n = round(whole[0]) if whole else None
    if n is not None and world is not None and n > world:
        return (f"every element is {n}x the reference: a sum over {n} micro-batches or parts "
                f"that was not divided by {n} (not over the ranks: this run has {world}), or a "
                "wrong constant factor in the formula")
    if n is not None and scale > 1:
        return (f"every element is {n}x the reference: a sum over {n} ranks or micro-batches "
                f"that was not divided by {n} (an average is sum / count)")
    if n is not None:
        return (f"every element is 1/{n} of the reference: divided by {n} once too often, or "
                f"only this rank's part without the sum over {n} ranks")
    return f"every element is {scale:.3g}x the reference (a wrong scale factor)"


def _numbers_report(failures: list[tuple[int, str, str]], world: int) -> str:
    rank, name, problem = failures[0]
    lines = [f"On rank {rank}, {name!r} {problem}"]
    if len(failures) > 1:
        by_name: dict[str, list[tuple[int, str]]] = {}
        for r, n, p in failures:
            by_name.setdefault(n, []).append((r, p))
        lines += ["", f"All {len(failures)} wrong values (tensor, ranks, first problem):"]
        for n, cases in by_name.items():
            ranks = "all ranks" if len(cases) == world else \
                "rank" + "s" * (len(cases) > 1) + " " + ", ".join(str(r) for r, _ in cases)
            short = cases[0][1].split("; allowed")[0].splitlines()[0]
            lines.append(f"  {n!r} on {ranks}: {short}")
    return "\n".join(lines)


# -- the library's references, switched off while the learner's own code is graded -------------


class ReferenceSwitchedOff(RuntimeError):
    """The exercise is graded on the learner's code: the library's version is off."""


@contextlib.contextmanager
def references_off(*targets: str) -> Iterator[None]:
    """While inside, the library's own versions of what an exercise builds raise a clear error.

    targets: names under dpmp_lab, e.g. "tp" (every public function and class of dl.tp and its
    private collective helpers), "tp.copy_to_tp_region", "dp.DataParallel", or a method of a
    class, "GridLayout.groups". Use it the same way in the visible and the hidden tests (in
    the notebook, or in the ranks through `with_references_off`), and say so in the exercise.
    """
    patches = [(owner, name) for target in targets for owner, name in _resolve_targets(target)]
    with contextlib.ExitStack() as stack:
        for owner, name in patches:   # through integrity: dl.ProcessGrid itself is guarded
            stack.enter_context(integrity.swapped(owner, name, _switched_off(owner, name)))
        yield


def with_references_off(fn: Callable[..., Any], *targets: str) -> Callable[..., Any]:
    """`fn`, run with `references_off(*targets)` around it: a function to launch on the ranks."""
    def graded(*args: Any, **kwargs: Any) -> Any:
        with references_off(*targets):
            return fn(*args, **kwargs)
    graded.__name__ = getattr(fn, "__name__", "graded")
    return graded


def _resolve_targets(target: str) -> list[tuple[Any, str]]:
    import importlib

    head, _, rest = target.partition(".")
    try:
        module = importlib.import_module(f"dpmp_lab.{head}")
    except ImportError:
        module = None
    if module is not None and not rest:          # a whole module: its public names
        names = [n for n in getattr(module, "__all__", []) if callable(getattr(module, n))]
        names += [n for n in ("_all_reduce", "_all_gather", "_reduce_scatter")
                  if n in vars(module)]
        return [(module, n) for n in names]
    import dpmp_lab

    owner: Any = module if module is not None else dpmp_lab
    parts = rest.split(".") if module is not None else target.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    if parts[-1] not in vars(owner):
        raise ValueError(f"references_off: dpmp_lab has no {target!r} to switch off")
    return [(owner, parts[-1])]


class _SwitchedOff:
    """Stands in for a switched-off function or class: calling it, or reaching any attribute
    of it (`ColumnParallelLinear.from_dense`), raises ReferenceSwitchedOff."""

    def __init__(self, label: str) -> None:
        object.__setattr__(self, "_label", label)

    def _refuse(self) -> ReferenceSwitchedOff:
        return ReferenceSwitchedOff(
            f"{self._label} is switched off here: this exercise is graded on your own code, so "
            "write it yourself (the library's version is there to compare with afterwards)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __getattr__(self, name: str) -> Any:
        raise self._refuse()

    def __repr__(self) -> str:
        return f"<{self._label}: switched off>"


def _switched_off(owner: Any, name: str) -> _SwitchedOff:
    where = getattr(owner, "__name__", "").removeprefix("dpmp_lab.")
    label = f"dl.{where}.{name}" if where and where != "dpmp_lab" else f"dl.{name}"
    return _SwitchedOff(label)


# -- communication ------------------------------------------------------------------------------


def comm(traces: Any, expected: Mapping | Callable[[int], Mapping], *,
         only: bool = True, bytes: Mapping | Callable[[int], Mapping] | None = None,
         bytes_rtol: float = 0.0, hints: Mapping | None = None,
         n_params: int | None = None) -> None:
    """Assert the exact communication each rank issued.

    traces:   res from dl.launch(..., trace=True), res.traces, or one Trace.
    expected: {key: calls} for every rank, or a function rank -> {key: calls}. A key is an op
              ("all_reduce"), (op, group) or (op, group, phase); group is a name ("dp"), a
              tuple of ranks, or None for any; phase is "forward", "backward", "none" or None.
    only:     every call a rank issued must match some key (else it is reported as extra).
    bytes:    {key: payload bytes} to check as well (exact, or within bytes_rtol).
    hints:    {key: message} to show when that key's count is wrong, before the built-in ones.
    n_params: trainable tensors of the model, so the hint can spot one all-reduce per tensor.
    """
    integrity.verify()
    _check_comm(traces, expected, only=only, bytes=bytes, bytes_rtol=bytes_rtol, hints=hints,
                n_params=n_params)


def _check_comm(traces: Any, expected: Mapping | Callable[[int], Mapping], *, only: bool = True,
                bytes: Any = None, bytes_rtol: float = 0.0, hints: Mapping | None = None,
                n_params: int | None = None) -> None:
    traces = traces_of(traces)
    problems: dict[str, list[int]] = {}
    for i, t in enumerate(traces):
        rank = t.rank if t.rank is not None else i
        want = expected(rank) if callable(expected) else expected
        want_bytes = bytes(rank) if callable(bytes) else bytes
        report = _comm_report(t, want, only, want_bytes, bytes_rtol, hints, n_params)
        if report:
            problems.setdefault(report, []).append(rank)
    if problems:
        parts = []
        for report, ranks in problems.items():
            who = "rank" if len(ranks) == 1 else "ranks"
            parts.append(f"The communication of {who} {', '.join(map(str, ranks))} is not what "
                         f"this exercise expects.\n\n{report}")
        raise CheckFailed("\n\n".join(parts))


_OVERLAP_HINT = ("the gradient communication starts only once backward has computed every "
                 "gradient (launched after loss.backward(), in finish(), or all at once from "
                 "the last hook): launch each bucket from a gradient hook as soon as its last "
                 "gradient has arrived, so it travels while earlier layers still compute theirs")


def overlaps_backward(traces: Any, op: str = "all_reduce", group: Any = None, *,
                      hint: str = _OVERLAP_HINT) -> None:
    """Assert that in every backward pass of every rank, some `op` call was issued while
    gradients were still being computed: communication overlapped with backward.

    The traces must come from `dl.trace(gradients_of=model)`, which records when each
    gradient is computed. A pass counts if it computed gradients and issued `op` calls.
    """
    integrity.verify()
    failures: dict[str, list[int]] = {}   # message -> ranks it is true of
    for i, t in enumerate(traces_of(traces)):
        rank = t.rank if t.rank is not None else i
        if not t.grads_ready:
            raise ValueError("no gradient times in the trace: record it with "
                             "dl.trace(gradients_of=model) around forward and backward")
        passes = [p for p in t.overlap(op, group) if p.calls]
        if not passes:
            failures.setdefault(f"no {op}{_on(group, None)} was issued during backward "
                                f"({t.count(op, group)} outside it).", []).append(rank)
            continue
        for n, p in enumerate(passes, 1):
            if not p.overlapped:
                failures.setdefault(
                    f"in backward pass {n}, all {p.calls} {op} call(s) were issued after the "
                    f"last of its {p.grads} gradients was computed, so none of them overlapped "
                    "backward.", []).append(rank)
    if failures:
        lines = [f"On {'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))}, {m}"
                 for m, r in failures.items()]
        raise CheckFailed("\n".join(lines) + f"\nLikely mistake: {hint}")


def _key(key: Any) -> tuple[str, Any, str | None]:
    parts = (key,) if isinstance(key, str) else tuple(key)
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"a communication key is op, (op, group) or (op, group, phase), "
                         f"not {key!r}")
    op, group, phase = (*parts, None, None)[:3]
    _matcher(op, group, phase)   # validates names early, with a clear message
    return op, group, phase


@dataclass
class _Row:
    """One line of the expected-vs-seen table."""

    op: str
    group: Any
    phase: Any
    expected: int
    seen: int
    key: tuple | None            # the expected key; None for calls nobody expected
    example: CommEvent | None = None

    @property
    def wrong(self) -> bool:
        return self.expected != self.seen


def _comm_report(t: Trace, expected: Mapping, only: bool, want_bytes: Mapping | None,
                 bytes_rtol: float, hints: Mapping | None, n_params: int | None) -> str:
    matched: set[int] = set()
    rows: list[_Row] = []
    for key, n in expected.items():
        op, group, phase = _key(key)
        picked = [i for i, ev in enumerate(t.events) if _matcher(op, group, phase)(ev)]
        matched.update(picked)
        rows.append(_Row(op, _show(group), _show(phase), n, len(picked), (op, group, phase)))
    if only:
        extra: dict[tuple, _Row] = {}
        for i, ev in enumerate(t.events):
            if i not in matched:
                k = (ev.op, ev.group_label, ev.phase or "none")
                extra.setdefault(k, _Row(*k, 0, 0, None, ev)).seen += 1
        rows += extra.values()
    bytes_lines = _bytes_problems(t, want_bytes, bytes_rtol)
    if not any(r.wrong for r in rows) and not bytes_lines:
        return ""
    table = viz.Table(["op", "group", "phase", "expected", "seen"],
                      [[r.op, r.group, r.phase, r.expected, r.seen] for r in rows],
                      marks=[r.wrong for r in rows])
    text = "\n".join("  " + line for line in str(table).splitlines())
    if bytes_lines:
        text += "\n\n" + "\n".join(bytes_lines)
    advice = _comm_hints(rows, hints or {}, n_params)
    if advice:
        text += "\n\nLikely mistake: " + "\nAlso: ".join(advice)
    return text


def _show(value: Any) -> Any:
    return "any" if value is None else value


def _bytes_problems(t: Trace, want: Mapping | None, rtol: float) -> list[str]:
    lines = []
    for key, n in (want or {}).items():
        op, group, phase = _key(key)
        seen = t.bytes(op, group, phase)
        if abs(seen - n) > rtol * abs(n):
            lines.append(f"bytes of {op} on {_show(group)} ({_show(phase)}): expected "
                         f"{n} ({viz.human_bytes(n)}), seen {seen} ({viz.human_bytes(seen)})")
    return lines


def _comm_hints(rows: list[_Row], hints: Mapping, n_params: int | None) -> list[str]:
    """Likely mistakes, most specific first, from the expected-vs-seen rows."""
    custom = {_key(k): v for k, v in hints.items()}
    extra = [r for r in rows if r.key is None]
    expected_ops = {r.op for r in rows if r.key is not None and r.expected > 0}
    explained: set[int] = set()   # extra rows a hint already accounts for
    out: list[str] = []
    for row in rows:
        if not row.wrong or row.key is None:
            continue
        op, group, phase = row.key
        if row.key in custom:   # the exercise's own words first, then ours below
            out.append(custom[row.key])
        if n_params and op == "all_reduce" and row.seen == n_params > row.expected:
            out.append(f"{row.seen} all-reduces = one per parameter tensor: flatten the "
                       "gradients into one buffer (or bucket them) and all-reduce that")
        elif row.seen == 0:
            out.append(_missing(row, extra, explained))
        elif row.expected and row.seen % row.expected == 0:
            out.append(f"{row.seen // row.expected}x the expected number of {op} calls"
                       f"{_on(group, phase)}: issued once per parameter or per micro-batch "
                       "instead of once per step, or twice (in a hook and again after "
                       "backward)?")
        elif row.seen > row.expected:
            out.append(f"{row.seen - row.expected} {op} call(s) more than needed"
                       f"{_on(group, phase)}")
        else:
            out.append(f"{row.expected - row.seen} {op} call(s) missing{_on(group, phase)}")
    for row in extra:
        mine = [msg for key, msg in custom.items() if _matcher(*key)(row.example)]
        if mine:   # the exercise's own words for a call it did not expect, even if explained
            out.append(mine[0])
        if id(row) in explained:
            continue
        if expected_ops and expected_ops <= {"send", "recv"} and row.op not in ("send", "recv"):
            out.append(f"this exercise builds its communication from send/recv only, but "
                       f"torch's {row.op} was called: {_P2P_ADVICE}")
        else:
            out.append(f"{row.seen} unexpected {row.op} call(s) on group "
                       f"{viz._cell(row.group)}: communication the algorithm does not need "
                       "costs time; remove it")
    return list(dict.fromkeys(out))


def _missing(row: _Row, extra: list[_Row], explained: set[int]) -> str:
    """Why an expected op was not seen at all: elsewhere, swapped for another op, or absent."""
    op, group, phase = row.key
    for other in extra:
        if other.op != op:
            continue
        explained.add(id(other))
        ev = other.example
        if group is not None and not _matcher(None, group, None)(ev):
            everyone = ev.label is None and ev.group == tuple(range(len(ev.group)))
            return (f"the {op} went to group {viz._cell(ev.group_label)} instead of the "
                    f"{viz._cell(group)} group: pass group=... to the collective"
                    + (" (without it, torch uses every rank)" if everyone else ""))
        if phase is not None:
            return (f"the {op} was issued {_phase_words(other.phase)}, not "
                    f"{_phase_words(phase)}: " + _phase_advice(phase))
        return f"the {op} was issued, but not where this exercise expects it"
    swap = _swapped_op(op, extra)
    if swap:
        explained.update(id(r) for r in extra)
        return swap
    return (f"no {op} was issued{_on(group, phase)}: the step that should communicate is "
            "missing (or never reached on this rank)")


def _swapped_op(op: str, extra: list[_Row]) -> str:
    others = {r.op for r in extra}
    if op == "all_reduce" and "all_gather" in others:
        return ("an all_gather where an all_reduce belongs: partial results must be summed "
                "(all_reduce), not concatenated")
    if op == "all_gather" and "all_reduce" in others:
        return ("an all_reduce where an all_gather belongs: the shards must be concatenated "
                "(all_gather), not summed")
    if op == "reduce_scatter" and "all_reduce" in others:
        return ("a full all_reduce where a reduce_scatter is enough: each rank only needs its "
                "own shard of the sum")
    if op in ("send", "recv") and others - {"send", "recv"}:
        used = ", ".join(sorted(others - {"send", "recv"}))
        return (f"torch's {used} was called, but this exercise builds the communication from "
                f"point-to-point messages: {_P2P_ADVICE}")
    return ""


_P2P_ADVICE = ("post each send together with its receive (dist.isend/dist.irecv, or "
               "dist.batch_isend_irecv, then wait), since on gloo a blocking send waits for its "
               "receiver, and ranks that all send first wait forever")


def _on(group: Any, phase: Any) -> str:
    where = "" if group is None else f" on the {viz._cell(group)} group"
    return where + ("" if phase is None else f" in {phase}")


def _phase_words(phase: Any) -> str:
    return {"forward": "during forward", "backward": "during backward"}.get(
        phase, "outside forward and backward")


def _phase_advice(phase: Any) -> str:
    if phase == "backward":
        return ("launch the gradient communication from gradient hooks during backward, so it "
                "overlaps the rest of backward, instead of after backward returns")
    if phase == "forward":
        return "this communication belongs in the forward pass"
    return "it should happen outside forward and backward (e.g. after backward returns)"


__all__ = ["CheckFailed", "FP32", "FP64", "OPS", "against_reference", "close", "comm",
           "compare", "grads", "overlaps_backward", "params", "references_off",
           "same_on_all_ranks", "with_references_off", "ReferenceSwitchedOff"]
