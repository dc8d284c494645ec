"""launcher/lines.py without processes: a rank's output split into labelled lines."""

from __future__ import annotations

from dpmp_lab.launcher.lines import LineSplitter, labelled


def test_whole_lines_come_out_and_the_unfinished_end_waits():
    s = LineSplitter()
    assert s.feed(b"epoch 1\nepo") == ("epoch 1\nepo", ["epoch 1"])
    assert s.feed(b"ch 2") == ("ch 2", [])
    assert s.feed(b"\n\nloss") == ("\n\nloss", ["epoch 2", ""])
    assert s.rest() == "loss" and s.rest() is None


def test_a_character_cut_between_reads_is_decoded_whole():
    data = "ü → ∑\n".encode()
    s = LineSplitter()
    texts, lines = [], []
    for i in range(len(data)):   # one byte a read: every multi-byte character is cut
        text, done = s.feed(data[i:i + 1])
        texts.append(text)
        lines += done
    assert "".join(texts) == "ü → ∑\n" and lines == ["ü → ∑"]


def test_end_of_stream_flushes_a_cut_character_as_a_replacement():
    s = LineSplitter()
    s.feed(b"caf\xc3")
    assert s.feed(b"") == ("\ufffd", [])
    assert s.rest() == "caf\ufffd"


def test_invalid_bytes_do_not_stop_the_stream():
    s = LineSplitter()
    assert s.feed(b"\xff\xfeok\n")[1] == ["\ufffd\ufffdok"]


def test_labelled():
    assert labelled(3, "loss 0.5") == "[rank 3] loss 0.5\n"
