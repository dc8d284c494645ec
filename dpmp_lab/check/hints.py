"""The likely mistakes: what the "Likely mistake:" line of a failed check says, kept as tables.

The checks compare; this module knows why results usually come out wrong. Two tables, each a
list of entries tried in order, where the first entry that applies speaks:

  SCALE_HINTS  a result is the reference times a constant: a sum not divided by the ranks or
               micro-batches, an average divided twice, a value never filled in.
  COMM_HINTS   a line of a rank's communication table is wrong: another group or phase, one
               collective for another, one per tensor, Nx the count, calls missing or unasked.

A grader who knows another mistake puts an entry in front, so that it speaks first (the last
entries of each table apply to everything, so an entry appended after them never speaks):

    from dpmp_lab.check.hints import COMM_HINTS, CommHint
    COMM_HINTS.insert(0, CommHint(
        when=lambda row, table: row.op == "all_to_all" and row.expected is None,
        says="an all_to_all reshuffles every rank's data: this exercise needs none"))

`when(row, table)` sees one wrong row and the rank's whole table (Row, CommTable below); `says`
is the message, or a function of (row, table) that writes it. SCALE_HINTS works the same way on
a Scale. The words of one exercise for one key go in `dl.check.comm(..., hints={key: message})`
instead; they are shown before the table's. Hints are read only once a check has failed, so an
entry changes what a failure says, never whether a check passes.

Every entry has a `key` (e.g. "comm.one_per_parameter"), printed after the hints of a failure as
"[hint: comm.one_per_parameter]" so that `dpmp-lab report` counts a class's mistakes by key, not
by their words (which carry numbers); an exercise's own words are keyed "exercise.<op>...".
The words are the library's, in the learner's language (i18n/messages.py: `_`, `N_`).

Why it stays whole: the order of each table decides which entry speaks, so each table is read
in one place, top to bottom, with the few words its entries share.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dpmp_lab.i18n.messages import N_, _
from dpmp_lab.render import cell
from dpmp_lab.trace import CommEvent, matcher

__all__ = ["BLOCKING_HINT", "COMM_HINTS", "CommHint", "CommTable", "HINT_TAG", "OVERLAP_HINT",
           "GATHERED_SUM", "ONE_RANK_REDUCES", "P2P", "P2P_ADVICE",
           "REDUCED_BY_HAND", "REPLICA_HINT", "Row", "SCALE_HINTS", "Scale", "ScaleHint",
           "UNFILLED_HINT", "UNWAITED_HINT", "WRITTEN_IN_FLIGHT_HINT", "exercise_key", "keyed_likely_mistakes",
           "keyed_scale_hint", "keyed_unfilled_hint", "likely", "tag", "where"]

# -- the keys a failure carries ----------------------------------------------------------------

HINT_TAG = re.compile(r"\[hint: ([A-Za-z0-9_.:-]+)\]")


def tag(keys: Iterable[str]) -> str:
    """'[hint: a] [hint: b]': the keys of a failure's hints, as its message carries them."""
    return " ".join(f"[hint: {k}]" for k in dict.fromkeys(keys))


def likely(hint: str) -> str:
    """'Likely mistake: <hint>', in the learner's language (the hint too, where it is one of
    the library's own)."""
    return _("Likely mistake: {hint}").format(hint=_(hint))


def exercise_key(key: tuple) -> str:
    """The key of an exercise's own words for communication key (op, group, phase)."""
    return "exercise." + ".".join(re.sub(r"[^A-Za-z0-9_]+", "_", str(p)) for p in key
                                  if p is not None)


# -- the fixed hints of single checks -----------------------------------------------------------

REPLICA_HINT = N_("the ranks started from different weights (broadcast from rank 0 missing) "
                  "or stepped with different gradients (gradients not averaged over the "
                  "group).")

OVERLAP_HINT = N_("the gradient communication starts only once backward has computed every "
                  "gradient (launched after loss.backward(), in finish(), or all at once from "
                  "the last hook): launch each bucket from a gradient hook as soon as its last "
                  "gradient has arrived, so it travels while earlier layers still compute "
                  "theirs")

BLOCKING_HINT = N_("the hooks started each all-reduce at the right moment, then waited for it "
                   "(a call without async_op returns only once its result has arrived, and so "
                   "does a handle's wait() called at once), so backward stood still meanwhile; "
                   "overlap needs a handle at once, and the wait after backward")

UNWAITED_HINT = N_("an asynchronous call returns at once and fills its tensor later; only its "
                   "handle's wait() says the result is there (on gloo it often is already, on "
                   "a GPU usually not), so a result read without it is whatever the buffer held "
                   "then. [hint: check.unwaited]")

