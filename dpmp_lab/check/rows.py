"""Where a learner's schedule row leaves the right one, said without showing the right one.

A failed table check that printed the expected row would hand the learner the exercise's
answer for that case; `row_parts` names the learner's own action where the rows part, and
whether the row holds the right actions at all, so the learner looks there and reasons.

    raise dl.check.CheckFailed(f"gpipe_table(3, 2), stage 1: {dl.check.row_parts(got, want)}")
"""

from collections import Counter
from collections.abc import Sequence

__all__ = ["row_parts"]


def row_parts(got: Sequence[object], want: Sequence[object], item: str = "action",
              of: str = "the schedule") -> str:
    """'got F0 F1 B1 B0: it parts from the schedule at action 2 (B1), ...': the learner's row,
    the first place it differs from `want` (by the learner's `item` there), and whether it
    holds the same items in another order; `want`'s own items are never named."""
    got, want = [str(a) for a in got], [str(a) for a in want]
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
              min(len(got), len(want)))
    shown = (", " if any(" " in a for a in got) else " ").join(got) or "nothing"
    if at < len(got):
        where = f"it parts from {of} at {item} {at} ({got[at]})"
    else:
        where = f"it stops after {at} {item}s, where {of} goes on"
    if Counter(got) == Counter(want):
        what = f"it holds the right {item}s, in another order"
    elif len(got) != len(want):
        what = f"it has {len(got)} {item}s, {of} {len(want)}"
    else:
        what = f"it does not hold the same {item}s as {of}"
    return f"got {shown}: {where}; {what}"
