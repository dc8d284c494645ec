"""failures.py without processes: what the launcher makes of what the ranks left behind."""

from __future__ import annotations

import contextlib
import inspect
import linecache
import multiprocessing
import signal
import threading

import pytest

from dpmp_lab.dp import GradientsNotAveraged
from dpmp_lab.launcher import serialize, worker
from dpmp_lab.launcher.failures import (
    DESTROYED_GROUP_HINT,
    HANDLE_HANG_HINT,
    HANG_HINT,
    P2P_HANG_HINT,
    UNGUARDED_EXIT,
    UNPICKLABLE_HINT,
    LaunchError,
    LaunchTimeout,
    RankFailure,
    Reason,
    UnguardedLaunch,
    death,
    hang_hint,
    launch_error,
    launch_timeout,
    oversized,
    p2p_wait,
    still_running,
    unpicklable,
    unreadable,
    waits_on_handle,
    where_stuck,
)
from dpmp_lab.launcher.protocol import MESSAGE_MARGIN, Raised, Returned, Started
from dpmp_lab.launcher.receiving import Result, receive
from dpmp_lab.launcher.stacks import dump_complete, stack_from_dump
from dpmp_lab.trace import Trace

CELL = "/tmp/ipykernel_0/cell-3.py"
C10D = "/site-packages/torch/distributed/distributed_c10d.py"
MAIN_THREAD = 0x7F00AA
OTHER_THREAD = 0x7F00BB


@pytest.fixture(autouse=True)
def cell_source():
    source = "def step(t):\n    dist.all_reduce(t)\n    return t\n"
    linecache.cache[CELL] = (len(source), None, source.splitlines(True), CELL)
    yield
    linecache.cache.pop(CELL, None)


def dump(main_frames: list[str], *, with_launcher: bool = True) -> str:
    """A faulthandler dump as a rank writes it on SIGUSR1: most recent call first."""
    launcher = [f'  File "{worker.__file__}", line 281 in _call_user',
                f'  File "{worker.__file__}", line 140 in rank_main',
                '  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run']
    return "\n".join([
        f"Thread 0x{OTHER_THREAD:016x} (most recent call first):",
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
        "",
        f"Current thread 0x{MAIN_THREAD:016x} (most recent call first):",
        *main_frames,
        *(launcher if with_launcher else []),
    ]) + "\n"


IN_ALL_REDUCE = [f'  File "{C10D}", line 2801 in all_reduce',
                 f'  File "{CELL}", line 2 in step']


def exception(rank: int, exc_type: str, message: str, traceback: str = "") -> RankFailure:
    return RankFailure(rank, Reason.EXCEPTION, exc_type=exc_type, message=message,
                       traceback=traceback)


# -- dumps -------------------------------------------------------------------------------------


def test_dump_becomes_a_traceback_of_the_main_thread_with_the_cells_source():
    stack = stack_from_dump(dump(IN_ALL_REDUCE), MAIN_THREAD)
    assert stack.splitlines() == [
        "Traceback (most recent call last):",
        f'  File "{CELL}", line 2, in step',
        "    dist.all_reduce(t)",
        f'  File "{C10D}", line 2801, in all_reduce',
    ]
    assert "threading.py" not in stack and "worker.py" not in stack


def test_unknown_main_thread_falls_back_to_the_first_block_and_empty_dumps_to_nothing():
    assert "threading.py" in stack_from_dump(dump(IN_ALL_REDUCE), None)
    assert stack_from_dump("", MAIN_THREAD) == ""
    assert stack_from_dump("Fatal Python error: Aborted\n", None) == ""


def test_a_dump_is_complete_once_the_launchers_frames_arrived():
    assert dump_complete(dump(IN_ALL_REDUCE), MAIN_THREAD)
    assert not dump_complete(dump(IN_ALL_REDUCE, with_launcher=False)[:120], MAIN_THREAD)
    # caught in the launcher's own code: nothing of the learner's to show yet
    assert not dump_complete(dump([]), MAIN_THREAD)