WRITTEN_IN_FLIGHT_HINT = N_(
    "an asynchronous call works on its tensor in the background until its handle's wait() "
    "returns; a change made to that tensor before then lands before or after the "
    "communication reads or fills it, as the timing falls, so the result varies from run to "
    "run. [hint: check.written_in_flight]")

# a reduction the ranks did by hand around collectives that only move data: one rank adding
# for all and sending the sum back, or every rank receiving all N copies to add them up
ONE_RANK_REDUCES = N_(
    "the gradients were reduced onto one rank and sent back from it: two collectives, one "
    "after the other, where a single one can leave the sum on every rank with the additions "
    "spread over all of them (done naively, the one rank receives and sends all N-1 other "
    "gradients). [hint: dp.reduce_then_broadcast]")
GATHERED_SUM = N_(
    "every rank received all N gradients to add them up itself: N copies of the gradient in "
    "memory and (N-1) n bytes in per rank, where a reduction done inside the collective sends "
    "about 2n per rank whatever N. [hint: dp.gather_then_sum]")
REDUCED_BY_HAND = {"reduce": ONE_RANK_REDUCES, "broadcast": ONE_RANK_REDUCES,
                   "all_gather": GATHERED_SUM}

# how the backwards of gradient accumulation's steps communicated, when not as they must
ACCUMULATION_ONE_BACKWARD = N_(
    "a step ran {ran} backward, not {n_micro}: the micro-batches' losses were added up and "
    "backpropagated once, so every micro-batch's activations stayed alive until that one "
    "backward. That is one large batch in pieces, with the memory of the whole shard; "
    "accumulation runs a backward per micro-batch, which frees that micro-batch's activations "
    "before the next forward. [hint: dp.accumulation_one_backward]")
ACCUMULATION_PIECES = N_(
    "a step ran {ran} backwards where it has {n_micro} micro-batches: the shard was cut into "
    "{ran} pieces, not {n_micro}. [hint: dp.accumulation_pieces]")
ACCUMULATION_NEVER_SENT = N_(
    "nothing was sent in any backward, so every rank stepped with its own gradient: a backward "
    "inside no_sync sends nothing, and finish_gradient_sync only completes what a backward "
    "outside it started. [hint: dp.accumulation_never_sent]")
ACCUMULATION_EVERY_BACKWARD = N_(
    "every micro-batch's backward sent all {n_buckets} buckets. The average may come out "
    "right, but each step sends its gradient {n_micro} times: all but one of those are partial "
    "sums that the next backward adds to. [hint: dp.accumulation_every_backward]")
ACCUMULATION_SENT_EARLY = N_(
    "the buckets went out in a backward before a step's last one: what was sent then held "
    "only the micro-batches done so far, and what the later backwards added to p.grad never "
    "reached the other ranks. [hint: dp.accumulation_sent_early]")
ACCUMULATION_SENDS = N_(
    "a step's gradient is complete only once its last micro-batch's backward has added to "
    "p.grad; what any backward sends before that is a partial sum, and a bucket sent twice is "
    "sent for nothing. [hint: dp.accumulation_sends]")

P2P_ADVICE = N_("post each send together with its receive (dist.isend/dist.irecv, or "
                "dist.batch_isend_irecv, then wait), since on gloo a blocking send waits for "
                "its receiver, and ranks that all send first wait forever")


# -- a result that is the reference times a constant ---------------------------------------------


@dataclass(frozen=True)
class Scale:
    """A result that is the reference times `factor`, element by element."""

    factor: float
    world: int | None = None   # the ranks of the run, when known

    @property
    def whole(self) -> int | None:
        """n when the factor is n or 1/n for a whole number n > 1, else None."""
        for n in (self.factor, 1 / self.factor) if self.factor else ():
            if math.isfinite(n) and abs(n - round(n)) < 1e-3 and round(n) > 1:
                return round(n)
        return None


@dataclass(frozen=True)
class ScaleHint:
    """A likely mistake behind a scaled result: `says` (a message, or a function of the Scale
    that writes it) when `when(scale)` holds."""

    when: Callable[[Scale], bool]
    says: str | Callable[[Scale], str]
    key: str = "scale.grader"


