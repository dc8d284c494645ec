"""Where a test's own code runs when it must run beside the learner's.

A check that needs the learner's objects themselves (the graph an autograd Function builds,
the gradients it leaves on a module), not only what the learner's functions return, runs that
part of itself where the learner's code is:

    saved, grads = dl.check.on_learners_side(measure, block, x)

In a notebook that is the notebook itself. When the tests run in a harness of their own
(dpmp_lab/harness: grading), it is the learner's kernel: `measure` travels there by value, and
what it returns comes back as data. So such a part computes and returns numbers; the judging
stays in the test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["on_learners_side", "route_calls"]

_call: Callable[[Callable[..., Any], tuple, dict], Any] | None = None


def on_learners_side(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) where the learner's code runs (see the module's docstring)."""
    if _call is None:
        return fn(*args, **kwargs)
    return _call(fn, args, kwargs)


def route_calls(call: Callable[[Callable[..., Any], tuple, dict], Any]) -> None:
    """From now on on_learners_side runs `call(fn, args, kwargs)`: how a grading harness sends
    those calls to the learner's kernel."""
    global _call
    _call = call
