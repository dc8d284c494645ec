"""dl.launch: results, output, environment, and every way a launch can go wrong."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab.launcher import processes
from tests.conftest import ROOT, fake_nvidia_smi, open_fds, stray_processes

pytestmark = pytest.mark.usefixtures("no_leaks")


def notebook_function(source: str, name: str):
    """Define a function the way a notebook cell does: in a module no other process can import."""
    module = types.ModuleType("__main__")
    exec(compile(textwrap.dedent(source), "/tmp/ipykernel_0/cell-7.py", "exec"), module.__dict__)
    return module.__dict__[name]


def all_reduce_rank_sum(scale: float = 1.0) -> float:
    t = torch.ones(3) * (dl.rank() + 1) * scale
    dist.all_reduce(t)
    print(f"rank {dl.rank()} of {dl.world_size()} on {dl.device()}: {t.tolist()}")
    return t[0].item()


# -- it works ---------------------------------------------------------------------------------


def auto_backend(world_size: int) -> str:
    """What backend="auto" initialises here: nccl (with gloo for CPU tensors) when this machine
    has a GPU per rank, as a course server may, else gloo."""
    import torch.distributed as dist

    enough = dl.visible_gpus() >= world_size and dist.is_nccl_available()
    return "cpu:gloo,cuda:nccl" if enough else "gloo"


def test_values_and_output_per_rank(capsys):
    res = dl.launch(all_reduce_rank_sum, 2.0, world_size=4)
    assert res.values == [20.0] * 4
    assert res[3] == 20.0 and len(res) == 4 and res.backend == auto_backend(4)
    streamed = capsys.readouterr().out
    for r in range(4):
        on = "cpu" if auto_backend(4) == "gloo" else f"cuda:{r}"
        assert f"rank {r} of 4 on {on}: [20.0, 20.0, 20.0]" in res.output[r]
        assert f"[rank {r}] rank {r} of 4 on {on}" in streamed


def test_stdout_and_stderr_kept_at_fd_level(capsys):
    def noisy():
        print("to python stdout")
        print("to python stderr", file=sys.stderr)
        os.write(1, b"straight to fd 1\n")
        os.write(2, b"straight to fd 2\n")
        os.write(1, b"no newline at the end")

    res = dl.launch(noisy, world_size=2)
    captured = capsys.readouterr()
    for r in range(2):
        for text in ("to python stdout", "to python stderr", "straight to fd 1",
                     "straight to fd 2", "no newline at the end"):
            assert text in res.output[r]
        assert f"[rank {r}] straight to fd 1" in captured.out
        assert f"[rank {r}] straight to fd 2" in captured.err
        assert f"[rank {r}] no newline at the end" in captured.out


def test_functions_defined_in_a_notebook_travel():
    cell = """
        import torch, torch.distributed as dist
        OFFSET = 10

        class Accumulator:
            def __init__(self, start):
                self.total = start
            def add(self, x):
                self.total += x
                return self

        def make_worker(k):
            def work(acc):                     # a closure over k and OFFSET
                t = torch.tensor([float(dist.get_rank() + k)])
                dist.all_reduce(t)
                return acc.add(t.item() + OFFSET).total
            return work
    """
    make_worker = notebook_function(cell, "make_worker")
    accumulator = notebook_function(cell, "Accumulator")
    res = dl.launch(make_worker(1), accumulator(100), world_size=3, stream=False)
    assert res.values == [100 + (1 + 2 + 3) + 10] * 3
    res = dl.launch(lambda a, b=1: a * b + dist.get_world_size(), 5, b=2, world_size=2,
                    stream=False)
    assert res.values == [12, 12]


def test_caller_environment_path_and_cwd_are_applied(tmp_path, monkeypatch):
    (tmp_path / "learner_helpers.py").write_text("def answer():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    # Set after the forkserver started: a plain forkserver child would not see it.
    monkeypatch.setenv("DPMP_TEST_VALUE", "from-the-notebook")

    def look():
        import learner_helpers

        return (os.environ.get("DPMP_TEST_VALUE"), os.environ.get("EXTRA"), os.getcwd(),
                learner_helpers.answer(), os.environ["RANK"], os.environ["WORLD_SIZE"])

    res = dl.launch(look, world_size=2, env={"EXTRA": "yes"}, stream=False)
    for r, value in enumerate(res.values):
        assert value == ("from-the-notebook", "yes", str(tmp_path), 42, str(r), "2")


def test_thread_count_per_rank():
    cores = len(os.sched_getaffinity(0))
    res = dl.launch(torch.get_num_threads, world_size=2, stream=False)
    assert res.values == [max(1, cores // 2)] * 2
    res = dl.launch(torch.get_num_threads, world_size=2, threads=3, stream=False)
    assert res.values == [3, 3]


def test_one_rank_and_eight_ranks():
    assert dl.launch(all_reduce_rank_sum, world_size=1, stream=False).values == [1.0]
    assert dl.launch(all_reduce_rank_sum, world_size=8, stream=False).values == [36.0] * 8


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_other_start_methods(method):
    res = dl.launch(all_reduce_rank_sum, world_size=2, start_method=method, stream=False)
    assert res.values == [3.0, 3.0]


def test_tensors_come_back():
    res = dl.launch(lambda: torch.arange(4.0) * dist.get_rank(), world_size=2, stream=False)
    assert torch.equal(res[1], torch.arange(4.0))


def test_rank_helpers_outside_a_rank_explain_themselves():
    for helper in (dl.rank, dl.world_size, dl.device):
        with pytest.raises(RuntimeError, match="inside a rank"):
            helper()


def test_two_launches_at_once_do_not_collide():
    script = textwrap.dedent("""
        import dpmp_lab as dl, torch, torch.distributed as dist
        def f():
            t = torch.ones(1) * dist.get_rank()
            dist.all_reduce(t)
            return t.item()
        if __name__ == "__main__":
            for _ in range(3):
                assert dl.launch(f, world_size=4, stream=False).values == [6.0] * 4
            print("ok")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err


