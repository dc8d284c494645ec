"""The harness's pieces without kernels: what crosses from the learner's side (codec.py: data,
decoded by an allowlist, every malformed input refused), which cell runs where (plan.py), and a
call across (agent.py answering remote.py's requests in one process: handles, tensors changed
in place, exceptions, the library's references switched off and the stand-ins put in).
tests/end_to_end/test_course.py and tests/end_to_end/grading_trust.py grade through real
kernels."""

from __future__ import annotations

import json
import math
import signal
import struct

import pytest
import torch

import dpmp_lab as dl
from dpmp_lab.harness import codec
from dpmp_lab.harness.agent import Agent
from dpmp_lab.harness.allowed import ALLOWED
from dpmp_lab.harness.codec import MAGIC, NotData, decode, encode
from dpmp_lab.harness.plan import Kind, Where, plan
from dpmp_lab.harness.remote import HarnessError, LearnerError, Link, Remote, rebuilt
from dpmp_lab.launcher.failures import RankFailure, Reason

# -- what crosses: data, decoded by an allowlist --------------------------------------------------


def test_data_crosses_as_itself():
    value = {"n": [1, 2.5, float("nan"), float("-inf"), True, None, "x", b"\0\1", 3 + 4j],
             (1, 2): (torch.arange(6.0).reshape(2, 3).t(), torch.Size([2, 3])),
             "sets": [{3, 4}, frozenset({5})], "r": range(1, 9, 2), "dtype": torch.bfloat16,
             "device": torch.device("cpu"), "empty": torch.empty(0, 3, dtype=torch.int64),
             "param": torch.nn.Parameter(torch.ones(2)), "mask": torch.tensor([True, False])}
    back = decode(encode(value))
    assert back.keys() == value.keys() and back["n"][0:2] == [1, 2.5]
    assert math.isnan(back["n"][2]) and back["n"][3] == float("-inf") and back["n"][8] == 3 + 4j
    assert torch.equal(back[(1, 2)][0], value[(1, 2)][0]) and back[(1, 2)][1] == torch.Size([2, 3])
    assert type(back["param"]) is torch.nn.Parameter and back["param"].requires_grad
    assert back["dtype"] is torch.bfloat16 and back["empty"].shape == (0, 3)
    assert back["sets"] == value["sets"] and back["r"] == range(1, 9, 2)


def test_a_numpy_number_crosses_as_the_number_it_holds():
    import numpy as np

    assert decode(encode([np.float64(2.5), np.int32(3), np.bool_(True)])) == [2.5, 3, True]
    assert [type(v) for v in decode(encode([np.float64(2.5), np.int32(3)]))] == [float, int]


class AlwaysEqual(list):
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [AlwaysEqual([1]), type("F", (float,), {})(1.0),
                                   type("S", (str,), {})("c"), print, object(),
                                   torch.ones(2).to_sparse()])
def test_what_is_not_data_is_refused_or_crosses_as_a_handle(value):
    with pytest.raises(NotData):
        encode(value)
    back = decode(encode([value], handle=lambda v: [7, "object", type(v).__name__]),
                  handle=lambda body: ("handle", body[0]))
    assert back == [("handle", 7)]
    with pytest.raises(NotData, match="a handle, where only data is accepted"):
        decode(encode(value, handle=lambda v: [7, "object", "x"]))


def test_a_value_that_contains_itself_is_no_data():
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(NotData, match="contains itself"):
        encode(loop)


def _raw(tree, blobs: bytes = b"") -> bytes:
    text = json.dumps(tree).encode()
    return MAGIC + struct.pack(">Q", len(text)) + text + blobs


@pytest.mark.parametrize("data, says", [
    (b"\x80\x04pickle", "not the harness's data format"),
    (MAGIC + struct.pack(">Q", 99) + b"{}", "truncated"),
    (MAGIC + struct.pack(">Q", 5) + b"{nope", "not a JSON tree"),
    (_raw({"o": ["__main__.Evil", {}]}), "not a class the harness accepts"),
    (_raw({"o": ["builtins.eval", {}]}), "not a class the harness accepts"),
    (_raw({"e": ["dpmp_lab.launcher.failures.Reason", "NOPE"]}), "not an allowed enum"),
    (_raw({"T": {"dtype": "float32", "shape": [4], "at": [0, 8], "grad": False,
                 "param": False}}, b"\0" * 8), "holds 8 bytes"),
    (_raw({"T": {"dtype": "object", "shape": [1], "at": [0, 8], "grad": False,
                 "param": False}}, b"\0" * 8), "unknown dtype"),
    (_raw({"b": [4, 100]}, b"\0" * 8), "points outside its bytes"),
    (_raw({"d": [[{"l": []}, 1]]}), "dict key of type list"),
    (_raw({"s": [{"l": []}]}), "unhashable"),
    (_raw({"r": [0, 5, 0]}), "not a range"),
    (_raw({"x": "1e999"}), "not a float"),
    (_raw({"q": 1}), "unknown node"),
    (_raw([1, 2]), "not a node"),
    (_raw({"l": [{"l": []}] * 3, "t": []}), "not a node"),
    (MAGIC + struct.pack(">Q", 10000) + b"[" * 5000 + b"]" * 5000, "not a JSON tree"),
    (_raw(eval("{'l': [" * 70 + "]}" * 70)), "nested deeper"),   # noqa: S307 - a literal
    (_raw({"o": ["dpmp_lab.trace.CommEvent", {"op": "all_reduce"}]}), "could not be rebuilt"),
])
def test_every_malformed_input_is_refused_saying_why(data, says):
    with pytest.raises(NotData, match=says):
        decode(data, ALLOWED)