def test_a_dump_read_while_the_main_threads_block_is_still_written_is_not_complete():
    # the launcher's listening thread also stands in the launcher's own frames, and comes first;
    # a read that ends inside the main thread's first line once made a frame without a name
    listener = (f"Thread 0x{OTHER_THREAD:016x} (most recent call first):\n"
                f'  File "{worker.__file__}", line 345 in listen\n\n')
    whole = listener + dump(IN_ALL_REDUCE).split("\n\n", 1)[1]
    cut = whole[:whole.index(" in all_reduce") + len(" in ")]
    assert not dump_complete(cut, MAIN_THREAD) and stack_from_dump(cut, MAIN_THREAD) == ""
    assert dump_complete(whole, MAIN_THREAD)
    assert "in all_reduce" in stack_from_dump(whole, MAIN_THREAD)


def test_where_stuck_prefers_the_dump_then_the_reported_traceback():
    reported = exception(0, "DistBackendError", "timed out", "Traceback: reported")
    assert "in step" in where_stuck(dump(IN_ALL_REDUCE), MAIN_THREAD, reported)
    assert where_stuck("", MAIN_THREAD, reported) == "Traceback: reported"
    assert where_stuck("", MAIN_THREAD, None) == ""


def test_a_dump_cut_before_the_main_threads_block_shows_no_other_threads_stack():
    # faulthandler writes the newest thread first; a rank that died while writing it (a thread
    # running Python under the walk) leaves only that thread's block in the pipe, and its
    # fatal-signal dump, main thread included, in its output
    cut = dump(IN_ALL_REDUCE).split("\n\n", 1)[0] + "\n"
    assert stack_from_dump(cut, MAIN_THREAD) == ""
    assert where_stuck(cut, MAIN_THREAD, None) == ""
    output = "epoch 1\nFatal Python error: Segmentation fault\n\n" + dump(IN_ALL_REDUCE)
    stack = where_stuck(cut, MAIN_THREAD, None, output)
    assert "in step" in stack and "threading.py" not in stack


# -- a rank's process ended ----------------------------------------------------------------------


def test_death_by_signal_lifts_the_fatal_error_dump_out_of_the_output():
    output = ("epoch 1\nlast words\nFatal Python error: Aborted\n\n"
              + dump(IN_ALL_REDUCE))
    f = death(1, -signal.SIGABRT, output, MAIN_THREAD, started=True)
    assert (f.reason, f.signal, f.exitcode) == (Reason.SIGNAL, signal.SIGABRT, -6)
    assert "in step" in f.traceback and f.output_tail == "epoch 1\nlast words"
    assert "killed by signal SIGABRT (aborted; with gloo" in f.describe()


def test_death_by_exit_keeps_the_output_tail():
    f = death(0, 3, "\n".join(f"line {i}" for i in range(30)), None, started=True)
    assert (f.reason, f.exitcode, f.traceback) == (Reason.EXIT, 3, "")
    assert f.output_tail.splitlines() == [f"line {i}" for i in range(15, 30)]
    assert f.describe().startswith("rank 0 exited with code 3 before returning")


def test_the_unguarded_exit_counts_only_before_the_rank_started():
    assert death(0, UNGUARDED_EXIT, "", None, started=False).reason == Reason.UNGUARDED
    assert death(0, UNGUARDED_EXIT, "", None, started=True).reason == Reason.EXIT


# -- sorting failures into the error --------------------------------------------------------------


def test_a_crash_is_the_cause_and_lost_peers_are_stopped():
    crash = death(2, -signal.SIGSEGV, "", None, started=True)
    lost = exception(0, "DistBackendError", "Connection closed by peer [127.0.0.1]:4")
    err = launch_error({0: lost, 2: crash}, output=[""] * 4, finished=[3], pg_timeout=30)
    assert type(err) is LaunchError
    assert list(err.failures) == [2] and err.stopped == [0, 1] and err.finished == [3]
    text = str(err)
    assert text.startswith("rank 2 of 4 failed\nrank 2 was killed by signal SIGSEGV")
    assert "rank 3 had returned." in text and "ranks 0, 1: stopped by the launcher" in text