# -- a rank fails -----------------------------------------------------------------------------


def test_exception_names_rank_type_message_and_traceback():
    fn = notebook_function("""
        import torch.distributed as dist
        def shard(batch):
            if dist.get_rank() == 2:
                raise ValueError(f"cannot split {batch} samples")
            dist.barrier()
    """, "shard")
    t0 = time.monotonic()
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(fn, 63, world_size=4, stream=False, timeout=240, pg_timeout=120)
    # the others stopped when rank 2 failed, not at the process-group timeout (a wide margin:
    # a launch under a loaded machine's suite takes seconds, not a minute)
    assert time.monotonic() - t0 < 60
    err = info.value
    assert not isinstance(err, dl.LaunchTimeout)
    assert list(err.failures) == [2]
    f = err.failures[2]
    assert (f.reason, f.exc_type, f.message) == ("exception", "ValueError", "cannot split 63 samples")
    assert 'cell-7.py", line 5, in shard' in f.traceback
    assert "rank 2 raised ValueError: cannot split 63 samples" in str(err)
    assert err.stopped == [0, 1, 3]
    assert "worker.py" not in f.traceback  # the launcher's frames are not the learner's business


def test_traceback_shows_notebook_source_lines():
    import linecache

    filename = "/tmp/ipykernel_0/cell-42.py"
    source = "def broken():\n    return 1 / 0\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType("__main__")
    exec(compile(source, filename, "exec"), module.__dict__)
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(module.broken, world_size=2, stream=False)
    first = next(iter(info.value.failures.values()))
    assert "return 1 / 0" in first.traceback


def test_every_rank_raising_is_reported_per_rank():
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(lambda: 1 / 0, world_size=2, stream=False)
    assert all(f.exc_type == "ZeroDivisionError" for f in info.value.failures.values())


@pytest.mark.parametrize("how, sig", [("abort", signal.SIGABRT), ("segfault", signal.SIGSEGV)])
def test_rank_killed_by_signal(how, sig):
    def crash(how):
        import ctypes

        print("last words", flush=True)
        if dist.get_rank() == 1:
            os.abort() if how == "abort" else ctypes.string_at(0)
        dist.barrier()

    with pytest.raises(dl.LaunchError) as info:
        dl.launch(crash, how, world_size=3, stream=False)
    f = info.value.failures[1]
    assert (f.reason, f.signal) == ("signal", sig)
    assert "last words" in f.output_tail
    assert f"killed by signal {sig.name}" in str(info.value)
    assert "in crash" in f.traceback


def test_mismatched_shapes_abort_with_gloo_message_and_hint():
    def mismatch():
        dist.all_reduce(torch.ones(4 * (dist.get_rank() + 1)))

    with pytest.raises(dl.LaunchError) as info:
        dl.launch(mismatch, world_size=2, stream=False)
    f = next(iter(info.value.failures.values()))
    assert f.signal == signal.SIGABRT
    assert "size doesn't match" in f.output_tail
    assert "different shapes" in str(info.value)


def test_early_exit_gives_exit_code():
    def leave():
        if dist.get_rank() == 0:
            os._exit(3)
        dist.barrier()

    with pytest.raises(dl.LaunchError) as info:
        dl.launch(leave, world_size=2, stream=False)
    f = info.value.failures[0]
    assert (f.reason, f.exitcode) == ("exit", 3)
    assert "exited with code 3" in str(info.value)


def test_sys_exit_is_a_failure_with_its_code():
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(lambda: sys.exit(4), world_size=2, stream=False)
    assert {f.exitcode for f in info.value.failures.values()} == {4}


