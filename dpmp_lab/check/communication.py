"""Communication checks: exact counts per op, group and phase, bytes, and overlap with backward.

    dl.check.comm(res, {("all_reduce", "tp", "forward"): 1, ("all_reduce", "tp", "backward"): 1})
    dl.check.overlaps_backward(res)      # traced with dl.trace(gradients_of=model)
    dl.check.reduced_in_one_collective(res, "dp_train_step")
    dl.check.accumulation_sends(traces, steps=2, n_micro=4, n_buckets=2)

A key names a set of calls: an op ("all_reduce"), (op, group) or (op, group, phase). Each rank's
calls are counted per key into a table of expected against seen (hints.CommTable). A rank whose
table is wrong gets it printed with the wrong rows marked, then the likely mistakes that
hints.COMM_HINTS finds in it; ranks with the same report are reported once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dpmp_lab._helpers import indent, ranks_text
from dpmp_lab.check.failed import CheckFailed
from dpmp_lab.check.hints import (
    ACCUMULATION_EVERY_BACKWARD,
    ACCUMULATION_NEVER_SENT,
    ACCUMULATION_ONE_BACKWARD,
    ACCUMULATION_PIECES,
    ACCUMULATION_SENDS,
    ACCUMULATION_SENT_EARLY,
    BLOCKING_HINT,
    OVERLAP_HINT,
    REDUCED_BY_HAND,
    UNWAITED_HINT,
    WRITTEN_IN_FLIGHT_HINT,
    CommTable,
    Row,
    keyed_likely_mistakes,
    likely,
    tag,
    where,
)
from dpmp_lab.i18n.messages import _
from dpmp_lab.render import Table, cell, human_bytes
from dpmp_lab.trace import Trace, matcher, traces_of

__all__ = ["accumulation_sends", "all_waited", "comm", "comm_table", "overlaps_backward",
           "parse_key", "reduced_in_one_collective", "untouched_in_flight"]

Key = tuple[str, Any, str | None]   # (op, group, phase); None: any


def comm(traces: Any, expected: Mapping | Callable[[int], Mapping], *,
         only: bool = True, bytes: Mapping | Callable[[int], Mapping] | None = None,
         bytes_rtol: float = 0.0, hints: Mapping | None = None,
         n_params: int | None = None) -> None:
    """Assert the exact communication each rank issued.

    traces:   res from dl.launch(..., trace=True), res.traces, or one Trace.
    expected: {key: calls} for every rank, or a function rank -> {key: calls}. A key is an op
              ("all_reduce"), (op, group) or (op, group, phase); op is None for any (an
              exercise that leaves the collective to the learner counts calls per phase);
              group is a name ("dp"), a tuple of ranks, or None for any; phase is "forward",
              "backward", "none" or None.
    only:     every call a rank issued must match some key (else it is reported as extra).
    bytes:    {key: payload bytes} to check as well (exact, or within bytes_rtol).
    hints:    {key: message} to show when that key's count is wrong, before the built-in ones.
    n_params: trainable tensors of the model, so the hint can spot one all-reduce per tensor.
    """
    reports: dict[str, list[int]] = {}   # report -> the ranks it is true of
    for i, t in enumerate(traces_of(traces)):
        rank = t.rank if t.rank is not None else i
        want = expected(rank) if callable(expected) else expected
        want_bytes = bytes(rank) if callable(bytes) else bytes
        report = _rank_report(t, want, only, want_bytes, bytes_rtol, hints, n_params)
        if report:
            reports.setdefault(report, []).append(rank)
    if reports:
        raise CheckFailed("\n\n".join(
            _("The communication of {ranks} is not what this exercise expects.").format(
                ranks=ranks_text(ranks)) + f"\n\n{report}" for report, ranks in reports.items()))


def reduced_in_one_collective(traces: Any, step: str) -> None:
    """Assert that no rank did a reduction's work around collectives that only move data (one
    rank reducing for all and sending the sum back; every rank gathering all N copies to add
    them up), and say which of the two it was. An exercise that leaves the choice of the
    collective to the learner asks for it this way, so that its visible test names none."""
    ts = traces_of(traces)
    used = sorted({ev.op for t in ts for ev in t.events} & set(REDUCED_BY_HAND))
    if used:
        raise CheckFailed(
            _("{step} issued {ops} calls, on {world} ranks.").format(
                step=step, ops=" and ".join(used), world=len(ts))
            + "\n" + likely(REDUCED_BY_HAND[used[0]]))


def all_waited(traces: Any, step: str) -> None:
    """Assert that no rank issued an asynchronous call whose handle it never waited on inside
    its trace (Trace.unwaited): the exercises that leave async_op to the learner ask this way,
    so that a result read early fails for that reason, not as wrong numbers."""
    for i, t in enumerate(traces_of(traces)):
        if t.unwaited():
            rank = t.rank if t.rank is not None else i
            raise CheckFailed(
                _("rank {rank}: {step} issued {n} asynchronous call(s) whose handle it never "
                  "waited on.").format(rank=rank, step=step, n=t.unwaited())
                + "\n" + likely(UNWAITED_HINT))
    untouched_in_flight(traces, step)


def untouched_in_flight(traces: Any, step: str) -> None:
    """Assert that no rank changed an asynchronous call's tensor in place before waiting on
    it (Trace.written_in_flight): a division or a copy into a buffer still on the wire gives
    numbers that come and go with the timing; this says why, the same on every run."""
    for i, t in enumerate(traces_of(traces)):
        written = t.written_in_flight()
        if written:
            rank = t.rank if t.rank is not None else i
            raise CheckFailed(
                _("rank {rank}: {step} changed the tensor of an asynchronous {op} in place "
                  "before waiting on its handle.").format(rank=rank, step=step,
                                                          op=written[0].op)
                + "\n" + likely(WRITTEN_IN_FLIGHT_HINT))


def accumulation_sends(traces: Any, steps: int, n_micro: int, n_buckets: int,
                       op: str = "all_reduce") -> None:
    """Assert that the backwards of `steps` optimizer steps, each of `n_micro` micro-batches,
    sent their gradient's `n_buckets` buckets (as `op` calls) once a step, when it was whole;
    otherwise name what happened instead, from the calls each backward issued. The exercise
    that asks for it leaves to the learner which backwards send, so its test states no pattern.

    The traces must come from `dl.trace(gradients_of=model)`, which tells backwards apart.
    """
    want = ([0] * (n_micro - 1) + [n_buckets]) * steps
    for i, t in enumerate(traces_of(traces)):
        rank = t.rank if t.rank is not None else i
        sent = [p.calls for p in t.overlap(op)]
        if sent == want:
            continue
        lasts = sent[n_micro - 1::n_micro]
        if n_micro > 1 and len(sent) == steps:
            why = _(ACCUMULATION_ONE_BACKWARD).format(ran=len(sent) // steps, n_micro=n_micro)
        elif len(sent) % steps == 0 and len(sent) != steps * n_micro:
            why = _(ACCUMULATION_PIECES).format(ran=len(sent) // steps, n_micro=n_micro)
        elif not any(sent):
            why = _(ACCUMULATION_NEVER_SENT)
        elif sent == [n_buckets] * len(sent):
            why = _(ACCUMULATION_EVERY_BACKWARD).format(n_buckets=n_buckets, n_micro=n_micro)
        elif not any(lasts):
            why = _(ACCUMULATION_SENT_EARLY)
        else:
            why = _(ACCUMULATION_SENDS)
        raise CheckFailed(
            _("On rank {rank}, the {op} calls of each backward ({steps} step(s) of {n_micro} "
              "micro-batches, the gradient in {n_buckets} buckets) were {sent}.").format(
                rank=rank, op=op, steps=steps, n_micro=n_micro, n_buckets=n_buckets, sent=sent)
            + "\n" + _("Likely mistake: {hint}").format(hint=why))


def overlaps_backward(traces: Any, op: str = "all_reduce", group: Any = None, *,
                      hint: str = OVERLAP_HINT) -> None:
    """Assert that in every backward pass of every rank, some asynchronous `op` call was still
    in flight, not yet waited for, when backward computed a gradient: communication overlapped
    with backward. (A blocking call issued there overlaps nothing: backward waits for it; nor
    does an asynchronous one waited for at once.)

    The traces must come from `dl.trace(gradients_of=model)`, which records when each
    gradient is computed. A pass counts if it computed gradients and issued `op` calls.
    """
    failures: dict[str, list[int]] = {}   # message -> the ranks it is true of
    blocking: set[int] = set()
    for i, t in enumerate(traces_of(traces)):
        rank = t.rank if t.rank is not None else i
        if not t.grads_ready:
            raise ValueError("no gradient times in the trace: record it with "
                             "dl.trace(gradients_of=model) around forward and backward")
        passes = [p for p in t.overlap(op, group) if p.calls]
        if not passes:
            failures.setdefault(_("no {op}{where} was issued during backward ({outside} "
                                  "outside it).").format(op=op, where=where(group, None),
                                                         outside=t.count(op, group)),
                                []).append(rank)
            continue
        for n, p in enumerate(passes, 1):
            if p.overlapped:
                continue
            if p.async_before_last_grad:
                blocking.add(rank)
                failures.setdefault(
                    _("in backward pass {n}, {calls} {op} call(s) were issued asynchronously "
                      "while gradients were still being computed, but each was waited for "
                      "before backward computed another gradient: none was still travelling "
                      "while backward went on.").format(
                        n=n, calls=p.async_before_last_grad, op=op), []).append(rank)
            elif p.before_last_grad:
                blocking.add(rank)
                failures.setdefault(
                    _("in backward pass {n}, {calls} {op} call(s) were issued while gradients "
                      "were still being computed, but as blocking calls: each returned only "
                      "once its sum had arrived, and backward stood still meanwhile.").format(
                        n=n, calls=p.before_last_grad, op=op), []).append(rank)
            else:
                failures.setdefault(
                    _("in backward pass {n}, all {calls} {op} call(s) were issued after the last "
                      "of its {grads} gradients was computed, so none of them overlapped "
                      "backward.").format(n=n, calls=p.calls, op=op, grads=p.grads),
                    []).append(rank)
    if failures:
        lines = [_("On {ranks}, {message}").format(ranks=ranks_text(ranks), message=message)
                 for message, ranks in failures.items()]
        if blocking:
            raise CheckFailed("\n".join(lines) + "\n"
                              + likely(BLOCKING_HINT)
                              + "\n" + tag(["overlap.blocking"]))
        raise CheckFailed("\n".join(lines) + "\n" + likely(hint)
                          + "\n" + tag(["overlap.after_backward" if hint == OVERLAP_HINT
                                        else "exercise.overlap"]))


def parse_key(key: Any) -> Key:
    """An expectation's key as (op, group, phase), its names checked at once."""
    parts = (key,) if isinstance(key, str) else tuple(key)
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"a communication key is op, (op, group) or (op, group, phase), "
                         f"not {key!r}")
    op, group, phase = (*parts, None, None)[:3]
    matcher(op, group, phase)   # an unknown op or phase fails here, with a clear message
    return op, group, phase


