"""The launch a check makes: under the device audit wherever the ranks have no GPU each.

The grader audits every launch on a machine without GPUs (dpmp_lab/launcher/audit.py): a buffer
made without `device=` fails there, as it would on a GPU server. A visible check that launched
plainly on a laptop would let the same code pass, and the learner would lose the points after
hand-in for a mistake the check could have shown. Checks launch through `launch` here instead,
so the learner sees the audit's message (the line, and what to write) before hand-in, while
the learner's own cells and the notebook's demos keep dl.launch, where dl.device() is what the
machine has. A rank the audit stopped makes the check fail with the audit's own message (a
CheckFailed), so that no check reads a cause of its own into that message's words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpmp_lab._helpers import ranks_text
from dpmp_lab.check.failed import CheckFailed
from dpmp_lab.launcher.audit import DeviceAuditError
from dpmp_lab.launcher.failures import LaunchError
from dpmp_lab.launcher.launch import (
    LaunchResult,
    audit_refused,
    audit_requested,
    ranks_have_gpus,
)
from dpmp_lab.launcher.launch import launch as _launch


def launch(fn: Callable[..., Any], *args: Any, world_size: int = 4, backend: str = "auto",
           device_audit: bool | None = None, **kwargs: Any) -> LaunchResult:
    """dl.launch for a check: `device_audit` defaults to on unless every rank has a GPU of its
    own (nccl), so code that would put data on the wrong device there fails here too;
    DPMP_LAB_DEVICE_AUDIT=0 turns it off (a timing, a test of something else)."""
    if device_audit is None:
        device_audit = audit_requested() or not (audit_refused()
                                                 or ranks_have_gpus(backend, world_size))
    try:
        return _launch(fn, *args, world_size=world_size, backend=backend,
                       device_audit=device_audit, **kwargs)
    except LaunchError as exc:
        # the audit names the line and the fix; a check's own guess at the cause (a size, a
        # dtype read into "a CPU tensor of shape [9]") would only mislead, and the traceback
        # would say the audit's words a second time
        said: dict[str, list[int]] = {}
        for failure in sorted(exc.failures.values(), key=lambda f: f.rank):
            if failure.raised(DeviceAuditError):
                said.setdefault(failure.message, []).append(failure.rank)
        if said:
            raise CheckFailed("\n".join(f"{ranks_text(ranks)}: {message}"
                                        for message, ranks in said.items())) from None
        raise


__all__ = ["launch"]