def test_unpicklable_return_value_is_explained():
    with pytest.raises(dl.LaunchError, match="cannot be sent back"):
        dl.launch(threading.Lock, world_size=2, stream=False)


def rank_only_class(folder: str):
    """Rank 1 returns an instance of a class from a module that only it can import."""
    if dist.get_rank() == 0:
        return "fine"
    Path(folder).mkdir(exist_ok=True)
    Path(folder, "rank_only_module.py").write_text("class Thing:\n    pass\n")
    sys.path.insert(0, folder)
    import rank_only_module

    return rank_only_module.Thing()


FRAGILE_CELL = """
    import torch.distributed as dist

    def refuse():
        raise RuntimeError("this object cannot be rebuilt here")

    class Fragile:
        def __reduce__(self):
            return refuse, ()

    def fragile():
        return Fragile() if dist.get_rank() == 1 else "fine"
"""


def test_a_result_the_notebook_cannot_unpickle_names_the_rank(tmp_path):
    for fn, args, error in [
        (rank_only_class, (str(tmp_path / "rank_only"),),
         "ModuleNotFoundError: No module named 'rank_only_module'"),
        (notebook_function(FRAGILE_CELL, "fragile"), (),
         "RuntimeError: this object cannot be rebuilt here"),
    ]:
        with pytest.raises(dl.LaunchError) as info:
            dl.launch(fn, *args, world_size=2, stream=False, timeout=20, pg_timeout=5)
        err = info.value
        assert list(err.failures) == [1] and err.finished == [0]
        assert (f"rank 1's result could not be unpickled in the notebook: {error}"
                in str(err)), str(err)
        assert "define the class in the notebook" in err.hint


def rank_message_pipe():
    """What a rank's own code can reach: the launcher's message pipe, from rank_main's frame."""
    frame = sys._getframe()
    while "msg_w" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["msg_w"]


def test_a_message_that_is_no_message_names_the_rank():
    def garble():
        if dist.get_rank() == 1:
            rank_message_pipe().send_bytes(b"not a pickle")
        return dist.get_rank()

    with pytest.raises(dl.LaunchError) as info:
        dl.launch(garble, world_size=2, stream=False, timeout=20, pg_timeout=5)
    assert list(info.value.failures) == [1]
    assert "rank 1 sent a message the notebook could not read: UnpicklingError" \
        in str(info.value)


def test_a_result_over_max_result_bytes_is_refused_in_the_rank():
    def big():
        return torch.zeros(1000) if dist.get_rank() == 1 else None   # 4 KB and more, pickled

    with pytest.raises(dl.LaunchError) as info:
        dl.launch(big, world_size=2, max_result_bytes=1000, stream=False, timeout=20,
                  pg_timeout=5)
    err = info.value
    # rank 0 returned, or, on a loaded machine, was stopped before its result came: never failed
    assert list(err.failures) == [1] and sorted(err.finished + err.stopped) == [0]
    text = str(err)
    assert "rank 1 raised ValueError: the function's result is 4." in text
    assert "over the launch's limit of 1000 B (max_result_bytes=1,000)" in text
    assert "dl.launch(..., max_result_bytes=...)" in text


def test_the_notebook_reads_no_message_over_the_limit():
    def bypass():   # a rank that skips its own check and sends 2 MiB straight to the launcher
        if dist.get_rank() == 1:
            rank_message_pipe().send_bytes(bytes(2 << 20))
        return dist.get_rank()

    t0 = time.monotonic()
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(bypass, world_size=2, max_result_bytes=1000, stream=False, timeout=120,
                  pg_timeout=5)
    assert time.monotonic() - t0 < 60   # ended by the message, not by the launch's timeout
    assert list(info.value.failures) == [1]
    assert ("rank 1 sent a message over 1.0 MiB, more than the launch reads "
            "(max_result_bytes=1,000, and 1.0 MiB for the message around a result)"
            in str(info.value))