def test_only_lost_peers_are_still_reported():
    lost = exception(1, "DistBackendError", "Connection reset by peer")
    err = launch_error({1: lost}, output=["", ""], finished=[], pg_timeout=30)
    assert list(err.failures) == [1] and err.stopped == [0]


def test_process_group_timeouts_everywhere_are_a_hang_and_the_p2p_kind_is_named():
    in_send = f'  File "{CELL}", line 2, in step\n  File "{C10D}", line 9, in send\n'
    failures = {1: exception(1, "torch.distributed.DistBackendError", "Timed out waiting",
                             in_send),
                0: exception(0, "RuntimeError", "operation timed out", "")}
    err = launch_error(failures, output=["", ""], finished=[], pg_timeout=2)
    assert isinstance(err, LaunchTimeout) and list(err.failures) == [0, 1]
    assert err.failures[1].reason == Reason.TIMEOUT
    assert err.failures[1].message.startswith(
        "waited 2 s in a send whose partner's matching recv never came")
    assert err.failures[0].message.startswith("waited 2 s in a collective that not every rank")
    assert err.hint == P2P_HANG_HINT
    assert failures[1].reason == Reason.EXCEPTION   # what was collected is left as it was


@pytest.mark.parametrize("failure, hint", [
    (exception(0, "RuntimeError", "Mismatch in sizes"), "different shapes or dtypes"),
    (RankFailure(0, Reason.SIGNAL, signal=signal.SIGKILL, exitcode=-9), "out of memory"),
    (exception(0, "ValueError", "bad batch"), None),
])
def test_hints_for_a_failure(failure, hint):
    err = launch_error({0: failure}, output=["", ""], finished=[], pg_timeout=30)
    assert (err.hint is None) if hint is None else hint in err.hint


def test_a_failure_s_hint_and_signal_are_told_in_the_learner_s_language(monkeypatch):
    """The report is in the language of the kernel (DPMP_LAB_LANG), the hint kept in English
    for code that compares it."""
    monkeypatch.setenv("DPMP_LAB_LANG", "ja")
    killed = RankFailure(0, Reason.SIGNAL, signal=signal.SIGKILL, exitcode=-9)
    err = launch_error({0: killed}, output=["", ""], finished=[], pg_timeout=30)
    text = str(err)
    assert "ランク 0 はシグナル SIGKILL で強制終了されました（外部から強制終了されました" in text
    assert "ヒント：マシンのメモリが足りなくなった可能性があります" in text
    assert "out of memory" in err.hint
    stuck = {0: still_running(0, stack=stack_from_dump(dump(IN_ALL_REDUCE), MAIN_THREAD),
                              output="", timeout=3)}
    text = str(launch_timeout(stuck, output=["", ""], finished=[1]))
    assert "ヒント：終わらないランクは、たいてい、ほかのランクが呼ばなかった集団通信で" in text
    monkeypatch.setenv("DPMP_LAB_LANG", "en")
    assert "was killed by signal SIGKILL (killed from outside" in str(
        launch_error({0: killed}, output=["", ""], finished=[], pg_timeout=30))


def test_launch_timeout_names_the_stuck_ranks_in_order():
    stuck = {r: still_running(r, stack=stack_from_dump(dump(IN_ALL_REDUCE), MAIN_THREAD),
                              output="step 7\n", timeout=3) for r in (2, 0)}
    err = launch_timeout(stuck, output=["", "", ""], finished=[1])
    assert list(err.failures) == [0, 2] and err.stopped == [] and err.hint == HANG_HINT
    text = str(err)
    # both waited on the same line with the same last output: told once, naming both
    assert text.startswith("ranks 0, 2 of 3 did not finish\nranks 0, 2 did not finish: still "
                           "running after 3 s (launch timeout)")
    assert text.count("dist.all_reduce(t)") == 1 and "last output of ranks 0, 2:\n    step 7" in text


