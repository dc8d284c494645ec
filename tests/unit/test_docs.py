"""The documentation holds together: every relative link in the project's Markdown files names a
file that exists and, after `#`, a heading that file has (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCS = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), ROOT / "course" / "README.md"])
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", path.read_text()))
            if not re.match(r"[a-z]+:", t)]


def test_the_anchor_rule_is_githubs():
    assert anchor("Seeing the communication: `dl.trace`") == "seeing-the-communication-dltrace"
    assert anchor("Speed (benchmarks/launch.py, 2 cores)") == "speed-benchmarkslaunchpy-2-cores"


def test_every_document_is_checked():
    assert {p.name for p in DOCS} >= {"README.md", "learner-guide.md", "instructor-guide.md",
                                      "library.md", "maintainer-guide.md", "INSTRUCTORS.md"}


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_relative_link_resolves(path):
    broken = []
    for target in links(path):
        file, _, part = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif part and dest.suffix == ".md" and part not in anchors(dest):
            broken.append(f"{target}: no heading #{part} in {dest.name}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)
