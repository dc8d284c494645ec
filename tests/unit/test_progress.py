"""launcher/progress.py: the live status row of a launch cell, and its plain fallback."""

from __future__ import annotations

from dpmp_lab.launcher.progress import Progress


def test_progress_is_shown_only_inside_ipython():
    p = Progress(2, enabled=True)
    assert not p.active   # a script or pytest: plain output only
    p.update(["running", "returned"])
    assert p.text() == "ranks: 0 starting, 1 starting"
