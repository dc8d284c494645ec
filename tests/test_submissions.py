"""Submissions are data: a learner's folder is read by descriptor, never through a link, and
within bounds (instructor/submitted.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from dpmp_lab.instructor import submitted

OUTSIDE = b"OUTSIDE-THE-SUBMISSION-9f1c2e"   # what no copy, page or report may hold


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file beside the course that a learner would like the grader (root) to read."""
    (tmp_path / "elsewhere").mkdir()
    path = tmp_path / "elsewhere" / "secret.txt"
    path.write_bytes(OUTSIDE)
    return path


# -- the reader: bounded, never through a link ----------------------------------------------------


def test_small_files_are_read_as_bounded_bytes_and_never_through_a_link(tmp_path, outside):
    (tmp_path / "s").mkdir()
    folder = tmp_path / "s"
    assert submitted.read_small(folder, "timestamp.txt") is None
    (folder / "timestamp.txt").write_bytes(b"x" * 4096)
    assert submitted.read_small(folder, "timestamp.txt") == b"x" * 4096
    (folder / "timestamp.txt").write_bytes(b"x" * 4097)
    with pytest.raises(submitted.NotData, match="4097 bytes"):
        submitted.read_small(folder, "timestamp.txt")
    (folder / "timestamp.txt").unlink()
    (folder / "timestamp.txt").symlink_to(outside)
    with pytest.raises(submitted.NotData, match="symbolic link"):
        submitted.read_small(folder, "timestamp.txt")
    assert submitted.small_text(folder, "timestamp.txt") is None
    (folder / "submission_secret.txt").write_bytes(b"\xff")
    assert submitted.small_text(folder, "submission_secret.txt") is None


def test_the_digest_sees_a_link_and_a_special_file_without_opening_them(tmp_path, outside):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"a")

    def digest() -> str:
        h = hashlib.sha256()
        submitted.digest(folder, h, max_bytes=2**20)
        return h.hexdigest()

    plain = digest()
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "a-checkpoint.txt").write_bytes(b"old")
    assert digest() == plain   # Jupyter's checkpoints are not what was graded
    os.mkfifo(folder / "pipe")   # opened, it would block the digest forever
    with_fifo = digest()
    (folder / "pipe").unlink()
    (folder / "pipe").symlink_to(outside)
    assert len({plain, with_fifo, digest()}) == 3