# A whole factor n reads as a sum over n ranks or micro-batches not divided by n; when n is not
# the number of ranks of the run it cannot be the ranks.
SCALE_HINTS: list[ScaleHint] = [
    # |factor| below 1e-9: an unfilled buffer's leftovers (-9e-309x, say), not a scale
    ScaleHint(lambda s: abs(s.factor) < 1e-9,
              N_("every element is zero: the value was never filled in, was read before the "
                 "collective filling it had finished (before its handle's wait()), or was zeroed "
                 "after it was computed (zero_grad in the wrong place?)"), key="scale.zero"),
    ScaleHint(lambda s: s.whole is not None and s.world is not None and s.whole != s.world
              and s.factor < 1,
              N_("every element is 1/{n} of the reference: divided by {n} once too often (not "
                 "the ranks: this run has {world}), or a wrong constant factor in the formula"),
              key="scale.divided_too_often"),
    ScaleHint(lambda s: s.whole is not None and s.world is not None and s.whole != s.world,
              N_("every element is {n}x the reference: a sum over {n} micro-batches or parts "
                 "that was not divided by {n} (not over the ranks: this run has {world}), or a "
                 "wrong constant factor in the formula"), key="scale.sum_not_divided"),
    ScaleHint(lambda s: s.whole is not None and s.factor > 1,
              N_("every element is {n}x the reference: a sum over {n} ranks or micro-batches "
                 "that was not divided by {n} (an average is sum / count)"),
              key="scale.sum_over_ranks_not_divided"),
    ScaleHint(lambda s: s.whole is not None,
              N_("every element is 1/{n} of the reference: divided by {n} once too often, or "
                 "only this rank's part without the sum over {n} ranks"),
              key="scale.divided_by_ranks_too_often"),
    ScaleHint(lambda s: True,
              N_("every element is {factor:.3g}x the reference (a wrong scale factor)"),
              key="scale.wrong_factor"),
]


def keyed_scale_hint(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float,
                     world: int | None = None) -> tuple[str, str]:
    """(key, message) of the likely mistake when `actual` is `expected` times a constant other
    than 1, else ('', ''). The constant is the least-squares fit; the fit must hold within 10x
    the tolerance."""
    denom = (expected * expected).sum().item()
    if denom == 0:
        return "", ""
    factor = (actual * expected).sum().item() / denom
    if (not math.isfinite(factor) or abs(factor - 1) < 1e-3
            or not torch.allclose(actual, factor * expected, rtol=10 * rtol, atol=10 * atol)):
        return "", ""
    scale = Scale(factor, world)
    hint = next((h for h in SCALE_HINTS if h.when(scale)), None)
    if hint is None:
        return "", ""
    if isinstance(hint.says, str):
        return hint.key, _(hint.says).format(n=scale.whole, world=scale.world,
                                             factor=scale.factor)
    return hint.key, hint.says(scale)


UNFILLED_HINT = N_("some elements are far beyond anything the computation makes ({value:.3g}): "
                   "memory read before anything was written to it, such as the result of an "
                   "asynchronous collective used before its handle's wait(), or a buffer from "
                   "torch.empty that was never filled")


def keyed_unfilled_hint(actual: torch.Tensor, expected: torch.Tensor) -> tuple[str, str]:
    """(key, message) when `actual` holds what only memory nobody wrote holds: values not a
    number, infinite, or 1e10 times the largest expected one, where the expected ones are
    finite; else ('', '')."""
    if not bool(torch.isfinite(expected).all()) or actual.numel() == 0:
        return "", ""
    bound = 1e10 * max(expected.abs().max().item(), 1e-30)
    odd = ~torch.isfinite(actual) | (actual.abs() > bound)
    if not bool(odd.any()):
        return "", ""
    value = actual[odd][0].item()
    return "value.unfilled", _(UNFILLED_HINT).format(value=value)


# -- a rank's communication, expected against seen ---------------------------------------------


@dataclass(eq=False)
class Row:
    """One line of a rank's communication table: the calls of one key, expected against seen.

    For a key, op, group and phase are the key's (None: any). For calls that no key expected,
    they are the calls' own (phase "none": outside forward and backward), `expected` is None
    and `example` is the first of them.
    """

    op: str
    group: Any
    phase: str | None
    expected: int | None
    seen: int
    example: CommEvent | None = None

    @property
    def wrong(self) -> bool:
        return self.expected != self.seen

    @property
    def key(self) -> tuple[str, Any, str | None]:
        return self.op, self.group, self.phase


@dataclass
class CommTable:
    """One rank's communication: a row per expected key, in the order given, then a row per
    (op, group, phase) of the calls no key expected. What every comm hint reads."""

    rows: list[Row]
    n_params: int | None = None   # the model's trainable tensors, when the check was told

    @property
    def wrong(self) -> bool:
        return any(r.wrong for r in self.rows)

    @property
    def unexpected(self) -> list[Row]:
        return [r for r in self.rows if r.expected is None]

    @property
    def unexpected_ops(self) -> set[str]:
        return {r.op for r in self.unexpected}

    @property
    def expected_ops(self) -> set[str]:
        """The ops some key expects at least once."""
        return {r.op for r in self.rows if r.expected}

    def unexpected_of(self, op: str) -> Row | None:
        """The first row of calls nobody expected that issued `op`."""
        return next((r for r in self.unexpected if r.op == op), None)


