"""Checks that graders and learners call: numbers against a reference, and communication.

    res = dl.check.against_reference(my_dp_step, full_batch_step, world_size=4,
                                     comm={("all_reduce", None, "backward"): 2})
    dl.check.comm(res, {("all_reduce", "tp", "forward"): 1, ("all_reduce", "tp", "backward"): 1})

A failed check raises CheckFailed (an AssertionError) whose message is for the learner: which
tensor on which rank, how far off, what communication was expected and what was seen, and the
mistake that most often produces that difference. In a notebook only the message is shown,
not our internals.

    audited        launch: dl.launch for a check, under the device audit where the ranks
                   have no GPU each (as the grader runs it), so a misplaced tensor fails here
    numbers        compare, close, same_on_all_ranks, against_reference; grads, params
    communication  comm, overlaps_backward: exact counts per op, group and phase, and bytes;
                   reduced_in_one_collective: no reduction done by hand around collectives;
                   accumulation_sends: the backwards of gradient accumulation that sent;
                   all_waited: every asynchronous call's handle waited on;
                   untouched_in_flight: no tensor changed while its call was on the wire
    references     references_off, with_references_off: the library's versions switched off;
                   stand_ins: the library's versions standing in for earlier answers
    sides          on_learners_side: a test's part that must run beside the learner's code
    rows           row_parts: where a schedule row leaves the right one, the right one unshown
    hints          the likely mistakes, as tables a grader can extend (COMM_HINTS, SCALE_HINTS)
    failed         CheckFailed
"""

from dpmp_lab.check.audited import launch
from dpmp_lab.check.communication import (
    accumulation_sends,
    all_waited,
    comm,
    overlaps_backward,
    reduced_in_one_collective,
    untouched_in_flight,
)
from dpmp_lab.check.failed import CheckFailed
from dpmp_lab.check.numbers import (
    FP32,
    FP64,
    against_reference,
    close,
    compare,
    grads,
    params,
    same_on_all_ranks,
)
from dpmp_lab.check.references import (
    ReferenceSwitchedOff,
    references_off,
    stand_ins,
    with_references_off,
)
from dpmp_lab.check.rows import row_parts
from dpmp_lab.check.sides import on_learners_side
from dpmp_lab.trace import OPS

__all__ = ["FP32", "FP64", "OPS", "CheckFailed", "ReferenceSwitchedOff", "accumulation_sends",
           "all_waited",
           "against_reference", "close", "comm", "compare", "grads", "launch",
           "on_learners_side", "overlaps_backward", "params", "reduced_in_one_collective",
           "references_off", "row_parts", "same_on_all_ranks", "stand_ins", "untouched_in_flight",
           "with_references_off"]