def test_a_collective_on_an_expanded_view_is_refused_before_it_crashes_the_rank():
    """gloo writes through a stride-0 view's one slot and kills the process (SIGSEGV/SIGABRT);
    every rank checks its collectives' tensors first, so the rank raises, naming the cause."""
    class InPlaceF(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            dist.all_reduce(grad)       # grad of .sum() is ones expanded: strides (0, 0)
            return grad

    def summed_in_place():
        x = torch.randn(3, 5, requires_grad=True)
        InPlaceF.apply(x).sum().backward()

    with pytest.raises(dl.LaunchError) as info:
        dl.launch(summed_in_place, world_size=2, stream=False, timeout=60)
    assert [f.exc_type for f in info.value.failures.values()] == ["ValueError"] * 2
    assert "whose elements share memory (strides (0, 0)" in str(info.value)
    assert "[hint: comm.shared_elements]" in str(info.value)

    def contiguous_and_transposed():
        a, b = torch.ones(3, 5), torch.ones(2, 3).t()
        dist.all_reduce(a)
        dist.all_reduce(b)
        return a.sum().item() + b.sum().item()
    assert dl.launch(contiguous_and_transposed, world_size=2, stream=False).values == [42.0] * 2


def test_a_peer_outside_the_group_is_refused_instead_of_waited_for():
    """gloo waits forever for a send to rank N of N ranks (the last rank of a chain sending on);
    every rank checks a call's peer first, so it raises at once, naming the rank."""
    def chain_without_an_end():
        dist.send(torch.ones(2), dst=dist.get_rank() + 1)   # the last rank has no next rank

    def broadcast_from_nowhere():
        dist.broadcast(torch.ones(2), src=dist.get_world_size())

    for fn, says in ((chain_without_an_end, "send with destination rank 2 in a group of 2"),
                     (broadcast_from_nowhere, "broadcast with root rank 2 in a group of 2")):
        with pytest.raises(dl.LaunchError) as info:
            dl.launch(fn, world_size=2, stream=False, timeout=60)
        assert not isinstance(info.value, dl.LaunchTimeout)
        assert says in str(info.value) and "[hint: comm.peer_outside_group]" in str(info.value)

    def ring():
        rank, world = dist.get_rank(), dist.get_world_size()
        t = torch.full((2,), float(rank))
        if rank % 2 == 0:
            dist.send(t, dst=(rank + 1) % world)
            dist.recv(t, src=(rank - 1) % world)
        else:
            got = torch.empty(2)
            dist.recv(got, src=(rank - 1) % world)
            dist.send(t, dst=(rank + 1) % world)
            t = got
        return t[0].item()
    assert dl.launch(ring, world_size=2, stream=False).values == [1.0, 0.0]


def test_a_rank_that_destroys_its_group_is_named_as_the_cause():
    def leave_early():
        # gloo's mesh connected by a first collective: rank 1 then fails in its all_reduce,
        # whenever it gets there (after a clock's wait instead, a loaded machine once had it
        # still connecting when the group went, and it failed there)
        dist.barrier()
        if dist.get_rank() == 0:
            dist.destroy_process_group()
            return "left"
        dist.all_reduce(torch.ones(2))
        return "done"

    with pytest.raises(dl.LaunchError) as info:
        dl.launch(leave_early, world_size=2, stream=False, timeout=20, pg_timeout=5)
    err = info.value
    assert list(err.failures) == [0, 1] and err.finished == []
    assert str(err).startswith(
        "rank 0 destroyed its process group (dist.destroy_process_group() in your function) "
        "while rank 1 still waited in a collective: leave the group to the launcher\n")
    assert "all_reduce" in err.failures[1].traceback
    assert "remove dist.destroy_process_group()" in err.hint


# -- what a rank started ends with the launch --------------------------------------------------

# A daemon the classic way: fork, setsid, fork again; the first child exits, so the daemon is
# an orphan in a session of its own. Prints the daemon's pid once it runs.
DAEMON = """
import os
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execvp("sleep", ["sleep", "600"])
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode())
"""


def start_children(folder: str, ending: str) -> list[int]:
    """Start a child, a child in a session of its own and a daemon; note their pids; then
    return, raise (rank 1, while rank 0 is stopped by the launcher) or hang."""
    plain = subprocess.Popen(["sleep", "600"])
    session = subprocess.Popen(["sleep", "600"], start_new_session=True)
    daemon = subprocess.run([sys.executable, "-c", DAEMON], capture_output=True, text=True,
                            check=True)
    pids = [plain.pid, session.pid, int(daemon.stdout)]
    Path(folder, f"rank{dist.get_rank()}").write_text(" ".join(map(str, pids)))
    if ending == "raises":
        if dist.get_rank() == 1:
            # once rank 0 has started its children too (on a busy machine it may still be
            # starting them, and the launcher stops it as soon as this rank raises)
            deadline = time.monotonic() + 15
            while not Path(folder, "rank0").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise ValueError("planned")
        time.sleep(60)
    if ending == "hangs":
        time.sleep(60)
    dist.barrier()
    return pids


def running(pid: int) -> bool:
    """Whether pid is a process that has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def still_running(pids: list[int], grace: float = 2.0) -> list[int]:
    deadline = time.monotonic() + grace
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if running(p)]


@pytest.mark.parametrize("ending", ["returns", "raises", "hangs"])
def test_what_a_rank_started_ends_with_the_launch(tmp_path, ending):
    pids: list[int] = []
    try:
        if ending == "returns":
            res = dl.launch(start_children, str(tmp_path), ending, world_size=2, stream=False,
                            timeout=20, pg_timeout=5)
            assert all(len(value) == 3 for value in res.values)
        else:
            with pytest.raises(dl.LaunchTimeout if ending == "hangs" else dl.LaunchError):
                dl.launch(start_children, str(tmp_path), ending, world_size=2, stream=False,
                          timeout=3 if ending == "hangs" else 20, pg_timeout=5)
        pids = [int(p) for f in sorted(tmp_path.glob("rank*")) for p in f.read_text().split()]
        assert len(pids) == 6
        assert still_running(pids) == [], "processes a rank started outlived the launch"
    finally:   # on a failure, leave no sleeper behind (only the ones this test started)
        for pid in pids:
            if running(pid) and Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00600\x00":
                os.kill(pid, signal.SIGKILL)


def test_kill_tree_ends_a_process_and_everything_below_it():
    job = subprocess.Popen(["sh", "-c", "sleep 600 & setsid sleep 600 & wait"],
                           start_new_session=True)
    deadline = time.monotonic() + 5
    while len(processes.descendants(job.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    below = processes.descendants(job.pid)
    assert len(below) == 2
    assert set(processes.kill_tree(job.pid)) == {job.pid, *below}
    assert job.wait(timeout=5) == -signal.SIGKILL
    assert still_running(below) == []
    assert processes.descendants(job.pid) == []


def test_without_proc_there_are_no_descendants_to_find(monkeypatch):
    monkeypatch.setattr(processes, "PROC", "/no/such/proc")
    assert processes.descendants(os.getpid()) == []
    assert processes.kill_tree(os.getpid(), include_self=False) == []


# -- a rank hangs -----------------------------------------------------------------------------


def skip_a_collective():
    if dist.get_rank() != 1:
        dist.all_reduce(torch.ones(2))
    return dist.get_rank()


def test_the_timeout_counts_from_when_the_ranks_are_started(monkeypatch):
    """A first launch waits for the forkserver to import torch (tens of seconds on a busy
    machine): that wait is no time of the ranks', so a short timeout still lets them finish."""
    from dpmp_lab.launcher.supervisor import Supervisor

    started = Supervisor._start

    def slow_start(self, store_path):
        time.sleep(3)   # the forkserver's import, as a busy machine pays it
        started(self, store_path)

    monkeypatch.setattr(Supervisor, "_start", slow_start)
    res = dl.launch(all_reduce_rank_sum, world_size=2, timeout=2, stream=False)
    assert res.values == [3.0, 3.0]


def test_skipped_collective_is_a_timeout_naming_the_stuck_ranks():
    t0 = time.monotonic()
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(skip_a_collective, world_size=3, timeout=3, stream=False)
    assert 2.5 < time.monotonic() - t0 < 30   # the timeout waited, and honoured soon after
    err = info.value
    assert sorted(err.failures) == [0, 2] and err.finished == [1]
    for f in err.failures.values():
        assert "in skip_a_collective" in f.traceback and "dist.all_reduce" in f.traceback
    assert "ranks 0, 2 of 3 did not finish" in str(err) and "rank 1 had returned" in str(err)
    # torch's flight record of every rank, the one that returned too: who issued what
    assert sorted(err.flight_records) == [0, 1, 2]
    assert "ranks 0, 2 issued collective #1, all_reduce([2] float32) and wait in it" in str(err)
    assert "rank 1 issued no collective at all" in str(err)


def test_process_group_timeout_is_reported_as_a_hang():
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(skip_a_collective, world_size=2, timeout=30, pg_timeout=2, stream=False)
    f = info.value.failures[0]
    assert "process-group timeout" in f.message and "all_reduce" in f.traceback
    assert sorted(info.value.flight_records) == [0, 1]
    assert "rank 1 issued no collective at all" in str(info.value)


def skip_a_collective_on_a_new_group():
    group = dist.new_group([0, 1])
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2), group=group)
    else:
        time.sleep(60)


