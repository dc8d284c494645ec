"""CheckFailed, the one exception every check raises: its message is written for the learner."""

from __future__ import annotations

__all__ = ["CheckFailed"]


class CheckFailed(AssertionError):
    """A check did not pass. The message says what was expected, what was seen, and why.

    An AssertionError, so pytest and nbgrader count it as a failed test; a notebook shows the
    message alone, not the grader's internals."""

    def _render_traceback_(self) -> list[str]:
        return ["CheckFailed: " + str(self)]
