"""A rank's output, cut into whole lines as it arrives, and labelled with the rank.

A pipe hands over bytes in whatever pieces the kernel chose: a line can arrive in three reads,
a UTF-8 character can be cut in two. Printing pieces as they come would interleave half-lines
of different ranks, so each stream keeps its unfinished end until the rest arrives.
"""

from __future__ import annotations

import codecs


class LineSplitter:
    """Bytes of one stream in, decoded text and whole lines out."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = ""

    def feed(self, data: bytes) -> tuple[str, list[str]]:
        """Take the next bytes (b"" at the end of the stream). Returns the text they decode to
        and the lines they complete, without their newlines."""
        text = self._decoder.decode(data, final=not data)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        return text, lines

    def rest(self) -> str | None:
        """The last line when the stream ended without a newline, else None (then forgotten)."""
        line, self._partial = self._partial, ""
        return line or None


def labelled(rank: int, line: str) -> str:
    """A line as the launching cell prints it."""
    return f"[rank {rank}] {line}\n"