def test_a_group_the_function_makes_times_out_like_the_default_group():
    # torch gives dist.new_group's groups a default of 30 minutes: the hang would last until
    # the launch's own timeout
    t0 = time.monotonic()
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(skip_a_collective_on_a_new_group, world_size=2, timeout=60, pg_timeout=2,
                  stream=False)
    assert time.monotonic() - t0 < 30
    assert "waited 2 s in a collective" in info.value.failures[0].message


WATCHDOG_LINE = (  # nccl's, as torch 2.11 wrote it on an H200 (tools/nccl_checks.py)
    "[rank0]:[E1204 17:28:42.945428078 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, "
    "Timeout(ms)=3000) ran for 3096 milliseconds before timing out.")


def _watchdog_line():
    time.sleep(0.5)
    os.write(2, (WATCHDOG_LINE + "\n").encode())
    time.sleep(60)


def watchdog_fires_in_rank_0():
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 0:   # what nccl's watchdog thread prints while the rank waits on;
        # like nccl's, the thread lives on after its line: a thread that ends while
        # faulthandler walks the threads for the launcher can crash the rank
        threading.Thread(target=_watchdog_line, daemon=True).start()
        dist.all_reduce(torch.ones(4))
    else:
        time.sleep(60)


def test_nccls_watchdog_ends_the_launch_at_once_with_the_flight_record():
    # on nccl the watchdog reports a collective past the process-group timeout and the rank
    # lives on (torch 2.11, measured): the launch stops there instead of at its own timeout
    t0 = time.monotonic()
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(watchdog_fires_in_rank_0, world_size=2, timeout=60, pg_timeout=30,
                  stream=False)
    # about 2 s here; the bound leaves the stacks' and then the record's waits (6 s each at
    # most) room on a loaded machine, and is still well short of pg_timeout and timeout
    assert time.monotonic() - t0 < 25
    err = info.value
    assert err.failures[0].message.startswith(
        "waited 30 s in collective #2 (allreduce, 4 elements) that did not complete")
    assert "in watchdog_fires_in_rank_0" in err.failures[0].traceback
    assert err.failures[1].message == "still running when another rank's collective timed out"
    assert "in watchdog_fires_in_rank_0" in err.failures[1].traceback
    assert "rank 1 never issued collective #2" in str(err)


