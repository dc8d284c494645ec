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

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl

from .conftest import ROOT, open_fds, stray_processes

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


def test_values_and_output_per_rank(capsys):
    res = dl.launch(all_reduce_rank_sum, 2.0, world_size=4)
    assert res.values == [20.0] * 4
    assert res[3] == 20.0 and len(res) == 4 and res.backend == "gloo"
    streamed = capsys.readouterr().out
    for r in range(4):
        assert f"rank {r} of 4 on cpu: [20.0, 20.0, 20.0]" in res.output[r]
        assert f"[rank {r}] rank {r} of 4 on cpu" in streamed


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
        dl.launch(fn, 63, world_size=4, stream=False)
    assert time.monotonic() - t0 < 10  # not the process-group timeout (30 s)
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


# -- a rank hangs -----------------------------------------------------------------------------


def skip_a_collective():
    if dist.get_rank() != 1:
        dist.all_reduce(torch.ones(2))
    return dist.get_rank()


def test_skipped_collective_is_a_timeout_naming_the_stuck_ranks():
    t0 = time.monotonic()
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(skip_a_collective, world_size=3, timeout=3, stream=False)
    assert 2.5 < time.monotonic() - t0 < 10
    err = info.value
    assert sorted(err.failures) == [0, 2] and err.finished == [1]
    for f in err.failures.values():
        assert "in skip_a_collective" in f.traceback and "dist.all_reduce" in f.traceback
    assert "ranks 0, 2 of 3 did not finish" in str(err) and "rank 1 had returned" in str(err)


def test_process_group_timeout_is_reported_as_a_hang():
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(skip_a_collective, world_size=2, timeout=30, pg_timeout=2, stream=False)
    f = info.value.failures[0]
    assert "process-group timeout" in f.message and "all_reduce" in f.traceback


def both_send_first():
    other = 1 - dist.get_rank()
    dist.send(torch.ones(2), dst=other)      # gloo: waits for a recv the other never posts
    buf = torch.empty(2)
    dist.recv(buf, src=other)


def test_point_to_point_deadlock_is_named_as_one_not_as_a_collective():
    with pytest.raises(dl.LaunchTimeout) as info:
        dl.launch(both_send_first, world_size=2, timeout=30, pg_timeout=2, stream=False)
    for f in info.value.failures.values():
        assert f.message.startswith("waited 2 s in a send whose partner never posted the "
                                    "matching recv"), f.message
    assert "collective" not in info.value.hint and "isend/irecv" in info.value.hint
    # the same reading of a stack that faulthandler dumped on a launch timeout
    from dpmp_lab.failures import p2p_wait as _p2p_wait
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


def test_keyboard_interrupt_stops_every_rank():
    def spin():
        while True:
            time.sleep(0.05)

    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="interrupted: all 3 ranks were stopped"):
        dl.launch(spin, world_size=3, timeout=60, stream=False)
    assert time.monotonic() - t0 < 10
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
])
def test_bad_arguments(kwargs, error, text):
    with pytest.raises(error, match=text):
        dl.launch(all_reduce_rank_sum, **{"world_size": 2, **kwargs})
    assert stray_processes() == []


def test_not_callable():
    with pytest.raises(TypeError, match="needs a function"):
        dl.launch(42, world_size=2)


def test_unpicklable_argument_is_named():
    with pytest.raises(ValueError, match=r"positional argument 1 \(lock\) cannot be sent"):
        dl.launch(all_reduce_rank_sum, 1.0, threading.Lock(), world_size=2)
    with pytest.raises(ValueError, match=r"keyword argument 'guard'"):
        dl.launch(all_reduce_rank_sum, world_size=2, guard=threading.Lock())


def test_process_group_already_initialised_in_caller():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="already initialised"):
            dl.launch(all_reduce_rank_sum, world_size=2)
    finally:
        dist.destroy_process_group()


def test_doctor_passes_and_fails_clearly():
    ok = subprocess.run([sys.executable, "-m", "dpmp_lab.cli", "doctor"], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "ok: 2 ranks on the CPU; CPU tensors through gloo" in ok.stdout
    assert "torch" in ok.stdout and "all checks passed" in ok.stdout
    assert "world size 4: gloo on the CPU (0 GPU(s) < 4 ranks)" in ok.stdout
    assert "nccl        skipped: no GPU visible" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "dpmp_lab.cli", "doctor", "--backend", "nccl"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and "FAILED" in bad.stderr


def test_doctor_says_what_auto_gives_each_world_size_on_a_gpu_server():
    from dpmp_lab.cli import backend_plan

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


def test_progress_is_shown_only_inside_ipython():
    from dpmp_lab.progress import Progress

    p = Progress(2, enabled=True)
    assert not p.active   # a script or pytest: plain output only
    p.update(["running", "returned"])
    assert p.text() == "ranks: 0 starting, 1 starting"


def test_result_says_which_backend_served_which_device(warm):
    res = dl.launch(lambda: None, world_size=2, stream=False, device_audit=False)
    assert res.backend == "gloo" and res.backends == {"cpu": "gloo"}
    assert res.describe().startswith("2 ranks on the CPU; CPU tensors through gloo;")
    # what a GPU server's launch reports: CUDA tensors through nccl, CPU tensors through gloo
    gpu = dl.LaunchResult(values=[None] * 4, output=[""] * 4, backend="cpu:gloo,cuda:nccl")
    assert gpu.backends == {"cuda": "nccl", "cpu": "gloo"}
    assert gpu.describe().startswith(
        "4 ranks on cuda:0..cuda:3; CUDA tensors through nccl, CPU tensors through gloo;")
