"""launcher/flight.py: torch's flight record, read for a hang (pure: records made by hand)."""

from __future__ import annotations

import os
import pickle

import pytest

from dpmp_lab.launcher import failures, flight


def entry(seq: int, op: str = "all_reduce", *, done: bool = True, group=("0", "default_pg"),
          sizes=((4,),), p2p: bool = False, backend: str = "gloo") -> dict:
    return {"process_group": group, "profiling_name": f"{backend}:{op}",
            "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0,
            "is_p2p": p2p, "input_sizes": [list(s) for s in sizes],
            "input_dtypes": ["Float"] * len(sizes), "state": "scheduled", "retired": done}


def record(*entries: dict) -> dict:
    return {"version": "2.10", "pg_config": {}, "entries": list(entries)}


def test_a_rank_that_never_issued_the_collective_the_others_wait_in_is_named():
    text = flight.summary({0: record(entry(1), entry(2, done=False)), 1: record(entry(1))}, 2)
    assert text.splitlines() == [
        "Flight recorder (what torch.distributed recorded each rank issuing):",
        "  the default group: rank 0 issued collective #2, all_reduce([4] float32) and waits "
        "in it",
        "  the default group: rank 1 never issued collective #2; its last was collective #1, "
        "all_reduce([4] float32)",
    ]


def test_different_collectives_at_the_same_place_are_named_with_their_shapes():
    text = flight.summary({0: record(entry(1, done=False)),
                           1: record(entry(1, "broadcast", sizes=((3,),), done=False))}, 2)
    assert ("the default group, collective #1: the ranks issued different collectives "
            "(rank 0 all_reduce([4] float32); rank 1 broadcast([3] float32))") in text


def test_groups_that_agree_and_finished_say_nothing_and_no_record_says_nothing():
    assert flight.summary({0: record(entry(1)), 1: record(entry(1))}, 2) == ""
    assert flight.summary({}, 2) == ""
    both_wait = flight.summary({0: record(entry(3, done=False)), 1: record(entry(3, done=False))}, 2)
    assert "every rank issued collective #3, all_reduce([4] float32); ranks 0, 1 still wait in it" \
        in both_wait


def test_subgroups_ranks_without_a_record_and_sends_in_flight():
    sub = ("1", "undefined")
    text = flight.summary({
        0: record(entry(1), entry(1, group=sub), entry(2, group=sub, done=False),
                  entry(1, "send 0->1", p2p=True, done=False)),
        1: record(entry(1), entry(1, group=sub)),
    }, 3)
    assert "group 1: rank 0 issued collective #2, all_reduce([4] float32) and waits in it" in text
    assert "group 1: rank 1 never issued collective #2" in text
    assert "rank 0 waits in send 0->1([4] float32)" in text
    assert "rank 2: no record" in text
    assert "the default group" not in text   # it agrees and finished
    issued_none = flight.summary({0: record(entry(1, done=False)), 1: record()}, 2)
    assert "the default group: rank 1 issued no collective at all" in issued_none


def test_records_are_read_as_plain_data_only(tmp_path):
    good = record(entry(1))
    flight.save({0: good}, str(tmp_path))
    assert (tmp_path / "flight_rank_0").exists()           # torch's name: fr_trace reads it

    class Hostile:
        def __reduce__(self):
            return (os.system, ("echo hostile",))

    (tmp_path / "flight_rank_1").write_bytes(pickle.dumps({"entries": [Hostile()]}))
    (tmp_path / "flight_rank_2").write_bytes(b"not a pickle")
    (tmp_path / "flight_rank_3").write_bytes(pickle.dumps(["no", "record"]))
    assert flight.read(str(tmp_path), 5) == {0: good}


def test_a_record_over_the_size_limit_is_left_unread(tmp_path, monkeypatch):
    flight.save({0: record(entry(1))}, str(tmp_path))
    monkeypatch.setattr(flight, "MAX_DUMP_BYTES", 10)
    assert flight.read(str(tmp_path), 1) == {}


def test_where_torch_writes_a_record_and_its_buffer():
    env = flight.environ("/x/launch")
    assert list(env.values()) == ["/x/launch/flight_rank_"]
    assert set(env) <= {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    assert flight.buffer_defaults({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}) == {}


@pytest.mark.parametrize("line, what", [
    ("[rank0]:[E1204 17:28:42.945428078 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=4, "
     "NumelOut=4, Timeout(ms)=3000) ran for 3096 milliseconds before timing out.",
     "waited 3 s in collective #2 (allreduce, 4 elements) that did not complete"),
    ("Watchdog caught collective operation timeout: WorkNCCL(OpType=SEND) ran for 5 ms",
     "waited 3 s in a collective that did not complete"),
])
def test_nccls_watchdog_line_is_read(line, what):
    assert failures.WATCHDOG_RE.search(line)
    failure = failures.watchdog_timeout(0, line, stack="", output=line, pg_timeout=3)
    assert failure.message.startswith(what) and failure.reason == failures.Reason.TIMEOUT
    assert not failures.WATCHDOG_RE.search("Watchdog caught nothing")


def write_records(folder: str) -> tuple[bool, bool]:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    rank = dist.get_rank()
    return flight.dump(folder, rank, "gloo"), flight.dump(folder + "/gone", rank, "gloo")


def test_a_rank_writes_its_record_whole_and_a_folder_gone_is_no_error(tmp_path):
    import dpmp_lab as dl

    assert not flight.dump(str(tmp_path), 0, "gloo")       # no process group here: no record
    assert dl.launch(write_records, str(tmp_path), world_size=2).values == [(True, False)] * 2
    records = flight.read(str(tmp_path), 2)
    assert [len(records[r]["entries"]) for r in (0, 1)] == [1, 1]
    assert sorted(os.listdir(tmp_path)) == ["flight_rank_0", "flight_rank_1"]   # no .part left