def flight_record_file() -> str:
    return os.environ["TORCH_FR_DUMP_TEMP_FILE"]


def test_flight_records_stay_in_the_launchs_own_folder():
    # torch writes its record on a timeout to this prefix, /tmp/nccl_trace_rank_ by default:
    # on a shared server, every learner's; here a folder of the launch's, removed after it
    prefix = dl.launch(flight_record_file, world_size=2).values[0]
    folder = os.path.dirname(prefix)
    assert os.path.basename(folder).startswith("dpmp_lab-") and not os.path.exists(folder)


def mismatched_collective():
    t = torch.ones(4 if dist.get_rank() == 0 else 3)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def debug_level() -> str:
    return dist.get_debug_level().name


def test_debug_makes_a_mismatched_collective_fail_at_once_naming_both_ranks(monkeypatch):
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    # without debug this waits out the 30 s process-group timeout (test above): a LaunchError
    # that is no timeout is torch's check, made before the collective ran
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(mismatched_collective, world_size=2, timeout=60, pg_timeout=30, debug=True,
                  stream=False)
    assert not isinstance(info.value, dl.LaunchTimeout)
    assert sorted(info.value.failures) == [0, 1]
    text = str(info.value)
    for words in ("Rank 0", "Rank 1", "ALLREDUCE", "BROADCAST", "TensorShape=[4]",
                  "TensorShape=[3]"):
        assert words in text, words
    assert dl.launch(debug_level, world_size=2, debug=True).values == ["DETAIL"] * 2
    # torch reads the variable at import, long before a rank exists: each rank reads it again
    assert dl.launch(debug_level, world_size=2,
                     env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}).values == ["INFO"] * 2
    assert dl.launch(debug_level, world_size=2).values == ["OFF"] * 2   # nothing left behind
    with pytest.raises(TypeError, match="debug"):
        dl.launch(debug_level, world_size=2, debug="yes")


def both_send_first():
    other = 1 - dist.get_rank()
    dist.send(torch.ones(2), dst=other)      # gloo: waits for a recv the other never posts
    buf = torch.empty(2)
    dist.recv(buf, src=other)


def test_point_to_point_deadlock_is_named_as_one_not_as_a_collective():
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(both_send_first, world_size=2, timeout=30, pg_timeout=2, stream=False)
    for f in info.value.failures.values():
        assert f.message.startswith(
            "waited 2 s in a send whose partner's matching recv never came"), f.message
    assert "collective" not in info.value.hint and "isend/irecv" in info.value.hint
    # the same reading of a stack that faulthandler dumped on a launch timeout
    from dpmp_lab.launcher.failures import p2p_wait as _p2p_wait
    stuck = ('  File "/x/torch/distributed/distributed_c10d.py", line 9, in recv\n'
             '  File "/x/torch/distributed/distributed_c10d.py", line 9, in wait\n')
    assert _p2p_wait('  File "cell", line 3, in f\n' + stuck) is None   # innermost is wait
    assert _p2p_wait('  File "/x/torch/distributed/distributed_c10d.py", line 9, in irecv') \
        == "recv"
    assert _p2p_wait('  File "/x/torch/distributed/distributed_c10d.py", line 9, in '
                     'all_reduce') is None