def test_decoding_is_bounded_in_bytes_and_values():
    with pytest.raises(NotData, match="over the limit"):
        decode(encode(b"\0" * 1000), max_bytes=100)
    many = _raw({"l": [0] * (codec.MAX_NODES + 1)})
    with pytest.raises(NotData, match="more than"):
        decode(many)


def test_the_librarys_data_classes_cross_rebuilt_by_their_constructors():
    t = dl.Trace()
    t.events = [dl.CommEvent("all_reduce", (0, 1), 16, "float32", (4,), "backward", False)]
    t.rank, t.waits, t.written = 1, [0.5], [0]
    failure = RankFailure(2, Reason.SIGNAL, signal=signal.SIGKILL, output_tail="x")
    value = {"res": dl.LaunchResult(values=[{"a": torch.ones(2)}, 3], output=["o", "p"],
                                    traces=[t, None]),
             "failure": failure, "routing": dl.moe.route(torch.softmax(torch.randn(5, 3), -1), 1,
                                                         2.0),
             "layout": dl.GridLayout(dp=2, tp=2)}
    back = decode(encode(value, ALLOWED), ALLOWED)
    res = back["res"]
    assert type(res) is dl.LaunchResult and res.world_size == 2 and res.output == ["o", "p"]
    assert res.traces[0].count("all_reduce", phase="backward") == 1 and res.traces[0].rank == 1
    assert res.traces[0].waits == [0.5] and res.traces[0].written_in_flight() == t.events
    t.written = [1]   # not one of its events
    with pytest.raises(NotData, match="not its events"):
        decode(encode(t, ALLOWED), ALLOWED)
    assert back["failure"] == failure and back["failure"].signal is signal.SIGKILL
    assert type(back["routing"]) is dl.moe.Routing and back["layout"] == dl.GridLayout(dp=2, tp=2)


# -- which cell runs where ----------------------------------------------------------------------


def test_the_plan_puts_each_cell_where_the_tests_need_it():
    cells = [(Kind.OWN, "import torch\nimport dpmp_lab as dl\nSIZE = 4"),   # read by a test
             None,                                                            # markdown
             (Kind.OWN, "def demo():\n    return 1\ndl.launch(demo)"),         # a demo
             (Kind.LEARNER, "def mine(x):\n    return x + SIZE\nanswer = 3"),
             (Kind.OWN, "%load_ext dpmp_lab"),                                 # a line magic
             (Kind.OWN, "def helper(x):\n    return mine(x) * 2"),             # a test calls it
             (Kind.TEST, "assert helper(1) == 10 and answer == 3 and SIZE == 4\nseen = 1"),
             (Kind.OWN, "print(seen)")]                                        # a test's name
    p = plan(cells)
    assert p.where == {0: Where.BOTH, 2: Where.LEARNER, 3: Where.LEARNER, 4: Where.BOTH,
                       5: Where.BOTH, 6: Where.HARNESS, 7: Where.HARNESS}
    assert p.learner_names == {"mine", "answer"}


def test_the_plan_reads_no_learners_cell():
    learner = (Kind.LEARNER, "import os\nos.system('boom')\nthis is not python (")
    p = plan([learner, (Kind.TEST, "assert x == 1")])
    assert p.where == {0: Where.LEARNER, 1: Where.HARNESS} and p.learner_names == {"x"}


# -- a call across: the agent answers the harness's requests ----------------------------------


class Direct(Link):
    """remote.py's link with the grader and the learner's kernel taken out: each request goes
    straight to an agent in this process."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def _exchange(self, data: bytes) -> tuple[dict, bytes]:
        return {"ok": True, "outputs": []}, self.agent.answer_request(data)


def _learner() -> tuple[dict, Link]:
    namespace: dict = {}
    exec("""
import torch
import torch.distributed as dist
import dpmp_lab as dl

def update(acc, scale):
    acc.mul_(scale)          # in place: the harness's tensor changes too
    return acc.sum().item()

def refuses(n):
    if n < 0:
        raise ValueError(f"n is {n}")
    return n

class Odd(Exception):
    pass

def raises_odd():
    raise Odd("mine")

def rows(n, rank, world, _split=dl.models.shard_range):
    return list(_split(n, rank, world))

def uses_piece(x):
    return piece(x)

