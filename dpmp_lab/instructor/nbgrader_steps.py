"""Several nbgrader commands in one Python process, one after the other.

A process that runs `nbgrader ...` pays for Python and nbgrader's imports before it does anything
(about 1.5 CPU-seconds here; torch's 2 more before the package's facade loaded its API lazily:
the course's nbgrader_config.py imports dpmp_lab, and a grader's process now never loads torch). Grading one
submission is two commands (autograde, then generate_feedback) and releasing the course one
generate_assignment per notebook, so a class of 40 paid that 80 times per assignment. Run here
they pay it once. nbgrader's own test suite runs its commands the same way, in one process with
the application reset between two.

    python -m dpmp_lab.instructor.nbgrader_steps '[{"args": ["autograde", "00_launch"]},
                                                   {"args": ["generate_feedback", "00_launch"]}]'

Each step is nbgrader's command line (`args`) and variables set for that step only (`env`,
e.g. the device audit's, which the sandboxed kernel keeps). The steps stop at the first one that
fails; the exit code is that step's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    """One nbgrader command: its arguments (what follows `nbgrader`) and extra variables."""

    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"args": list(self.args), "env": dict(self.env)}


def command(steps: Sequence[Step]) -> list[str]:
    """The command line that runs `steps` with this Python."""
    return [sys.executable, "-m", "dpmp_lab.instructor.nbgrader_steps",
            json.dumps([s.as_json() for s in steps])]


def parse(text: str) -> list[Step]:
    """The steps of a command line's JSON; ValueError saying what is wrong."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the steps are not JSON: {exc}") from None
    if not isinstance(raw, list) or not raw:
        raise ValueError("the steps must be a non-empty JSON list")
    steps = []
    for item in raw:
        args, env = (item.get("args"), item.get("env", {})) if isinstance(item, dict) else (0, 0)
        if not (isinstance(args, list) and args and all(isinstance(a, str) for a in args)):
            raise ValueError(f"a step needs 'args', a non-empty list of strings: {item!r}")
        if not (isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ValueError(f"a step's 'env' maps names to strings: {item!r}")
        steps.append(Step(tuple(args), env))
    return steps


def run_step(step: Step) -> int:
    """Run one nbgrader command here, as `nbgrader args` would in a process of its own; its
    exit code. The application is reset afterwards, so the next step starts clean (the object
    that ran is the one to reset: taking a subcommand clears nbgrader's singleton)."""
    from jupyter_core.application import NoStart
    from jupyter_core.utils import ensure_event_loop
    from nbgrader.apps.nbgraderapp import NbGraderApp

    saved = {name: os.environ.get(name) for name in step.env}
    os.environ.update(step.env)
    ensure_event_loop()
    app = NbGraderApp.instance()
    try:
        app.initialize(list(step.args))
        app.start()
        return 0
    except NoStart:
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        app.reset()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_steps(steps: Sequence[Step]) -> int:
    """Run the steps in order, stopping at the first that fails; its exit code, else 0."""
    for step in steps:
        code = run_step(step)
        if code:
            print(f"[nbgrader_steps] `nbgrader {' '.join(step.args)}` failed (exit {code}); "
                  "the steps after it were not run", file=sys.stderr, flush=True)
            return code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) != 1:
        print("usage: python -m dpmp_lab.instructor.nbgrader_steps STEPS_JSON",
              file=sys.stderr)
        return 2
    try:
        steps = parse(argv[0])
    except ValueError as exc:
        print(f"nbgrader_steps: {exc}", file=sys.stderr)
        return 2
    return run_steps(steps)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Step", "command", "main", "parse", "run_step", "run_steps"]
