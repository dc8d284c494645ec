"""The sandbox (sandbox.py) and a job's limits (limits.py), each shown from inside: what a
sandboxed process sees and may do, that nothing it starts survives it, that the kernel
manager runs a real kernel there, and that each limit holds where the machine has it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dpmp_lab.instructor import limits, sandbox
from dpmp_lab.instructor.limits import Cgroups, Limits
from tests.conftest import ROOT

needs_sandbox = pytest.mark.skipif(
    sandbox.problem() is not None and os.environ.get("CI") != "true",
    reason=f"the sandbox cannot run here: {sandbox.problem()}")


def _inside(tmp_path: Path, code: str, env: dict | None = None) -> dict:
    """Run Python `code` in the sandbox (the checkout hidden, as when grading); its JSON."""
    rw = {tmp_path / "work": sandbox.WORK, tmp_path / "home": sandbox.HOME,
          tmp_path / "tmp": "/tmp", tmp_path / "shm": sandbox.SHM}
    for folder in rw:
        folder.mkdir(exist_ok=True)
    sandbox.give_to_sandbox(*rw)
    inside_env = sandbox.kernel_env({**os.environ, **(env or {})})
    done = subprocess.run(sandbox.argv([sys.executable, "-c", textwrap.dedent(code)], rw=rw,
                                       env=inside_env, hidden=[ROOT]),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_sandbox
def test_a_python_under_tmp_is_seen_inside_over_the_private_tmp(tmp_path, monkeypatch):
    """A checkout (and its venv) in /tmp: the job's own /tmp must not hide it."""
    venv = tmp_path / "checkout" / ".venv"
    venv.mkdir(parents=True)
    (venv / "marker").write_text("the interpreter's files")
    (tmp_path / "checkout" / "solutions").mkdir()
    paths = sandbox.python_paths
    monkeypatch.setattr(sandbox, "python_paths", lambda hidden=(): [*paths(hidden), venv])
    seen = _inside(tmp_path, f"""
        import json, os
        out = {{"marker": open({str(venv / "marker")!r}).read(),
                "solutions": os.path.exists({str(tmp_path / "checkout" / "solutions")!r})}}
        try:
            open({str(venv / "x")!r}, "w")
            out["write"] = "written"
        except OSError as exc:
            out["write"] = exc.strerror
        open("/tmp/mine", "w").write("x")
        print(json.dumps(out))""")
    assert seen == {"marker": "the interpreter's files", "solutions": False,
                    "write": "Read-only file system"}
    assert (tmp_path / "tmp" / "mine").exists()   # /tmp is still the job's own


@needs_sandbox
def test_inside_the_system_is_read_only_and_the_course_is_not_there(tmp_path):
    seen = _inside(tmp_path, f"""
        import json, os, socket
        out = {{"uid": os.getuid(), "cwd": os.getcwd()}}
        for path in ({str(ROOT / "solutions")!r}, {str(ROOT / "gradebook.db")!r},
                     {str(ROOT / "nbgrader_config.py")!r}, {str(ROOT / "tests")!r},
                     "/etc/shadow", {str(tmp_path)!r}):
            out[path] = os.path.exists(path)
        for path in ("/usr/x", "/x", {str(ROOT / "dpmp_lab" / "x")!r}, "/job/work/x", "/tmp/x"):
            try:
                open(path, "w").write("x")
                out[path] = "written"
            except OSError as exc:
                out[path] = exc.strerror
        try:
            socket.create_connection(("1.1.1.1", 80), timeout=2)
            out["network"] = "connected"
        except OSError as exc:
            out["network"] = type(exc).__name__
        import dpmp_lab
        out["package"] = dpmp_lab.__file__
        out["secret"] = os.environ.get("MY_SECRET_TOKEN")
        print(json.dumps(out))
    """, env={"MY_SECRET_TOKEN": "hunter2"})
    assert seen["uid"] == 65534 and seen["cwd"] == sandbox.WORK
    for path in ("solutions", "gradebook.db", "nbgrader_config.py", "tests"):
        assert seen[str(ROOT / path)] is False, path
    assert seen["/etc/shadow"] is False and seen[str(tmp_path)] is False
    assert seen["/usr/x"] == seen["/x"] == seen[str(ROOT / "dpmp_lab" / "x")] == (
        "Read-only file system")
    assert seen["/job/work/x"] == seen["/tmp/x"] == "written"
    assert (tmp_path / "work" / "x").exists() and (tmp_path / "tmp" / "x").exists()
    assert seen["network"] != "connected"
    assert seen["package"] == str(ROOT / "dpmp_lab" / "__init__.py")
    assert seen["secret"] is None