def keywords(scale, timeout, env=None):
    return scale * dist.get_rank(), timeout, env

def piece(x):
    return -1

class Box:
    def __init__(self, v):
        self.v = v
    def double(self):
        return self.v * 2

answer = [1, 2]
""", namespace)
    return namespace, Direct(Agent(namespace))


def _names(link: Link, namespace: dict, names: list[str]) -> dict:
    exported = link.ask({"op": "export", "names": names})
    return {name: decode(data, ALLOWED, link.remote) for name, data in exported.items()}


def test_the_learners_names_cross_as_data_or_handles():
    namespace, link = _learner()
    names = _names(link, namespace, ["answer", "update", "Box", "missing"])
    assert names["answer"] == [1, 2] and "missing" not in names
    assert type(names["update"]) is Remote and names["update"].__name__ == "update"
    box = names["Box"](21)
    assert type(box) is Remote and box.double() == 42 and box.v == 21
    with pytest.raises(AttributeError):
        box._private   # noqa: B018 - what a harness never reads of the learner's objects


def test_a_call_changes_tensors_in_place_and_raises_as_the_learners_code_did():
    namespace, link = _learner()
    names = _names(link, namespace, ["update", "refuses", "raises_odd"])
    acc = torch.ones(3)
    assert names["update"](acc, 2.0) == 6.0 and torch.equal(acc, torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="n is -1") as info:
        names["refuses"](-1)
    assert "In the learner's code" in info.value.__notes__[0]
    with pytest.raises(LearnerError, match="Odd: mine"):
        names["raises_odd"]()


def test_the_references_switched_off_and_the_stand_ins_reach_the_learners_kernel():
    namespace, link = _learner()
    names = _names(link, namespace, ["rows", "uses_piece"])
    assert names["rows"](10, 1, 4) == [3, 4, 5]
    with dl.check.references_off("models.shard_range"):   # a default argument holds it
        with pytest.raises(dl.check.ReferenceSwitchedOff):
            names["rows"](10, 1, 4)
    here = {"piece": lambda x: x * 10}
    with dl.check.stand_ins(here, piece=abs):
        assert names["uses_piece"](-3) == 3
    assert names["uses_piece"](-3) == -1 and here["piece"](1) == 10


def test_a_launch_of_the_learners_function_keeps_its_keywords_apart_from_the_options():
    """The harness sends a launch of the learner's code to the learner's kernel: a keyword of
    the function named like a launcher option reaches the function, never the launcher."""
    from dpmp_lab.harness import remote
    from dpmp_lab.launcher import launch as launch_module

    namespace, link = _learner()
    keywords = _names(link, namespace, ["keywords"])["keywords"]
    launch_module.route_launches(remote.launch_route(link))
    try:
        res = dl.launch(keywords, 3, world_size=2, stream=False, timeout=60,
                        fn_kwargs={"timeout": 7, "env": "mine"})
    finally:
        launch_module.route_launches(None)
    assert res.values == [(0, 7, "mine"), (3, 7, "mine")]


def test_a_routed_launch_carries_the_harness_s_device_audit(monkeypatch):
    """The grader turns the audit on through the environment of both kernels; the learner's
    kernel could change its own, so the harness decides and says so in the launch's options."""
    from dpmp_lab.harness import remote

    namespace, link = _learner()
    keywords = _names(link, namespace, ["keywords"])["keywords"]
    asked = []
    monkeypatch.setattr(link, "call", lambda fn, args, kwargs: asked.append(kwargs) or "sent")
    route = remote.launch_route(link)
    for value, audit in (("1", True), ("0", False)):
        monkeypatch.setenv("DPMP_LAB_DEVICE_AUDIT", value)
        assert route(keywords, (1,), {}, {"device_audit": None}) == "sent"
        assert asked[-1]["device_audit"] is audit
    assert route(keywords, (1,), {}, {"device_audit": False}) == "sent"   # a launch's own word
    assert asked[-1]["device_audit"] is False


def test_a_learners_object_never_crosses_by_pickling():
    namespace, link = _learner()
    update = _names(link, namespace, ["update"])["update"]
    import pickle

    with pytest.raises(TypeError, match="exists only in the learner's kernel"):
        pickle.dumps(update)


def test_a_launch_error_is_rebuilt_from_its_data():
    failure = RankFailure(1, Reason.EXCEPTION, exc_type="ValueError", message="bad",
                          traceback="  line 3")
    info = {"types": ["dpmp_lab.launcher.failures.LaunchError"], "message": "x",
            "launch": {"failures": {1: failure}, "output": ["", ""], "finished": [0],
                       "stopped": [], "world_size": 2, "summary": None, "hint": None,
                       "flight_records": {}, "timeout": False}}
    err = rebuilt(info)
    assert type(err) is dl.LaunchError and err.failures[1] is failure
    assert "rank 1 raised ValueError: bad" in str(err)
    assert type(rebuilt({"types": ["x.Y"], "message": "m"})) is LearnerError
    assert type(rebuilt("not a dict")) is HarnessError