def test_python_hang_shows_where_each_rank_is():
    def spin():
        while True:
            time.sleep(0.05)

    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(spin, world_size=2, timeout=2, stream=False)
    assert sorted(info.value.failures) == [0, 1]
    assert all("in spin" in f.traceback for f in info.value.failures.values())


def test_keyboard_interrupt_stops_every_rank(tmp_path):
    def spin(running):
        import pathlib

        import torch.distributed as dist

        pathlib.Path(running, str(dist.get_rank())).touch()
        while True:
            time.sleep(0.05)

    def interrupt_once_every_rank_runs():
        # an event, not a clock: a timer fired before the ranks ran under load (issue 42)
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    # conftest.sigint_put_back gives every test Python's handler (pytest started as a
    # background job inherits SIGINT ignored, and the SIGINT below would then do nothing)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, (
        f"SIGINT is handled by {signal.getsignal(signal.SIGINT)!r}, not Python's handler")
    threading.Thread(target=interrupt_once_every_rank_runs, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="interrupted: all 3 ranks were stopped"):
        dl.launch(spin, str(tmp_path), world_size=3, timeout=60, stream=False)
    assert time.monotonic() - t0 < 60
    assert stray_processes() == []
    assert dl.launch(all_reduce_rank_sum, world_size=2, stream=False).values == [3.0, 3.0]


def test_hundred_launches_leave_nothing_behind():
    def mixed(i):
        kind = i % 4
        if kind == 1 and dist.get_rank() == 1:
            raise RuntimeError("planned")
        if kind == 2 and dist.get_rank() == 0:
            os._exit(5)
        dist.barrier()
        return i

    before = open_fds()
    outcomes = {"ok": 0, "error": 0}
    for i in range(100):
        try:
            dl.launch(mixed, i, world_size=2, stream=False)
            outcomes["ok"] += 1
        except dl.LaunchError:
            outcomes["error"] += 1
    assert outcomes == {"ok": 50, "error": 50}
    assert stray_processes() == [] and open_fds() <= before


# -- bad input is refused before any process starts -------------------------------------------


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(world_size=0), ValueError, "at least 1"),
    (dict(world_size="4"), TypeError, "must be an int"),
    (dict(backend="mpi"), ValueError, "backend must be one of"),
    (dict(backend="nccl"), ValueError, "NCCL|GPU"),
    (dict(start_method="thread"), ValueError, "start_method"),
    (dict(timeout=0), ValueError, "positive number"),
    (dict(threads=0), ValueError, "threads"),
    (dict(env={"A": 1}), TypeError, "env must map"),
    (dict(max_result_bytes=0), ValueError, "max_result_bytes=0"),
    (dict(max_result_bytes=1.5), TypeError, "max_result_bytes must be an int"),
    (dict(max_result_bytes=None), TypeError, "max_result_bytes must be an int"),
])
def test_bad_arguments(kwargs, error, text):
    with pytest.raises(error, match=text):
        dl.launch(all_reduce_rank_sum, **{"world_size": 2, **kwargs})
    assert stray_processes() == []


def takes_the_launchers_names(scale, timeout, env=None):
    return scale * dist.get_rank(), timeout, env


def test_a_function_gets_keywords_named_like_the_launchers_options_through_fn_kwargs():
    res = dl.launch(takes_the_launchers_names, 10, world_size=2, stream=False, timeout=60,
                    fn_kwargs={"timeout": 5, "env": "mine"})
    assert res.values == [(0, 5, "mine"), (10, 5, "mine")]
    with pytest.raises(TypeError, match="scale both as a keyword argument and in fn_kwargs"):
        dl.launch(takes_the_launchers_names, world_size=2, scale=1,
                  fn_kwargs={"scale": 2, "timeout": 5})
    with pytest.raises(TypeError, match="fn_kwargs must map names"):
        dl.launch(takes_the_launchers_names, 1, world_size=2, fn_kwargs=[("timeout", 5)])
    assert stray_processes() == []


def test_not_callable():
    with pytest.raises(TypeError, match="needs a function"):
        dl.launch(42, world_size=2)


def test_unpicklable_argument_is_named():
    with pytest.raises(ValueError, match=r"positional argument 1 \(lock\) cannot be sent"):
        dl.launch(all_reduce_rank_sum, 1.0, threading.Lock(), world_size=2)
    with pytest.raises(ValueError, match=r"keyword argument 'guard'"):
        dl.launch(all_reduce_rank_sum, world_size=2, guard=threading.Lock())


def test_an_unpicklable_argument_is_named_in_the_learners_language(monkeypatch):
    monkeypatch.setenv("DPMP_LAB_LANG", "ja")
    with pytest.raises(ValueError, match=r"位置引数1（lock）をランクへ送れません"):
        dl.launch(all_reduce_rank_sum, 1.0, threading.Lock(), world_size=2)