@needs_sandbox
def test_nothing_started_inside_outlives_the_sandbox(tmp_path):
    mark = f"DPMP_LAB_SANDBOX_TEST={os.getpid()}-{tmp_path.name}"
    _inside(tmp_path, """
        import json, os, subprocess, sys
        subprocess.Popen(["sleep", "300"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "300"])
            os._exit(0)
        print(json.dumps({}))
    """, env={"DPMP_LAB_SANDBOX_TEST": mark.split("=", 1)[1]})
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if mark.encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    left.append(entry)
            except OSError:
                pass
    assert left == []


def test_the_sandbox_binds_the_package_but_not_the_checkout(monkeypatch):
    """Not even when the grader has the checkout on sys.path (PYTHONPATH, or an editable
    install): the package's own folder is bound, never what holds it."""
    monkeypatch.setattr(sys, "path", [str(ROOT), *sys.path])
    for hidden in ([ROOT], []):
        paths = sandbox.python_paths(hidden)
        assert ROOT / "dpmp_lab" in paths and ROOT not in paths
        assert not any(p != ROOT / "dpmp_lab" and ROOT.is_relative_to(p) for p in paths)


@needs_sandbox
def test_inside_nothing_of_the_grader_can_be_read_or_written(tmp_path, monkeypatch):
    """The sandbox's user is never the host's root; bwrap (pid 1 inside) holds none of the
    grader's environment and its memory is not the sandbox's to write; /dev/shm is a folder of
    the job's, measured with its disk; the checkout on the grader's PYTHONPATH is not there."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("MY_SECRET_TOKEN", "hunter2")
    seen = _inside(tmp_path, f"""
        import json, os
        out = {{"uid": os.getuid()}}
        for line in open("/proc/self/uid_map").read().splitlines():
            inside, outside, count = map(int, line.split())
            if inside <= os.getuid() < inside + count:
                out["host uid"] = outside + os.getuid() - inside
        try:
            out["environ"] = "hunter2" in open("/proc/1/environ").read()
        except OSError as exc:
            out["environ"] = exc.strerror
        try:
            open("/proc/1/mem", "wb").close()
            out["mem"] = "writable"
        except OSError as exc:
            out["mem"] = exc.strerror
        open("/dev/shm/mine", "w").write("x" * 1000)
        out["checkout"] = [p for p in ({str(ROOT / "tests")!r}, {str(ROOT / ".git")!r},
                                       {str(ROOT / "solutions")!r}) if os.path.exists(p)]
        out["pythonpath"] = os.environ.get("PYTHONPATH")
        print(json.dumps(out))
    """)
    assert seen["uid"] == sandbox.SANDBOX_UID and seen["host uid"] != 0, seen
    assert seen["environ"] is not True and seen["mem"] != "writable", seen
    assert (tmp_path / "shm" / "mine").stat().st_size == 1000
    assert seen["checkout"] == [] and seen["pythonpath"] == str(ROOT)   # holding dpmp_lab only


def test_a_kernels_own_output_keeps_its_last_part_only():
    from dpmp_lab.instructor.sandbox_kernel import OutputTail

    read, write = os.pipe()
    with open(read, "rb") as pipe:
        tail = OutputTail(pipe, keep=64 * 1024)
        with open(write, "wb") as out:
            for i in range(2000):
                out.write(b"%06d" % i + b"\n" * 4089)
        tail._thread.join(10)
    text = tail.text()
    assert len(text) <= 64 * 1024 and "001999" in text and "000000" not in text


def test_a_missing_sandbox_is_one_sentence_that_says_what_to_do(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    if sys.platform.startswith("linux"):
        assert "apt-get install bubblewrap" in sandbox.problem()
    monkeypatch.setattr(sys, "platform", "darwin")
    assert "Linux-only" in sandbox.problem() and "--no-sandbox" in sandbox.problem()


@needs_sandbox
def test_a_kernel_runs_in_the_sandbox_and_a_cell_can_be_interrupted(tmp_path):
    from dpmp_lab.instructor.sandbox_kernel import SandboxedKernelManager

    (tmp_path / "data.txt").write_text("the submission's own file")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (
        "import os\nprint(os.getcwd(), open('data.txt').read())\nopen('mine.txt', 'w')",
        "import dpmp_lab as dl, torch, torch.distributed as dist\n"
        "def f():\n    t = torch.ones(1) * dist.get_rank()\n    dist.all_reduce(t)\n"
        "    return t.item()\nprint(dl.launch(f, world_size=2, timeout=60).values)",
        "import time\ntime.sleep(60)", "print('still here')")]
    # the sleeping cell alone gets a short limit: the others start torch and two ranks
    NotebookClient(nb, timeout_func=lambda cell: 3 if "sleep(60)" in cell.source else 120,
                   kernel_manager_class=SandboxedKernelManager,
                   allow_errors=True, interrupt_on_timeout=True, startup_timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells]
    assert f"{sandbox.WORK} the submission's own file" in texts[0]
    assert "[1.0, 1.0]" in texts[1]
    assert any(o.get("ename") == "KeyboardInterrupt" for o in nb.cells[2].outputs)
    assert "still here" in texts[3]
    assert not (tmp_path / "mine.txt").exists()   # what the kernel wrote stayed inside


def test_limits_are_whole_numbers():
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)
    with pytest.raises(TypeError, match="disk_mb"):
        Limits(disk_mb=True)
    assert "512 MiB" in Limits().describe()


def test_a_job_starts_with_its_rlimits(tmp_path):
    job = Cgroups()   # no cgroup: rlimits only
    code = ("import resource\nprint(resource.getrlimit(resource.RLIMIT_FSIZE)[0], "
            "resource.getrlimit(resource.RLIMIT_CORE)[0])")
    done = subprocess.run(limits.enter_command([sys.executable, "-c", code],
                                               Limits(disk_mb=7), job),
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == [str(8 * 2**20), "0"], done.stderr
    assert "RLIMIT_AS" in limits.rlimits(Limits(), job)
    assert "no memory cgroup here" in limits.held_text(Limits(), job)


def test_disk_used_counts_what_is_allocated_and_stops_past_a_count(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 300_000)
    with open(tmp_path / "sparse", "wb") as f:   # a hole costs nothing
        f.seek(2**30)
        f.write(b"x")
    used, entries = limits.disk_used([tmp_path])
    assert 300_000 <= used < 2_000_000 and entries == 2
    for i in range(30):
        (tmp_path / f"f{i}").touch()
    assert limits.disk_used([tmp_path], max_entries=10)[1] == 11


def _held(what: str) -> Cgroups:
    job = Cgroups.create(Limits(memory_mb=256, processes=20))
    if what not in job.held:
        job.kill_all()
        pytest.skip(f"no {what} cgroup can be made on this machine: {job.held}")
    return job


def test_a_memory_cgroup_stops_a_job_past_its_limit_and_says_so():
    job = _held("memory")
    try:
        done = subprocess.run(limits.enter_command(
            [sys.executable, "-c", "x = bytearray(600 * 2**20)"], Limits(memory_mb=256), job),
            capture_output=True, timeout=60)
        assert done.returncode == -9
        assert job.hit() == "it used more than its memory limit of 256 MiB"
    finally:
        job.kill_all()
    assert not any(f.exists() for f in job.folders)


def test_a_pids_cgroup_stops_a_fork_bomb_and_says_so():
    job = _held("pids")
    # the sleeps hold no pipe of ours, so the run ends when the Python process does
    code = ("import subprocess\nkids = []\ntry:\n    for _ in range(40):\n"
            "        kids.append(subprocess.Popen(['sleep', '30'], stdout=subprocess.DEVNULL,\n"
            "                                     stderr=subprocess.DEVNULL))\nexcept OSError:\n"
            "    print('refused')\n")
    try:
        done = subprocess.run(limits.enter_command([sys.executable, "-c", code],
                                                   Limits(processes=20), job),
                              capture_output=True, text=True, timeout=60)
        assert "refused" in done.stdout
        assert job.hit() == "it started more than its limit of 20 processes at once"
    finally:
        job.kill_all()   # the sleeps it did start
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY
