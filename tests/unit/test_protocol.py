"""launcher/protocol.py: the rank states and outcomes, and the messages a rank sends, built
and read by name only."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from dpmp_lab.launcher import serialize
from dpmp_lab.launcher.progress import Progress
from dpmp_lab.launcher.protocol import Outcome, Raised, RankState, Returned, Started


def test_states_and_outcomes_are_strings_too():
    assert RankState.RETURNED == "returned" and f"{RankState.FAILED}" == "failed"
    assert {RankState.RUNNING: 1}["running"] == 1
    assert Outcome.ALL_RETURNED != RankState.RETURNED   # the three "returned" are now apart
    p = Progress(2, enabled=True)
    assert p.text() == "ranks: 0 starting, 1 starting"


def test_messages_are_built_and_read_by_name_only():
    m = Raised(exc_type="ValueError", message="bad", traceback="tb", exitcode=None)
    with pytest.raises(TypeError):
        Raised("ValueError", "bad", "tb", None)   # positional: a new field would shift these
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.message = "other"
    match m:
        case Raised(message=text, exitcode=None):
            assert text == "bad"
        case _:
            pytest.fail("not matched by name")
    with pytest.raises(TypeError):   # positional patterns are refused, not silently reordered
        match m:
            case Raised(_, _):
                pass


@pytest.mark.parametrize("message", [
    Started(main_thread=34),
    Returned(value=serialize.dumps([1.5, "x"]), trace=serialize.dumps(None)),
    Returned(value=b"", trace=b"", destroyed_group=True),
    Raised(exc_type="KeyError", message="'a'", traceback="", exitcode=2),
])
def test_messages_travel_as_the_rank_sends_them(message):
    assert serialize.loads(serialize.dumps(message)) == message
    assert pickle.loads(pickle.dumps(message)) == message   # by reference: no code is shipped