def comm_table(t: Trace, expected: Mapping, *, only: bool = True,
               n_params: int | None = None) -> CommTable:
    """A rank's calls counted per key; with `only`, the calls no key matched as extra rows,
    one per (op, group, phase)."""
    matched: set[int] = set()
    rows = []
    for key, n in expected.items():
        op, group, phase = parse_key(key)
        match = matcher(op, group, phase)
        picked = [i for i, ev in enumerate(t.events) if match(ev)]
        matched.update(picked)
        rows.append(Row(op, group, phase, n, len(picked)))
    if only:
        extra: dict[tuple, Row] = {}
        for i, ev in enumerate(t.events):
            if i not in matched:
                k = (ev.op, ev.group_label, ev.phase or "none")
                extra.setdefault(k, Row(*k, expected=None, seen=0, example=ev)).seen += 1
        rows += extra.values()
    return CommTable(rows, n_params)


def _rank_report(t: Trace, expected: Mapping, only: bool, want_bytes: Mapping | None,
                 bytes_rtol: float, hints: Mapping | None, n_params: int | None) -> str:
    """'' when this rank's communication is right, else its table, bytes and likely mistakes."""
    table = comm_table(t, expected, only=only, n_params=n_params)
    bytes_lines = _bytes_problems(t, want_bytes, bytes_rtol)
    if not table.wrong and not bytes_lines:
        return ""
    text = indent(str(Table(
        [_("op"), _("group"), _("phase"), _("expected"), _("seen")],
        [[_any(r.op), _any(r.group), _any(r.phase), r.expected or 0, r.seen]
         for r in table.rows],
        marks=[r.wrong for r in table.rows])))
    if bytes_lines:
        text += "\n\n" + "\n".join(bytes_lines)
    advice = keyed_likely_mistakes(table, {parse_key(k): v for k, v in (hints or {}).items()})
    if advice:
        messages = list(dict.fromkeys(msg for _key, msg in advice))
        text += ("\n\n" + "\n".join([likely(messages[0])]
                                    + [_("Also: {hint}").format(hint=m) for m in messages[1:]])
                 + "\n" + tag(key for key, _msg in advice))
    return text


def _bytes_problems(t: Trace, want: Mapping | None, rtol: float) -> list[str]:
    lines = []
    for key, n in (want or {}).items():
        op, group, phase = parse_key(key)
        seen = t.bytes(op, group, phase)
        if abs(seen - n) > rtol * abs(n):
            lines.append(_("bytes of {op} on {group} ({phase}): expected {n} ({n_human}), seen "
                           "{seen} ({seen_human})").format(
                op=op, group=_any(group), phase=_any(phase), n=n, n_human=human_bytes(n),
                seen=seen, seen_human=human_bytes(seen)))
    return lines


def _any(value: Any) -> str:
    return _("any") if value is None else cell(value)