def _nothing(row: Row, table: CommTable) -> Iterable[Row]:
    return ()


@dataclass(frozen=True)
class CommHint:
    """A likely mistake behind a wrong row: `says` (a message, or a function of row and table
    that writes it) when `when(row, table)` holds. `accounts_for(row, table)`: the rows of calls
    nobody expected that this mistake explains, so they get no line of their own."""

    when: Callable[[Row, CommTable], bool]
    says: str | Callable[[Row, CommTable], str]
    accounts_for: Callable[[Row, CommTable], Iterable[Row]] = _nothing
    key: str = "comm.grader"


# -- the words the comm hints share ----------------------------------------------------------------

P2P = ("send", "recv")

_PHASE_WORDS = {"forward": N_("during forward"), "backward": N_("during backward")}
_PHASE_ADVICE = {"backward": N_("launch the gradient communication from gradient hooks during "
                                "backward, so it overlaps the rest of backward, instead of "
                                "after backward returns"),
                 "forward": N_("this communication belongs in the forward pass")}


def where(group: Any, phase: str | None) -> str:
    """' on the dp group in backward', or as much of it as is given."""
    return (("" if group is None else _(" on the {group} group").format(group=cell(group)))
            + ("" if phase is None else _(" in {phase}").format(phase=phase)))


def _op(row: Row) -> str:
    """A row's op, or the words for any op (a key that counts calls whatever the collective)."""
    return row.op if row.op is not None else _("collective")


def _phase_words(phase: str | None) -> str:
    return _(_PHASE_WORDS.get(phase, N_("outside forward and backward")))


def _phase_advice(phase: str | None) -> str:
    return _(_PHASE_ADVICE.get(phase, N_("it should happen outside forward and backward (e.g. "
                                         "after backward returns)")))


def _none_seen(row: Row) -> bool:
    return row.expected is not None and row.seen == 0


def _elsewhere(row: Row, table: CommTable) -> Row | None:
    """For an expected op that was not seen: the first of its calls that went somewhere else."""
    return table.unexpected_of(row.op) if _none_seen(row) else None


def _the_call_elsewhere(row: Row, table: CommTable) -> list[Row]:
    return [_elsewhere(row, table)]


def _every_unexpected(row: Row, table: CommTable) -> list[Row]:
    return table.unexpected


def _to_another_group(row: Row, table: CommTable) -> bool:
    other = _elsewhere(row, table)
    return (other is not None and row.group is not None
            and not matcher(None, row.group, None)(other.example))


def _another_group_words(row: Row, table: CommTable) -> str:
    ev = _elsewhere(row, table).example
    everyone = ev.label is None and ev.group == tuple(range(len(ev.group)))
    return (_("the {op} went to group {went} instead of the {group} group: pass group=... to "
              "the collective").format(op=row.op, went=cell(ev.group_label),
                                       group=cell(row.group))
            + (_(" (without it, torch uses every rank)") if everyone else ""))


def _instead(wanted: str, used: str) -> Callable[[Row, CommTable], bool]:
    """`used` was issued where `wanted` belongs (and no `wanted` at all)."""
    return lambda row, table: (_none_seen(row) and row.op == wanted
                               and used in table.unexpected_ops)


# -- the table -----------------------------------------------------------------------------------

