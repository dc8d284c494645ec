"""starting.py: the forkserver warmed up at import in IPython (and only there), and a script that
launches without `if __name__ == "__main__":` told so in one error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("no_leaks")

MARK = "DPMP_TEST_MARK"


def run_python(code: str, *, env: dict[str, str] | None = None, script: Path | None = None,
               timeout: float = 120) -> tuple[subprocess.CompletedProcess, str]:
    """Run code (or a script file) in a fresh interpreter tagged with a mark of its own, so
    every process it started can be found afterwards."""
    mark = uuid.uuid4().hex
    full_env = {**os.environ, **(env or {}), MARK: mark,
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, str(script)] if script else [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=script.parent if script else ROOT)
    return done, mark


def processes_marked(mark: str) -> list[int]:
    """Processes whose environment at start carried the mark: the run's descendants."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if f"{MARK}={mark}".encode() in environ.split(b"\0"):
                found.append(int(entry))
    return found


def gone_soon(mark: str, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := processes_marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


IN_IPYTHON = """
import threading
from IPython.core.interactiveshell import InteractiveShell
InteractiveShell.instance()          # what a kernel or the IPython prompt has running
import dpmp_lab as dl
from dpmp_lab.launcher import starting
for t in threading.enumerate():
    if t.name == "dpmp_lab-warm-up":
        t.join(30)
print("forkserver running:", starting.forkserver_running())
"""


def test_importing_in_ipython_starts_the_forkserver_and_leaves_nothing_behind():
    done, mark = run_python(IN_IPYTHON)
    assert done.returncode == 0, done.stderr
    assert "forkserver running: True" in done.stdout
    assert gone_soon(mark) == [], "the warmed-up forkserver outlived its process"


@pytest.mark.parametrize("code, env", [
    (IN_IPYTHON, {"DPMP_LAB_WARM": "0"}),                             # turned off
    ("import dpmp_lab\ndpmp_lab.load()\n"                              # a script: never
     "from dpmp_lab.launcher import starting\n"
     "print('forkserver running:', starting.forkserver_running())", {}),
])
def test_no_warm_up_when_turned_off_or_outside_ipython(code, env):
    done, _ = run_python(code, env=env)
    assert done.returncode == 0, done.stderr
    assert "forkserver running: False" in done.stdout


def test_launching_at_once_after_the_import_waits_for_the_warm_up_instead_of_racing_it():
    code = textwrap.dedent("""
        from IPython.core.interactiveshell import InteractiveShell
        InteractiveShell.instance()
        import dpmp_lab as dl
        import torch.distributed as dist
        # a fork launch while the warm-up thread may still be inside multiprocessing
        print(dl.launch(dist.get_rank, world_size=2, start_method="fork", stream=False).values)
        print(dl.launch(dist.get_rank, world_size=2, stream=False).values)
    """)
    done, mark = run_python(code, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[0, 1]", "[0, 1]"]
    assert gone_soon(mark) == []


def test_a_script_read_from_standard_input_is_refused_with_the_way_out(tmp_path):
    """python - < train.py: every rank started afresh would run the main script's file again,
    and "<stdin>" is none (each rank died with exit code 1, nothing said why)."""
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    script = ("import dpmp_lab as dl\n"
              "def work():\n    return 1\n"
              "if __name__ == '__main__':\n"
              "    print(dl.launch(work, world_size=2, stream=False).values)\n")
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1
    assert "RuntimeError: this script was read from <stdin>" in done.stderr
    assert "python script.py" in done.stderr and 'start_method="fork"' in done.stderr
    assert gone_soon(mark) == []
    forked = script.replace("stream=False", "stream=False, start_method='fork'")
    done = subprocess.run([sys.executable, "-"], input=forked, capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "[1, 1]", done.stderr
    assert gone_soon(mark) == []


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_script_that_launches_unguarded_gets_one_short_error(tmp_path, start_method):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import torch.distributed as dist
        import dpmp_lab as dl

        def work():
            return dist.get_rank()

        print(dl.launch(work, world_size=3, start_method={start_method!r}, stream=False))
    """))
    done, mark = run_python("", script=script)
    out = done.stdout + done.stderr
    assert done.returncode == 1
    assert 'if __name__ == "__main__":' in out and "train.py calls dl.launch" in out
    assert "bootstrapping phase" not in out and "rank 1" not in out
    assert len(out.splitlines()) < 25, out
    assert gone_soon(mark) == [], "processes outlived the script"