def test_p2p_wait_reads_the_innermost_torch_distributed_call():
    assert p2p_wait(f'  File "{C10D}", line 9, in irecv') == "recv"
    assert p2p_wait(f'  File "{C10D}", line 9, in batch_isend_irecv') == "recv"
    assert p2p_wait(f'  File "{C10D}", line 9, in send_object_list') == "send"
    assert p2p_wait(f'  File "{C10D}", line 9, in send\n  File "{C10D}", line 9, in wait') is None
    assert p2p_wait(f'  File "{CELL}", line 2, in send') is None   # not torch's send
    assert hang_hint({0: exception(0, "RuntimeError", "", "")}) == HANG_HINT


def test_an_unguarded_script_is_one_error_saying_what_to_add():
    failures = {r: death(r, UNGUARDED_EXIT, "", None, started=False) for r in range(4)}
    err = launch_error(failures, output=[""] * 4, finished=[], pg_timeout=30)
    assert isinstance(err, UnguardedLaunch) and isinstance(err, LaunchError)
    text = str(err)
    assert 'if __name__ == "__main__":' in text and "__mp_main__" in text
    assert "rank 0" not in text and len(text.splitlines()) < 10


def test_the_report_is_what_ipython_shows():
    err = launch_error({0: exception(0, "ValueError", "bad", "  File x")}, output=["", ""],
                       finished=[1], pg_timeout=30)
    assert err._render_traceback_() == ["LaunchError: " + err.report()]


# -- what the notebook could not read -------------------------------------------------------------


def test_a_result_that_cannot_be_unpickled_is_one_sentence_naming_the_rank():
    f = unpicklable(1, ModuleNotFoundError("No module named 'rank_only'"))
    assert f.reason == Reason.UNPICKLABLE and f.exc_type == "ModuleNotFoundError"
    assert f.describe() == ("rank 1's result could not be unpickled in the notebook: "
                            "ModuleNotFoundError: No module named 'rank_only'")
    err = launch_error({1: f}, output=["", ""], finished=[0], pg_timeout=30)
    assert str(err).startswith("rank 1 of 2 failed\nrank 1's result could not be unpickled")
    assert err.hint == UNPICKLABLE_HINT and "rank 0 had returned." in str(err)


def test_unreadable_and_oversized_messages_name_the_rank_and_the_limit():
    f = unreadable(0, ValueError("bad bytes"))
    assert f.describe() == "rank 0 sent a message the notebook could not read: ValueError: bad bytes"
    big = oversized(3, 256 << 20, 1 << 20)
    assert big.reason == Reason.UNREADABLE
    assert big.describe().startswith(
        "rank 3 sent a message over 257.0 MiB, more than the launch reads "
        "(max_result_bytes=268,435,456, and 1.0 MiB for the message around a result)")
    assert "dl.launch(..., max_result_bytes=...)" in big.describe()


def test_the_size_check_in_a_rank_names_size_limit_and_how_to_raise_it():
    worker.check_result_size(1000, 1000)   # at the limit is fine
    with pytest.raises(ValueError) as info:
        worker.check_result_size(3 << 20, 1 << 20)
    assert str(info.value).startswith(
        "the function's result is 3.0 MiB pickled (3,145,728 bytes), over the launch's limit of "
        "1.0 MiB (max_result_bytes=1,048,576)")
    assert "dl.launch(..., max_result_bytes=...)" in str(info.value)