def test_process_group_already_initialised_in_caller():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="already initialised"):
            dl.launch(all_reduce_rank_sum, world_size=2)
    finally:
        dist.destroy_process_group()


def test_doctor_passes_and_fails_clearly(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "dpmp_lab.cli", "doctor"], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "ok: 2 ranks on the CPU; CPU tensors through gloo" in ok.stdout
    assert "torch" in ok.stdout and "all checks passed" in ok.stdout
    assert "world size 4: gloo on the CPU (0 GPU(s) < 4 ranks)" in ok.stdout
    assert "nccl        skipped: no GPU visible" in ok.stdout
    # a GPU server whose torch is the CPU build: nvidia-smi lists GPUs that torch cannot use
    gpu_server = dict(os.environ, PATH=fake_nvidia_smi(tmp_path / "bin", 8))
    gpu_server.pop("CUDA_VISIBLE_DEVICES", None)
    bad = subprocess.run([sys.executable, "-m", "dpmp_lab.cli", "doctor", "--backend", "nccl"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=gpu_server)
    assert bad.returncode != 0 and "FAILED" in bad.stderr
    assert "nvidia-smi lists 8, driver 535.104.05" in bad.stdout
    assert "this torch is the CPU build" in bad.stderr and "Fix: install the CUDA build" in \
        bad.stderr
    assert "all checks passed" not in bad.stdout


def test_a_gpu_torch_cannot_use_is_a_problem_with_its_fix(tmp_path, monkeypatch):
    from dpmp_lab.launcher.nvidia import gpu_problem, nvidia_smi

    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "eight", 8, driver="520.61.05"))
    assert nvidia_smi() == (8, "520.61.05")
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "none", 0))
    assert nvidia_smi() == (0, None)            # nvidia-smi fails: no driver loaded
    too_old = gpu_problem("12.8", 0, 8, "520.61.05")
    assert "needs an NVIDIA driver >= 525" in too_old and "the driver is 520.61.05" in too_old
    assert gpu_problem("13.0", 0, 8, "575.51.03").count(">= 580") == 1
    assert "sees none" in gpu_problem("12.8", 0, 8, "535.104.05")   # a driver new enough
    cpu_build = gpu_problem(None, 0, 8, "535.104.05")
    assert cpu_build.startswith("nvidia-smi lists 8 GPU(s), but this torch is the CPU build")
    assert gpu_problem("12.8", 8, 8, "535.104.05") is None        # torch sees them
    assert gpu_problem(None, 0, 0, None) is None                   # no GPU at all
    assert gpu_problem(None, 0, 8, "535.104.05", hidden=True) is None   # hidden on purpose


def test_doctor_says_what_auto_gives_each_world_size_on_a_gpu_server():
    from dpmp_lab.launcher.doctor import backend_plan

    plan = backend_plan(gpus=4, nccl=True)
    assert plan[0].startswith("world size 1: nccl on cuda:0..0")
    assert plan[2].startswith("world size 4: nccl on cuda:0..3 (cpu:gloo,cuda:nccl")
    assert plan[3] == "world size 8: gloo on the CPU (4 GPU(s) < 8 ranks)"
    assert backend_plan(gpus=2, nccl=False)[0] == "world size 1: gloo on the CPU (no NCCL in this torch)"


def test_ranks_die_with_a_killed_kernel():
    script = textwrap.dedent("""
        import os, time, dpmp_lab as dl
        def stay():
            print("PID", os.getpid(), flush=True)
            time.sleep(600)
        if __name__ == "__main__":
            dl.launch(stay, world_size=2, timeout=600)
    """)
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = []
    while len(pids) < 2:
        line = kernel.stdout.readline()
        assert line, "the launch ended before its ranks started"
        if "PID" in line:
            pids.append(int(line.split()[-1]))
    kernel.kill()  # like a kernel restart: no cleanup code runs in it
    kernel.wait()
    kernel.stdout.close()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and
                 "Z" not in open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]]
    assert alive == [], "ranks outlived their kernel"


def test_result_says_which_backend_served_which_device(warm):
    res = dl.launch(lambda: None, world_size=2, stream=False, device_audit=False,
                    backend="gloo")   # named: "auto" is nccl on a server with 2+ GPUs
    assert res.backend == "gloo" and res.backends == {"cpu": "gloo"}
    assert res.describe().startswith("2 ranks on the CPU; CPU tensors through gloo;")
    # what a GPU server's launch reports: CUDA tensors through nccl, CPU tensors through gloo
    gpu = dl.LaunchResult(values=[None] * 4, output=[""] * 4, backend="cpu:gloo,cuda:nccl")
    assert gpu.backends == {"cuda": "nccl", "cpu": "gloo"}
    assert gpu.describe().startswith(
        "4 ranks on cuda:0..cuda:3; CUDA tensors through nccl, CPU tensors through gloo;")
