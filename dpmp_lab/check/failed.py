"""CheckFailed, the one exception every check raises: its message is written for the learner."""

from __future__ import annotations

import re

from dpmp_lab.i18n import LIKELY_MISTAKE

__all__ = ["CheckFailed"]


class CheckFailed(AssertionError):
    """A check did not pass. The message says what was expected, what was seen, and why.

    An AssertionError, so pytest and nbgrader count it as a failed test; a notebook shows the
    message alone, not the grader's internals."""

    def seen(self) -> str:
        """The message without the check's own guess at the cause (its "Likely mistake" lines,
        in any language, and their hint keys): for a test that knows the cause better and says
        its own, so that the learner reads one cause, not two."""
        lines = [line for line in str(self).split("\n")
                 if not line.lstrip().startswith(tuple(LIKELY_MISTAKE.values()))
                 and not _HINT_KEYS.fullmatch(line.strip())]
        return "\n".join(lines).rstrip()

    def _render_traceback_(self) -> list[str]:
        return ["CheckFailed: " + str(self)]


_HINT_KEYS = re.compile(r"(\[hint: [^\]]+\]\s*)+")