def sent(message_bytes: bytes, limit: int = 1000):
    """What receive makes of these bytes, sent on a pipe as a rank sends its messages."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    with reader, writer:
        writer.send_bytes(message_bytes)
        return receive(reader, 2, limit)


class Refuses:
    def __reduce__(self):
        return _refuse, ()


def _refuse():
    raise RuntimeError("not here")


def test_receive_unpickles_results_on_their_own():
    started = Started(main_thread=2)
    assert sent(serialize.dumps(started)) == started
    returned = Returned(value=serialize.dumps([1.5]), trace=serialize.dumps(None),
                        destroyed_group=True)
    assert sent(serialize.dumps(returned)) == Result([1.5], None, True)
    raised = sent(serialize.dumps(Raised(exc_type="KeyError", message="'a'", traceback="tb",
                                         exitcode=None)))
    assert (raised.rank, raised.reason, raised.exc_type, raised.traceback) == (
        2, Reason.EXCEPTION, "KeyError", "tb")


def test_receive_turns_what_it_cannot_read_into_a_failure_of_the_rank():
    bad_value = Returned(value=serialize.dumps(Refuses()), trace=serialize.dumps(None))
    f = sent(serialize.dumps(bad_value))
    assert f.reason == Reason.UNPICKLABLE and "RuntimeError: not here" in f.message
    assert sent(b"garbage").reason == Reason.UNREADABLE
    assert "a dict is no message" in sent(serialize.dumps({"not": "a message"})).message


def test_receive_reads_no_message_past_its_limit_and_none_from_a_closed_pipe():
    reader, writer = multiprocessing.Pipe(duplex=False)

    def send_too_much():   # blocks until the reader gives up on it
        with contextlib.suppress(OSError):
            writer.send_bytes(bytes(MESSAGE_MARGIN + 11))

    sender = threading.Thread(target=send_too_much)
    sender.start()
    f = receive(reader, 0, limit=10)
    assert f.reason == Reason.UNREADABLE
    assert f.describe().startswith("rank 0 sent a message over 1.0 MiB, more than the launch")
    assert reader.closed   # multiprocessing read the length only, and closed the pipe
    sender.join(timeout=5)
    writer.close()
    reader, writer = multiprocessing.Pipe(duplex=False)
    writer.close()
    with reader:
        assert receive(reader, 0, limit=10) is None


# -- a process group destroyed by the function ----------------------------------------------------


def test_a_destroyed_group_is_the_cause_of_the_peers_lost_connection():
    lost = exception(1, "RuntimeError", "Connection closed by peer [127.0.0.1]:4",
                     f'  File "{CELL}", line 2, in step\n  File "{C10D}", line 9, in all_reduce')
    err = launch_error({1: lost}, output=["", ""], finished=[0], pg_timeout=5, destroyed=[0])
    assert type(err) is LaunchError and list(err.failures) == [0, 1]
    assert err.finished == [] and err.stopped == [] and err.hint == DESTROYED_GROUP_HINT
    text = str(err)
    assert text.startswith(
        "rank 0 destroyed its process group (dist.destroy_process_group() in your function) "
        "while rank 1 still waited in a collective: leave the group to the launcher\n"
        "rank 0 returned after destroying its process group itself")
    assert "rank 1 raised RuntimeError: Connection closed by peer" in text


def test_destroyed_groups_in_plural_and_in_a_recv():
    in_recv = f'  File "{CELL}", line 2, in step\n  File "{C10D}", line 9, in recv'
    waiting = {r: exception(r, "DistBackendError", "Connection reset by peer", in_recv)
               for r in (3, 1)}
    err = launch_error(waiting, output=[""] * 5, finished=[0, 2, 4], pg_timeout=5,
                       destroyed=[2, 0])
    assert list(err.failures) == [0, 2, 1, 3] and err.finished == [4]
    assert err.summary == (
        "ranks 0, 2 destroyed their process groups (dist.destroy_process_group() in your "
        "function) while ranks 1, 3 still waited in a send or recv: leave the group to the "
        "launcher")


def test_a_destroyed_group_does_not_hide_a_real_cause():
    crash = exception(1, "ValueError", "bad batch")
    err = launch_error({1: crash}, output=["", ""], finished=[0], pg_timeout=5, destroyed=[0])
    assert list(err.failures) == [1] and "destroy" not in str(err)
    timeout = exception(1, "DistBackendError", "Timed out waiting 5000ms")
    err = launch_error({1: timeout}, output=["", ""], finished=[0], pg_timeout=5,
                       destroyed=[0])
    assert not isinstance(err, LaunchTimeout) and "rank 0 destroyed" in str(err)


def test_ranks_that_failed_alike_are_told_once_naming_them():
    """An unattempted exercise raises the same error from the same line in every rank: one
    traceback, naming the ranks, instead of one per rank; a rank that failed otherwise keeps
    its own."""
    stub = 'File "cell-7.py", line 3, in gather_rows\n    raise NotImplementedError()'

    def raised(rank: int, message: str = "", where: str = stub) -> RankFailure:
        return RankFailure(rank, Reason.EXCEPTION, exc_type="NotImplementedError",
                           message=message, traceback=where)

    err = LaunchError({r: raised(r) for r in range(4)}, output=[""] * 4, finished=[],
                      stopped=[], world_size=4)
    text = str(err)
    assert "ranks 0, 1, 2, 3 raised NotImplementedError" in text
    assert text.count("raise NotImplementedError()") == 1
    assert "rank 0 raised" not in text and list(err.failures) == [0, 1, 2, 3]
    # named in order, whichever reported first (the summary keeps the order of arrival)
    text = str(LaunchError({1: raised(1), 0: raised(0)}, output=["", ""], finished=[],
                           stopped=[], world_size=2))
    assert text.startswith("ranks 1, 0 of 2 failed\nranks 0, 1 raised NotImplementedError")
    other = raised(2, where=stub.replace("line 3", "line 9"))
    text = str(LaunchError({0: raised(0), 1: raised(1, "why"), 2: other, 3: raised(3)},
                           output=[""] * 4, finished=[], stopped=[], world_size=4))
    assert "ranks 0, 3 raised NotImplementedError: \n" in text
    assert "rank 1 raised NotImplementedError: why" in text and "rank 2 raised" in text
    assert text.count("raise NotImplementedError()") == 3
    killed = [RankFailure(r, Reason.SIGNAL, signal=signal.SIGKILL, output_tail="oom")
              for r in (0, 1)]
    text = str(LaunchError(dict(enumerate(killed)), output=["", ""], finished=[], stopped=[],
                           world_size=2))
    assert "ranks 0, 1 were killed by signal SIGKILL" in text
    assert "last output of ranks 0, 1:" in text and text.count("oom") == 1


def test_a_wait_on_a_request_handle_is_its_own_kind_of_hang():
    """work.wait() runs in C++: the innermost frame is the learner's line, not torch's."""
    in_wait = f'  File "{CELL}", line 6, in run_stage\n    work.wait()'
    assert waits_on_handle(in_wait)
    assert waits_on_handle(f'  File "{CELL}", line 6, in f\n    dist.isend(t, 1).wait(timeout=td)')
    assert not waits_on_handle(f'  File "{CELL}", line 6, in f\n    dist.all_reduce(t)')
    # dl.trace records each wait in a wrapper of its own: the learner's line is under it
    traced = in_wait.replace("work.wait()", "stage.send_activation(out, j).work.wait()") + (
        f'\n  File "{inspect.getfile(Trace)}", line 9, in wait\n'
        "    return original(work, *args, **kwargs)")
    assert waits_on_handle(traced)
    assert not waits_on_handle(traced.replace(".work.wait()", ".work"))
    failures = {0: exception(0, "torch.distributed.DistBackendError", "Timed out", in_wait)}
    err = launch_error(failures, output=[""], finished=[], pg_timeout=2)
    assert isinstance(err, LaunchTimeout) and err.hint == HANDLE_HANG_HINT
    assert err.failures[0].message.startswith("waited 2 s on a request handle")
    stuck = {0: still_running(0, stack=in_wait, output="", timeout=3)}
    assert launch_timeout(stuck, output=[""], finished=[]).hint == HANDLE_HANG_HINT


def test_a_failure_says_which_class_the_rank_raised_whatever_language_its_message_is_in():
    failure = exception(0, "dpmp_lab.dp.data_parallel.GradientsNotAveraged", "勾配が平均されないまま")
    assert failure.raised(GradientsNotAveraged) and not failure.raised(RuntimeError)
    assert exception(1, "IndexError", "list index out of range").raised(IndexError)
    assert not RankFailure(2, Reason.EXIT, exitcode=1).raised(SystemExit)