COMM_HINTS: list[CommHint] = [
    CommHint(lambda row, t: (row.expected is not None and row.op == "all_reduce"
                             and bool(t.n_params) and row.seen == t.n_params > row.expected),
             lambda row, t: _("{seen} all-reduces = one per parameter tensor: flatten the "
                              "gradients into one buffer (or bucket them) and all-reduce that"
                              ).format(seen=row.seen),
             key="comm.one_per_parameter"),

    # the expected op was issued, but not where the key says: its first such call tells where.
    # (In the same group and any phase, it would have matched the key: group or phase differs.)
    CommHint(_to_another_group, _another_group_words, _the_call_elsewhere, key="comm.wrong_group"),
    CommHint(lambda row, t: _elsewhere(row, t) is not None and row.phase is not None,
             lambda row, t: _("the {op} was issued {there}, not {here}: {advice}").format(
                 op=row.op, there=_phase_words(_elsewhere(row, t).phase),
                 here=_phase_words(row.phase), advice=_phase_advice(row.phase)),
             _the_call_elsewhere, key="comm.wrong_phase"),

    # one collective where another belongs
    CommHint(_instead("all_reduce", "all_gather"),
             N_("an all_gather where an all_reduce belongs: partial results must be summed "
                "(all_reduce), not concatenated"), _every_unexpected,
             key="comm.all_gather_for_all_reduce"),
    CommHint(_instead("all_gather", "all_reduce"),
             N_("an all_reduce where an all_gather belongs: the shards must be concatenated "
                "(all_gather), not summed"), _every_unexpected,
             key="comm.all_reduce_for_all_gather"),
    CommHint(_instead("reduce_scatter", "all_reduce"),
             N_("a full all_reduce where a reduce_scatter is enough: each rank only needs its "
                "own shard of the sum"), _every_unexpected,
             key="comm.all_reduce_for_reduce_scatter"),
    CommHint(lambda row, t: (_none_seen(row) and row.op in P2P
                             and bool(t.unexpected_ops - set(P2P))),
             lambda row, t: _("torch's {ops} was called, but this exercise builds the "
                              "communication from point-to-point messages: {advice}").format(
                 ops=", ".join(sorted(t.unexpected_ops - set(P2P))), advice=_(P2P_ADVICE)),
             _every_unexpected, key="comm.collective_for_send_recv"),

    # the count of an expected op
    CommHint(lambda row, t: _none_seen(row),
             lambda row, t: _("no {op} was issued{where}: the step that should communicate is "
                              "missing (or never reached on this rank)").format(
                 op=_op(row), where=where(row.group, row.phase)),
             key="comm.none_issued"),
    CommHint(lambda row, t: bool(row.expected) and row.seen % row.expected == 0,
             lambda row, t: _("{n}x the expected number of {op} calls{where}: issued once per "
                              "parameter, per micro-batch or per projection where one call "
                              "serves them all, or twice (in a hook and again after "
                              "backward)?").format(n=row.seen // row.expected, op=_op(row),
                                                   where=where(row.group, row.phase)),
             key="comm.multiple_of_expected"),
    CommHint(lambda row, t: row.expected is not None and row.seen > row.expected,
             lambda row, t: _("{n} {op} call(s) more than needed{where}").format(
                 n=row.seen - row.expected, op=_op(row), where=where(row.group, row.phase)),
             key="comm.more_than_needed"),
    CommHint(lambda row, t: row.expected is not None,
             lambda row, t: _("{n} {op} call(s) missing{where}").format(
                 n=row.expected - row.seen, op=_op(row), where=where(row.group, row.phase)),
             key="comm.calls_missing"),

    # calls nobody expected
    CommHint(lambda row, t: (row.op not in P2P and bool(t.expected_ops)
                             and t.expected_ops <= set(P2P)),
             lambda row, t: _("this exercise builds its communication from send/recv only, but "
                              "torch's {op} was called: {advice}").format(op=row.op,
                                                                          advice=_(P2P_ADVICE)),
             key="comm.collective_in_send_recv_exercise"),
    CommHint(lambda row, t: True,
             lambda row, t: _("{n} unexpected {op} call(s) on group {group}: communication the "
                              "algorithm does not need costs time; remove it").format(
                 n=row.seen, op=row.op, group=cell(row.group)),
             key="comm.unexpected"),
]


def keyed_likely_mistakes(table: CommTable,
                          custom: Mapping[tuple, str] | None = None) -> list[tuple[str, str]]:
    """What most likely went wrong in a rank's table, as (key, message) pairs: for each wrong
    row, the exercise's own words first (keyed by exercise_key), then the first entry of
    COMM_HINTS that applies (by its key). A row of calls nobody expected gets no entry of its
    own when an earlier one accounted for it. custom: {(op, group, phase): message}, an
    exercise's words for the row of that key and for calls nobody expected that it matches."""
    custom = custom or {}
    out: list[tuple[str, str]] = []
    accounted: set[Row] = set()
    for row in table.rows:
        if not row.wrong:
            continue
        if row.expected is not None:
            out += [(exercise_key(row.key), custom[row.key])] if row.key in custom else []
        else:
            out += [(exercise_key(key), msg) for key, msg in custom.items()
                    if matcher(*key)(row.example)][:1]
            if row in accounted:
                continue
        hint = next((h for h in COMM_HINTS if h.when(row, table)), None)
        if hint is None:
            continue
        out.append((hint.key, _(hint.says) if isinstance(hint.says, str)
                    else hint.says(row, table)))
        accounted.update(hint.accounts_for(row, table))
    return list(dict.fromkeys(out))
